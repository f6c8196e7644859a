// The report of a cluster run, assembled from the workers' statistics.
#pragma once

#include <vector>

#include "proto/localpar.pb.h"
#include "proto/report.pb.h"

namespace localpar {

// Each stage's own figures at the end of the run (throughput, memory, queues, phases, bytes)
// from its statistics, as report.json's stage_reports. The epochs' figures are the ledger's.
void AddStageReports(const std::vector<v1::StatsResponse>& stats, v1::RunReport* report);

// trace.json: each stage's training-step compute intervals.
v1::Trace ClusterTrace(const std::vector<v1::StatsResponse>& stats);

}  // namespace localpar
