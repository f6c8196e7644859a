// The linear family: `linear` (the whole example flattened to out_features) and `dense` (the
// last dimension only, per position). x W + b with W [in, out], one GEMM with the bias (and
// a following ReLU) in its epilogue.
#include "common/nn/layers/linear.h"

#include <cmath>

#include "common/core/rng.h"
#include "common/nn/init.h"
#include "common/nn/layers/family.h"

namespace localpar {
namespace {

class Linear final : public SplitBackwardLayer {
 public:
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

  void BackwardInput(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    if (!dx) return;
    int64_t n = x.numel() / in_;
    dx->Ensure(backend_, x.shape());
    backend_.Gemm(false, true, n, in_, out_, 1.0f, dy.f32(), weight_.value.f32(), 0.0f, dx->f32());
  }
  void BackwardWeights(const Tensor& x, const Tensor& dy, LayerCache&) override {
    int64_t n = x.numel() / in_;
    backend_.Gemm(true, false, in_, out_, n, 1.0f, x.f32(), dy.f32(), 1.0f, weight_.grad.f32());
    backend_.SumRows(dy.f32(), bias_.grad.f32(), n, out_);
  }
  std::vector<Param*> params() override { return {&weight_, &bias_}; }
  bool ForwardPositions(const Tensor& x, int64_t, DecodeCache& c) override {
    if (!tokenwise_) return false;  // it mixes the positions
    const int64_t n = x.numel() / in_;
    c.out.Ensure(backend_, {n, out_});
    backend_.GemmBias(n, out_, in_, x.f32(), weight_.value.f32(), bias_.value.f32(), c.out.f32(),
                      fused_relu_);
    return true;
  }

  // The ReLU after this layer runs in its GEMM's epilogue. Its backward needs only x and
  // dy, so the output may be post-ReLU.
  bool TakeEpilogue(Epilogue e) override {
    if (e != Epilogue::kRelu) return false;
    fused_relu_ = true;
    return true;
  }

  // PyTorch's [out, in], its inputs in the order torch.flatten gives an [C, H, W] image
  // (ours are [H, W, C]) when the input is one, or was one before a flatten layer.
  ExportLayout TorchLayout(const Param& p, const Shape& nchw) const override {
    if (&p != &weight_) return Layer::TorchLayout(p, nchw);
    const Shape& image = !tokenwise_ && in_shape_.size() == 3 ? in_shape_ : nchw;
    if (tokenwise_ || image.size() != 3 || NumElements(image) != in_) {
      return TransposedLayout(in_, out_);
    }
    const int64_t h = image[0], w = image[1], c = image[2];
    ExportLayout l;
    l.shape = {out_, in_};
    l.to_ours.resize(static_cast<size_t>(in_ * out_));
    int64_t i = 0;
    for (int64_t o = 0; o < out_; ++o) {
      for (int64_t ci = 0; ci < c; ++ci) {
        for (int64_t y = 0; y < h; ++y) {
          for (int64_t x = 0; x < w; ++x) l.to_ours[i++] = ((y * w + x) * c + ci) * out_ + o;
        }
      }
    }
    return l;
  }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    std::string flat = x;
    if (!tokenwise_ && in_shape_.size() != 1) flat = g.Op("Flatten", {x}, {IntAttr("axis", 1)});
    return OnnxAffine(g, *this, weight_, bias_, flat);
  }

 private:
  Backend& backend_;
  int64_t in_ = 0, out_;
  bool tokenwise_;
  bool fused_relu_ = false;
  Param weight_, bias_;
};

class LinearKind final : public LayerKind {
 public:
  explicit LinearKind(bool tokenwise) : tokenwise_(tokenwise) {}
  const char* name() const override { return tokenwise_ ? "dense" : "linear"; }
  LayerIssue Check(const LayerConfig& c) const override {
    if (c.Int("out_features") <= 0) return {"out_features", "must be > 0"};
    if (c.Int("in_features") < 0) return {"in_features", "must be >= 0"};
    return {};
  }
  std::string Infer(const LayerConfig& c, const Shape& in, Shape* out) const override {
    const int64_t features = c.Int("out_features"), declared = c.Int("in_features");
    if (tokenwise_ && in.empty()) return "needs at least one dimension";
    if (features <= 0) return "out_features must be > 0";
    const int64_t have = tokenwise_ ? in.back() : NumElements(in);
    if (declared > 0 && declared != have) {
      return "in_features " + std::to_string(declared) +
             (tokenwise_ ? " does not match the last dimension of its input " + ShapeString(in)
                         : " does not match the " + std::to_string(have) +
                               " features of its input " + ShapeString(in));
    }
    if (tokenwise_) {
      *out = in;
      out->back() = features;
    } else {
      *out = {features};
    }
    return "";
  }
  std::unique_ptr<Layer> Make(Backend& b, const LayerConfig& c, const Shape& in, uint64_t seed,
                              std::string*) const override {
    return std::make_unique<Linear>(b, in, c.Int("out_features"), tokenwise_, seed);
  }
  int64_t Parameters(const LayerConfig& c, const Shape& in) const override {
    const int64_t have = tokenwise_ ? (in.empty() ? 0 : in.back()) : NumElements(in);
    return CountFromDouble((static_cast<double>(have) + 1) * c.Number("out_features"));
  }
  double Flops(const LayerConfig& c, const Shape& in) const override {
    // 2 per multiply-add: every input element meets every output feature of its row.
    return 2.0 * static_cast<double>(NumElements(in)) * static_cast<double>(c.Int("out_features"));
  }

 private:
  const bool tokenwise_;
};

}  // namespace

LayerConfig LinearConfig(int64_t out_features) {
  return LayerConfig("linear", {{"out_features", static_cast<double>(out_features)}});
}
LayerConfig DenseConfig(int64_t out_features) {
  return LayerConfig("dense", {{"out_features", static_cast<double>(out_features)}});
}

const LayerKind& LinearLayerKind() {
  static const LinearKind kind(false);
  return kind;
}
const LayerKind& DenseLayerKind() {
  static const LinearKind kind(true);
  return kind;
}

}  // namespace localpar
