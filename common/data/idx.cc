// IDX reading through zlib, which reads gzip and plain files alike.
#include "common/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/regular_file.h"

namespace localpar {
namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

// Reads exactly n bytes; returns how many were read (fewer means end of file) or -1.
int64_t ReadFully(gzFile f, uint8_t* dst, int64_t n) {
  int64_t got = 0;
  while (got < n) {
    unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - got, 1 << 30));
    int r = gzread(f, dst + got, chunk);
    if (r < 0) return -1;
    if (r == 0) break;
    got += r;
  }
  return got;
}

// Upper bound on a plausible data set (4 GiB) so a corrupt header cannot make us
// allocate without limit.
constexpr int64_t kMaxBytes = int64_t{4} << 30;

// Reads and checks the magic number and the dimensions; leaves `f` at the first element.
absl::StatusOr<std::vector<int64_t>> ReadHeader(gzFile f, const std::string& path, int64_t* total) {
  uint8_t header[4];
  int64_t got = ReadFully(f, header, 4);
  if (got < 0) return absl::DataLossError(absl::StrCat(path, ": corrupt gzip stream"));
  if (got < 4) return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  if (header[0] != 0 || header[1] != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: bad magic number 0x%02x%02x%02x%02x (not an IDX file)", path,
                        header[0], header[1], header[2], header[3]));
  }
  if (header[2] != 0x08) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: element type 0x%02x is not supported (only unsigned byte, 0x08)", path, header[2]));
  }
  int rank = header[3];
  if (rank < 1 || rank > 4) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": rank ", rank, " out of range 1..4"));
  }
  std::vector<int64_t> dims;
  *total = 1;
  for (int i = 0; i < rank; ++i) {
    uint8_t d[4];
    if (ReadFully(f, d, 4) != 4) {
      return absl::DataLossError(absl::StrCat(path, ": truncated header (dimension ", i, ")"));
    }
    int64_t dim = (int64_t{d[0]} << 24) | (d[1] << 16) | (d[2] << 8) | d[3];
    if (dim <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": dimension ", i, " is ", dim));
    }
    // Compare before multiplying: two 32-bit extents can overflow 64 bits.
    if (dim > kMaxBytes / *total) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": header claims more than ", kMaxBytes, " bytes"));
    }
    *total *= dim;
    dims.push_back(dim);
  }
  return dims;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ReadIdxDims(const std::string& path) {
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  GzHandle f(gzopen(path.c_str(), "rb"));
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  int64_t total = 0;
  return ReadHeader(f.get(), path, &total);
}

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  GzHandle f(gzopen(path.c_str(), "rb"));
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  int64_t total = 0;
  absl::StatusOr<std::vector<int64_t>> dims = ReadHeader(f.get(), path, &total);
  if (!dims.ok()) return dims.status();
  IdxArray out;
  out.dims = *std::move(dims);
  int64_t got = 0;
  // Grow the buffer as data actually arrives (a header alone cannot make us allocate
  // gigabytes), in chunks of at most 16 MiB.
  constexpr int64_t kChunk = int64_t{16} << 20;
  while (got < total) {
    int64_t want = std::min(kChunk, total - got);
    out.data.resize(static_cast<size_t>(got + want));
    int64_t n = ReadFully(f.get(), out.data.data() + got, want);
    if (n < 0) return absl::DataLossError(absl::StrCat(path, ": corrupt gzip stream"));
    got += n;
    if (n < want) break;
  }
  out.data.resize(static_cast<size_t>(got));
  if (got != total) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: header promises ", total, " bytes, file has ", got));
  }
  uint8_t extra;
  if (ReadFully(f.get(), &extra, 1) != 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": unexpected bytes after the ", total, " the header describes"));
  }
  return out;
}

}  // namespace localpar
