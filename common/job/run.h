// Runs a job with the in-process reference trainer: data, epochs, evaluation, report.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/dataset.h"
#include "common/job/job.h"

namespace localpar {

struct RunOptions {
  std::string device = "cpu";  // "cpu", "cuda" or "auto"
  int threads = 1;             // CPU GEMM threads
  bool progress = true;        // a progress line on stderr
  std::string out_dir;         // where report.json goes ("" = nowhere)
};

struct EpochReport {
  int epoch = 0;
  std::vector<HeadStats> train, test;  // per stage
  double seconds = 0;
};

struct RunReport {
  std::string job;
  std::string rule;
  std::string backend;
  int stages = 0;
  int64_t parameters = 0;
  int64_t steps = 0;
  int64_t train_examples = 0;
  double wall_seconds = 0;
  double examples_per_second = 0;
  std::vector<EpochReport> epochs;
};

absl::StatusOr<DataSplit> LoadJobData(const v1::Job& job);

// Trains `job`; reports progress to `log`. `data` comes from LoadJobData.
absl::StatusOr<RunReport> RunReference(const v1::Job& job, const DataSplit& data,
                                       const RunOptions& options, std::ostream& log);

std::string ReportJson(const RunReport& report);
std::string ReportTable(const RunReport& report);

}  // namespace localpar
