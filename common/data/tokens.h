// Token sequences for language models: the token ids of text files (a byte per token) or of
// token files (nanoGPT's raw uint16 .bin, llm.c's headered shards), memory-mapped and read a
// window at a time, so memory does not grow with the corpus. A split is a range of the
// corpus cut into windows of seq_len tokens whose labels are the next token at each
// position; which windows make an epoch is a pure function of (seed, epoch, index).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace localpar {

// How a token file is laid out.
enum class TokenFileFormat {
  kAuto,     // an llm.c shard when it starts with llm.c's magic, raw uint16 otherwise
  kRawU16,   // nanoGPT's train.bin / val.bin: little-endian uint16 ids, nothing else
  kLlmcU16,  // llm.c: 256 int32 header (magic 20240520, version 1, token count), uint16 ids
  kBytes,    // text: every byte is a token
};

// Token ids concatenated from files, each mapped read-only. Reading a window copies it out
// and drops the pages it touched from this process's resident memory (they stay in the page
// cache), so resident memory stays flat however large the files are.
class TokenCorpus {
 public:
  // Maps `files` in order. Errors name the file and the offset: a file that cannot be
  // opened or mapped, an llm.c shard with a wrong magic or version or a token count that
  // disagrees with its size, a raw uint16 file of an odd size, an empty file.
  static absl::StatusOr<std::shared_ptr<TokenCorpus>> Map(const std::vector<std::string>& files,
                                                          TokenFileFormat format);
  ~TokenCorpus();
  TokenCorpus(const TokenCorpus&) = delete;
  TokenCorpus& operator=(const TokenCorpus&) = delete;

  int64_t size() const { return size_; }  // tokens
  int bytes_per_token() const { return width_; }
  // Ids [begin, begin + n) into x and ids [begin + 1, begin + n + 1) into y (either may be
  // null); begin + n + 1 <= size(). A file that shrank since it was mapped (truncated while
  // the run reads it) is a DATA_LOSS error naming it, checked before its pages are touched:
  // reading past its new end would kill the process with SIGBUS.
  absl::Status Window(int64_t begin, int64_t n, int32_t* x, int32_t* y) const;
  // The largest id in [begin, end), read in chunks (resident memory stays flat).
  int32_t MaxId(int64_t begin, int64_t end) const;
  // The first id >= vocab in [begin, end) as "FILE: token at byte offset O is I, not below
  // the vocabulary V"; "" when there is none.
  std::string FirstIdOutside(int64_t begin, int64_t end, int64_t vocab) const;
  // Which file holds token i, and at which byte offset: for messages.
  std::string Where(int64_t i) const;

 private:
  struct Piece {
    std::string path;
    const uint8_t* map = nullptr;  // the whole file
    size_t map_bytes = 0;
    int fd = -1;               // kept open: its size is checked before each read of the mapping
    int64_t header_bytes = 0;  // skipped before the first token
    int64_t first = 0;         // index of its first token in the corpus
    int64_t count = 0;
  };
  TokenCorpus() = default;
  // Calls f(piece, first token in piece, count) over the pieces covering [begin, end).
  template <typename F>
  void ForRange(int64_t begin, int64_t end, F f) const;
  // Calls f(id, piece, byte offset) for every token of [begin, end) until it returns false.
  template <typename F>
  void Scan(int64_t begin, int64_t end, F f) const;
  void Release(const Piece& p, const void* at, size_t bytes) const;
  absl::Status Intact(const Piece& p) const;  // still at least as long as when mapped

  std::vector<Piece> pieces_;
  int64_t size_ = 0;
  int width_ = 2;
};

// The windows of one split of a corpus: tokens [begin, end).
struct TokenWindows {
  enum Kind {
    kStrided,      // window i starts at begin + i * seq_len (non-overlapping, in order)
    kRandom,       // window i of an epoch starts at a seeded random offset
    kInterleaved,  // the old text split: non-overlapping windows in blocks of 16, every
                   // period-th block held out (`held_out` says which side this is)
  };
  std::shared_ptr<const TokenCorpus> corpus;
  Kind kind = kStrided;
  int64_t seq_len = 0;
  int64_t begin = 0, end = 0;
  int64_t count = 0;   // windows in the split (an epoch's, for kRandom)
  uint64_t seed = 0;   // kRandom
  int64_t period = 0;  // kInterleaved
  bool held_out = false;
  // Where window `index` of epoch `epoch` starts.
  int64_t Start(int64_t epoch, int64_t index) const;
};

// Windows of `seq_len` tokens over [begin, end): as many as fit without overlapping.
TokenWindows StridedWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t seq_len,
                            int64_t begin, int64_t end);
// `count` windows an epoch at random offsets in [begin, end), from (seed, epoch, index).
TokenWindows RandomWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t seq_len,
                           int64_t begin, int64_t end, int64_t count, uint64_t seed);
// One side of the interleaved split of the whole corpus: non-overlapping windows in blocks
// of 16, every `period`-th block held out.
TokenWindows InterleavedWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t seq_len,
                                int64_t period, bool held_out);

}  // namespace localpar
