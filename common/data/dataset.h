// In-memory labelled data sets, epoch shuffling and batch assembly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/core/shape.h"

namespace localpar {

inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
inline constexpr char kDefaultTextCorpusDir[] = "/usr/share/games/fortunes";

struct Dataset {
  Shape example_shape;  // e.g. [28, 28, 1] (NHWC without the batch), or [seq_len] token ids
  int32_t classes = 0;
  int64_t label_size = 1;  // labels per example: 1, or one per position for language models
  std::vector<float> x;    // size() * NumElements(example_shape)
  std::vector<int32_t> y;  // size() * label_size
  int64_t size() const { return static_cast<int64_t>(y.size()) / label_size; }
  int64_t example_size() const { return NumElements(example_shape); }
};

// How raw values became the examples in x: x = (raw * scale - mean) * inv_std, in float32,
// one operation at a time (so predict and export can repeat it bit for bit).
struct InputNormalization {
  float scale = 1.0f;  // 1/255 for pixel bytes
  float mean = 0.0f;
  float inv_std = 1.0f;
  bool tokens = false;  // token ids: never transformed
};

struct DataSplit {
  Dataset train, test;
  InputNormalization normalization;
};

// Reads the four IDX files of the Fashion-MNIST layout from `dir` (train- and t10k-,
// images-idx3-ubyte and labels-idx1-ubyte, each gzipped or plain), pixels scaled to [0, 1]:
// any image size, [count, rows, cols] or [count, rows, cols, channels]. The class count is
// the largest label in either split plus one. Checks that image and label counts agree and
// that both splits have the same example shape, naming the file. `limit` > 0 keeps the first
// examples of each split.
absl::StatusOr<DataSplit> LoadFashionMnist(const std::string& dir, int64_t train_limit = 0,
                                           int64_t test_limit = 0);

struct IdxDataShape {
  Shape example_shape;
  int32_t classes = 0;
};
// What LoadFashionMnist would give as example shape and class count, reading only the
// training images' header and the labels.
absl::StatusOr<IdxDataShape> ReadFashionMnistShape(const std::string& dir);

// Reads the CIFAR-10 binary files in `dir` (data_batch_1..5.bin, test_batch.bin) into NHWC
// [32, 32, 3] images scaled to [0, 1]. Errors name the file: missing, truncated (not a whole
// number of 3073-byte records) or a label outside 0..9.
absl::StatusOr<DataSplit> LoadCifar10(const std::string& dir, int64_t train_limit = 0,
                                      int64_t test_limit = 0);

struct TextCorpusOptions {
  std::vector<std::string> paths;  // files or directories
  int64_t seq_len = 64;
  float holdout_fraction = 0.1f;
};
// A byte-level corpus cut into seq_len windows: x holds the window's bytes (as float ids),
// y the byte after each position. Windows go to the held-out split in whole blocks of 16, one
// block in every round(1 / holdout_fraction). A missing path or an empty corpus is an error
// naming it.
absl::StatusOr<DataSplit> LoadTextCorpus(const TextCorpusOptions& options, int64_t train_limit = 0,
                                         int64_t test_limit = 0);

// Cross-entropy, in bits per label, of the held-out labels under the training labels'
// unigram distribution (add-one smoothed): the score of a model that ignores context.
double UnigramBitsPerLabel(const DataSplit& split);

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

// Standardises both splits with the training split's mean and standard deviation, and
// records them in split.normalization.
void Standardize(DataSplit& split);

// Applies `norm` to raw values in place (what loading and Standardize did to the data).
void ApplyNormalization(const InputNormalization& norm, float* values, int64_t count);

// The order of examples in an epoch: a Fisher-Yates shuffle driven by (seed, epoch).
std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch);

// Copies examples order[begin, begin+count) into contiguous x and y buffers (y receives
// label_size labels per example).
void GatherBatch(const Dataset& data, const std::vector<int64_t>& order, int64_t begin,
                 int64_t count, float* x, int32_t* y);

}  // namespace localpar
