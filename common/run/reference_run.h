// Runs a job with the in-process reference trainer: data, the batch plan, evaluation, the
// report.
#pragma once

#include <atomic>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/dataset.h"
#include "common/run/batch_plan.h"
#include "common/run/job_data.h"
#include "proto/report.pb.h"

namespace localpar {

struct RunOptions {
  std::string device = "cpu";    // "cpu", "cuda" or "auto"
  int threads = 1;               // CPU GEMM threads
  bool progress = true;          // a progress line on stderr
  std::string out_dir;           // where report.json and weights.pb go ("" = nowhere)
  std::string version;           // recorded in the report
  int weights_pb_limit_mib = 0;  // past this, weights go to OUT/weights/ as shards (0: 1.5 GiB)
  std::string init_from;         // start from these weights (weights.pb or safetensors); "" = none
  // Continue from the newest complete checkpoint under this directory, as `localpar run`
  // lays one out (regrouped when the job's --stages or --replicas differ); "" = start fresh.
  std::string resume;
  // Polled after every training step: once set, the run stops there and reports (and
  // writes) what it has, with RunReport.interrupted set.
  const std::atomic<bool>* stop = nullptr;
};

// Trains `job` (`data` comes from LoadJobData): progress and what it reads to `log`, the
// report's table and the files it writes to `out` (run_io.h, as a cluster's coordinator).
absl::StatusOr<v1::RunReport> RunReference(const v1::Job& job, const DataSplit& data,
                                           const RunOptions& options, std::ostream& log,
                                           std::ostream& out);

}  // namespace localpar
