// The container every checkpoint file is written in: a magic, a format version, the payload's
// length and its CRC-32, written atomically; and the fixed-width fields of such headers.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace localpar {

inline constexpr uint32_t kCheckpointFormatVersion = 1;
inline constexpr char kCheckpointMagic[8] = {'L', 'P', 'C', 'K', 'P', 'T', '\r', '\n'};

// [8-byte magic][u32 version][u64 payload bytes][u32 CRC-32 of payload][payload], written to
// a temporary file, fsynced, then renamed over `path` (and the directory fsynced).
absl::Status WriteChecksummedFile(const std::string& path, const std::string& payload);
// Refuses, naming the file: a missing file, a bad magic, another format version, a length
// that disagrees with the file, or a checksum mismatch.
absl::StatusOr<std::string> ReadChecksummedFile(const std::string& path);

// zlib's CRC-32 of `s`, and of `s` continuing a running `crc`.
uint32_t Crc32(std::string_view s);
uint32_t Crc32More(uint32_t crc, std::string_view s);

// A header's fixed-width field, in this machine's byte order.
template <typename T>
void PutRaw(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T GetRaw(const std::string& in, size_t off) {
  T v;
  std::memcpy(&v, in.data() + off, sizeof(T));
  return v;
}

}  // namespace localpar
