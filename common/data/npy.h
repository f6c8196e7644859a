// NumPy arrays: .npy files (format versions 1-3) and .npz archives of them (stored or
// deflated), read into memory; and .npy files written.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace localpar {

struct NpyArray {
  std::string dtype;           // NumPy's descr without the byte order: "f4", "u1", "i8", ...
  std::vector<int64_t> shape;  // C order
  std::string data;            // the raw bytes, little-endian
  int64_t count() const;       // elements
  bool is_float() const { return !dtype.empty() && dtype[0] == 'f'; }
  bool is_integer() const { return !dtype.empty() && (dtype[0] == 'i' || dtype[0] == 'u'); }
  // Element i converted; for integers exact up to 2^53.
  double at(int64_t i) const;
};

// Parses one .npy image; `name` is used in errors ("FILE: header: ..."). Refuses big-endian
// and Fortran-ordered arrays, object arrays, and data that does not match the header.
absl::StatusOr<NpyArray> ParseNpy(const std::string& bytes, const std::string& name);
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);

// Every array of an .npz archive, by name without ".npy".
absl::StatusOr<std::map<std::string, NpyArray>> ReadNpzFile(const std::string& path);

// Writes a float32 array.
absl::Status WriteNpyFile(const std::string& path, const std::vector<int64_t>& shape,
                          const std::vector<float>& values);

}  // namespace localpar
