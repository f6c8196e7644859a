// What the layer families share: parameter creation and the export layouts and ONNX idioms
// that more than one family uses. Only files in common/nn/layers/ include it.
#pragma once

#include <string>
#include <utility>

#include "common/nn/layer_kind.h"
#include "common/nn/onnx_graph.h"

namespace localpar {

inline Param MakeParam(Backend& backend, std::string name, Tensor value) {
  Param p;
  p.name = std::move(name);
  p.grad = Tensor::Zeros(backend, value.shape());
  p.value = std::move(value);
  return p;
}

// PyTorch's layout of our [rows, cols] matrix: [cols, rows].
ExportLayout TransposedLayout(int64_t rows, int64_t cols);

// x W + b, with W [in, out] as localpar stores it.
inline std::string OnnxAffine(OnnxGraph& g, const Layer& layer, const Param& w, const Param& b,
                              const std::string& x) {
  return g.Op("Add", {g.Op("MatMul", {x, g.Parameter(layer, w)}), g.Parameter(layer, b)});
}

// Builds a layer of an already-checked shape, the kind's name prefixed to any error.
template <typename Kind>
bool ShapeFits(const Kind& kind, const LayerConfig& c, const Shape& in, Shape* out,
               std::string* error) {
  std::string why = kind.Infer(c, in, out);
  if (why.empty()) return true;
  *error = std::string(kind.name()) + ": " + why;
  return false;
}

}  // namespace localpar
