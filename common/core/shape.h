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

// Counts of elements or parameters derived from a job's settings saturate here, far above any
// real model and far below int64's limit, so that sums and products of them cannot overflow.
constexpr int64_t kMaxCount = int64_t{1} << 62;

inline int64_t CountFromDouble(double v) {
  if (!(v > 0)) return 0;
  return v >= static_cast<double>(kMaxCount) ? kMaxCount : static_cast<int64_t>(v);
}

inline int64_t AddCounts(int64_t a, int64_t b) { return a >= kMaxCount - b ? kMaxCount : a + b; }

// The most values one example may hold at any point of a network (its input, any layer's
// output, the logits): 2^31, 8 GiB in float32. Larger shapes are refused before anything is
// allocated (InferLayerShape, ValidateModel), and counts derived from shapes within it
// cannot overflow.
constexpr int64_t kMaxExampleElements = int64_t{1} << 31;

inline std::string ShapeString(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

// "" when every extent of `s` is > 0 and it holds at most kMaxExampleElements values
// (checked before multiplying, so it never overflows); else why not, naming it `what`.
inline std::string ExampleShapeError(const std::string& what, const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d <= 0) return what + " " + ShapeString(s) + " has an extent <= 0";
    if (d > kMaxExampleElements / n) {
      return what + " " + ShapeString(s) + " holds more than " +
             std::to_string(kMaxExampleElements) + " values per example";
    }
    n *= d;
  }
  return "";
}

// Elements per row when the outermost extent is the batch.
inline int64_t RowSize(const Shape& s) {
  int64_t n = 1;
  for (size_t i = 1; i < s.size(); ++i) n *= s[i];
  return n;
}

}  // namespace localpar
