// Tensor shapes: a list of extents, outermost first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace localpar {

using Shape = std::vector<int64_t>;

inline int64_t NumElements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

inline std::string ShapeString(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

// Elements per row when the outermost extent is the batch.
inline int64_t RowSize(const Shape& s) {
  int64_t n = 1;
  for (size_t i = 1; i < s.size(); ++i) n *= s[i];
  return n;
}

}  // namespace localpar
