// Layer kinds reached through the registry: construction, shapes, counts, defaults, checks.
#include "common/nn/layer.h"

#include <cmath>
#include <type_traits>

#include "common/nn/layer_kind.h"
#include "common/nn/layers/family.h"
#include "common/nn/onnx_graph.h"

namespace localpar {

std::set<std::pair<std::string, std::string>>* LayerConfig::trace = nullptr;

double LayerConfig::Number(const std::string& name, double fallback) const {
  Trace(name);
  auto it = settings.find(name);
  return it == settings.end() ? fallback : it->second;
}

int64_t LayerConfig::Int(const std::string& name, int64_t fallback) const {
  Trace(name);
  auto it = settings.find(name);
  if (it == settings.end()) return fallback;
  // Out-of-range settings saturate (and are then refused by the kind's checks).
  if (!(it->second > -9.2e18)) return INT64_MIN;
  if (!(it->second < 9.2e18)) return INT64_MAX;
  return static_cast<int64_t>(it->second);
}

void LayerConfig::Default(const std::string& name, double value) {
  if (Number(name) == 0) settings[name] = value;
}

ExportLayout Layer::TorchLayout(const Param& p, const Shape&) const {
  ExportLayout l;
  l.shape.assign(p.value.shape().begin(), p.value.shape().end());
  return l;
}

std::unique_ptr<Layer> Layer::MakeTiedOutput(Backend&, const Shape&, int64_t, std::string* error) {
  *error = std::string("a ") + kind() + " layer has no table to tie an output projection to";
  return nullptr;
}

ExportLayout TransposedLayout(int64_t rows, int64_t cols) {
  ExportLayout l;
  l.shape = {cols, rows};
  l.to_ours.resize(static_cast<size_t>(rows * cols));
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) l.to_ours[c * rows + r] = r * cols + c;
  }
  return l;
}

namespace {

const LayerKind* KindOf(const LayerConfig& c, std::string* error) {
  const LayerKind* kind = FindLayerKind(c.kind);
  if (!kind && error) {
    *error = c.kind.empty() ? "no layer kind set (" + LayerKindList() + ")"
                            : "unknown layer kind \"" + c.kind + "\" (" + LayerKindList() + ")";
  }
  return kind;
}

}  // namespace

bool InferLayerShape(const LayerConfig& c, const Shape& in, Shape* out, std::string* error) {
  const LayerKind* kind = KindOf(c, error);
  if (!kind) return false;
  // Kinds multiply extents: a shape beyond kMaxExampleElements goes no further.
  if (std::string why = ExampleShapeError("input", in); !why.empty()) {
    if (error) *error = why;
    return false;
  }
  if (kind->expands()) {
    Shape cur = in;
    std::vector<LayerConfig> parts = kind->Expand(c, in);
    for (const LayerConfig& p : parts) {
      Shape next;
      if (!InferLayerShape(p, cur, &next, error)) {
        *error = std::string(kind->name()) + ": " + *error;
        return false;
      }
      cur = next;
    }
    *out = cur;
    return true;
  }
  return ShapeFits(*kind, c, in, out, error);
}

std::unique_ptr<Layer> MakeLayer(Backend& b, const LayerConfig& c, const Shape& in, uint64_t seed,
                                 std::string* error) {
  Shape out;
  if (!InferLayerShape(c, in, &out, error)) return nullptr;
  const LayerKind* kind = FindLayerKind(c.kind);
  if (kind->expands()) {
    *error = std::string(kind->name()) + ": a shorthand kind is expanded before it is built";
    return nullptr;
  }
  std::unique_ptr<Layer> layer = kind->Make(b, c, in, seed, error);
  if (layer) layer->in_shape_ = in;
  return layer;
}

namespace {

// f over the layers a shorthand kind stands for, each taking the shape the one before makes.
template <typename T>
T SumOverParts(const LayerKind& kind, const LayerConfig& c, const Shape& in,
               T (*f)(const LayerConfig&, const Shape&)) {
  T n = 0;
  Shape cur = in;
  std::string ignored;
  for (const LayerConfig& p : kind.Expand(c, in)) {
    if constexpr (std::is_integral_v<T>) {
      n = AddCounts(n, f(p, cur));  // parameter counts saturate (shape.h)
    } else {
      n += f(p, cur);
    }
    Shape next;
    if (InferLayerShape(p, cur, &next, &ignored)) cur = next;
  }
  return n;
}

}  // namespace

int64_t LayerParameterCount(const LayerConfig& c, const Shape& in) {
  const LayerKind* kind = KindOf(c, nullptr);
  if (!kind) return 0;
  if (!kind->expands()) return kind->Parameters(c, in);
  return SumOverParts(*kind, c, in, LayerParameterCount);
}

double LayerForwardFlops(const LayerConfig& c, const Shape& in) {
  const LayerKind* kind = KindOf(c, nullptr);
  if (!kind) return 0;
  if (!kind->expands()) return kind->Flops(c, in);
  return SumOverParts(*kind, c, in, LayerForwardFlops);
}

double LayerActivationValues(const LayerConfig& c, const Shape& in) {
  const LayerKind* kind = KindOf(c, nullptr);
  if (!kind) return 0;
  if (kind->expands()) return SumOverParts(*kind, c, in, LayerActivationValues);
  Shape out;
  std::string ignored;
  if (!InferLayerShape(c, in, &out, &ignored)) return 0;
  double n = 1;
  for (int64_t d : out) n *= static_cast<double>(d);
  return n + kind->SavedValues(c, in);
}

void ExpandLayer(const LayerConfig& c, Shape* cur, std::vector<LayerConfig>* out) {
  const LayerKind* kind = FindLayerKind(c.kind);
  std::vector<LayerConfig> made;
  if (kind && kind->expands()) {
    Shape inner = *cur;
    for (const LayerConfig& p : kind->Expand(c, *cur)) ExpandLayer(p, &inner, &made);
  } else {
    LayerConfig copy = c;
    copy.body.clear();
    Shape inner = *cur;
    for (const LayerConfig& b : c.body) ExpandLayer(b, &inner, &copy.body);
    made.push_back(std::move(copy));
  }
  for (LayerConfig& m : made) {
    Shape next;
    std::string ignored;  // model validation reports shape errors with full context
    if (InferLayerShape(m, *cur, &next, &ignored)) *cur = next;
    out->push_back(std::move(m));
  }
}

LayerIssue CheckLayerSettings(const LayerConfig& c) {
  std::string error;
  const LayerKind* kind = KindOf(c, &error);
  if (!kind) return {"", error};
  // Sizes, kernels, strides and the like: a bound every kind shares, so that no product of
  // them overflows before the shapes are checked.
  for (const auto& [name, value] : c.settings) {
    if (!std::isfinite(value) || std::fabs(value) > kMaxLayerSetting) {
      return {name, "must be a number of magnitude at most " + std::to_string(kMaxLayerSetting)};
    }
  }
  return kind->Check(c);
}

void ApplyLayerDefaults(LayerConfig& c) {
  if (const LayerKind* kind = FindLayerKind(c.kind)) kind->Defaults(c);
  for (LayerConfig& b : c.body) ApplyLayerDefaults(b);
}

void FuseActivations(std::vector<std::unique_ptr<Layer>>& layers) {
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    const Epilogue e = layers[i + 1]->as_epilogue();
    if (e != Epilogue::kNone && layers[i]->TakeEpilogue(e)) layers[i + 1]->PassThrough();
  }
}

}  // namespace localpar
