// CIFAR-10 binary files and byte-level text corpora.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data/dataset.h"

namespace localpar {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxFileBytes = int64_t{1} << 30;  // refuse anything larger than 1 GiB

// Reads a whole file, refusing what cannot be a data file.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
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

// The corpus files a path names, in a stable order.
absl::Status CorpusFiles(const std::string& path, std::vector<std::string>* files) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    std::string hint = path == kDefaultTextCorpusDir
                           ? "; it comes in the Debian package fortunes (apt-get install fortunes)"
                           : "";
    return absl::NotFoundError(
        absl::StrCat("text corpus ", path, ": no such file or directory", hint));
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
  return s;
}

absl::StatusOr<DataSplit> LoadTextCorpus(const TextCorpusOptions& o, int64_t train_limit,
                                         int64_t test_limit) {
  if (o.paths.empty()) return absl::InvalidArgumentError("text corpus: no paths given");
  if (o.seq_len <= 0) return absl::InvalidArgumentError("text corpus: seq_len must be > 0");
  std::vector<std::string> files;
  for (const std::string& p : o.paths) {
    if (absl::Status st = CorpusFiles(p, &files); !st.ok()) return st;
  }
  std::string text;
  for (const std::string& f : files) {
    absl::StatusOr<std::string> data = ReadWholeFile(f);
    if (!data.ok()) return data.status();
    if (static_cast<int64_t>(text.size() + data->size()) > kMaxFileBytes) {
      return absl::InvalidArgumentError(absl::StrCat("text corpus: over 1 GiB at ", f));
    }
    text += *data;
  }
  std::string where = o.paths.size() == 1 ? o.paths[0] : absl::StrCat(o.paths.size(), " paths");
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("text corpus ", where, " is empty (", files.size(), " files, 0 bytes)"));
  }
  const int64_t t = o.seq_len, windows = (static_cast<int64_t>(text.size()) - 1) / t;
  const int64_t period = std::max<int64_t>(2, std::llround(1.0 / o.holdout_fraction));
  constexpr int64_t kBlock = 16;
  DataSplit s;
  s.normalization.tokens = true;
  for (Dataset* d : {&s.train, &s.test}) {
    d->example_shape = {t};
    d->classes = 256;
    d->label_size = t;
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  for (int64_t w = 0; w < windows; ++w) {
    bool held_out = (w / kBlock) % period == period - 1;
    Dataset& d = held_out ? s.test : s.train;
    int64_t limit = held_out ? test_limit : train_limit;
    if (limit > 0 && d.size() >= limit) continue;
    const uint8_t* at = bytes + w * t;
    for (int64_t i = 0; i < t; ++i) {
      d.x.push_back(static_cast<float>(at[i]));
      d.y.push_back(at[i + 1]);
    }
  }
  if (s.train.size() == 0 || s.test.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text corpus ", where, ": ", text.size(), " bytes make ", windows, " windows of seq_len ",
        t, ", too few for both a training and a held-out split (need at least ", kBlock * period,
        ")"));
  }
  return s;
}

double UnigramBitsPerLabel(const DataSplit& split) {
  int32_t classes = std::max(split.train.classes, 1);
  std::vector<double> count(static_cast<size_t>(classes), 1.0);  // add-one smoothing
  double total = classes;
  for (int32_t v : split.train.y) {
    if (v >= 0 && v < classes) {
      count[v] += 1.0;
      total += 1.0;
    }
  }
  double bits = 0;
  int64_t n = 0;
  for (int32_t v : split.test.y) {
    if (v < 0 || v >= classes) continue;
    bits -= std::log2(count[v] / total);
    ++n;
  }
  return n ? bits / static_cast<double>(n) : 0.0;
}

}  // namespace localpar
