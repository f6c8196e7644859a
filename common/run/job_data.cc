// A job's data loaded and standardised, and batches assembled from it in host memory.
#include "common/run/job_data.h"

#include "common/data/user_data.h"
#include "common/job/data_source.h"
#include "common/job/data_spec.h"

namespace localpar {

BatchAssembler::BatchAssembler(const Dataset& data, int64_t max_rows)
    : data_(data),
      x_(static_cast<size_t>(max_rows * data.example_size())),
      y_(static_cast<size_t>(max_rows * data.label_size)) {}

absl::Status BatchAssembler::Gather(const std::vector<int64_t>& order, int64_t begin, int64_t rows,
                                    int64_t epoch) {
  rows_ = rows;
  return MarkDataError(GatherBatch(data_, order, begin, rows, x_.data(), y_.data(), epoch));
}

Shape BatchAssembler::y_shape() const {
  if (data_.label_size == 1) return {rows_};
  return {rows_, data_.label_size};
}

Shape BatchAssembler::x_shape() const {
  Shape s{rows_};
  s.insert(s.end(), data_.example_shape.begin(), data_.example_shape.end());
  return s;
}

absl::StatusOr<DataSplit> LoadJobData(const v1::Job& job) {
  const DataSource& source = DataSourceOf(job.data());
  absl::StatusOr<DataSplit> split = source.Load(job);
  if (!split.ok()) return MarkDataError(split.status());
  if (source.OwnValidation()) return split;  // token ids: never standardised
  if (job.data().holdout_fraction() > 0) HoldOut(*split, job.data().holdout_fraction());
  Standardize(*split);
  return split;
}

}  // namespace localpar
