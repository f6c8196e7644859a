// The layer zoo: linear, activations, layer norm, dropout, conv, pooling, flatten,
// embedding and residual blocks. Each delegates its arithmetic to Backend kernels.
#include <algorithm>
#include <cmath>
#include <string>

#include "common/core/rng.h"
#include "common/nn/init.h"
#include "common/nn/layer.h"

namespace localpar {
namespace {

Param MakeParam(Backend& backend, std::string name, Tensor value) {
  Param p;
  p.name = std::move(name);
  p.grad = Tensor::Zeros(backend, value.shape());
  p.value = std::move(value);
  return p;
}

int64_t PooledExtent(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  return (in + 2 * pad - k) / stride + 1;
}

// ---------------------------------------------------------------------------------------
class Linear final : public Layer {
 public:
  // tokenwise: maps the last dimension only ([..., in] -> [..., out]); otherwise the whole
  // example is flattened ([...] -> [out]).
  Linear(Backend& b, const Shape& in_shape, int64_t out, bool tokenwise, uint64_t seed)
      : backend_(b), out_(out), tokenwise_(tokenwise) {
    in_ = tokenwise ? in_shape.back() : NumElements(in_shape);
    out_shape_ = tokenwise ? in_shape : Shape{out};
    out_shape_.back() = out;
    float bound = 1.0f / std::sqrt(static_cast<float>(in_));
    weight_ = MakeParam(b, "weight", UniformInit(b, {in_, out}, bound, HashCombine(seed, 1)));
    bias_ = MakeParam(b, "bias", UniformInit(b, {out}, bound, HashCombine(seed, 2)));
  }
  const char* kind() const override { return tokenwise_ ? "dense" : "linear"; }

  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    int64_t n = x.numel() / in_;
    Shape s{x.rows()};
    s.insert(s.end(), out_shape_.begin(), out_shape_.end());
    c.out.Ensure(backend_, s);
    backend_.GemmBias(n, out_, in_, x.f32(), weight_.value.f32(), bias_.value.f32(), c.out.f32(),
                      fused_relu_);
  }

  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    int64_t n = x.numel() / in_;
    backend_.Gemm(true, false, in_, out_, n, 1.0f, x.f32(), dy.f32(), 1.0f, weight_.grad.f32());
    backend_.SumRows(dy.f32(), bias_.grad.f32(), n, out_);
    if (dx) {
      dx->Ensure(backend_, x.shape());
      backend_.Gemm(false, true, n, in_, out_, 1.0f, dy.f32(), weight_.value.f32(), 0.0f,
                    dx->f32());
    }
  }
  std::vector<Param*> params() override { return {&weight_, &bias_}; }

  // The ReLU after this layer runs in its GEMM's epilogue (FuseActivations). Its backward
  // needs only x and dy, so the output may be post-ReLU.
  bool fused_relu_ = false;

 private:
  Backend& backend_;
  int64_t in_ = 0, out_;
  bool tokenwise_;
  Param weight_, bias_;
};

// ---------------------------------------------------------------------------------------
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

  bool applied_by_previous_ = false;  // the preceding Linear applies it (FuseActivations)

 private:
  Backend& backend_;
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

 private:
  Backend& backend_;
};

// ---------------------------------------------------------------------------------------
class LayerNorm final : public Layer {
 public:
  LayerNorm(Backend& b, const Shape& in, float eps) : backend_(b), cols_(in.back()), eps_(eps) {
    out_shape_ = in;
    gamma_ = MakeParam(b, "gamma", ConstantInit(b, {cols_}, 1.0f));
    beta_ = MakeParam(b, "beta", ConstantInit(b, {cols_}, 0.0f));
  }
  const char* kind() const override { return "layer_norm"; }
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

 private:
  Backend& backend_;
  int64_t cols_;
  float eps_;
  Param gamma_, beta_;
};

// ---------------------------------------------------------------------------------------
// Batch norm over the last dimension (channels for NHWC images). Training normalises with
// the batch's statistics and updates the running ones; evaluation uses the running ones.
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

 private:
  Backend& backend_;
  int64_t cols_;
  float eps_, momentum_;
  Param gamma_, beta_, running_mean_, running_var_;
};

// ---------------------------------------------------------------------------------------
// x + PE for x of shape [positions, dim], with the fixed sinusoids of "Attention Is All
// You Need": PE[t, 2i] = sin(t / 10000^(2i/dim)), PE[t, 2i+1] = cos(same).
class PositionalEncoding final : public Layer {
 public:
  PositionalEncoding(Backend& b, const Shape& in) : backend_(b) {
    out_shape_ = in;
    table_ = Tensor::FromHost(b, {in[0] * in[1]}, PositionalEncodingTable(in[0], in[1]));
  }
  const char* kind() const override { return "positional_encoding"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    c.out.Ensure(backend_, x.shape());
    c.out.CopyFrom(x);
    backend_.AddRowVector(c.out.f32(), table_.f32(), x.rows(), table_.numel());
  }
  void Backward(const Tensor&, const Tensor& dy, LayerCache&, Tensor* dx) override {
    if (dx) *dx = dy;
  }

 private:
  Backend& backend_;
  Tensor table_;
};

// ---------------------------------------------------------------------------------------
// Causal multi-head self-attention on [positions, dim]: qkv = x W + b, per head
// softmax(q k^T / sqrt(d_head)) v over earlier positions only, then an output projection.
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
    int64_t n = x.rows(), rows = n * positions_, mats = n * heads_, hd = positions_ * head_width_;
    const Tensor &heads = c.saved[0], &probs = c.saved[1], &merged = c.saved[2];
    const float* q = heads.f32();
    const float* k = q + mats * hd;
    const float* v = k + mats * hd;
    // Output projection.
    backend_.Gemm(true, false, width_, width_, rows, 1.0f, merged.f32(), dy.f32(), 1.0f,
                  out_proj_.grad.f32());
    backend_.SumRows(dy.f32(), out_bias_.grad.f32(), rows, width_);
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
    qkv_.Ensure(backend_, {rows, 3 * width_});
    backend_.MergeHeads(dheads_.f32(), qkv_.f32(), n, positions_, 3, heads_, head_width_);
    backend_.Gemm(true, false, width_, 3 * width_, rows, 1.0f, x.f32(), qkv_.f32(), 1.0f,
                  wqkv_.grad.f32());
    backend_.SumRows(qkv_.f32(), bqkv_.grad.f32(), rows, 3 * width_);
    if (dx) {
      dx->Ensure(backend_, x.shape());
      backend_.Gemm(false, true, rows, width_, 3 * width_, 1.0f, qkv_.f32(), wqkv_.value.f32(),
                    0.0f, dx->f32());
    }
  }
  std::vector<Param*> params() override { return {&wqkv_, &bqkv_, &out_proj_, &out_bias_}; }

 private:
  float Scale() const { return 1.0f / std::sqrt(static_cast<float>(head_width_)); }
  Backend& backend_;
  int64_t positions_, width_, heads_, head_width_;
  Param wqkv_, bqkv_, out_proj_, out_bias_;
  // Scratch shared by every batch (one layer's forward and backward never overlap).
  Tensor qkv_, scores_, dscores_, ctx_, dheads_;
};

// ---------------------------------------------------------------------------------------
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

 private:
  Backend& backend_;
  float rate_;
  uint64_t salt_;
};

// ---------------------------------------------------------------------------------------
// The sliding window of a convolution or pooling layer over [height, width, channels].
struct ImageWindow {
  ImageWindow(const Shape& in, int64_t kernel_size, int64_t stride_size, int64_t pad)
      : height(in[0]),
        width(in[1]),
        channels(in[2]),
        kernel(kernel_size),
        stride(stride_size),
        padding(pad),
        out_height(PooledExtent(height, kernel, stride, padding)),
        out_width(PooledExtent(width, kernel, stride, padding)) {}
  const int64_t height, width, channels, kernel, stride, padding, out_height, out_width;
};

// NHWC convolution; the backend's Conv ops do the work (ops/conv).
class Conv2d final : public Layer {
 public:
  Conv2d(Backend& b, const Shape& in, int64_t out_ch, int64_t k, int64_t stride, int64_t pad,
         uint64_t seed)
      : backend_(b), window_(in, k, stride, pad), out_channels_(out_ch) {
    out_shape_ = {window_.out_height, window_.out_width, out_channels_};
    int64_t fan_in = window_.kernel * window_.kernel * window_.channels;
    float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    weight_ = MakeParam(b, "weight",
                        UniformInit(b, {fan_in, out_channels_}, bound, HashCombine(seed, 1)));
    bias_ = MakeParam(b, "bias", UniformInit(b, {out_channels_}, bound, HashCombine(seed, 2)));
  }
  const char* kind() const override { return "conv2d"; }

  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    const ConvGeometry g = Geometry(x.rows());
    c.out.Ensure(backend_, {g.n, g.oh, g.ow, g.out_channels});
    backend_.ConvForward(g, x.f32(), weight_.value.f32(), bias_.value.f32(), c.out.f32(),
                         Workspace(g));
  }

  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    const ConvGeometry g = Geometry(x.rows());
    backend_.ConvBackwardWeights(g, x.f32(), dy.f32(), weight_.grad.f32(), bias_.grad.f32(),
                                 Workspace(g));
    if (dx) {
      dx->Ensure(backend_, x.shape());
      backend_.ConvBackwardData(g, dy.f32(), weight_.value.f32(), dx->f32(), Workspace(g));
    }
  }
  std::vector<Param*> params() override { return {&weight_, &bias_}; }

 private:
  ConvGeometry Geometry(int64_t n) const {
    return {n,
            window_.height,
            window_.width,
            window_.channels,
            out_channels_,
            window_.kernel,
            window_.stride,
            window_.padding,
            window_.out_height,
            window_.out_width};
  }
  // The backend's scratch for this geometry, reused by every batch (forward and backward
  // never overlap).
  float* Workspace(const ConvGeometry& g) {
    workspace_.Ensure(backend_, {std::max<int64_t>(1, backend_.ConvWorkspaceFloats(g))});
    return workspace_.f32();
  }

  Backend& backend_;
  const ImageWindow window_;
  const int64_t out_channels_;
  Param weight_, bias_;
  Tensor workspace_;
};

// ---------------------------------------------------------------------------------------
class Pool2d final : public Layer {
 public:
  Pool2d(Backend& b, const Shape& in, bool max, int64_t k, int64_t stride, int64_t pad)
      : backend_(b), max_(max), window_(in, k, stride, pad) {
    out_shape_ = {window_.out_height, window_.out_width, window_.channels};
  }
  const char* kind() const override { return max_ ? "max_pool" : "avg_pool"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    int64_t n = x.rows();
    c.out.Ensure(backend_, {n, window_.out_height, window_.out_width, window_.channels});
    if (max_) {
      c.aux0.Ensure(backend_, {n, window_.out_height, window_.out_width, window_.channels},
                    DType::kI32);
      backend_.MaxPoolForward(x.f32(), c.out.f32(), c.aux0.i32(), n, window_.height, window_.width,
                              window_.channels, window_.kernel, window_.stride, window_.padding,
                              window_.out_height, window_.out_width);
    } else {
      backend_.AvgPoolForward(x.f32(), c.out.f32(), n, window_.height, window_.width,
                              window_.channels, window_.kernel, window_.stride, window_.padding,
                              window_.out_height, window_.out_width);
    }
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    if (!dx) return;
    int64_t n = x.rows();
    dx->Ensure(backend_, x.shape());
    if (max_) {
      backend_.MaxPoolBackward(dy.f32(), c.aux0.i32(), dx->f32(), n, window_.height, window_.width,
                               window_.channels, window_.kernel, window_.stride, window_.padding,
                               window_.out_height, window_.out_width);
    } else {
      backend_.AvgPoolBackward(dy.f32(), dx->f32(), n, window_.height, window_.width,
                               window_.channels, window_.kernel, window_.stride, window_.padding,
                               window_.out_height, window_.out_width);
    }
  }

 private:
  Backend& backend_;
  bool max_;
  const ImageWindow window_;
};

class GlobalAvgPool final : public Layer {
 public:
  GlobalAvgPool(Backend& b, const Shape& in)
      : backend_(b), out_area_(in[0] * in[1]), channels_(in[2]) {
    out_shape_ = {channels_};
  }
  const char* kind() const override { return "global_avg_pool"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    c.out.Ensure(backend_, {x.rows(), channels_});
    backend_.GlobalAvgPoolForward(x.f32(), c.out.f32(), x.rows(), out_area_, channels_);
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    if (!dx) return;
    dx->Ensure(backend_, x.shape());
    backend_.GlobalAvgPoolBackward(dy.f32(), dx->f32(), x.rows(), out_area_, channels_);
  }

 private:
  Backend& backend_;
  int64_t out_area_, channels_;
};

// Reshape only: output and input gradient share storage with their sources.
class Flatten final : public Layer {
 public:
  explicit Flatten(const Shape& in) { out_shape_ = {NumElements(in)}; }
  const char* kind() const override { return "flatten"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    c.out = x.Reshaped({x.rows(), x.row_size()});
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    if (dx) *dx = dy.Reshaped(x.shape());
  }
};

// ---------------------------------------------------------------------------------------
class Embedding final : public Layer {
 public:
  Embedding(Backend& b, const Shape& in, int64_t vocab, int64_t dim, uint64_t seed)
      : backend_(b), vocab_(vocab), dim_(dim) {
    out_shape_ = in;
    out_shape_.push_back(dim);
    table_ = MakeParam(b, "table", UniformInit(b, {vocab, dim}, 1.0f, HashCombine(seed, 1)));
  }
  const char* kind() const override { return "embedding"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    Shape s = x.shape();
    s.push_back(dim_);
    c.out.Ensure(backend_, s);
    backend_.EmbeddingForward(x.f32(), table_.value.f32(), c.out.f32(), x.numel(), dim_, vocab_);
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor*) override {
    // Token ids have no gradient.
    backend_.EmbeddingBackward(x.f32(), dy.f32(), table_.grad.f32(), x.numel(), dim_, vocab_);
  }
  std::vector<Param*> params() override { return {&table_}; }

 private:
  Backend& backend_;
  int64_t vocab_, dim_;
  Param table_;
};

// ---------------------------------------------------------------------------------------
// y = x + body(x).
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
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    const Tensor* g = &dy;
    for (size_t i = body_.size(); i-- > 0;) {
      const Tensor& in = i == 0 ? x : c.sub[i - 1].out;
      body_[i]->Backward(in, *g, c.sub[i], &c.sub_grads[i]);
      g = &c.sub_grads[i];
    }
    if (dx) {
      dx->Ensure(backend_, x.shape());
      backend_.Add(dy.f32(), g->f32(), dx->f32(), x.numel());
    }
  }
  std::vector<Param*> params() override {
    std::vector<Param*> out;
    for (auto& l : body_) {
      for (Param* p : l->params()) out.push_back(p);
    }
    return out;
  }

 private:
  Backend& backend_;
  std::vector<std::unique_ptr<Layer>> body_;
};

}  // namespace

std::vector<float> PositionalEncodingTable(int64_t positions, int64_t dim) {
  std::vector<float> pe(static_cast<size_t>(positions * dim));
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t i = 0; i < dim; ++i) {
      double freq = std::pow(10000.0, -static_cast<double>(i - i % 2) / static_cast<double>(dim));
      double a = static_cast<double>(p) * freq;
      pe[p * dim + i] = static_cast<float>(i % 2 == 0 ? std::sin(a) : std::cos(a));
    }
  }
  return pe;
}

const char* LayerKindName(LayerConfig::Kind kind) {
  using K = LayerConfig::Kind;
  switch (kind) {
    case K::kLinear:
      return "linear";
    case K::kRelu:
      return "relu";
    case K::kGelu:
      return "gelu";
    case K::kLayerNorm:
      return "layer_norm";
    case K::kDropout:
      return "dropout";
    case K::kConv2d:
      return "conv2d";
    case K::kMaxPool:
      return "max_pool";
    case K::kAvgPool:
      return "avg_pool";
    case K::kGlobalAvgPool:
      return "global_avg_pool";
    case K::kFlatten:
      return "flatten";
    case K::kEmbedding:
      return "embedding";
    case K::kResidual:
      return "residual";
    case K::kBatchNorm:
      return "batch_norm";
    case K::kDense:
      return "dense";
    case K::kPositionalEncoding:
      return "positional_encoding";
    case K::kCausalSelfAttention:
      return "causal_self_attention";
  }
  return "?";
}

namespace {

// Conv and pooling windows over an image [height, width, channels]: the output shape with
// `channels` channels, or why it does not fit ("" when it does).
std::string WindowedShape(const LayerConfig& cfg, const Shape& in, int64_t channels, Shape* out) {
  if (in.size() != 3)
    return "needs an image input [height, width, channels], got " + ShapeString(in);
  if (cfg.kernel <= 0) return "kernel must be > 0";
  if (cfg.stride <= 0) return "stride must be > 0";
  if (cfg.padding < 0 || cfg.padding >= cfg.kernel) return "padding must be in [0, kernel)";
  int64_t oh = PooledExtent(in[0], cfg.kernel, cfg.stride, cfg.padding);
  int64_t ow = PooledExtent(in[1], cfg.kernel, cfg.stride, cfg.padding);
  if (oh <= 0 || ow <= 0) {
    return "kernel " + std::to_string(cfg.kernel) + " does not fit input " + ShapeString(in);
  }
  *out = {oh, ow, channels};
  return "";
}

// Layers that keep their input's shape and check only their settings.
std::string ShapePreserving(const LayerConfig& cfg, const Shape& in) {
  using K = LayerConfig::Kind;
  switch (cfg.kind) {
    case K::kDropout:
      return cfg.dropout >= 0.0f && cfg.dropout < 1.0f ? "" : "rate must be in [0, 1)";
    case K::kLayerNorm:
    case K::kBatchNorm:
      if (in.empty()) return "needs at least one dimension";
      if (!(cfg.eps > 0.0f)) return "eps must be > 0";
      if (cfg.kind == K::kBatchNorm && !(cfg.momentum >= 0.0f && cfg.momentum <= 1.0f)) {
        return "momentum must be in [0, 1]";
      }
      return "";
    case K::kPositionalEncoding:
    case K::kCausalSelfAttention:
      if (in.size() != 2) return "needs a sequence input [positions, dim], got " + ShapeString(in);
      if (cfg.kind == K::kCausalSelfAttention && (cfg.heads <= 0 || in[1] % cfg.heads != 0)) {
        return "heads (" + std::to_string(cfg.heads) + ") must divide dim " + std::to_string(in[1]);
      }
      return "";
    default:
      return "";
  }
}

std::string ResidualShape(const LayerConfig& cfg, const Shape& in) {
  Shape cur = in;
  for (size_t i = 0; i < cfg.body.size(); ++i) {
    Shape next;
    std::string e;
    if (!InferLayerShape(cfg.body[i], cur, &next, &e))
      return "body[" + std::to_string(i) + "]: " + e;
    cur = next;
  }
  if (cur != in)
    return "body output " + ShapeString(cur) + " differs from its input " + ShapeString(in);
  return "";
}

}  // namespace

bool InferLayerShape(const LayerConfig& cfg, const Shape& in, Shape* out, std::string* error) {
  using K = LayerConfig::Kind;
  auto result = [&](const std::string& why) {
    if (why.empty()) return true;
    *error = std::string(LayerKindName(cfg.kind)) + ": " + why;
    return false;
  };
  switch (cfg.kind) {
    case K::kLinear:
      if (cfg.out_features <= 0) return result("out_features must be > 0");
      if (cfg.in_features > 0 && cfg.in_features != NumElements(in)) {
        return result("in_features " + std::to_string(cfg.in_features) + " does not match the " +
                      std::to_string(NumElements(in)) + " features of its input " +
                      ShapeString(in));
      }
      *out = {cfg.out_features};
      return true;
    case K::kRelu:
    case K::kGelu:
    case K::kDropout:
    case K::kLayerNorm:
    case K::kBatchNorm:
    case K::kPositionalEncoding:
    case K::kCausalSelfAttention:
      *out = in;
      return result(ShapePreserving(cfg, in));
    case K::kResidual:
      *out = in;
      return result(ResidualShape(cfg, in));
    case K::kConv2d:
      if (cfg.out_features <= 0) return result("out_channels must be > 0");
      return result(WindowedShape(cfg, in, cfg.out_features, out));
    case K::kMaxPool:
    case K::kAvgPool:
      return result(WindowedShape(cfg, in, in.size() == 3 ? in[2] : 0, out));
    case K::kGlobalAvgPool:
      if (in.size() != 3) {
        return result("needs an image input [height, width, channels], got " + ShapeString(in));
      }
      *out = {in[2]};
      return true;
    case K::kFlatten:
      *out = {NumElements(in)};
      return true;
    case K::kEmbedding:
      if (cfg.vocab <= 0 || cfg.dim <= 0) return result("vocab and dim must be > 0");
      *out = in;
      out->push_back(cfg.dim);
      return true;
    case K::kDense:
      if (in.empty()) return result("needs at least one dimension");
      if (cfg.out_features <= 0) return result("out_features must be > 0");
      if (cfg.in_features > 0 && cfg.in_features != in.back()) {
        return result("in_features " + std::to_string(cfg.in_features) +
                      " does not match the last dimension of its input " + ShapeString(in));
      }
      *out = in;
      out->back() = cfg.out_features;
      return true;
  }
  return result("unknown layer kind");
}

namespace {

// f(layer, its input shape) added up over a residual block's body, each layer taking the
// shape the one before it makes.
template <typename T>
T SumOverBody(const LayerConfig& cfg, const Shape& in, T (*f)(const LayerConfig&, const Shape&)) {
  T n = 0;
  Shape cur = in;
  std::string ignored;
  for (const LayerConfig& b : cfg.body) {
    n += f(b, cur);
    Shape next;
    if (InferLayerShape(b, cur, &next, &ignored)) cur = next;
  }
  return n;
}

}  // namespace

int64_t LayerParameterCount(const LayerConfig& cfg, const Shape& in) {
  using K = LayerConfig::Kind;
  const int64_t last = in.empty() ? 0 : in.back();
  switch (cfg.kind) {
    case K::kLinear:
      return (NumElements(in) + 1) * cfg.out_features;
    case K::kDense:
      return (last + 1) * cfg.out_features;
    case K::kConv2d:
      return (cfg.kernel * cfg.kernel * (in.size() == 3 ? in[2] : 0) + 1) * cfg.out_features;
    case K::kLayerNorm:
      return 2 * last;
    case K::kBatchNorm:
      return 4 * last;  // scale, shift, running mean and variance
    case K::kEmbedding:
      return cfg.vocab * cfg.dim;
    case K::kCausalSelfAttention:
      return 4 * last * last + 4 * last;  // qkv and output projections
    case K::kResidual:
      return SumOverBody<int64_t>(cfg, in, LayerParameterCount);
    default:
      return 0;
  }
}

double LayerForwardFlops(const LayerConfig& cfg, const Shape& in) {
  using K = LayerConfig::Kind;
  const double last = in.empty() ? 0.0 : static_cast<double>(in.back());
  const double elements = static_cast<double>(NumElements(in));
  const double positions = last > 0 ? elements / last : 0.0;
  Shape out;
  std::string ignored;
  switch (cfg.kind) {
    case K::kLinear:
      return 2.0 * elements * static_cast<double>(cfg.out_features);
    case K::kDense:
      return 2.0 * positions * last * static_cast<double>(cfg.out_features);
    case K::kConv2d: {
      if (!InferLayerShape(cfg, in, &out, &ignored) || out.size() != 3 || in.size() != 3) return 0;
      const double window = static_cast<double>(cfg.kernel * cfg.kernel) * last;
      return 2.0 * window * static_cast<double>(NumElements(out));
    }
    case K::kCausalSelfAttention:
      // Four d x d projections per position, then scores Q K^T and their weighted sum of V
      // over every pair of positions (the mask is applied to a full matrix).
      return 2.0 * 4.0 * positions * last * last + 2.0 * 2.0 * positions * positions * last;
    case K::kResidual:
      return SumOverBody<double>(cfg, in, LayerForwardFlops);
    default:
      return 0;  // elementwise, normalisation, pooling and lookups: no multiply-adds
  }
}

void FuseActivations(std::vector<std::unique_ptr<Layer>>& layers) {
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    auto* linear = dynamic_cast<Linear*>(layers[i].get());
    auto* relu = dynamic_cast<Relu*>(layers[i + 1].get());
    if (linear && relu) {
      linear->fused_relu_ = true;
      relu->applied_by_previous_ = true;
    }
  }
}

std::unique_ptr<Layer> MakeLayer(Backend& b, const LayerConfig& cfg, const Shape& in, uint64_t seed,
                                 std::string* error) {
  Shape out;
  if (!InferLayerShape(cfg, in, &out, error)) return nullptr;
  using K = LayerConfig::Kind;
  switch (cfg.kind) {
    case K::kLinear:
    case K::kDense:
      return std::make_unique<Linear>(b, in, cfg.out_features, cfg.kind == K::kDense, seed);
    case K::kBatchNorm:
      return std::make_unique<BatchNorm>(b, in, cfg.eps, cfg.momentum);
    case K::kPositionalEncoding:
      return std::make_unique<PositionalEncoding>(b, in);
    case K::kCausalSelfAttention:
      return std::make_unique<CausalSelfAttention>(b, in, cfg.heads, seed);
    case K::kRelu:
      return std::make_unique<Relu>(b, in);
    case K::kGelu:
      return std::make_unique<Gelu>(b, in);
    case K::kLayerNorm:
      return std::make_unique<LayerNorm>(b, in, cfg.eps);
    case K::kDropout:
      return std::make_unique<Dropout>(b, in, cfg.dropout, seed);
    case K::kConv2d:
      return std::make_unique<Conv2d>(b, in, cfg.out_features, cfg.kernel, cfg.stride, cfg.padding,
                                      seed);
    case K::kMaxPool:
    case K::kAvgPool:
      return std::make_unique<Pool2d>(b, in, cfg.kind == K::kMaxPool, cfg.kernel, cfg.stride,
                                      cfg.padding);
    case K::kGlobalAvgPool:
      return std::make_unique<GlobalAvgPool>(b, in);
    case K::kFlatten:
      return std::make_unique<Flatten>(in);
    case K::kEmbedding:
      return std::make_unique<Embedding>(b, in, cfg.vocab, cfg.dim, seed);
    case K::kResidual: {
      std::vector<std::unique_ptr<Layer>> body;
      Shape cur = in;
      for (size_t i = 0; i < cfg.body.size(); ++i) {
        auto l = MakeLayer(b, cfg.body[i], cur, HashCombine(seed, 100 + i), error);
        if (!l) return nullptr;
        cur = l->output_shape();
        body.push_back(std::move(l));
      }
      return std::make_unique<Residual>(b, std::move(body), in);
    }
  }
  *error = "unknown layer kind";
  return nullptr;
}

}  // namespace localpar
