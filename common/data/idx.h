// Reader for IDX files (the MNIST family's format), gzipped or plain.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace localpar {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // unsigned bytes (type 0x08), row-major
};

// Refuses, naming the file: a missing file, a wrong magic number, a type other than
// unsigned byte, absurd dimensions, a truncated payload, and trailing bytes.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);
// The dimensions alone, from the header (checked as above); nothing else is read.
absl::StatusOr<std::vector<int64_t>> ReadIdxDims(const std::string& path);

}  // namespace localpar
