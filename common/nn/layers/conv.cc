// The convolution family, on NHWC images [height, width, channels]: `conv2d`, `max_pool`,
// `avg_pool` (windows with one stride and one zero padding on every side) and
// `global_avg_pool`. The backend's Conv and pool ops do the work (common/ops/conv, pool).
#include "common/nn/layers/conv.h"

#include <algorithm>
#include <cmath>

#include "common/core/check.h"
#include "common/core/rng.h"
#include "common/nn/init.h"
#include "common/nn/layers/family.h"

namespace localpar {
namespace {

int64_t PooledExtent(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  return (in + 2 * pad - k) / stride + 1;
}

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
  std::vector<OnnxAttribute> OnnxWindow() const {
    return {IntsAttr("kernel_shape", {kernel, kernel}), IntsAttr("strides", {stride, stride}),
            IntsAttr("pads", {padding, padding, padding, padding})};
  }
};

class Conv2d final : public SplitBackwardLayer {
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

  void BackwardInput(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    if (!dx) return;
    const ConvGeometry g = Geometry(x.rows());
    dx->Ensure(backend_, x.shape());
    backend_.ConvBackwardData(g, dy.f32(), weight_.value.f32(), dx->f32(), Workspace(g));
  }
  void BackwardWeights(const Tensor& x, const Tensor& dy, LayerCache&) override {
    const ConvGeometry g = Geometry(x.rows());
    backend_.ConvBackwardWeights(g, x.f32(), dy.f32(), weight_.grad.f32(), bias_.grad.f32(),
                                 Workspace(g));
  }
  std::vector<Param*> params() override { return {&weight_, &bias_}; }

  // Ours: [(ky * k + kx) * cin + ci, co]; PyTorch's (and ONNX's): [co, ci, ky, kx].
  ExportLayout TorchLayout(const Param& p, const Shape& nchw) const override {
    if (&p != &weight_) return Layer::TorchLayout(p, nchw);
    const int64_t k = window_.kernel, cin = window_.channels, cout = out_channels_;
    ExportLayout l;
    l.shape = {cout, cin, k, k};
    l.to_ours.resize(static_cast<size_t>(k * k * cin * cout));
    int64_t i = 0;
    for (int64_t co = 0; co < cout; ++co) {
      for (int64_t ci = 0; ci < cin; ++ci) {
        for (int64_t ky = 0; ky < k; ++ky) {
          for (int64_t kx = 0; kx < k; ++kx)
            l.to_ours[i++] = ((ky * k + kx) * cin + ci) * cout + co;
        }
      }
    }
    return l;
  }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    return g.ToNhwc(g.Op("Conv",
                         {g.ToNchw(x), g.Parameter(*this, weight_, /*torch_layout=*/true),
                          g.Parameter(*this, bias_)},
                         window_.OnnxWindow()));
  }

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
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    std::vector<OnnxAttribute> a = window_.OnnxWindow();
    if (!max_) a.push_back(IntAttr("count_include_pad", 1));  // localpar divides by k*k
    return g.ToNhwc(g.Op(max_ ? "MaxPool" : "AveragePool", {g.ToNchw(x)}, a));
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
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    return g.Op("ReduceMean", {x}, {IntsAttr("axes", {1, 2}), IntAttr("keepdims", 0)});
  }

 private:
  Backend& backend_;
  int64_t out_area_, channels_;
};

enum class Which { kConv, kMaxPool, kAvgPool, kGlobal };

class ConvKind final : public LayerKind {
 public:
  ConvKind(Which which, const char* name) : which_(which), name_(name) {}
  const char* name() const override { return name_; }
  void Defaults(LayerConfig& c) const override {
    if (which_ == Which::kGlobal) return;
    c.Default("kernel", Kernel(c));
    c.Default("stride", Stride(c));
  }
  LayerIssue Check(const LayerConfig& c) const override {
    if (which_ == Which::kGlobal) return {};
    if (which_ == Which::kConv && c.Int("out_channels") <= 0)
      return {"out_channels", "must be > 0"};
    if (Kernel(c) <= 0 || Stride(c) <= 0 || c.Int("padding") < 0) {
      return {"", "kernel and stride must be > 0, padding >= 0"};
    }
    return {};
  }
  std::string Infer(const LayerConfig& c, const Shape& in, Shape* out) const override {
    if (in.size() != 3) {
      return "needs an image input [height, width, channels], got " + ShapeString(in);
    }
    if (which_ == Which::kGlobal) {
      *out = {in[2]};
      return "";
    }
    if (which_ == Which::kConv && c.Int("out_channels") <= 0) return "out_channels must be > 0";
    const int64_t k = Kernel(c), stride = Stride(c), pad = c.Int("padding");
    if (k <= 0) return "kernel must be > 0";
    if (stride <= 0) return "stride must be > 0";
    if (pad < 0 || pad >= k) return "padding must be in [0, kernel)";
    const int64_t oh = PooledExtent(in[0], k, stride, pad),
                  ow = PooledExtent(in[1], k, stride, pad);
    if (oh <= 0 || ow <= 0)
      return "kernel " + std::to_string(k) + " does not fit input " + ShapeString(in);
    *out = {oh, ow, which_ == Which::kConv ? c.Int("out_channels") : in[2]};
    return "";
  }
  std::unique_ptr<Layer> Make(Backend& b, const LayerConfig& c, const Shape& in, uint64_t seed,
                              std::string*) const override {
    if (which_ == Which::kGlobal) return std::make_unique<GlobalAvgPool>(b, in);
    if (which_ == Which::kConv) {
      return std::make_unique<Conv2d>(b, in, c.Int("out_channels"), Kernel(c), Stride(c),
                                      c.Int("padding"), seed);
    }
    return std::make_unique<Pool2d>(b, in, which_ == Which::kMaxPool, Kernel(c), Stride(c),
                                    c.Int("padding"));
  }
  int64_t Parameters(const LayerConfig& c, const Shape& in) const override {
    if (which_ != Which::kConv) return 0;
    const double k = static_cast<double>(Kernel(c));
    const double channels = in.size() == 3 ? static_cast<double>(in[2]) : 0.0;
    return CountFromDouble((k * k * channels + 1) * c.Number("out_channels"));
  }
  double Flops(const LayerConfig& c, const Shape& in) const override {
    Shape out;
    if (which_ != Which::kConv || !Infer(c, in, &out).empty()) return 0;
    const double window = static_cast<double>(Kernel(c) * Kernel(c) * in[2]);
    return 2.0 * window * static_cast<double>(NumElements(out));
  }

 private:
  int64_t Kernel(const LayerConfig& c) const {
    return c.Int("kernel", which_ == Which::kConv ? 3 : 2);
  }
  int64_t Stride(const LayerConfig& c) const {
    return c.Int("stride", which_ == Which::kConv ? 1 : Kernel(c));
  }
  const Which which_;
  const char* const name_;
};

}  // namespace

LayerConfig Conv2dConfig(int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding) {
  return LayerConfig("conv2d", {{"out_channels", static_cast<double>(out_channels)},
                                {"kernel", static_cast<double>(kernel)},
                                {"stride", static_cast<double>(stride)},
                                {"padding", static_cast<double>(padding)}});
}
LayerConfig GlobalAvgPoolConfig() { return LayerConfig("global_avg_pool"); }

const LayerKind& Conv2dLayerKind() {
  static const ConvKind kind(Which::kConv, "conv2d");
  return kind;
}
const LayerKind& MaxPoolLayerKind() {
  static const ConvKind kind(Which::kMaxPool, "max_pool");
  return kind;
}
const LayerKind& AvgPoolLayerKind() {
  static const ConvKind kind(Which::kAvgPool, "avg_pool");
  return kind;
}
const LayerKind& GlobalAvgPoolLayerKind() {
  static const ConvKind kind(Which::kGlobal, "global_avg_pool");
  return kind;
}

}  // namespace localpar
