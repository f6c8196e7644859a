// The attention family, on sequences [positions, dim]: `causal_self_attention` (multi-head,
// causal, with input and output projections) and `transformer_block`, shorthand for a
// pre-norm block: x + attention(layer_norm(x)), then x + dense(gelu(dense(layer_norm(x)))).
#include <cmath>

#include "common/core/rng.h"
#include "common/nn/init.h"
#include "common/nn/layers/elementwise.h"
#include "common/nn/layers/family.h"
#include "common/nn/layers/linear.h"
#include "common/nn/layers/norm.h"
#include "common/nn/layers/residual.h"

namespace localpar {
namespace {

// qkv = x W + b, per head softmax(q k^T / sqrt(d_head)) v over earlier positions only,
// then an output projection.
class CausalSelfAttention final : public Layer {
 public:
  CausalSelfAttention(Backend& b, const Shape& in, int64_t heads, uint64_t seed)
      : backend_(b), positions_(in[0]), width_(in[1]), heads_(heads), head_width_(in[1] / heads) {
    out_shape_ = in;
    float bound = 1.0f / std::sqrt(static_cast<float>(width_));
    wqkv_ = MakeParam(b, "qkv_weight",
                      UniformInit(b, {width_, 3 * width_}, bound, HashCombine(seed, 1)));
    bqkv_ = MakeParam(b, "qkv_bias", ConstantInit(b, {3 * width_}, 0.0f));
    out_proj_ =
        MakeParam(b, "out_weight", UniformInit(b, {width_, width_}, bound, HashCombine(seed, 2)));
    out_bias_ = MakeParam(b, "out_bias", ConstantInit(b, {width_}, 0.0f));
  }
  const char* kind() const override { return "causal_self_attention"; }

  // Saved per batch: saved[0] q|k|v by head [3, n, h, t, dh]; saved[1] attention
  // probabilities [n*h, t, t]; saved[2] the heads' outputs merged back to [n, t, d].
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    int64_t n = x.rows(), rows = n * positions_, mats = n * heads_, hd = positions_ * head_width_;
    c.saved.resize(3);
    Tensor &heads = c.saved[0], &probs = c.saved[1], &merged = c.saved[2];
    qkv_.Ensure(backend_, {rows, 3 * width_});
    backend_.Gemm(false, false, rows, 3 * width_, width_, 1.0f, x.f32(), wqkv_.value.f32(), 0.0f,
                  qkv_.f32());
    backend_.AddRowVector(qkv_.f32(), bqkv_.value.f32(), rows, 3 * width_);
    heads.Ensure(backend_, {3, n, heads_, positions_, head_width_});
    backend_.SplitHeads(qkv_.f32(), heads.f32(), n, positions_, 3, heads_, head_width_);
    const float* q = heads.f32();
    const float* k = q + mats * hd;
    const float* v = k + mats * hd;
    scores_.Ensure(backend_, {mats, positions_, positions_});
    backend_.GemmBatched(false, true, positions_, positions_, head_width_, 1.0f, q, hd, k, hd, 0.0f,
                         scores_.f32(), positions_ * positions_, mats);
    probs.Ensure(backend_, {mats, positions_, positions_});
    backend_.CausalSoftmaxForward(scores_.f32(), probs.f32(), mats, positions_, Scale());
    ctx_.Ensure(backend_, {n, heads_, positions_, head_width_});
    backend_.GemmBatched(false, false, positions_, head_width_, positions_, 1.0f, probs.f32(),
                         positions_ * positions_, v, hd, 0.0f, ctx_.f32(), hd, mats);
    merged.Ensure(backend_, {n, positions_, width_});
    backend_.MergeHeads(ctx_.f32(), merged.f32(), n, positions_, 1, heads_, head_width_);
    c.out.Ensure(backend_, {n, positions_, width_});
    backend_.Gemm(false, false, rows, width_, width_, 1.0f, merged.f32(), out_proj_.value.f32(),
                  0.0f, c.out.f32());
    backend_.AddRowVector(c.out.f32(), out_bias_.value.f32(), rows, width_);
  }

  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    Gradients(x, dy, c, dx, qkv_, true);
  }
  bool splits_backward() const override { return true; }
  // d(qkv) goes to the cache (aux0), where BackwardWeights finds it.
  void BackwardInput(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    Gradients(x, dy, c, dx, c.aux0, false);
  }
  void BackwardWeights(const Tensor& x, const Tensor& dy, LayerCache& c) override {
    OutputWeights(dy, c);
    InputWeights(x, c.aux0);
  }
  std::vector<Param*> params() override { return {&wqkv_, &bqkv_, &out_proj_, &out_bias_}; }

  // Decoding with a key-value cache: kept[0] and kept[1] hold every position's keys and
  // values so far, [heads, positions, head width]; the new positions' queries attend to
  // them. kept[2..] are scratch.
  bool ForwardPositions(const Tensor& x, int64_t start, DecodeCache& c) override {
    const int64_t count = x.numel() / width_, keys = start + count, dh = head_width_;
    if (start < 0 || keys > positions_ || (start > 0 && count != 1)) return false;
    c.kept.resize(8);
    Tensor &kc = c.kept[0], &vc = c.kept[1], &qkv = c.kept[2], &heads = c.kept[3];
    Tensor &scores = c.kept[4], &probs = c.kept[5], &ctx = c.kept[6], &merged = c.kept[7];
    if (start == 0) {
      kc.Ensure(backend_, {heads_ * positions_, dh});
      vc.Ensure(backend_, {heads_ * positions_, dh});
    }
    qkv.Ensure(backend_, {count, 3 * width_});
    backend_.Gemm(false, false, count, 3 * width_, width_, 1.0f, x.f32(), wqkv_.value.f32(), 0.0f,
                  qkv.f32());
    backend_.AddRowVector(qkv.f32(), bqkv_.value.f32(), count, 3 * width_);
    heads.Ensure(backend_, {3 * heads_ * count, dh});  // [3, heads, count, dh]
    backend_.SplitHeads(qkv.f32(), heads.f32(), 1, count, 3, heads_, dh);
    for (int64_t h = 0; h < heads_; ++h) {
      kc.Slice(h * positions_ + start, count).CopyFrom(heads.Slice((heads_ + h) * count, count));
      vc.Slice(h * positions_ + start, count)
          .CopyFrom(heads.Slice((2 * heads_ + h) * count, count));
    }
    scores.Ensure(backend_, {heads_ * count, keys});
    backend_.GemmBatched(false, true, count, keys, dh, 1.0f, heads.f32(), count * dh, kc.f32(),
                         positions_ * dh, 0.0f, scores.f32(), count * keys, heads_);
    probs.Ensure(backend_, {heads_ * count, keys});
    backend_.CachedCausalSoftmaxForward(scores.f32(), probs.f32(), heads_, count, keys, Scale());
    ctx.Ensure(backend_, {heads_ * count, dh});
    backend_.GemmBatched(false, false, count, dh, keys, 1.0f, probs.f32(), count * keys, vc.f32(),
                         positions_ * dh, 0.0f, ctx.f32(), count * dh, heads_);
    merged.Ensure(backend_, {count, width_});
    backend_.MergeHeads(ctx.f32(), merged.f32(), 1, count, 1, heads_, dh);
    c.out.Ensure(backend_, {count, width_});
    backend_.Gemm(false, false, count, width_, width_, 1.0f, merged.f32(), out_proj_.value.f32(),
                  0.0f, c.out.f32());
    backend_.AddRowVector(c.out.f32(), out_bias_.value.f32(), count, width_);
    return true;
  }

  ExportLayout TorchLayout(const Param& p, const Shape& nchw) const override {
    if (&p == &wqkv_) return TransposedLayout(width_, 3 * width_);
    if (&p == &out_proj_) return TransposedLayout(width_, width_);
    return Layer::TorchLayout(p, nchw);
  }
  // nanoGPT's module: qkv and out, each an nn.Linear.
  std::string TorchName(const Param& p) const override {
    if (&p == &wqkv_) return "qkv.weight";
    if (&p == &bqkv_) return "qkv.bias";
    if (&p == &out_proj_) return "out.weight";
    return "out.bias";
  }

  // [N, T, D] for any T up to the context: qkv split into heads, softmax(q k^T * scale)
  // over earlier positions, merged, then the output projection.
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    const int64_t t = positions_, d = width_, h = heads_, dh = head_width_;
    std::string qkv = OnnxAffine(g, *this, wqkv_, bqkv_, x);  // [N, T, 3D]; columns (part, head, j)
    std::string split =
        g.Transpose(g.Op("Reshape", {qkv, g.Ints({0, 0, 3, h, dh})}), {2, 0, 3, 1, 4});
    std::vector<std::string> parts;
    for (int64_t p = 0; p < 3; ++p) {
      parts.push_back(g.Op("Gather", {split, g.Index(p)}, {IntAttr("axis", 0)}));  // [N, H, T, dh]
    }
    std::string scores = g.Op("MatMul", {parts[0], g.Transpose(parts[1], {0, 1, 3, 2})});
    scores = g.Op("Mul", {scores, g.Scalar(Scale())});
    std::vector<float> mask(static_cast<size_t>(t * t), 0.0f);
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = i + 1; j < t; ++j) mask[i * t + j] = -INFINITY;
    }
    const std::string causal = g.Floats("causal_mask", {t, t}, mask);
    scores = g.Op("Add", {scores, g.Leading(causal, g.PositionsOf(x), {0, 1})});
    std::string probs = g.Op("Softmax", {scores}, {IntAttr("axis", -1)});
    std::string ctx = g.Op("MatMul", {probs, parts[2]});  // [N, H, T, dh]
    std::string merged =
        g.Op("Reshape", {g.Transpose(ctx, {0, 2, 1, 3}), g.Ints({0, 0, d})});  // [N, T, D]
    return OnnxAffine(g, *this, out_proj_, out_bias_, merged);
  }

 private:
  // The backward pass, d(qkv) into `dqkv` (scratch, or the cache's when the weights come
  // later); with `weights` the parameter gradients too.
  void Gradients(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx, Tensor& dqkv,
                 bool weights) {
    int64_t n = x.rows(), rows = n * positions_, mats = n * heads_, hd = positions_ * head_width_;
    const Tensor &heads = c.saved[0], &probs = c.saved[1];
    const float* q = heads.f32();
    const float* k = q + mats * hd;
    const float* v = k + mats * hd;
    // Output projection.
    if (weights) OutputWeights(dy, c);
    qkv_.Ensure(backend_, {rows, width_});  // scratch: d(merged)
    backend_.Gemm(false, true, rows, width_, width_, 1.0f, dy.f32(), out_proj_.value.f32(), 0.0f,
                  qkv_.f32());
    ctx_.Ensure(backend_, {n, heads_, positions_, head_width_});  // d(per-head outputs)
    backend_.SplitHeads(qkv_.f32(), ctx_.f32(), n, positions_, 1, heads_, head_width_);
    // Through probs @ v.
    dheads_.Ensure(backend_, {3, n, heads_, positions_, head_width_});
    float* dq = dheads_.f32();
    float* dk = dq + mats * hd;
    float* dv = dk + mats * hd;
    scores_.Ensure(backend_, {mats, positions_, positions_});  // d(probs)
    backend_.GemmBatched(false, true, positions_, positions_, head_width_, 1.0f, ctx_.f32(), hd, v,
                         hd, 0.0f, scores_.f32(), positions_ * positions_, mats);
    backend_.GemmBatched(true, false, positions_, head_width_, positions_, 1.0f, probs.f32(),
                         positions_ * positions_, ctx_.f32(), hd, 0.0f, dv, hd, mats);
    // Through the softmax, then q k^T.
    dscores_.Ensure(backend_, {mats, positions_, positions_});
    backend_.CausalSoftmaxBackward(probs.f32(), scores_.f32(), dscores_.f32(), mats, positions_,
                                   Scale());
    backend_.GemmBatched(false, false, positions_, head_width_, positions_, 1.0f, dscores_.f32(),
                         positions_ * positions_, k, hd, 0.0f, dq, hd, mats);
    backend_.GemmBatched(true, false, positions_, head_width_, positions_, 1.0f, dscores_.f32(),
                         positions_ * positions_, q, hd, 0.0f, dk, hd, mats);
    // Input projection.
    dqkv.Ensure(backend_, {rows, 3 * width_});
    backend_.MergeHeads(dheads_.f32(), dqkv.f32(), n, positions_, 3, heads_, head_width_);
    if (weights) InputWeights(x, dqkv);
    if (dx) {
      dx->Ensure(backend_, x.shape());
      backend_.Gemm(false, true, rows, width_, 3 * width_, 1.0f, dqkv.f32(), wqkv_.value.f32(),
                    0.0f, dx->f32());
    }
  }
  void OutputWeights(const Tensor& dy, LayerCache& c) {
    const int64_t rows = dy.rows() * positions_;
    backend_.Gemm(true, false, width_, width_, rows, 1.0f, c.saved[2].f32(), dy.f32(), 1.0f,
                  out_proj_.grad.f32());
    backend_.SumRows(dy.f32(), out_bias_.grad.f32(), rows, width_);
  }
  void InputWeights(const Tensor& x, const Tensor& dqkv) {
    const int64_t rows = x.rows() * positions_;
    backend_.Gemm(true, false, width_, 3 * width_, rows, 1.0f, x.f32(), dqkv.f32(), 1.0f,
                  wqkv_.grad.f32());
    backend_.SumRows(dqkv.f32(), bqkv_.grad.f32(), rows, 3 * width_);
  }
  float Scale() const { return 1.0f / std::sqrt(static_cast<float>(head_width_)); }
  Backend& backend_;
  int64_t positions_, width_, heads_, head_width_;
  Param wqkv_, bqkv_, out_proj_, out_bias_;
  // Scratch shared by every batch (one layer's forward and backward never overlap).
  Tensor qkv_, scores_, dscores_, ctx_, dheads_;
};

std::string SequenceShapeIssue(const Shape& in, int64_t heads) {
  if (in.size() != 2) return "needs a sequence input [positions, dim], got " + ShapeString(in);
  if (heads <= 0 || in[1] % heads != 0) {
    return "heads (" + std::to_string(heads) + ") must divide dim " + std::to_string(in[1]);
  }
  return "";
}

class AttentionKind final : public LayerKind {
 public:
  const char* name() const override { return "causal_self_attention"; }
  void Defaults(LayerConfig& c) const override { c.Default("heads", 1); }
  LayerIssue Check(const LayerConfig& c) const override {
    if (c.Int("heads", 1) <= 0) return {"heads", "must be > 0"};
    return {};
  }
  std::string Infer(const LayerConfig& c, const Shape& in, Shape* out) const override {
    *out = in;
    return SequenceShapeIssue(in, c.Int("heads", 1));
  }
  std::unique_ptr<Layer> Make(Backend& b, const LayerConfig& c, const Shape& in, uint64_t seed,
                              std::string*) const override {
    return std::make_unique<CausalSelfAttention>(b, in, c.Int("heads", 1), seed);
  }
  int64_t Parameters(const LayerConfig&, const Shape& in) const override {
    const double d = in.empty() ? 0.0 : static_cast<double>(in.back());
    return CountFromDouble(4 * d * d + 4 * d);  // qkv and output projections
  }
  double Flops(const LayerConfig&, const Shape& in) const override {
    // Four d x d projections per position, then scores Q K^T and their weighted sum of V
    // over every pair of positions (the mask is applied to a full matrix).
    const double d = in.empty() ? 0.0 : static_cast<double>(in.back());
    const double positions = d > 0 ? static_cast<double>(NumElements(in)) / d : 0.0;
    return 2.0 * 4.0 * positions * d * d + 2.0 * 2.0 * positions * positions * d;
  }
  double SavedValues(const LayerConfig& c, const Shape& in) const override {
    // The softmaxed scores, [heads, positions, positions].
    const double d = in.empty() ? 0.0 : static_cast<double>(in.back());
    const double positions = d > 0 ? static_cast<double>(NumElements(in)) / d : 0.0;
    return static_cast<double>(c.Int("heads", 1)) * positions * positions;
  }
};

class TransformerBlockKind final : public LayerKind {
 public:
  const char* name() const override { return "transformer_block"; }
  // mlp_hidden 0 stays: it means 4 x the block's width, known only from shapes.
  void Defaults(LayerConfig& c) const override { c.Default("heads", 1); }
  LayerIssue Check(const LayerConfig& c) const override {
    if (c.Int("heads", 1) <= 0) return {"heads", "must be > 0"};
    if (c.Int("mlp_hidden") < 0) return {"mlp_hidden", "must be >= 0 (0: 4 x the width)"};
    return {};
  }
  std::string Infer(const LayerConfig& c, const Shape& in, Shape* out) const override {
    *out = in;
    return SequenceShapeIssue(in, c.Int("heads", 1));
  }
  bool expands() const override { return true; }
  std::vector<LayerConfig> Expand(const LayerConfig& c, const Shape& in) const override {
    const int64_t dim = in.empty() ? 0 : in.back();
    const int64_t hidden = c.Int("mlp_hidden") > 0 ? c.Int("mlp_hidden") : 4 * dim;
    LayerConfig attention("causal_self_attention", {{"heads", c.Number("heads", 1)}});
    return {
        ResidualConfig({LayerNormConfig(), attention}),
        ResidualConfig({LayerNormConfig(), DenseConfig(hidden), GeluConfig(), DenseConfig(dim)})};
  }
  std::unique_ptr<Layer> Make(Backend&, const LayerConfig&, const Shape&, uint64_t,
                              std::string* error) const override {
    *error = "transformer_block: expanded before it is built";
    return nullptr;
  }
};

}  // namespace

const LayerKind& CausalSelfAttentionLayerKind() {
  static const AttentionKind kind;
  return kind;
}
const LayerKind& TransformerBlockLayerKind() {
  static const TransformerBlockKind kind;
  return kind;
}

}  // namespace localpar
