// Runs a job with the in-process reference trainer: data, the batch plan, evaluation, the
// report.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/dataset.h"
#include "common/job/batch_plan.h"
#include "common/job/job.h"
#include "proto/report.pb.h"

namespace localpar {

// Host buffers for one batch, filled from a plan item's rows of an order; the reference
// trainer and the coordinator both assemble batches through this.
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
  std::string version;         // recorded in the report
  std::string init_from;       // start from these weights (weights.pb or safetensors); "" = none
};

absl::StatusOr<DataSplit> LoadJobData(const v1::Job& job);

// The backend RunOptions ask for; an unknown device name is INVALID_ARGUMENT, a CUDA device
// that is not there FAILED_PRECONDITION.
absl::StatusOr<std::unique_ptr<Backend>> PickBackend(const RunOptions& options);

// Trains `job`; reports progress to `log`. `data` comes from LoadJobData.
absl::StatusOr<v1::RunReport> RunReference(const v1::Job& job, const DataSplit& data,
                                           const RunOptions& options, std::ostream& log);

}  // namespace localpar
