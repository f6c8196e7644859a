// The normalisation family, over the last dimension: `layer_norm` (per row) and `batch_norm`
// (per channel over the batch and positions, with running statistics for evaluation).
#include "common/nn/layers/norm.h"

#include <cmath>

#include "common/nn/init.h"
#include "common/nn/layers/family.h"

namespace localpar {
namespace {

constexpr float kDefaultEps = 1e-5f;
constexpr float kDefaultMomentum = 0.1f;

class LayerNorm final : public Layer {
 public:
  LayerNorm(Backend& b, const Shape& in, float eps) : backend_(b), cols_(in.back()), eps_(eps) {
    out_shape_ = in;
    gamma_ = MakeParam(b, "gamma", ConstantInit(b, {cols_}, 1.0f));
    beta_ = MakeParam(b, "beta", ConstantInit(b, {cols_}, 0.0f));
  }
  const char* kind() const override { return "layer_norm"; }
  std::string TorchName(const Param& p) const override { return &p == &gamma_ ? "weight" : "bias"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    int64_t rows = x.numel() / cols_;
    c.out.Ensure(backend_, x.shape());
    c.aux0.Ensure(backend_, {rows});
    c.aux1.Ensure(backend_, {rows});
    backend_.LayerNormForward(x.f32(), gamma_.value.f32(), beta_.value.f32(), c.out.f32(),
                              c.aux0.f32(), c.aux1.f32(), rows, cols_, eps_);
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    int64_t rows = x.numel() / cols_;
    if (dx) dx->Ensure(backend_, x.shape());
    backend_.LayerNormBackward(dy.f32(), x.f32(), gamma_.value.f32(), c.aux0.f32(), c.aux1.f32(),
                               dx ? dx->f32() : nullptr, gamma_.grad.f32(), beta_.grad.f32(), rows,
                               cols_);
  }
  std::vector<Param*> params() override { return {&gamma_, &beta_}; }
  bool ForwardPositions(const Tensor& x, int64_t, DecodeCache& c) override {
    const int64_t rows = x.numel() / cols_;
    c.out.Ensure(backend_, {rows, cols_});
    c.kept.resize(2);
    c.kept[0].Ensure(backend_, {rows});
    c.kept[1].Ensure(backend_, {rows});
    backend_.LayerNormForward(x.f32(), gamma_.value.f32(), beta_.value.f32(), c.out.f32(),
                              c.kept[0].f32(), c.kept[1].f32(), rows, cols_, eps_);
    return true;
  }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    return g.Op("LayerNormalization", {x, g.Parameter(*this, gamma_), g.Parameter(*this, beta_)},
                {IntAttr("axis", -1), FloatAttr("epsilon", eps_)});
  }

 private:
  Backend& backend_;
  int64_t cols_;
  float eps_;
  Param gamma_, beta_;
};

// Training normalises with the batch's statistics and updates the running ones;
// evaluation uses the running ones.
class BatchNorm final : public Layer {
 public:
  BatchNorm(Backend& b, const Shape& in, float eps, float momentum)
      : backend_(b), cols_(in.back()), eps_(eps), momentum_(momentum) {
    out_shape_ = in;
    gamma_ = MakeParam(b, "gamma", ConstantInit(b, {cols_}, 1.0f));
    beta_ = MakeParam(b, "beta", ConstantInit(b, {cols_}, 0.0f));
    for (Param* p : {&running_mean_, &running_var_}) p->trainable = false;
    running_mean_.name = "running_mean";
    running_mean_.value = ConstantInit(b, {cols_}, 0.0f);
    running_var_.name = "running_var";
    running_var_.value = ConstantInit(b, {cols_}, 1.0f);
  }
  const char* kind() const override { return "batch_norm"; }
  // nn.BatchNorm's names: weight and bias, running_mean and running_var as they are.
  std::string TorchName(const Param& p) const override {
    if (&p == &gamma_) return "weight";
    if (&p == &beta_) return "bias";
    return p.name;
  }
  bool tracks_batches() const override { return true; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext& ctx) override {
    int64_t rows = x.numel() / cols_;
    c.out.Ensure(backend_, x.shape());
    c.aux0.Ensure(backend_, {cols_});
    c.aux1.Ensure(backend_, {cols_});
    backend_.BatchNormForward(x.f32(), gamma_.value.f32(), beta_.value.f32(), c.out.f32(),
                              c.aux0.f32(), c.aux1.f32(), running_mean_.value.f32(),
                              running_var_.value.f32(), rows, cols_, eps_, momentum_, ctx.train);
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    int64_t rows = x.numel() / cols_;
    if (dx) dx->Ensure(backend_, x.shape());
    backend_.BatchNormBackward(dy.f32(), x.f32(), gamma_.value.f32(), c.aux0.f32(), c.aux1.f32(),
                               dx ? dx->f32() : nullptr, gamma_.grad.f32(), beta_.grad.f32(), rows,
                               cols_);
  }
  std::vector<Param*> params() override { return {&gamma_, &beta_, &running_mean_, &running_var_}; }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    // y = x * scale + shift per channel, from the running statistics exactly as localpar
    // computes them in evaluation.
    std::vector<float> gamma = gamma_.value.ToHost(), beta = beta_.value.ToHost();
    std::vector<float> mean = running_mean_.value.ToHost(), var = running_var_.value.ToHost();
    std::vector<float> scale(gamma.size()), shift(gamma.size());
    for (size_t i = 0; i < gamma.size(); ++i) {
      float rs = 1.0f / std::sqrt(var[i] + eps_);
      scale[i] = gamma[i] * rs;
      shift[i] = beta[i] - mean[i] * scale[i];
    }
    std::string scaled = g.Op("Mul", {x, g.Floats("bn_scale", {cols_}, scale)});
    return g.Op("Add", {scaled, g.Floats("bn_shift", {cols_}, shift)});
  }

 private:
  Backend& backend_;
  int64_t cols_;
  float eps_, momentum_;
  Param gamma_, beta_, running_mean_, running_var_;
};

class NormKind final : public LayerKind {
 public:
  explicit NormKind(bool batch) : batch_(batch) {}
  const char* name() const override { return batch_ ? "batch_norm" : "layer_norm"; }
  void Defaults(LayerConfig& c) const override {
    c.Default("eps", kDefaultEps);
    if (batch_) c.Default("momentum", kDefaultMomentum);
  }
  LayerIssue Check(const LayerConfig& c) const override {
    const double eps = Eps(c);
    if (!(eps > 0.0) || !std::isfinite(eps)) return {"eps", "must be a finite number > 0"};
    if (batch_ && !(Momentum(c) >= 0.0 && Momentum(c) <= 1.0)) {
      return {"momentum", "must be in [0, 1]"};
    }
    return {};
  }
  std::string Infer(const LayerConfig& c, const Shape& in, Shape* out) const override {
    *out = in;
    if (in.empty()) return "needs at least one dimension";
    if (!(Eps(c) > 0.0)) return "eps must be > 0";
    if (batch_ && !(Momentum(c) >= 0.0 && Momentum(c) <= 1.0)) return "momentum must be in [0, 1]";
    return "";
  }
  std::unique_ptr<Layer> Make(Backend& b, const LayerConfig& c, const Shape& in, uint64_t,
                              std::string*) const override {
    if (batch_) {
      return std::make_unique<BatchNorm>(b, in, static_cast<float>(Eps(c)),
                                         static_cast<float>(Momentum(c)));
    }
    return std::make_unique<LayerNorm>(b, in, static_cast<float>(Eps(c)));
  }
  int64_t Parameters(const LayerConfig&, const Shape& in) const override {
    const int64_t last = in.empty() ? 0 : in.back();
    return (batch_ ? 4 : 2) * last;  // scale and shift (and running mean and variance)
  }

 private:
  static double Eps(const LayerConfig& c) { return c.Number("eps", kDefaultEps); }
  static double Momentum(const LayerConfig& c) { return c.Number("momentum", kDefaultMomentum); }
  const bool batch_;
};

}  // namespace

LayerConfig LayerNormConfig() { return LayerConfig("layer_norm"); }

const LayerKind& LayerNormLayerKind() {
  static const NormKind kind(false);
  return kind;
}
const LayerKind& BatchNormLayerKind() {
  static const NormKind kind(true);
  return kind;
}

}  // namespace localpar
