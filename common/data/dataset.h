// In-memory labelled data sets, epoch shuffling and batch assembly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/core/shape.h"

namespace localpar {

inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

struct Dataset {
  Shape example_shape;  // e.g. [28, 28, 1] (NHWC without the batch)
  int32_t classes = 0;
  std::vector<float> x;  // size() * NumElements(example_shape)
  std::vector<int32_t> y;
  int64_t size() const { return static_cast<int64_t>(y.size()); }
  int64_t example_size() const { return NumElements(example_shape); }
};

struct DataSplit {
  Dataset train, test;
};

// Reads the four Fashion-MNIST IDX files from `dir` (pixels scaled to [0, 1]); checks that
// image and label counts agree and that labels are in 0..9. `limit` > 0 keeps the first
// examples of each split.
absl::StatusOr<DataSplit> LoadFashionMnist(const std::string& dir, int64_t train_limit = 0,
                                           int64_t test_limit = 0);

struct SyntheticOptions {
  int64_t train_examples = 1024;
  int64_t test_examples = 256;
  Shape shape = {28, 28, 1};
  int32_t classes = 10;
  uint64_t seed = 0;
  float noise = 1.0f;
};
// Gaussian clusters around per-class centres: learnable, deterministic, no files.
DataSplit MakeSynthetic(const SyntheticOptions& options);

// Standardises both splits with the training split's mean and standard deviation.
void Standardize(DataSplit& split);

// The order of examples in an epoch: a Fisher-Yates shuffle driven by (seed, epoch).
std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch);

// Copies examples order[begin, begin+count) into contiguous x and y buffers.
void GatherBatch(const Dataset& data, const std::vector<int64_t>& order, int64_t begin,
                 int64_t count, float* x, int32_t* y);

}  // namespace localpar
