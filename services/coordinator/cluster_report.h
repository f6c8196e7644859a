// The report of a cluster run, assembled from the workers' statistics.
#pragma once

#include <map>
#include <vector>

#include "proto/localpar.pb.h"
#include "proto/report.pb.h"

namespace localpar {

// `stats`: every stage's statistics at the end of the run. `at_epoch_end`: those taken
// when each epoch's evaluation finished, which survive a recovery (a worker that is
// configured again forgets its figures); preferred where present. `before` holds the epochs
// a resumed run inherited from its checkpoint. Fills epochs and stage_reports of `report`.
void AddClusterFigures(const std::vector<v1::StatsResponse>& stats,
                       const std::map<int, std::vector<v1::StatsResponse>>& at_epoch_end,
                       const v1::RunReport& before, int epochs, v1::RunReport* report);

// trace.json: each stage's training-step compute intervals.
v1::Trace ClusterTrace(const std::vector<v1::StatsResponse>& stats);

}  // namespace localpar
