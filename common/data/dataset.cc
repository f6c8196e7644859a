// Data set loading, synthetic data, standardisation, shuffling and batching.
#include "common/data/dataset.h"

#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/core/rng.h"
#include "common/data/idx.h"

namespace localpar {
namespace {

absl::StatusOr<Dataset> LoadSplit(const std::string& dir, const std::string& prefix,
                                  int64_t limit) {
  std::string images = absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz");
  std::string labels = absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz");
  absl::StatusOr<IdxArray> img = ReadIdxFile(images);
  if (!img.ok()) return img.status();
  absl::StatusOr<IdxArray> lab = ReadIdxFile(labels);
  if (!lab.ok()) return lab.status();
  if (img->dims.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        images, ": expected 3 dimensions (count, rows, cols), got ", img->dims.size()));
  }
  if (lab->dims.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(labels, ": expected 1 dimension, got ", lab->dims.size()));
  }
  if (img->dims[0] != lab->dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(images, " has ", img->dims[0], " images but ",
                                                   labels, " has ", lab->dims[0], " labels"));
  }
  int64_t n = img->dims[0];
  if (limit > 0 && limit < n) n = limit;
  Dataset d;
  d.example_shape = {img->dims[1], img->dims[2], 1};
  d.classes = 10;
  int64_t per = d.example_size();
  d.x.resize(static_cast<size_t>(n * per));
  d.y.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n * per; ++i) d.x[i] = img->data[i] * (1.0f / 255.0f);
  for (int64_t i = 0; i < n; ++i) {
    if (lab->data[i] >= d.classes) {
      return absl::InvalidArgumentError(
          absl::StrCat(labels, ": label ", int{lab->data[i]}, " at index ", i, " is not in 0..9"));
    }
    d.y[i] = lab->data[i];
  }
  return d;
}

}  // namespace

absl::StatusOr<DataSplit> LoadFashionMnist(const std::string& dir, int64_t train_limit,
                                           int64_t test_limit) {
  DataSplit s;
  absl::StatusOr<Dataset> train = LoadSplit(dir, "train", train_limit);
  if (!train.ok()) {
    if (absl::IsNotFound(train.status())) {
      return absl::NotFoundError(
          absl::StrCat(train.status().message(),
                       "; Fashion-MNIST comes in the Debian package dataset-fashion-mnist "
                       "(apt-get install dataset-fashion-mnist)"));
    }
    return train.status();
  }
  absl::StatusOr<Dataset> test = LoadSplit(dir, "t10k", test_limit);
  if (!test.ok()) return test.status();
  s.train = *std::move(train);
  s.test = *std::move(test);
  return s;
}

DataSplit MakeSynthetic(const SyntheticOptions& o) {
  Rng rng(o.seed);
  int64_t per = NumElements(o.shape);
  std::vector<float> centres(static_cast<size_t>(o.classes * per));
  for (float& c : centres) c = 2.0f * rng.NextUniform() - 1.0f;
  auto gaussian = [&rng]() {
    // Box-Muller; 1 - u keeps the log finite.
    float u1 = 1.0f - rng.NextUniform(), u2 = rng.NextUniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  };
  auto make = [&](int64_t n) {
    Dataset d;
    d.example_shape = o.shape;
    d.classes = o.classes;
    d.x.resize(static_cast<size_t>(n * per));
    d.y.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      int32_t label = static_cast<int32_t>(rng.NextBelow(static_cast<uint64_t>(o.classes)));
      d.y[i] = label;
      for (int64_t j = 0; j < per; ++j) {
        d.x[i * per + j] = centres[label * per + j] + o.noise * gaussian();
      }
    }
    return d;
  };
  DataSplit s;
  s.train = make(o.train_examples);
  s.test = make(o.test_examples);
  return s;
}

void Standardize(DataSplit& split) {
  double sum = 0, sq = 0;
  for (float v : split.train.x) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  double n = static_cast<double>(split.train.x.size());
  if (n == 0) return;
  double mean = sum / n;
  double var = sq / n - mean * mean;
  float inv = static_cast<float>(1.0 / std::sqrt(var > 1e-12 ? var : 1.0));
  float m = static_cast<float>(mean);
  for (Dataset* d : {&split.train, &split.test}) {
    for (float& v : d->x) v = (v - m) * inv;
  }
}

std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  Rng rng(HashCombine(seed, static_cast<uint64_t>(epoch)));
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(rng.NextBelow(static_cast<uint64_t>(i + 1)));
    std::swap(order[i], order[j]);
  }
  return order;
}

void GatherBatch(const Dataset& data, const std::vector<int64_t>& order, int64_t begin,
                 int64_t count, float* x, int32_t* y) {
  int64_t per = data.example_size();
  for (int64_t i = 0; i < count; ++i) {
    int64_t src = order[begin + i];
    std::memcpy(x + i * per, data.x.data() + src * per, sizeof(float) * per);
    std::memcpy(y + i * data.label_size, data.y.data() + src * data.label_size,
                sizeof(int32_t) * data.label_size);
  }
}

}  // namespace localpar
