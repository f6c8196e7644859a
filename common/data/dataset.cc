// Data set loading, synthetic data, standardisation, shuffling and batching.
#include "common/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/rng.h"
#include "common/data/idx.h"

namespace localpar {
namespace {

// `dir/prefix-kind` gzipped (.gz) or plain, whichever exists; the .gz is tried first.
absl::StatusOr<std::string> FindIdxFile(const std::string& dir, const std::string& prefix,
                                        const std::string& kind) {
  const std::string plain = absl::StrCat(dir, "/", prefix, "-", kind);
  for (const std::string& path : {plain + ".gz", plain}) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec)) return path;
  }
  return absl::NotFoundError(absl::StrCat(plain, ".gz (or ", plain, "): no such file"));
}

// [rows, cols, 1] for a [count, rows, cols] file, [rows, cols, channels] for a 4-D one.
absl::StatusOr<Shape> ExampleShape(const std::vector<int64_t>& dims, const std::string& path) {
  if (dims.size() == 3) return Shape{dims[1], dims[2], 1};
  if (dims.size() == 4) return Shape{dims[1], dims[2], dims[3]};
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": expected 3 dimensions (count, rows, cols) or 4 (count, rows, cols, channels), got ",
      dims.size()));
}

struct IdxSplit {
  IdxArray images, labels;
  std::string images_path, labels_path;
  int32_t max_label = -1;
};

absl::StatusOr<IdxSplit> ReadSplit(const std::string& dir, const std::string& prefix) {
  IdxSplit s;
  absl::StatusOr<std::string> images = FindIdxFile(dir, prefix, "images-idx3-ubyte");
  if (!images.ok()) return images.status();
  absl::StatusOr<std::string> labels = FindIdxFile(dir, prefix, "labels-idx1-ubyte");
  if (!labels.ok()) return labels.status();
  s.images_path = *images;
  s.labels_path = *labels;
  absl::StatusOr<IdxArray> img = ReadIdxFile(*images);
  if (!img.ok()) return img.status();
  absl::StatusOr<IdxArray> lab = ReadIdxFile(*labels);
  if (!lab.ok()) return lab.status();
  if (absl::StatusOr<Shape> shape = ExampleShape(img->dims, *images); !shape.ok()) {
    return shape.status();
  }
  if (lab->dims.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(*labels, ": expected 1 dimension, got ", lab->dims.size()));
  }
  if (img->dims[0] != lab->dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(*images, " has ", img->dims[0], " images but ",
                                                   *labels, " has ", lab->dims[0], " labels"));
  }
  for (uint8_t l : lab->data) s.max_label = std::max<int32_t>(s.max_label, l);
  s.images = *std::move(img);
  s.labels = *std::move(lab);
  return s;
}

Dataset ToDataset(const IdxSplit& s, int32_t classes, int64_t limit) {
  Dataset d;
  d.example_shape = *ExampleShape(s.images.dims, s.images_path);
  d.classes = classes;
  int64_t n = s.images.dims[0];
  if (limit > 0 && limit < n) n = limit;
  int64_t per = d.example_size();
  d.x.resize(static_cast<size_t>(n * per));
  d.y.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n * per; ++i) d.x[i] = s.images.data[i] * (1.0f / 255.0f);
  for (int64_t i = 0; i < n; ++i) d.y[i] = s.labels.data[i];
  return d;
}

absl::Status WithInstallHint(const absl::Status& s, const std::string& dir) {
  if (!absl::IsNotFound(s) || dir != kDefaultFashionMnistDir) return s;
  return absl::NotFoundError(absl::StrCat(s.message(),
                                          "; Fashion-MNIST comes in the Debian package "
                                          "dataset-fashion-mnist (apt-get install "
                                          "dataset-fashion-mnist)"));
}

}  // namespace

absl::StatusOr<DataSplit> LoadFashionMnist(const std::string& dir, int64_t train_limit,
                                           int64_t test_limit) {
  absl::StatusOr<IdxSplit> train = ReadSplit(dir, "train");
  if (!train.ok()) return WithInstallHint(train.status(), dir);
  absl::StatusOr<IdxSplit> test = ReadSplit(dir, "t10k");
  if (!test.ok()) return WithInstallHint(test.status(), dir);
  if (train->images.dims.size() != test->images.dims.size() ||
      !std::equal(train->images.dims.begin() + 1, train->images.dims.end(),
                  test->images.dims.begin() + 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        test->images_path, ": examples of shape [",
        absl::StrJoin(test->images.dims.begin() + 1, test->images.dims.end(), ","), "], but ",
        train->images_path, " has [",
        absl::StrJoin(train->images.dims.begin() + 1, train->images.dims.end(), ","), "]"));
  }
  // The class count is the largest label in either split, plus one.
  const int32_t classes = std::max(train->max_label, test->max_label) + 1;
  if (classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(train->labels_path, " and ", test->labels_path,
                     ": every label is 0; a classifier needs at least 2 classes"));
  }
  DataSplit s;
  s.normalization.scale = 1.0f / 255.0f;
  s.train = ToDataset(*train, classes, train_limit);
  s.test = ToDataset(*test, classes, test_limit);
  return s;
}

absl::StatusOr<IdxDataShape> ReadFashionMnistShape(const std::string& dir) {
  IdxDataShape out;
  absl::StatusOr<std::string> images = FindIdxFile(dir, "train", "images-idx3-ubyte");
  if (!images.ok()) return WithInstallHint(images.status(), dir);
  absl::StatusOr<std::vector<int64_t>> dims = ReadIdxDims(*images);
  if (!dims.ok()) return dims.status();
  absl::StatusOr<Shape> shape = ExampleShape(*dims, *images);
  if (!shape.ok()) return shape.status();
  out.example_shape = *shape;
  int32_t max_label = -1;
  for (const char* prefix : {"train", "t10k"}) {
    absl::StatusOr<std::string> labels = FindIdxFile(dir, prefix, "labels-idx1-ubyte");
    if (!labels.ok()) return WithInstallHint(labels.status(), dir);
    absl::StatusOr<IdxArray> lab = ReadIdxFile(*labels);
    if (!lab.ok()) return lab.status();
    for (uint8_t l : lab->data) max_label = std::max<int32_t>(max_label, l);
  }
  out.classes = max_label + 1;
  return out;
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
  split.normalization.mean = m;
  split.normalization.inv_std = inv;
}

void ApplyNormalization(const InputNormalization& norm, float* values, int64_t count) {
  if (norm.tokens) return;
  for (int64_t i = 0; i < count; ++i)
    values[i] = (values[i] * norm.scale - norm.mean) * norm.inv_std;
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

absl::Status GatherBatch(const Dataset& data, const std::vector<int64_t>& order, int64_t begin,
                         int64_t count, void* x, int32_t* y, int64_t epoch) {
  const int64_t per = data.example_size();
  for (int64_t i = 0; i < count; ++i) {
    int64_t src = order.empty() ? begin + i : order[begin + i];
    if (data.windows) {
      const TokenWindows& w = *data.windows;
      absl::Status s =
          w.corpus->Window(w.Start(epoch, src), w.seq_len, static_cast<int32_t*>(x) + i * per,
                           y + i * data.label_size);
      if (!s.ok()) return s;
      continue;
    }
    std::memcpy(static_cast<float*>(x) + i * per, data.x.data() + src * per, sizeof(float) * per);
    std::memcpy(y + i * data.label_size, data.y.data() + src * data.label_size,
                sizeof(int32_t) * data.label_size);
  }
  return absl::OkStatus();
}

}  // namespace localpar
