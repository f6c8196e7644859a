// The checksummed container of checkpoint files (checkpoint_file.h).
#include "common/model_io/checkpoint_file.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/io/atomic_file.h"

namespace localpar {
namespace {

constexpr size_t kHeader = 8 + 4 + 8 + 4;

}  // namespace

uint32_t Crc32More(uint32_t crc, std::string_view s) {
  uLong c = crc;
  size_t off = 0;
  while (off < s.size()) {
    uInt n = static_cast<uInt>(std::min<size_t>(s.size() - off, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(s.data() + off), n);
    off += n;
  }
  return static_cast<uint32_t>(c);
}

uint32_t Crc32(std::string_view s) {
  return Crc32More(static_cast<uint32_t>(crc32(0L, Z_NULL, 0)), s);
}

absl::Status WriteChecksummedFile(const std::string& path, const std::string& payload) {
  std::string header(kCheckpointMagic, sizeof(kCheckpointMagic));
  PutRaw<uint32_t>(&header, kCheckpointFormatVersion);
  PutRaw<uint64_t>(&header, payload.size());
  PutRaw<uint32_t>(&header, Crc32(payload));
  return WriteFileAtomically(path, {header, payload});
}

absl::StatusOr<std::string> ReadChecksummedFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string data = ss.str();
  if (data.size() < kHeader ||
      std::memcmp(data.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": not a localpar checkpoint file"));
  }
  uint32_t version = GetRaw<uint32_t>(data, 8);
  if (version != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": format version ", version, ", this build reads ", kCheckpointFormatVersion));
  }
  uint64_t length = GetRaw<uint64_t>(data, 12);
  if (length != data.size() - kHeader) {
    return absl::DataLossError(absl::StrCat(path, ": truncated or padded: header says ", length,
                                            " payload bytes, file has ", data.size() - kHeader));
  }
  std::string payload = data.substr(kHeader);
  if (Crc32(payload) != GetRaw<uint32_t>(data, 20)) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch (corrupt file)"));
  }
  return payload;
}

}  // namespace localpar
