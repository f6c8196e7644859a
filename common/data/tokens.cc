// Token corpora, memory-mapped, and their windows.
#include "common/data/tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/core/rng.h"

namespace localpar {
namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;
// Scans read this many tokens at a time, releasing each chunk's pages after it.
constexpr int64_t kScanTokens = int64_t{1} << 22;

int64_t PageSize() {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  return page;
}

}  // namespace

TokenCorpus::~TokenCorpus() {
  for (const Piece& p : pieces_) {
    if (p.map) munmap(const_cast<uint8_t*>(p.map), p.map_bytes);
    if (p.fd >= 0) close(p.fd);
  }
}

absl::StatusOr<std::shared_ptr<TokenCorpus>> TokenCorpus::Map(const std::vector<std::string>& files,
                                                              TokenFileFormat format) {
  std::shared_ptr<TokenCorpus> c(new TokenCorpus());
  c->width_ = format == TokenFileFormat::kBytes ? 1 : 2;
  for (const std::string& path : files) {
    // O_NONBLOCK: opening a FIFO would otherwise wait for a writer (it is refused below).
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      return errno == ENOENT ? absl::NotFoundError(absl::StrCat(path, ": no such file"))
                             : absl::PermissionDeniedError(
                                   absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
    }
    struct stat st = {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
    }
    Piece p;
    p.path = path;
    p.map_bytes = static_cast<size_t>(st.st_size);
    if (p.map_bytes == 0) {
      close(fd);
      if (format == TokenFileFormat::kBytes) continue;  // an empty text file adds nothing
      return absl::InvalidArgumentError(absl::StrCat(path, ": empty file (0 tokens)"));
    }
    void* m = mmap(nullptr, p.map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": cannot map ", p.map_bytes, " bytes: ", std::strerror(errno)));
    }
    madvise(m, p.map_bytes, MADV_RANDOM);  // windows are read at random: no read-ahead
    madvise(m, p.map_bytes, MADV_NOHUGEPAGE);
    p.map = static_cast<const uint8_t*>(m);
    p.fd = fd;
    c->pieces_.push_back(p);  // unmapped and closed by the destructor from here on
    Piece& piece = c->pieces_.back();
    const int64_t bytes = static_cast<int64_t>(piece.map_bytes);
    int32_t header[3] = {0, 0, 0};
    if (bytes >= 12) std::memcpy(header, piece.map, sizeof(header));
    const bool llmc = format == TokenFileFormat::kLlmcU16 ||
                      (format == TokenFileFormat::kAuto && bytes >= 12 && header[0] == kLlmcMagic);
    if (llmc) {
      if (bytes < kLlmcHeaderBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": ", bytes, " bytes, shorter than llm.c's ", kLlmcHeaderBytes, "-byte header"));
      }
      if (header[0] != kLlmcMagic) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": byte offset 0: magic ", header[0], ", not llm.c's ", kLlmcMagic));
      }
      if (header[1] != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": byte offset 4: version ", header[1], ", not 1 (uint16 tokens)"));
      }
      const int64_t want = kLlmcHeaderBytes + int64_t{header[2]} * 2;
      if (header[2] <= 0 || want != bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": byte offset 8: the header says ", header[2], " tokens (", want,
                         " bytes with the header), the file has ", bytes, " bytes"));
      }
      piece.header_bytes = kLlmcHeaderBytes;
      piece.count = header[2];
    } else if (c->width_ == 2) {
      if (bytes % 2 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": ", bytes, " bytes is not a whole number of uint16 tokens (byte offset ",
            bytes - 1, " is half a token)"));
      }
      piece.count = bytes / 2;
    } else {
      piece.count = bytes;
    }
    piece.first = c->size_;
    c->size_ += piece.count;
    madvise(const_cast<uint8_t*>(piece.map), piece.map_bytes, MADV_DONTNEED);
  }
  return c;
}

template <typename F>
void TokenCorpus::ForRange(int64_t begin, int64_t end, F f) const {
  auto it = std::upper_bound(pieces_.begin(), pieces_.end(), begin,
                             [](int64_t i, const Piece& p) { return i < p.first; });
  for (--it; begin < end && it != pieces_.end(); ++it) {
    const int64_t from = begin - it->first;
    const int64_t n = std::min(end, it->first + it->count) - begin;
    f(*it, from, n);
    begin += n;
  }
}

// Drops the pages around [at, at + bytes) from this process's resident memory. The range is
// widened to 2 MiB boundaries: a fault maps the pages around the one touched too (the
// kernel's fault-around, and a huge page where the file has one), which a range of just the
// bytes read would leave behind, a few dozen KiB a window.
void TokenCorpus::Release(const Piece& p, const void* at, size_t bytes) const {
  const uintptr_t page = static_cast<uintptr_t>(std::max<int64_t>(PageSize(), 2 << 20));
  uintptr_t from =
      std::max(reinterpret_cast<uintptr_t>(at) & ~(page - 1), reinterpret_cast<uintptr_t>(p.map));
  uintptr_t to = reinterpret_cast<uintptr_t>(at) + bytes;
  const uintptr_t map_end = reinterpret_cast<uintptr_t>(p.map) + p.map_bytes;
  to = std::min(map_end, (to + page - 1) & ~(page - 1));
  if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
}

absl::Status TokenCorpus::Intact(const Piece& p) const {
  struct stat st = {};
  if (fstat(p.fd, &st) != 0) {
    return absl::DataLossError(
        absl::StrCat(p.path, ": cannot check its size while reading it: ", std::strerror(errno)));
  }
  if (static_cast<uint64_t>(st.st_size) < p.map_bytes) {
    return absl::DataLossError(absl::StrCat(
        p.path, ": shrank from ", p.map_bytes, " to ", st.st_size,
        " bytes while the run read it (truncated?); a token file must not change during a run"));
  }
  return absl::OkStatus();
}

absl::Status TokenCorpus::Window(int64_t begin, int64_t n, int32_t* x, int32_t* y) const {
  int64_t out = 0;
  const int width = width_;
  absl::Status status;
  // One pass over [begin, begin + n + 1): token k goes to x[k] and y[k - 1].
  ForRange(begin, begin + n + 1, [&](const Piece& p, int64_t from, int64_t count) {
    if (!status.ok() || !(status = Intact(p)).ok()) return;
    const uint8_t* at = p.map + p.header_bytes + from * width;
    for (int64_t i = 0; i < count; ++i, ++out) {
      int32_t id;
      if (width == 1) {
        id = at[i];
      } else {
        uint16_t v;
        std::memcpy(&v, at + 2 * i, 2);
        id = v;
      }
      if (x && out < n) x[out] = id;
      if (y && out > 0) y[out - 1] = id;
    }
    Release(p, at, static_cast<size_t>(count * width));
  });
  return status;
}

template <typename F>
void TokenCorpus::Scan(int64_t begin, int64_t end, F f) const {
  bool go = true;
  ForRange(begin, end, [&](const Piece& p, int64_t from, int64_t count) {
    for (int64_t at = 0; at < count && go; at += kScanTokens) {
      const int64_t n = std::min(kScanTokens, count - at);
      const uint8_t* b = p.map + p.header_bytes + (from + at) * width_;
      for (int64_t i = 0; i < n && go; ++i) {
        int32_t id;
        if (width_ == 1) {
          id = b[i];
        } else {
          uint16_t v;
          std::memcpy(&v, b + 2 * i, 2);
          id = v;
        }
        go = f(id, p, p.header_bytes + (from + at + i) * width_);
      }
      Release(p, b, static_cast<size_t>(n * width_));
    }
  });
}

int32_t TokenCorpus::MaxId(int64_t begin, int64_t end) const {
  int32_t best = 0;
  Scan(begin, end, [&](int32_t id, const Piece&, int64_t) {
    best = std::max(best, id);
    return true;
  });
  return best;
}

std::string TokenCorpus::FirstIdOutside(int64_t begin, int64_t end, int64_t vocab) const {
  std::string found;
  Scan(begin, end, [&](int32_t id, const Piece& p, int64_t offset) {
    if (id < vocab) return true;
    found = absl::StrCat(p.path, ": token at byte offset ", offset, " is ", id,
                         ", not below the vocabulary of ", vocab);
    return false;
  });
  return found;
}

std::string TokenCorpus::Where(int64_t i) const {
  std::string out;
  ForRange(i, i + 1, [&](const Piece& p, int64_t from, int64_t) {
    out = absl::StrCat(p.path, " byte offset ", p.header_bytes + from * width_);
  });
  return out;
}

int64_t TokenWindows::Start(int64_t epoch, int64_t index) const {
  switch (kind) {
    case kStrided:
      return begin + index * seq_len;
    case kRandom: {
      const uint64_t range = static_cast<uint64_t>(end - begin - seq_len);
      const uint64_t h = HashCombine(HashCombine(seed, static_cast<uint64_t>(epoch)),
                                     static_cast<uint64_t>(index));
      return begin + static_cast<int64_t>(h % range);
    }
    case kInterleaved: {
      constexpr int64_t kBlock = 16;
      int64_t w;
      if (held_out) {
        w = (index / kBlock) * kBlock * period + kBlock * (period - 1) + index % kBlock;
      } else {
        const int64_t per_group = kBlock * (period - 1);
        w = (index / per_group) * kBlock * period + index % per_group;
      }
      return w * seq_len;
    }
  }
  return begin;
}

TokenWindows StridedWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t seq_len,
                            int64_t begin, int64_t end) {
  TokenWindows w;
  w.corpus = std::move(corpus);
  w.kind = TokenWindows::kStrided;
  w.seq_len = seq_len;
  w.begin = begin;
  w.end = end;
  w.count = end - begin > seq_len ? (end - begin - 1) / seq_len : 0;
  return w;
}

TokenWindows RandomWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t seq_len,
                           int64_t begin, int64_t end, int64_t count, uint64_t seed) {
  TokenWindows w;
  w.corpus = std::move(corpus);
  w.kind = TokenWindows::kRandom;
  w.seq_len = seq_len;
  w.begin = begin;
  w.end = end;
  w.count = end - begin > seq_len ? count : 0;
  w.seed = seed;
  return w;
}

TokenWindows InterleavedWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t seq_len,
                                int64_t period, bool held_out) {
  constexpr int64_t kBlock = 16;
  TokenWindows w;
  w.kind = TokenWindows::kInterleaved;
  w.seq_len = seq_len;
  w.begin = 0;
  w.end = corpus->size();
  w.period = period;
  w.held_out = held_out;
  const int64_t all = (corpus->size() - 1) / seq_len;
  const int64_t groups = all / (kBlock * period), rest = all % (kBlock * period);
  const int64_t held = groups * kBlock + std::max<int64_t>(0, rest - kBlock * (period - 1));
  w.count = held_out ? held : all - held;
  w.corpus = std::move(corpus);
  return w;
}

}  // namespace localpar
