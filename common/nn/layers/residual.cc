// The residual family: `residual`, y = x + body(x), the body any layers that keep the shape.
#include "common/nn/layers/residual.h"

#include <type_traits>

#include "common/core/rng.h"
#include "common/nn/layers/family.h"

namespace localpar {
namespace {

class Residual final : public Layer {
 public:
  Residual(Backend& b, std::vector<std::unique_ptr<Layer>> body, const Shape& in)
      : backend_(b), body_(std::move(body)) {
    out_shape_ = in;
  }
  const char* kind() const override { return "residual"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext& ctx) override {
    c.sub.resize(body_.size());
    c.sub_grads.resize(body_.size());
    const Tensor* in = &x;
    for (size_t i = 0; i < body_.size(); ++i) {
      body_[i]->Forward(*in, c.sub[i], ctx);
      in = &c.sub[i].out;
    }
    c.out.Ensure(backend_, x.shape());
    backend_.Add(x.f32(), in->f32(), c.out.f32(), x.numel());
  }
  // Both halves in turn: each parameter's gradient is the same sum either way.
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    BackwardInput(x, dy, c, dx);
    BackwardWeights(x, dy, c);
  }
  bool splits_backward() const override {
    for (const auto& l : body_) {
      if (l->splits_backward()) return true;
    }
    return false;
  }
  // The body's input halves, keeping each inner gradient in the cache for BackwardWeights.
  void BackwardInput(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    const Tensor* g = &dy;
    for (size_t i = body_.size(); i-- > 0;) {
      const Tensor& in = i == 0 ? x : c.sub[i - 1].out;
      body_[i]->BackwardInput(in, *g, c.sub[i], &c.sub_grads[i]);
      g = &c.sub_grads[i];
    }
    if (dx) {
      dx->Ensure(backend_, x.shape());
      backend_.Add(dy.f32(), g->f32(), dx->f32(), x.numel());
    }
  }
  void BackwardWeights(const Tensor& x, const Tensor& dy, LayerCache& c) override {
    for (size_t i = body_.size(); i-- > 0;) {
      const Tensor& in = i == 0 ? x : c.sub[i - 1].out;
      body_[i]->BackwardWeights(in, i + 1 == body_.size() ? dy : c.sub_grads[i + 1], c.sub[i]);
    }
  }
  bool ForwardPositions(const Tensor& x, int64_t start, DecodeCache& c) override {
    c.sub.resize(body_.size());
    const Tensor* in = &x;
    for (size_t i = 0; i < body_.size(); ++i) {
      if (!body_[i]->ForwardPositions(*in, start, c.sub[i])) return false;
      in = &c.sub[i].out;
    }
    c.out.Ensure(backend_, in->shape());
    backend_.Add(x.f32(), in->f32(), c.out.f32(), x.numel());
    return true;
  }
  std::vector<Param*> params() override {
    std::vector<Param*> out;
    for (auto& l : body_) {
      for (Param* p : l->params()) out.push_back(p);
    }
    return out;
  }
  std::string TorchChildName(size_t j) const override { return "body." + std::to_string(j); }
  std::vector<const Layer*> children() const override {
    std::vector<const Layer*> out;
    for (const auto& l : body_) out.push_back(l.get());
    return out;
  }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    std::string y = x;
    for (const auto& l : body_) y = l->EmitOnnx(g, y);
    return g.Op("Add", {x, y});
  }

 private:
  Backend& backend_;
  std::vector<std::unique_ptr<Layer>> body_;
};

class ResidualKind final : public LayerKind {
 public:
  const char* name() const override { return "residual"; }
  LayerIssue Check(const LayerConfig& c) const override {
    if (c.body.empty()) return {"body", "is empty"};
    for (size_t i = 0; i < c.body.size(); ++i) {
      LayerIssue inner = CheckLayerSettings(c.body[i]);
      if (inner.why.empty()) continue;
      std::string field = "body[" + std::to_string(i) + "]";
      if (!c.body[i].kind.empty()) field += "." + c.body[i].kind;
      if (!inner.field.empty()) field += "." + inner.field;
      return {field, inner.why};
    }
    return {};
  }
  std::string Infer(const LayerConfig& c, const Shape& in, Shape* out) const override {
    *out = in;
    Shape cur = in;
    for (size_t i = 0; i < c.body.size(); ++i) {
      Shape next;
      std::string e;
      if (!InferLayerShape(c.body[i], cur, &next, &e))
        return "body[" + std::to_string(i) + "]: " + e;
      cur = next;
    }
    if (cur != in) {
      return "body output " + ShapeString(cur) + " differs from its input " + ShapeString(in);
    }
    return "";
  }
  std::unique_ptr<Layer> Make(Backend& b, const LayerConfig& c, const Shape& in, uint64_t seed,
                              std::string* error) const override {
    std::vector<std::unique_ptr<Layer>> body;
    Shape cur = in;
    for (size_t i = 0; i < c.body.size(); ++i) {
      auto l = MakeLayer(b, c.body[i], cur, HashCombine(seed, 100 + i), error);
      if (!l) return nullptr;
      cur = l->output_shape();
      body.push_back(std::move(l));
    }
    return std::make_unique<Residual>(b, std::move(body), in);
  }
  int64_t Parameters(const LayerConfig& c, const Shape& in) const override {
    return Sum(c, in, LayerParameterCount);
  }
  double Flops(const LayerConfig& c, const Shape& in) const override {
    return Sum(c, in, LayerForwardFlops);
  }
  double SavedValues(const LayerConfig& c, const Shape& in) const override {
    return Sum(c, in, LayerActivationValues);
  }

 private:
  // f(layer, its input shape) added up over the body, each layer taking the shape the one
  // before it makes.
  template <typename T>
  static T Sum(const LayerConfig& c, const Shape& in, T (*f)(const LayerConfig&, const Shape&)) {
    T n = 0;
    Shape cur = in;
    std::string ignored;
    for (const LayerConfig& b : c.body) {
      if constexpr (std::is_integral_v<T>) {
        n = AddCounts(n, f(b, cur));  // parameter counts saturate (shape.h)
      } else {
        n += f(b, cur);
      }
      Shape next;
      if (InferLayerShape(b, cur, &next, &ignored)) cur = next;
    }
    return n;
  }
};

}  // namespace

LayerConfig ResidualConfig(std::vector<LayerConfig> body) {
  LayerConfig c("residual");
  c.body = std::move(body);
  return c;
}

const LayerKind& ResidualLayerKind() {
  static const ResidualKind kind;
  return kind;
}

}  // namespace localpar
