// In-memory labelled data sets, epoch shuffling and batch assembly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/core/dtype.h"
#include "common/core/shape.h"
#include "common/data/tokens.h"

namespace localpar {

inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
inline constexpr char kDefaultTextCorpusDir[] = "/usr/share/games/fortunes";

struct Dataset {
  Shape example_shape;  // e.g. [28, 28, 1] (NHWC without the batch), or [seq_len] token ids
  int32_t classes = 0;
  int64_t label_size = 1;  // labels per example: 1, or one per position for language models
  std::vector<float> x;    // size() * NumElements(example_shape)
  std::vector<int32_t> y;  // size() * label_size
  // Token sequences: windows read from a mapped corpus as batches are gathered, instead of
  // x and y (which stay empty).
  std::optional<TokenWindows> windows;
  int64_t size() const {
    return windows ? windows->count : static_cast<int64_t>(y.size()) / label_size;
  }
  int64_t example_size() const { return NumElements(example_shape); }
  // What a batch's inputs hold: float32 values, or int32 token ids for token windows.
  DType input_dtype() const { return windows ? DType::kI32 : DType::kF32; }
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
  std::vector<std::string> class_names;  // label i is class_names[i]; empty when unknown
  std::vector<std::string> warnings;     // what the reader skipped, for the user to see
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
  std::vector<std::string> paths;             // files or directories
  std::vector<std::string> validation_paths;  // scored instead of a held-out share
  int64_t seq_len = 64;
  float holdout_fraction = 0.1f;
  // The held-out share: the tail of the text (default), or every round(1 / fraction)-th
  // block of 16 windows interleaved with the training text.
  bool interleaved = false;
  // Training windows at seeded random offsets (nanoGPT's sampling), instead of the text cut
  // into consecutive windows.
  bool random_windows = false;
  uint64_t seed = 0;
};
// What to say after "no such file" for a corpus path: where the file comes from (the
// fortunes package, karpathy/char-rnn's tiny Shakespeare) or the flag that points elsewhere.
std::string MissingCorpusHint(const std::string& path);

// A byte-level corpus (every byte a token, vocabulary 256), memory-mapped: an example is a
// window of seq_len bytes (as float ids), its labels the byte after each position. A missing
// path or an empty corpus is an error naming it; so is a split too short for one window.
absl::StatusOr<DataSplit> LoadTextCorpus(const TextCorpusOptions& options, int64_t train_limit = 0,
                                         int64_t test_limit = 0);

struct TokenDataOptions {
  std::vector<std::string> train_paths, validation_paths;
  TokenFileFormat format = TokenFileFormat::kAuto;
  int64_t seq_len = 64;
  int64_t vocab = 0;              // 0: the largest id in the files + 1
  int64_t tokens_per_epoch = 0;   // 0: the training files' token count
  float holdout_fraction = 0.1f;  // the tail held out, without validation_paths
  bool random_windows = true;
  uint64_t seed = 0;
};
// Token files (tokens.h), memory-mapped. Errors name the file and the offset: a bad header,
// a token at or above `vocab`, a file or split shorter than one window, an empty
// validation set.
absl::StatusOr<DataSplit> LoadTokenData(const TokenDataOptions& options, int64_t train_limit = 0,
                                        int64_t test_limit = 0);

// Cross-entropy, in bits per label, of the held-out labels under the training labels'
// unigram distribution (add-one smoothed): the score of a model that ignores context. Over
// the first 2^24 labels of each split.
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
// label_size labels per example); an empty `order` means examples begin.. in order. x holds
// data.input_dtype() elements: floats, or a sequence source's token ids. `epoch` picks a
// sequence source's random windows. Errors only from a sequence source whose file changed
// under it (TokenCorpus::Window).
absl::Status GatherBatch(const Dataset& data, const std::vector<int64_t>& order, int64_t begin,
                         int64_t count, void* x, int32_t* y, int64_t epoch = 0);

}  // namespace localpar
