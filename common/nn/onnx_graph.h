// What a layer needs to describe itself as ONNX nodes, without protobuf: the core's side of
// ONNX export. common/model_io/onnx_export.cc implements it over the ONNX protobuf messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/nn/layer.h"

namespace localpar {

struct OnnxAttribute {
  enum Type { kInt, kInts, kFloat };
  std::string name;
  Type type = kInt;
  std::vector<int64_t> ints;  // kInt: one value
  float f = 0;
};

inline OnnxAttribute IntAttr(std::string name, int64_t v) {
  return {std::move(name), OnnxAttribute::kInt, {v}, 0};
}
inline OnnxAttribute IntsAttr(std::string name, std::vector<int64_t> v) {
  return {std::move(name), OnnxAttribute::kInts, std::move(v), 0};
}
inline OnnxAttribute FloatAttr(std::string name, float v) {
  return {std::move(name), OnnxAttribute::kFloat, {}, v};
}

class OnnxGraph {
 public:
  virtual ~OnnxGraph() = default;
  // A node of operator `type` (opset 17) with one output; returns the output's name.
  virtual std::string Op(const std::string& type, const std::vector<std::string>& inputs,
                         const std::vector<OnnxAttribute>& attributes = {}) = 0;
  // A float32 constant named after `hint`.
  virtual std::string Floats(const std::string& hint, const std::vector<int64_t>& dims,
                             const std::vector<float>& values) = 0;
  // A 1-D int64 constant (shapes for Reshape), and an int64 scalar (indices for Gather).
  virtual std::string Ints(const std::vector<int64_t>& values) = 0;
  virtual std::string Index(int64_t value) = 0;
  // A layer's parameter as an initializer under its exported name: as localpar stores it,
  // or in PyTorch's layout (the layer's TorchLayout).
  virtual std::string Parameter(const Layer& layer, const Param& p, bool torch_layout = false) = 0;

  std::string Scalar(float v) { return Floats("const", {}, {v}); }
  std::string Transpose(const std::string& x, std::vector<int64_t> perm) {
    return Op("Transpose", {x}, {IntsAttr("perm", std::move(perm))});
  }
  // Sequences are [N, T, ...] with T known only at run time (any length up to the context):
  // T as a 1-D int64 tensor of one element, and the leading T entries of a constant laid out
  // for the whole context, along each of `axes` (a position table, a causal mask).
  std::string PositionsOf(const std::string& x) {
    return Op("Shape", {x}, {IntAttr("start", 1), IntAttr("end", 2)});
  }
  std::string Leading(const std::string& table, const std::string& positions,
                      const std::vector<int64_t>& axes) {
    std::string ends = positions;
    if (axes.size() > 1) {
      ends = Op("Concat", std::vector<std::string>(axes.size(), positions), {IntAttr("axis", 0)});
    }
    return Op("Slice", {table, Ints(std::vector<int64_t>(axes.size(), 0)), ends, Ints(axes)});
  }
  std::string ToNchw(const std::string& x) { return Transpose(x, {0, 3, 1, 2}); }
  std::string ToNhwc(const std::string& x) { return Transpose(x, {0, 2, 3, 1}); }
};

}  // namespace localpar
