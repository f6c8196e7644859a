// CIFAR-10 binary files, byte-level text corpora and token files.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data/dataset.h"
#include "common/io/regular_file.h"

namespace localpar {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxFileBytes = int64_t{1} << 30;  // refuse anything larger than 1 GiB

// Reads a whole file, refusing what cannot be a data file.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  if (absl::Status s = CheckRegularFile(path, "text corpus"); !s.ok()) return s;
  uintmax_t size = fs::file_size(path, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ec.message()));
  if (size > static_cast<uintmax_t>(kMaxFileBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", size, " bytes is over 1 GiB"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open"));
  std::string data(static_cast<size_t>(size), '\0');
  in.read(data.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) {
    return absl::DataLossError(absl::StrCat(path, ": short read (file changed while reading?)"));
  }
  return data;
}

// Appends the records of one CIFAR-10 file, at most `limit` in total (0: all).
absl::Status AppendCifarFile(const std::string& path, int64_t limit, Dataset* d) {
  constexpr int64_t kPixels = 32 * 32, kRecord = 1 + 3 * kPixels;
  absl::StatusOr<std::string> data = ReadWholeFile(path);
  if (!data.ok()) return data.status();
  int64_t bytes = static_cast<int64_t>(data->size());
  if (bytes == 0 || bytes % kRecord != 0) {
    return absl::DataLossError(absl::StrCat(path, ": ", bytes, " bytes is not a whole number of ",
                                            kRecord, "-byte records (truncated or not CIFAR-10)"));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(data->data());
  for (int64_t r = 0; r < bytes / kRecord; ++r) {
    if (limit > 0 && d->size() >= limit) break;
    const uint8_t* rec = p + r * kRecord;
    if (rec[0] > 9) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": record ", r, " has label ", int{rec[0]}, ", not in 0..9"));
    }
    d->y.push_back(rec[0]);
    // Planar RGB -> interleaved NHWC.
    for (int64_t i = 0; i < kPixels; ++i) {
      for (int c = 0; c < 3; ++c) d->x.push_back(rec[1 + c * kPixels + i] * (1.0f / 255.0f));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string MissingCorpusHint(const std::string& path) {
  if (path == kDefaultTextCorpusDir) {
    return "; it comes in the Debian package fortunes (apt-get install fortunes)";
  }
  if (path.ends_with("tinyshakespeare.txt")) {
    return "; tiny Shakespeare is karpathy/char-rnn's data/tinyshakespeare/input.txt "
           "(1,115,394 bytes): point --data_path at your copy";
  }
  return "; point --data_path at the files";
}

namespace {

// The corpus files a path names, in a stable order.
absl::Status CorpusFiles(const std::string& path, std::vector<std::string>* files) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    return absl::NotFoundError(
        absl::StrCat("text corpus ", path, ": no such file or directory", MissingCorpusHint(path)));
  }
  if (!fs::is_directory(st)) {
    files->push_back(path);
    return absl::OkStatus();
  }
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (e.is_symlink() || !e.is_regular_file()) continue;
    std::string name = e.path().filename().string();
    if (name.ends_with(".dat") || name.starts_with(".")) continue;
    found.push_back(e.path().string());
  }
  if (ec) return absl::InvalidArgumentError(absl::StrCat("text corpus ", path, ": ", ec.message()));
  std::sort(found.begin(), found.end());
  files->insert(files->end(), found.begin(), found.end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DataSplit> LoadCifar10(const std::string& dir, int64_t train_limit,
                                      int64_t test_limit) {
  DataSplit s;
  s.normalization.scale = 1.0f / 255.0f;
  for (Dataset* d : {&s.train, &s.test}) {
    d->example_shape = {32, 32, 3};
    d->classes = 10;
  }
  for (int i = 1; i <= 5; ++i) {
    absl::Status st =
        AppendCifarFile(absl::StrCat(dir, "/data_batch_", i, ".bin"), train_limit, &s.train);
    if (!st.ok()) return st;
  }
  absl::Status st = AppendCifarFile(absl::StrCat(dir, "/test_batch.bin"), test_limit, &s.test);
  if (!st.ok()) return st;
  s.class_names = {"airplane", "automobile", "bird",  "cat",  "deer",
                   "dog",      "frog",       "horse", "ship", "truck"};
  return s;
}

namespace {

constexpr int64_t kInterleaveBlock = 16;

// Both splits of a sequence source: labels per position, the vocabulary, token ids.
DataSplit SequenceSplit(int64_t seq_len, int32_t vocab) {
  DataSplit s;
  s.normalization.tokens = true;
  for (Dataset* d : {&s.train, &s.test}) {
    d->example_shape = {seq_len};
    d->classes = vocab;
    d->label_size = seq_len;
  }
  return s;
}

void Limit(Dataset* d, int64_t limit) {
  if (limit > 0 && d->windows->count > limit) d->windows->count = limit;
}

// Training windows over [begin, end) of `corpus`: random ones (`count` an epoch) or
// consecutive ones.
TokenWindows TrainWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t seq_len, int64_t begin,
                          int64_t end, bool random, int64_t count, uint64_t seed) {
  if (!random) return StridedWindows(std::move(corpus), seq_len, begin, end);
  return RandomWindows(std::move(corpus), seq_len, begin, end, count, seed);
}

}  // namespace

absl::StatusOr<DataSplit> LoadTextCorpus(const TextCorpusOptions& o, int64_t train_limit,
                                         int64_t test_limit) {
  if (o.paths.empty()) return absl::InvalidArgumentError("text corpus: no paths given");
  if (o.seq_len <= 0) return absl::InvalidArgumentError("text corpus: seq_len must be > 0");
  std::vector<std::string> files, validation;
  for (const std::string& p : o.paths) {
    if (absl::Status st = CorpusFiles(p, &files); !st.ok()) return st;
  }
  for (const std::string& p : o.validation_paths) {
    if (absl::Status st = CorpusFiles(p, &validation); !st.ok()) return st;
  }
  const std::string where =
      o.paths.size() == 1 ? o.paths[0] : absl::StrCat(o.paths.size(), " paths");
  if (files.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("text corpus ", where, " is empty (no files)"));
  }
  absl::StatusOr<std::shared_ptr<TokenCorpus>> text =
      TokenCorpus::Map(files, TokenFileFormat::kBytes);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("text corpus ", text.status().message()));
  }
  const int64_t t = o.seq_len, n = (*text)->size();
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("text corpus ", where, " is empty (", files.size(), " files, 0 bytes)"));
  }
  DataSplit s = SequenceSplit(t, 256);
  if (!validation.empty()) {
    absl::StatusOr<std::shared_ptr<TokenCorpus>> held =
        TokenCorpus::Map(validation, TokenFileFormat::kBytes);
    if (!held.ok()) {
      return absl::Status(held.status().code(),
                          absl::StrCat("text corpus validation ", held.status().message()));
    }
    s.train.windows = TrainWindows(*text, t, 0, n, o.random_windows, (n - 1) / t, o.seed);
    s.test.windows = StridedWindows(*held, t, 0, (*held)->size());
  } else if (o.interleaved) {
    const int64_t period = std::max<int64_t>(2, std::llround(1.0 / o.holdout_fraction));
    s.train.windows = InterleavedWindows(*text, t, period, /*held_out=*/false);
    s.test.windows = InterleavedWindows(*text, t, period, /*held_out=*/true);
    if (s.train.size() == 0 || s.test.size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "text corpus ", where, ": ", n, " bytes make ", (n - 1) / t, " windows of seq_len ", t,
          ", too few for both a training and a held-out split (need at least ",
          kInterleaveBlock * period, ")"));
    }
  } else {
    // The tail: the last holdout_fraction of the text, after everything trained on.
    const int64_t cut =
        n - static_cast<int64_t>(std::llround(o.holdout_fraction * static_cast<double>(n)));
    s.train.windows = TrainWindows(*text, t, 0, cut, o.random_windows, (cut - 1) / t, o.seed);
    s.test.windows = StridedWindows(*text, t, cut, n);
  }
  if (s.train.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("text corpus ", where, ": ", n,
                                                   " bytes leave no training window of seq_len ", t,
                                                   " (it needs ", t + 1, " bytes)"));
  }
  if (s.test.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text corpus ", where, ": the held-out text is shorter than one window of seq_len ", t,
        " (", t + 1, " bytes); lower seq_len, raise holdout_fraction, or give validation_paths"));
  }
  Limit(&s.train, train_limit);
  Limit(&s.test, test_limit);
  return s;
}

absl::StatusOr<DataSplit> LoadTokenData(const TokenDataOptions& o, int64_t train_limit,
                                        int64_t test_limit) {
  if (o.train_paths.empty()) return absl::InvalidArgumentError("data.tokens.train_paths: empty");
  if (o.seq_len <= 0) return absl::InvalidArgumentError("data.tokens.seq_len: must be > 0");
  absl::StatusOr<std::shared_ptr<TokenCorpus>> train = TokenCorpus::Map(o.train_paths, o.format);
  if (!train.ok()) return train.status();
  std::shared_ptr<TokenCorpus> held;
  if (!o.validation_paths.empty()) {
    absl::StatusOr<std::shared_ptr<TokenCorpus>> v = TokenCorpus::Map(o.validation_paths, o.format);
    if (!v.ok()) return v.status();
    held = *v;
  }
  const int64_t t = o.seq_len, n = (*train)->size();
  const int64_t cut =
      held ? n
           : n - static_cast<int64_t>(std::llround(o.holdout_fraction * static_cast<double>(n)));
  if (cut < t + 1) {
    return absl::InvalidArgumentError(absl::StrCat((*train)->Where(0), ": the training tokens (",
                                                   cut, ") are fewer than one window of seq_len ",
                                                   t, " needs (", t + 1, ")"));
  }
  int64_t vocab = o.vocab;
  if (vocab <= 0) {
    vocab = int64_t{(*train)->MaxId(0, n)} + 1;
    if (held) vocab = std::max<int64_t>(vocab, int64_t{held->MaxId(0, held->size())} + 1);
  } else {
    for (const std::shared_ptr<TokenCorpus>& c : {*train, held}) {
      if (!c) continue;
      std::string bad = c->FirstIdOutside(0, c->size(), vocab);
      if (!bad.empty()) return absl::InvalidArgumentError(bad);
    }
  }
  DataSplit s = SequenceSplit(t, static_cast<int32_t>(vocab));
  const int64_t per_epoch = (o.tokens_per_epoch > 0 ? o.tokens_per_epoch : cut) / t;
  s.train.windows =
      TrainWindows(*train, t, 0, cut, o.random_windows, std::max<int64_t>(1, per_epoch), o.seed);
  s.test.windows =
      held ? StridedWindows(held, t, 0, held->size()) : StridedWindows(*train, t, cut, n);
  if (s.test.size() == 0) {
    return absl::InvalidArgumentError(
        held ? absl::StrCat(held->Where(0), ": the validation tokens (", held->size(),
                            ") are fewer than one window of seq_len ", t, " needs (", t + 1, ")")
             : absl::StrCat("data.tokens: the held-out tail (", n - cut,
                            " tokens) is shorter "
                            "than one window of seq_len ",
                            t, "; give validation_paths"));
  }
  Limit(&s.train, train_limit);
  Limit(&s.test, test_limit);
  return s;
}

double UnigramBitsPerLabel(const DataSplit& split) {
  constexpr int64_t kMaxLabels = int64_t{1} << 24;
  // The labels of a split: its y, or its windows' (the first 2^24).
  auto labels = [&](const Dataset& d) {
    if (!d.windows) return d.y;
    std::vector<int32_t> y;
    const int64_t per = d.label_size;
    const int64_t rows = std::min(d.size(), std::max<int64_t>(1, kMaxLabels / per));
    y.resize(static_cast<size_t>(rows * per));
    for (int64_t r = 0; r < rows; ++r) {
      // A file that changed under us: the figure uses what was read; the run's own reads
      // report it.
      if (!d.windows->corpus->Window(d.windows->Start(0, r), per, nullptr, y.data() + r * per)
               .ok()) {
        y.resize(static_cast<size_t>(r * per));
        break;
      }
    }
    return y;
  };
  int32_t classes = std::max(split.train.classes, 1);
  std::vector<double> count(static_cast<size_t>(classes), 1.0);  // add-one smoothing
  double total = classes;
  for (int32_t v : labels(split.train)) {
    if (v >= 0 && v < classes) {
      count[v] += 1.0;
      total += 1.0;
    }
  }
  double bits = 0;
  int64_t n = 0;
  for (int32_t v : labels(split.test)) {
    if (v < 0 || v >= classes) continue;
    bits -= std::log2(count[v] / total);
    ++n;
  }
  return n ? bits / static_cast<double>(n) : 0.0;
}

}  // namespace localpar
