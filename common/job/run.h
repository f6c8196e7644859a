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

// Total training steps of a job over `train_examples` (epochs, capped by max_steps).
int64_t TotalSteps(const v1::Job& job, int64_t train_examples);

// Host buffers for one batch. The reference trainer and the coordinator both fill batches
// through this, from EpochOrder(n, job.seed(), epoch) in consecutive slices of batch_size,
// so they feed exactly the same examples in the same order.
class BatchAssembler {
 public:
  BatchAssembler(const Dataset& data, int64_t max_rows);
  void Gather(const std::vector<int64_t>& order, int64_t begin, int64_t rows);
  int64_t rows() const { return rows_; }
  const float* x() const { return x_.data(); }
  const int32_t* y() const { return y_.data(); }
  Shape x_shape() const;
  // [rows], or [rows, labels per example] for per-position labels.
  Shape y_shape() const;
  size_t x_bytes() const { return static_cast<size_t>(rows_ * data_.example_size()) * 4; }
  size_t y_bytes() const { return static_cast<size_t>(rows_ * data_.label_size) * 4; }

 private:
  const Dataset& data_;
  std::vector<float> x_;
  std::vector<int32_t> y_;
  int64_t rows_ = 0;
};

struct RunOptions {
  std::string device = "cpu";  // "cpu", "cuda" or "auto"
  int threads = 1;             // CPU GEMM threads
  bool progress = true;        // a progress line on stderr
  std::string out_dir;         // where report.json and weights.pb go ("" = nowhere)
};

struct EpochReport {
  int epoch = 0;
  std::vector<HeadStats> train, test;  // per stage
  double seconds = 0;
};

// Per-stage figures of a distributed run.
struct StageReport {
  double examples_per_second = 0;    // over the stage's own compute time
  int64_t resident_bytes = 0;        // at the end of the run
  int64_t resident_bytes_first = 0;  // at the end of the first epoch
  int64_t queue_max_depth = 0;
  int64_t queue_capacity = 0;
  int64_t overlap_max_delay = 0;  // asynchronous OVERLAP: largest delay applied, in steps
  double overlap_mean_delay = 0;
  int64_t rejected = 0;
  int64_t baseline_bytes = 0;  // resident before the stage was built
  int64_t state_bytes = 0;     // parameters, gradients, optimizer state
  int64_t activation_bytes_per_example = 0;
  std::vector<int64_t> resident_bytes_by_epoch;  // at the end of each epoch
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
  std::vector<StageReport> stage_reports;  // distributed runs only
};

absl::StatusOr<DataSplit> LoadJobData(const v1::Job& job);

// The backend RunOptions ask for (cpu, cuda or auto).
absl::StatusOr<std::unique_ptr<Backend>> PickBackend(const RunOptions& options);

// Trains `job`; reports progress to `log`. `data` comes from LoadJobData.
absl::StatusOr<RunReport> RunReference(const v1::Job& job, const DataSplit& data,
                                       const RunOptions& options, std::ostream& log);

std::string ReportJson(const RunReport& report);
// Writes report.json to `dir` (created if missing), atomically.
absl::Status WriteReport(const RunReport& report, const std::string& dir);
std::string ReportTable(const RunReport& report);

}  // namespace localpar
