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
  Linear(Backend& b, int64_t in, int64_t out, uint64_t seed) : b_(b), in_(in), out_(out) {
    out_shape_ = {out};
    float bound = 1.0f / std::sqrt(static_cast<float>(in));
    w_ = MakeParam(b, "weight", UniformInit(b, {in, out}, bound, HashCombine(seed, 1)));
    bias_ = MakeParam(b, "bias", UniformInit(b, {out}, bound, HashCombine(seed, 2)));
  }
  const char* kind() const override { return "linear"; }

  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    int64_t n = x.rows();
    c.out.Ensure(b_, {n, out_});
    b_.Gemm(false, false, n, out_, in_, 1.0f, x.f32(), w_.value.f32(), 0.0f, c.out.f32());
    b_.AddRowVector(c.out.f32(), bias_.value.f32(), n, out_);
  }

  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    int64_t n = x.rows();
    b_.Gemm(true, false, in_, out_, n, 1.0f, x.f32(), dy.f32(), 1.0f, w_.grad.f32());
    b_.SumRows(dy.f32(), bias_.grad.f32(), n, out_);
    if (dx) {
      dx->Ensure(b_, x.shape());
      b_.Gemm(false, true, n, in_, out_, 1.0f, dy.f32(), w_.value.f32(), 0.0f, dx->f32());
    }
  }
  std::vector<Param*> params() override { return {&w_, &bias_}; }

 private:
  Backend& b_;
  int64_t in_, out_;
  Param w_, bias_;
};

// ---------------------------------------------------------------------------------------
class Relu final : public Layer {
 public:
  Relu(Backend& b, const Shape& in) : b_(b) { out_shape_ = in; }
  const char* kind() const override { return "relu"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    c.out.Ensure(b_, x.shape());
    b_.ReluForward(x.f32(), c.out.f32(), x.numel());
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    if (!dx) return;
    dx->Ensure(b_, x.shape());
    b_.ReluBackward(c.out.f32(), dy.f32(), dx->f32(), x.numel());
  }

 private:
  Backend& b_;
};

class Gelu final : public Layer {
 public:
  Gelu(Backend& b, const Shape& in) : b_(b) { out_shape_ = in; }
  const char* kind() const override { return "gelu"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    c.out.Ensure(b_, x.shape());
    b_.GeluForward(x.f32(), c.out.f32(), x.numel());
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    if (!dx) return;
    dx->Ensure(b_, x.shape());
    b_.GeluBackward(x.f32(), dy.f32(), dx->f32(), x.numel());
  }

 private:
  Backend& b_;
};

// ---------------------------------------------------------------------------------------
class LayerNorm final : public Layer {
 public:
  LayerNorm(Backend& b, const Shape& in, float eps) : b_(b), cols_(in.back()), eps_(eps) {
    out_shape_ = in;
    gamma_ = MakeParam(b, "gamma", ConstantInit(b, {cols_}, 1.0f));
    beta_ = MakeParam(b, "beta", ConstantInit(b, {cols_}, 0.0f));
  }
  const char* kind() const override { return "layer_norm"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    int64_t rows = x.numel() / cols_;
    c.out.Ensure(b_, x.shape());
    c.aux0.Ensure(b_, {rows});
    c.aux1.Ensure(b_, {rows});
    b_.LayerNormForward(x.f32(), gamma_.value.f32(), beta_.value.f32(), c.out.f32(), c.aux0.f32(),
                        c.aux1.f32(), rows, cols_, eps_);
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    int64_t rows = x.numel() / cols_;
    if (dx) dx->Ensure(b_, x.shape());
    b_.LayerNormBackward(dy.f32(), x.f32(), gamma_.value.f32(), c.aux0.f32(), c.aux1.f32(),
                         dx ? dx->f32() : nullptr, gamma_.grad.f32(), beta_.grad.f32(), rows,
                         cols_);
  }
  std::vector<Param*> params() override { return {&gamma_, &beta_}; }

 private:
  Backend& b_;
  int64_t cols_;
  float eps_;
  Param gamma_, beta_;
};

// ---------------------------------------------------------------------------------------
class Dropout final : public Layer {
 public:
  Dropout(Backend& b, const Shape& in, float p, uint64_t salt) : b_(b), p_(p), salt_(salt) {
    out_shape_ = in;
  }
  const char* kind() const override { return "dropout"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext& ctx) override {
    c.aux1 = Tensor();
    if (!ctx.train || p_ == 0.0f) {
      c.out = x;  // identity: share the input's storage
      return;
    }
    c.out.Ensure(b_, x.shape());
    c.aux0.Ensure(b_, x.shape());
    c.aux1 = c.aux0;  // marks "mask valid"
    b_.DropoutForward(x.f32(), c.out.f32(), c.aux0.f32(), x.numel(), p_,
                      HashCombine(ctx.seed, salt_));
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    if (!dx) return;
    if (!c.aux1.defined()) {
      *dx = dy;
      return;
    }
    dx->Ensure(b_, x.shape());
    b_.Mul(dy.f32(), c.aux0.f32(), dx->f32(), x.numel());
  }

 private:
  Backend& b_;
  float p_;
  uint64_t salt_;
};

// ---------------------------------------------------------------------------------------
// NHWC convolution as im2col + GEMM, processed in groups of images so the column buffer
// stays bounded; the backward pass recomputes the columns instead of storing them.
class Conv2d final : public Layer {
 public:
  Conv2d(Backend& b, const Shape& in, int64_t out_ch, int64_t k, int64_t stride, int64_t pad,
         uint64_t seed)
      : b_(b), h_(in[0]), w_(in[1]), c_(in[2]), oc_(out_ch), k_(k), s_(stride), p_(pad) {
    oh_ = PooledExtent(h_, k_, s_, p_);
    ow_ = PooledExtent(w_, k_, s_, p_);
    out_shape_ = {oh_, ow_, oc_};
    int64_t fan_in = k_ * k_ * c_;
    float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    weight_ = MakeParam(b, "weight", UniformInit(b, {fan_in, oc_}, bound, HashCombine(seed, 1)));
    bias_ = MakeParam(b, "bias", UniformInit(b, {oc_}, bound, HashCombine(seed, 2)));
    int64_t per_image = oh_ * ow_ * fan_in;
    group_ = std::max<int64_t>(1, kColumnBudget / std::max<int64_t>(1, per_image));
  }
  const char* kind() const override { return "conv2d"; }

  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    int64_t n = x.rows();
    c.out.Ensure(b_, {n, oh_, ow_, oc_});
    int64_t fan_in = k_ * k_ * c_;
    for (int64_t i0 = 0; i0 < n; i0 += group_) {
      int64_t g = std::min(group_, n - i0);
      col_.Ensure(b_, {g * oh_ * ow_, fan_in});
      b_.Im2Col(x.f32() + i0 * h_ * w_ * c_, col_.f32(), g, h_, w_, c_, k_, k_, s_, p_, oh_, ow_);
      b_.Gemm(false, false, g * oh_ * ow_, oc_, fan_in, 1.0f, col_.f32(), weight_.value.f32(), 0.0f,
              c.out.f32() + i0 * oh_ * ow_ * oc_);
    }
    b_.AddRowVector(c.out.f32(), bias_.value.f32(), n * oh_ * ow_, oc_);
  }

  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    int64_t n = x.rows();
    int64_t fan_in = k_ * k_ * c_;
    b_.SumRows(dy.f32(), bias_.grad.f32(), n * oh_ * ow_, oc_);
    if (dx) {
      dx->Ensure(b_, x.shape());
      b_.Fill(dx->f32(), 0.0f, dx->numel());
    }
    for (int64_t i0 = 0; i0 < n; i0 += group_) {
      int64_t g = std::min(group_, n - i0);
      int64_t rows = g * oh_ * ow_;
      const float* dyg = dy.f32() + i0 * oh_ * ow_ * oc_;
      col_.Ensure(b_, {rows, fan_in});
      b_.Im2Col(x.f32() + i0 * h_ * w_ * c_, col_.f32(), g, h_, w_, c_, k_, k_, s_, p_, oh_, ow_);
      b_.Gemm(true, false, fan_in, oc_, rows, 1.0f, col_.f32(), dyg, 1.0f, weight_.grad.f32());
      if (dx) {
        b_.Gemm(false, true, rows, fan_in, oc_, 1.0f, dyg, weight_.value.f32(), 0.0f, col_.f32());
        b_.Col2Im(col_.f32(), dx->f32() + i0 * h_ * w_ * c_, g, h_, w_, c_, k_, k_, s_, p_, oh_,
                  ow_);
      }
    }
  }
  std::vector<Param*> params() override { return {&weight_, &bias_}; }

 private:
  static constexpr int64_t kColumnBudget = 8 << 20;  // floats in the column buffer
  Backend& b_;
  int64_t h_, w_, c_, oc_, k_, s_, p_, oh_ = 0, ow_ = 0, group_ = 1;
  Param weight_, bias_;
  Tensor col_;  // scratch, reused by every batch (forward and backward never overlap)
};

// ---------------------------------------------------------------------------------------
class Pool2d final : public Layer {
 public:
  Pool2d(Backend& b, const Shape& in, bool max, int64_t k, int64_t stride, int64_t pad)
      : b_(b), max_(max), h_(in[0]), w_(in[1]), c_(in[2]), k_(k), s_(stride), p_(pad) {
    oh_ = PooledExtent(h_, k_, s_, p_);
    ow_ = PooledExtent(w_, k_, s_, p_);
    out_shape_ = {oh_, ow_, c_};
  }
  const char* kind() const override { return max_ ? "max_pool" : "avg_pool"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    int64_t n = x.rows();
    c.out.Ensure(b_, {n, oh_, ow_, c_});
    if (max_) {
      c.aux0.Ensure(b_, {n, oh_, ow_, c_}, DType::kI32);
      b_.MaxPoolForward(x.f32(), c.out.f32(), c.aux0.i32(), n, h_, w_, c_, k_, s_, p_, oh_, ow_);
    } else {
      b_.AvgPoolForward(x.f32(), c.out.f32(), n, h_, w_, c_, k_, s_, p_, oh_, ow_);
    }
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    if (!dx) return;
    int64_t n = x.rows();
    dx->Ensure(b_, x.shape());
    if (max_) {
      b_.MaxPoolBackward(dy.f32(), c.aux0.i32(), dx->f32(), n, h_, w_, c_, k_, s_, p_, oh_, ow_);
    } else {
      b_.AvgPoolBackward(dy.f32(), dx->f32(), n, h_, w_, c_, k_, s_, p_, oh_, ow_);
    }
  }

 private:
  Backend& b_;
  bool max_;
  int64_t h_, w_, c_, k_, s_, p_, oh_ = 0, ow_ = 0;
};

class GlobalAvgPool final : public Layer {
 public:
  GlobalAvgPool(Backend& b, const Shape& in) : b_(b), hw_(in[0] * in[1]), c_(in[2]) {
    out_shape_ = {c_};
  }
  const char* kind() const override { return "global_avg_pool"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    c.out.Ensure(b_, {x.rows(), c_});
    b_.GlobalAvgPoolForward(x.f32(), c.out.f32(), x.rows(), hw_, c_);
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    if (!dx) return;
    dx->Ensure(b_, x.shape());
    b_.GlobalAvgPoolBackward(dy.f32(), dx->f32(), x.rows(), hw_, c_);
  }

 private:
  Backend& b_;
  int64_t hw_, c_;
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
      : b_(b), dim_(dim) {
    out_shape_ = in;
    out_shape_.push_back(dim);
    table_ = MakeParam(b, "table", UniformInit(b, {vocab, dim}, 1.0f, HashCombine(seed, 1)));
  }
  const char* kind() const override { return "embedding"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    Shape s = x.shape();
    s.push_back(dim_);
    c.out.Ensure(b_, s);
    b_.EmbeddingForward(x.i32(), table_.value.f32(), c.out.f32(), x.numel(), dim_);
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor*) override {
    // Token ids have no gradient.
    b_.EmbeddingBackward(x.i32(), dy.f32(), table_.grad.f32(), x.numel(), dim_);
  }
  std::vector<Param*> params() override { return {&table_}; }

 private:
  Backend& b_;
  int64_t dim_;
  Param table_;
};

// ---------------------------------------------------------------------------------------
// y = x + body(x).
class Residual final : public Layer {
 public:
  Residual(Backend& b, std::vector<std::unique_ptr<Layer>> body, const Shape& in)
      : b_(b), body_(std::move(body)) {
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
    c.out.Ensure(b_, x.shape());
    b_.Add(x.f32(), in->f32(), c.out.f32(), x.numel());
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& c, Tensor* dx) override {
    const Tensor* g = &dy;
    for (size_t i = body_.size(); i-- > 0;) {
      const Tensor& in = i == 0 ? x : c.sub[i - 1].out;
      body_[i]->Backward(in, *g, c.sub[i], &c.sub_grads[i]);
      g = &c.sub_grads[i];
    }
    if (dx) {
      dx->Ensure(b_, x.shape());
      b_.Add(dy.f32(), g->f32(), dx->f32(), x.numel());
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
  Backend& b_;
  std::vector<std::unique_ptr<Layer>> body_;
};

}  // namespace

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
  }
  return "?";
}

bool InferLayerShape(const LayerConfig& cfg, const Shape& in, Shape* out, std::string* error) {
  using K = LayerConfig::Kind;
  auto fail = [&](const std::string& msg) {
    *error = std::string(LayerKindName(cfg.kind)) + ": " + msg;
    return false;
  };
  auto need_image = [&]() {
    if (in.size() != 3) {
      return fail("needs an image input [height, width, channels], got " + ShapeString(in));
    }
    return true;
  };
  auto pooled = [&](int64_t channels) {
    if (cfg.kernel <= 0) return fail("kernel must be > 0");
    if (cfg.stride <= 0) return fail("stride must be > 0");
    if (cfg.padding < 0 || cfg.padding >= cfg.kernel) {
      return fail("padding must be in [0, kernel)");
    }
    int64_t oh = PooledExtent(in[0], cfg.kernel, cfg.stride, cfg.padding);
    int64_t ow = PooledExtent(in[1], cfg.kernel, cfg.stride, cfg.padding);
    if (oh <= 0 || ow <= 0) {
      return fail("kernel " + std::to_string(cfg.kernel) + " does not fit input " +
                  ShapeString(in));
    }
    *out = {oh, ow, channels};
    return true;
  };
  switch (cfg.kind) {
    case K::kLinear:
      if (cfg.out_features <= 0) return fail("out_features must be > 0");
      if (cfg.in_features > 0 && cfg.in_features != NumElements(in)) {
        return fail("in_features " + std::to_string(cfg.in_features) + " does not match the " +
                    std::to_string(NumElements(in)) + " features of its input " + ShapeString(in));
      }
      *out = {cfg.out_features};
      return true;
    case K::kRelu:
    case K::kGelu:
      *out = in;
      return true;
    case K::kDropout:
      if (!(cfg.dropout >= 0.0f && cfg.dropout < 1.0f)) return fail("rate must be in [0, 1)");
      *out = in;
      return true;
    case K::kLayerNorm:
      if (in.empty()) return fail("needs at least one dimension");
      if (!(cfg.eps > 0.0f)) return fail("eps must be > 0");
      *out = in;
      return true;
    case K::kConv2d:
      if (!need_image()) return false;
      if (cfg.out_features <= 0) return fail("out_channels must be > 0");
      return pooled(cfg.out_features);
    case K::kMaxPool:
    case K::kAvgPool:
      if (!need_image()) return false;
      return pooled(in[2]);
    case K::kGlobalAvgPool:
      if (!need_image()) return false;
      *out = {in[2]};
      return true;
    case K::kFlatten:
      *out = {NumElements(in)};
      return true;
    case K::kEmbedding:
      if (cfg.vocab <= 0 || cfg.dim <= 0) return fail("vocab and dim must be > 0");
      *out = in;
      out->push_back(cfg.dim);
      return true;
    case K::kResidual: {
      Shape cur = in;
      for (size_t i = 0; i < cfg.body.size(); ++i) {
        Shape next;
        std::string e;
        if (!InferLayerShape(cfg.body[i], cur, &next, &e)) {
          return fail("body[" + std::to_string(i) + "]: " + e);
        }
        cur = next;
      }
      if (cur != in) {
        return fail("body output " + ShapeString(cur) + " differs from its input " +
                    ShapeString(in));
      }
      *out = in;
      return true;
    }
  }
  return fail("unknown layer kind");
}

std::unique_ptr<Layer> MakeLayer(Backend& b, const LayerConfig& cfg, const Shape& in, uint64_t seed,
                                 std::string* error) {
  Shape out;
  if (!InferLayerShape(cfg, in, &out, error)) return nullptr;
  using K = LayerConfig::Kind;
  switch (cfg.kind) {
    case K::kLinear:
      return std::make_unique<Linear>(b, NumElements(in), cfg.out_features, seed);
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
