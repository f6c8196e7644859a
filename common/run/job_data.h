// A job's data loaded and standardised (LoadJobData), and batches assembled from it: the
// reference run and the coordinator both gather batches through BatchAssembler.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/data/dataset.h"
#include "proto/job.pb.h"

namespace localpar {

// Host buffers for one batch, filled from a plan item's rows of an order; the reference
// trainer and the coordinator both assemble batches through this.
class BatchAssembler {
 public:
  BatchAssembler(const Dataset& data, int64_t max_rows);
  // Rows order[begin, begin + rows) of the data (begin.. when `order` is empty); `epoch`
  // picks a sequence source's random windows.
  // Errors: a token file that changed during the run (GatherBatch), a data error.
  absl::Status Gather(const std::vector<int64_t>& order, int64_t begin, int64_t rows,
                      int64_t epoch = 0);
  int64_t rows() const { return rows_; }
  // The inputs: x_dtype() elements (float32 values, or int32 token ids), 4 bytes each.
  const void* x() const { return x_.data(); }
  DType x_dtype() const { return data_.input_dtype(); }
  // The inputs as token ids (x_dtype() kI32).
  const int32_t* ids() const { return reinterpret_cast<const int32_t*>(x_.data()); }
  const int32_t* y() const { return y_.data(); }
  Shape x_shape() const;
  // [rows], or [rows, labels per example] for per-position labels.
  Shape y_shape() const;
  size_t x_bytes() const { return static_cast<size_t>(rows_ * data_.example_size()) * 4; }
  size_t y_bytes() const { return static_cast<size_t>(rows_ * data_.label_size) * 4; }

 private:
  const Dataset& data_;
  std::vector<uint32_t> x_;  // 4-byte elements of either type
  std::vector<int32_t> y_;
  int64_t rows_ = 0;
};

absl::StatusOr<DataSplit> LoadJobData(const v1::Job& job);

}  // namespace localpar
