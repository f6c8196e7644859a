// The elementwise family: `relu`, `gelu` (tanh approximation), `dropout` (inverted, masks
// from the step's seed) and `flatten` (a reshape). No parameters, no FLOPs counted.
#include "common/nn/layers/elementwise.h"

#include "common/core/rng.h"
#include "common/nn/layers/family.h"

namespace localpar {
namespace {

class Relu final : public Layer {
 public:
  Relu(Backend& b, const Shape& in) : backend_(b) { out_shape_ = in; }
  const char* kind() const override { return "relu"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    if (applied_by_previous_) {
      c.out = x;  // already max(0, .): share the previous layer's output
      return;
    }
    c.out.Ensure(backend_, x.shape());
    backend_.ReluForward(x.f32(), c.out.f32(), x.numel());
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    if (!dx) return;
    dx->Ensure(backend_, x.shape());
    backend_.ReluBackward(c.out.f32(), dy.f32(), dx->f32(), x.numel());
  }
  bool ForwardPositions(const Tensor& x, int64_t, DecodeCache& c) override {
    if (applied_by_previous_) {
      c.out = x;
      return true;
    }
    c.out.Ensure(backend_, x.shape());
    backend_.ReluForward(x.f32(), c.out.f32(), x.numel());
    return true;
  }
  Epilogue as_epilogue() const override { return Epilogue::kRelu; }
  void PassThrough() override { applied_by_previous_ = true; }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    return g.Op("Relu", {x});
  }

 private:
  Backend& backend_;
  bool applied_by_previous_ = false;  // the preceding GEMM applies it
};

class Gelu final : public Layer {
 public:
  Gelu(Backend& b, const Shape& in) : backend_(b) { out_shape_ = in; }
  const char* kind() const override { return "gelu"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    c.out.Ensure(backend_, x.shape());
    backend_.GeluForward(x.f32(), c.out.f32(), x.numel());
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    if (!dx) return;
    dx->Ensure(backend_, x.shape());
    backend_.GeluBackward(x.f32(), dy.f32(), dx->f32(), x.numel());
  }
  bool ForwardPositions(const Tensor& x, int64_t, DecodeCache& c) override {
    c.out.Ensure(backend_, x.shape());
    backend_.GeluForward(x.f32(), c.out.f32(), x.numel());
    return true;
  }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as localpar computes it.
    std::string cube = g.Op("Mul", {x, g.Op("Mul", {x, x})});
    std::string inner = g.Op("Add", {x, g.Op("Mul", {cube, g.Scalar(0.044715f)})});
    std::string t = g.Op("Tanh", {g.Op("Mul", {inner, g.Scalar(0.7978845608028654f)})});
    std::string half = g.Op("Mul", {x, g.Scalar(0.5f)});
    return g.Op("Mul", {half, g.Op("Add", {t, g.Scalar(1.0f)})});
  }

 private:
  Backend& backend_;
};

class Dropout final : public Layer {
 public:
  Dropout(Backend& b, const Shape& in, float p, uint64_t salt)
      : backend_(b), rate_(p), salt_(salt) {
    out_shape_ = in;
  }
  const char* kind() const override { return "dropout"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext& ctx) override {
    c.aux1 = Tensor();
    if (!ctx.train || rate_ == 0.0f) {
      c.out = x;  // identity: share the input's storage
      return;
    }
    c.out.Ensure(backend_, x.shape());
    c.aux0.Ensure(backend_, x.shape());
    c.aux1 = c.aux0;  // marks "mask valid"
    backend_.DropoutForward(x.f32(), c.out.f32(), c.aux0.f32(), x.numel(), rate_,
                            HashCombine(ctx.seed, salt_));
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    if (!dx) return;
    if (!c.aux1.defined()) {
      *dx = dy;
      return;
    }
    dx->Ensure(backend_, x.shape());
    backend_.Mul(dy.f32(), c.aux0.f32(), dx->f32(), x.numel());
  }
  bool ForwardPositions(const Tensor& x, int64_t, DecodeCache& c) override {
    c.out = x;  // evaluation: the identity
    return true;
  }
  std::string EmitOnnx(OnnxGraph&, const std::string& x) const override { return x; }

 private:
  Backend& backend_;
  float rate_;
  uint64_t salt_;
};

// Reshape only: output and input gradient share storage with their sources.
class Flatten final : public Layer {
 public:
  explicit Flatten(const Shape& in) { out_shape_ = {NumElements(in)}; }
  const char* kind() const override { return "flatten"; }
  bool flattens_image() const override { return true; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    c.out = x.Reshaped({x.rows(), x.row_size()});
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    if (dx) *dx = dy.Reshaped(x.shape());
  }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    return g.Op("Flatten", {x}, {IntAttr("axis", 1)});
  }
};

enum class Which { kRelu, kGelu, kDropout, kFlatten };

class ElementwiseKind final : public LayerKind {
 public:
  ElementwiseKind(Which which, const char* name) : which_(which), name_(name) {}
  const char* name() const override { return name_; }
  LayerIssue Check(const LayerConfig& c) const override {
    if (which_ == Which::kDropout) {
      const double rate = c.Number("rate");
      if (!(rate >= 0.0 && rate < 1.0)) return {"rate", "must be in [0, 1)"};
    }
    return {};
  }
  std::string Infer(const LayerConfig& c, const Shape& in, Shape* out) const override {
    if (which_ == Which::kFlatten) {
      *out = {NumElements(in)};
      return "";
    }
    *out = in;
    if (which_ == Which::kDropout) return Check(c).why.empty() ? "" : "rate must be in [0, 1)";
    return "";
  }
  std::unique_ptr<Layer> Make(Backend& b, const LayerConfig& c, const Shape& in, uint64_t seed,
                              std::string*) const override {
    switch (which_) {
      case Which::kRelu:
        return std::make_unique<Relu>(b, in);
      case Which::kGelu:
        return std::make_unique<Gelu>(b, in);
      case Which::kDropout:
        return std::make_unique<Dropout>(b, in, static_cast<float>(c.Number("rate")), seed);
      case Which::kFlatten:
        return std::make_unique<Flatten>(in);
    }
    return nullptr;
  }

 private:
  const Which which_;
  const char* const name_;
};

}  // namespace

LayerConfig ReluConfig() { return LayerConfig("relu"); }
LayerConfig GeluConfig() { return LayerConfig("gelu"); }

const LayerKind& ReluLayerKind() {
  static const ElementwiseKind kind(Which::kRelu, "relu");
  return kind;
}
const LayerKind& GeluLayerKind() {
  static const ElementwiseKind kind(Which::kGelu, "gelu");
  return kind;
}
const LayerKind& DropoutLayerKind() {
  static const ElementwiseKind kind(Which::kDropout, "dropout");
  return kind;
}
const LayerKind& FlattenLayerKind() {
  static const ElementwiseKind kind(Which::kFlatten, "flatten");
  return kind;
}

}  // namespace localpar
