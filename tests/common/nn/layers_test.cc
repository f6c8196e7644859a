// Every layer's backward pass against central finite differences, and every layer on CUDA
// against the same layer on the CPU (same seed, same inputs).
#include <gtest/gtest.h>

#include <cmath>

#include "common/core/rng.h"
#include "common/nn/layer.h"
#include "common/nn/stage.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::AllClose;
using testing::RandomVector;

struct LayerCase {
  std::string name;
  LayerConfig config;
  Shape input;  // with batch
  float eps = 1e-2f;
  // Inputs on a grid of distinct values (for max pooling, where ties break FD).
  bool distinct_inputs = false;
  // Inputs kept away from 0 (for ReLU's kink).
  bool away_from_zero = false;
};

// Keeps test names and listings readable.
void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

// A layer of `kind`: `out` is the output width (linear, dense) or channels (conv2d); the
// window settings matter to convolutions and pools only.
LayerConfig Cfg(const std::string& kind, int64_t out = 0, int64_t kernel = 3, int64_t stride = 1,
                int64_t pad = 0) {
  LayerConfig c(kind);
  if (out > 0) {
    c.Set("out_features", static_cast<double>(out));
    c.Set("out_channels", static_cast<double>(out));
  }
  c.Set("kernel", static_cast<double>(kernel));
  c.Set("stride", static_cast<double>(stride));
  c.Set("padding", static_cast<double>(pad));
  return c;
}

std::vector<LayerCase> Cases() {
  std::vector<LayerCase> cases;
  cases.push_back({"linear", Cfg("linear", 5), {3, 7}});
  cases.push_back({"linear_on_image", Cfg("linear", 4), {2, 3, 3, 2}});
  LayerCase relu{"relu", Cfg("relu"), {4, 6}};
  relu.away_from_zero = true;
  cases.push_back(relu);
  cases.push_back({"gelu", Cfg("gelu"), {4, 6}});
  LayerConfig ln = Cfg("layer_norm");
  cases.push_back({"layer_norm", ln, {3, 2, 8}, 1e-2f});
  cases.push_back({"conv2d", Cfg("conv2d", 4, 3, 1, 1), {2, 5, 5, 3}});
  cases.push_back({"conv2d_strided", Cfg("conv2d", 3, 3, 2, 0), {2, 7, 6, 2}});
  LayerCase mp{"max_pool", Cfg("max_pool", 0, 2, 2, 0), {2, 4, 4, 3}, 1e-3f};
  mp.distinct_inputs = true;
  cases.push_back(mp);
  LayerCase mpo{"max_pool_overlapping_padded", Cfg("max_pool", 0, 3, 2, 1), {2, 5, 5, 2}, 1e-3f};
  mpo.distinct_inputs = true;
  cases.push_back(mpo);
  cases.push_back({"avg_pool", Cfg("avg_pool", 0, 3, 2, 1), {2, 5, 5, 2}});
  cases.push_back({"global_avg_pool", Cfg("global_avg_pool"), {3, 4, 4, 5}});
  cases.push_back({"flatten", Cfg("flatten"), {3, 2, 2, 2}});
  LayerConfig res = Cfg("residual");
  res.body = {Cfg("conv2d", 3, 3, 1, 1), Cfg("gelu"), Cfg("conv2d", 3, 3, 1, 1)};
  cases.push_back({"residual_conv_block", res, {2, 4, 4, 3}});
  LayerConfig res_mlp = Cfg("residual");
  res_mlp.body = {Cfg("layer_norm"), Cfg("linear", 8), Cfg("gelu"), Cfg("linear", 6)};
  cases.push_back({"residual_prenorm_mlp", res_mlp, {3, 6}});
  cases.push_back({"batch_norm_image", Cfg("batch_norm"), {3, 2, 2, 4}, 1e-2f});
  cases.push_back({"batch_norm_features", Cfg("batch_norm"), {5, 3}, 1e-2f});
  cases.push_back({"dense_per_position", Cfg("dense", 5), {2, 3, 4}});
  cases.push_back({"positional_encoding", Cfg("positional_encoding"), {2, 5, 6}});
  cases.push_back({"position_embedding", Cfg("position_embedding"), {2, 5, 6}});
  LayerConfig attn = Cfg("causal_self_attention");
  attn.Set("heads", 2);
  cases.push_back({"causal_self_attention", attn, {2, 5, 8}});
  LayerConfig attn1 = Cfg("causal_self_attention");
  cases.push_back({"causal_self_attention_one_head", attn1, {1, 4, 6}});
  LayerConfig block = Cfg("residual");
  block.body = {Cfg("layer_norm"), attn};
  cases.push_back({"residual_prenorm_attention", block, {2, 4, 8}});
  LayerConfig resnet = Cfg("residual");
  resnet.body = {Cfg("conv2d", 3, 3, 1, 1), Cfg("batch_norm"), Cfg("gelu"),
                 Cfg("conv2d", 3, 3, 1, 1), Cfg("batch_norm")};
  cases.push_back({"residual_conv_bn_block", resnet, {3, 4, 4, 3}});
  return cases;
}

std::vector<float> MakeInput(const LayerCase& c, uint64_t seed) {
  size_t n = static_cast<size_t>(NumElements(c.input));
  std::vector<float> x = RandomVector(n, seed);
  if (c.distinct_inputs) {
    // A shuffled grid 0.01 apart: every window has a clear maximum.
    Rng rng(seed);
    for (size_t i = 0; i < n; ++i) x[i] = 0.01f * static_cast<float>(i) - 0.005f * n;
    for (size_t i = n; i > 1; --i) std::swap(x[i - 1], x[rng.NextBelow(i)]);
  }
  if (c.away_from_zero) {
    for (float& v : x) v = v < 0 ? v - 0.1f : v + 0.1f;
  }
  return x;
}

// Scalar objective: sum_i w_i * y_i, so d/dy = w.
double Objective(Layer& layer, const Tensor& x, const std::vector<float>& w) {
  LayerCache cache;
  layer.Forward(x, cache, ForwardContext{true, 7});
  std::vector<float> y = cache.out.ToHost();
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(w[i]) * y[i];
  return s;
}

class LayerGradient : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LayerGradient, BackwardMatchesFiniteDifferences) {
  const LayerCase& c = GetParam();
  auto cpu = MakeCpuBackend();
  Shape per_example(c.input.begin() + 1, c.input.end());
  std::string error;
  auto layer = MakeLayer(*cpu, c.config, per_example, 99, &error);
  ASSERT_TRUE(layer) << error;
  std::vector<float> xv = MakeInput(c, 1);
  Tensor x = Tensor::FromHost(*cpu, c.input, xv);

  LayerCache cache;
  layer->Forward(x, cache, ForwardContext{true, 7});
  std::vector<float> w = RandomVector(static_cast<size_t>(cache.out.numel()), 2);
  Tensor dy = Tensor::FromHost(*cpu, cache.out.shape(), w);
  Tensor dx;
  layer->Backward(x, dy, cache, &dx);
  std::vector<float> analytic_dx = dx.ToHost();

  std::vector<float> numeric_dx(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    float orig = x.f32()[i];
    x.f32()[i] = orig + c.eps;
    double up = Objective(*layer, x, w);
    x.f32()[i] = orig - c.eps;
    double down = Objective(*layer, x, w);
    x.f32()[i] = orig;
    numeric_dx[i] = static_cast<float>((up - down) / (2 * c.eps));
  }
  EXPECT_TRUE(AllClose(analytic_dx, numeric_dx, 2e-3f, 2e-2f)) << "d/dx of " << c.name;

  for (Param* p : layer->params()) {
    if (!p->trainable) continue;  // running statistics: no gradient
    std::vector<float> analytic = p->grad.ToHost();
    std::vector<float> numeric(analytic.size());
    for (size_t i = 0; i < analytic.size(); ++i) {
      float orig = p->value.f32()[i];
      p->value.f32()[i] = orig + c.eps;
      double up = Objective(*layer, x, w);
      p->value.f32()[i] = orig - c.eps;
      double down = Objective(*layer, x, w);
      p->value.f32()[i] = orig;
      numeric[i] = static_cast<float>((up - down) / (2 * c.eps));
    }
    EXPECT_TRUE(AllClose(analytic, numeric, 2e-3f, 2e-2f)) << c.name << "." << p->name;
  }
}

// Zero-bubble schedules: two micro-batches' input halves, then their weight halves (each
// from its own cache, as two slots), give the input gradients and the accumulated parameter
// gradients of two whole backward passes, bit for bit.
TEST_P(LayerGradient, SplitBackwardEqualsTheWholeBitForBit) {
  const LayerCase& c = GetParam();
  auto cpu = MakeCpuBackend();
  Shape per_example(c.input.begin() + 1, c.input.end());
  std::string error;
  auto whole = MakeLayer(*cpu, c.config, per_example, 99, &error);
  auto split = MakeLayer(*cpu, c.config, per_example, 99, &error);
  ASSERT_TRUE(whole && split) << error;
  Tensor x[2], dy[2], dx_whole[2], dx_split[2];
  LayerCache cw[2], cs[2];
  for (int m = 0; m < 2; ++m) {
    x[m] = Tensor::FromHost(*cpu, c.input, MakeInput(c, 1 + m));
    whole->Forward(x[m], cw[m], ForwardContext{true, 7});
    split->Forward(x[m], cs[m], ForwardContext{true, 7});
    dy[m] = Tensor::FromHost(*cpu, cw[m].out.shape(),
                             RandomVector(static_cast<size_t>(cw[m].out.numel()), 5 + m));
  }
  for (int m = 0; m < 2; ++m) whole->Backward(x[m], dy[m], cw[m], &dx_whole[m]);
  for (int m = 0; m < 2; ++m) split->BackwardInput(x[m], dy[m], cs[m], &dx_split[m]);
  for (int m = 0; m < 2; ++m) split->BackwardWeights(x[m], dy[m], cs[m]);
  for (int m = 0; m < 2; ++m) EXPECT_EQ(dx_split[m].ToHost(), dx_whole[m].ToHost()) << m;
  auto pw = whole->params(), ps = split->params();
  for (size_t i = 0; i < pw.size(); ++i) {
    if (!pw[i]->trainable) continue;
    EXPECT_EQ(ps[i]->grad.ToHost(), pw[i]->grad.ToHost()) << c.name << "." << pw[i]->name;
  }
}

// A layer's (or a chain's) output, input gradient and parameter gradients, read back.
struct LayerResult {
  std::vector<float> y, dx;
  std::vector<std::vector<float>> grads;
};

// CUDA against CPU: float32 summation order differs, nothing else.
void ExpectCudaMatchesCpu(const LayerResult& got, const LayerResult& want) {
  EXPECT_TRUE(AllClose(got.y, want.y, 1e-5f, 1e-4f)) << "forward";
  EXPECT_TRUE(AllClose(got.dx, want.dx, 1e-5f, 1e-4f)) << "dx";
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_TRUE(AllClose(got.grads[i], want.grads[i], 1e-4f, 1e-4f)) << "param " << i;
  }
}

TEST_P(LayerGradient, CudaMatchesCpu) {
  LP_REQUIRE_CUDA(gpu);
  const LayerCase& c = GetParam();
  auto cpu = MakeCpuBackend();
  Shape per_example(c.input.begin() + 1, c.input.end());
  std::vector<float> xv = MakeInput(c, 3);
  auto run = [&](Backend& be) {
    std::string error;
    auto layer = MakeLayer(be, c.config, per_example, 5, &error);
    EXPECT_TRUE(layer) << error;
    Tensor x = Tensor::FromHost(be, c.input, xv);
    LayerCache cache;
    layer->Forward(x, cache, ForwardContext{true, 7});
    Tensor dy = Tensor::FromHost(be, cache.out.shape(),
                                 RandomVector(static_cast<size_t>(cache.out.numel()), 4));
    Tensor dx;
    layer->Backward(x, dy, cache, &dx);
    LayerResult r{cache.out.ToHost(), dx.ToHost(), {}};
    // Trainable parameters' gradients; running statistics' values.
    for (Param* p : layer->params()) {
      r.grads.push_back(p->trainable ? p->grad.ToHost() : p->value.ToHost());
    }
    return r;
  };
  ExpectCudaMatchesCpu(run(*gpu), run(*cpu));
}

// What a worker checks before it allocates a stage: the count from shapes alone is what the
// built layer holds.
TEST_P(LayerGradient, ParameterCountFromShapesMatchesTheBuiltLayer) {
  const LayerCase& c = GetParam();
  auto cpu = MakeCpuBackend();
  Shape per_example(c.input.begin() + 1, c.input.end());
  std::string error;
  auto layer = MakeLayer(*cpu, c.config, per_example, 1, &error);
  ASSERT_TRUE(layer) << error;
  int64_t built = 0;
  for (Param* p : layer->params()) built += p->value.numel();
  EXPECT_EQ(LayerParameterCount(c.config, per_example), built);
}

INSTANTIATE_TEST_SUITE_P(Layers, LayerGradient, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// Linear + ReLU fused (the ReLU in the GEMM's epilogue) against the same layers unfused:
// bitwise equal on the CPU, and the CUDA fused path (cuBLASLt) against the CPU unfused one.
TEST(FusedLinearRelu, ForwardAndBackwardEqualTheUnfusedLayers) {
  const Shape input = {6, 10};
  std::vector<float> xv = RandomVector(60, 21);
  auto run = [&](Backend& be, bool fuse) {
    std::vector<LayerConfig> cfgs = {Cfg("linear", 7), Cfg("relu"), Cfg("linear", 5), Cfg("relu")};
    std::vector<std::unique_ptr<Layer>> layers;
    Shape shape = {10};
    for (size_t i = 0; i < cfgs.size(); ++i) {
      std::string error;
      layers.push_back(MakeLayer(be, cfgs[i], shape, 40 + i, &error));
      EXPECT_TRUE(layers.back()) << error;
      shape = layers.back()->output_shape();
    }
    if (fuse) FuseActivations(layers);
    std::vector<LayerCache> caches(layers.size());
    std::vector<Tensor> inputs;
    Tensor x = Tensor::FromHost(be, input, xv);
    const Tensor* in = &x;
    for (size_t i = 0; i < layers.size(); ++i) {
      inputs.push_back(*in);
      layers[i]->Forward(*in, caches[i], ForwardContext{true, 1});
      in = &caches[i].out;
    }
    // Fused, each ReLU hands on its Linear's output itself (no separate pass or buffer).
    EXPECT_EQ(caches[1].out.raw() == caches[0].out.raw(), fuse);
    EXPECT_EQ(caches[3].out.raw() == caches[2].out.raw(), fuse);
    LayerResult r{in->ToHost(), {}, {}};
    Tensor dy = Tensor::FromHost(be, in->shape(), RandomVector(in->numel(), 22));
    for (size_t i = layers.size(); i-- > 0;) {
      Tensor dx;
      layers[i]->Backward(inputs[i], dy, caches[i], &dx);
      dy = dx.Clone();
    }
    r.dx = dy.ToHost();
    for (auto& l : layers)
      for (Param* p : l->params()) r.grads.push_back(p->grad.ToHost());
    return r;
  };
  auto cpu = MakeCpuBackend();
  LayerResult plain = run(*cpu, false), fused = run(*cpu, true);
  EXPECT_EQ(fused.y, plain.y);
  EXPECT_EQ(fused.dx, plain.dx);
  EXPECT_EQ(fused.grads, plain.grads);
  bool some_clipped = false;
  for (float v : plain.y) some_clipped |= v == 0.0f;
  EXPECT_TRUE(some_clipped);  // the ReLU really acts on this input
  if (auto gpu = testing::MaybeCuda()) ExpectCudaMatchesCpu(run(*gpu, true), plain);
}

TEST(Embedding, GradientScattersIntoLookedUpRowsOnEveryBackend) {
  LayerConfig c = Cfg("embedding");
  c.Set("vocab", 5);
  c.Set("dim", 3);
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(MakeCpuBackend());
  if (auto gpu = testing::MaybeCuda()) backends.push_back(std::move(gpu));
  for (auto& be : backends) {
    std::string error;
    auto layer = MakeLayer(*be, c, {4}, 11, &error);
    ASSERT_TRUE(layer) << error;
    // Token ids travel as integers.
    Tensor ids = Tensor::FromHostI32(*be, {1, 4}, std::vector<int32_t>{2, 0, 2, 4});
    LayerCache cache;
    layer->Forward(ids, cache, ForwardContext{});
    std::vector<float> table = layer->params()[0]->value.ToHost();
    std::vector<float> out = cache.out.ToHost();
    for (int d = 0; d < 3; ++d) {
      EXPECT_EQ(out[0 * 3 + d], table[2 * 3 + d]);
      EXPECT_EQ(out[3 * 3 + d], table[4 * 3 + d]);
    }
    std::vector<float> g(12);
    for (int i = 0; i < 12; ++i) g[i] = static_cast<float>(i + 1);
    layer->Backward(ids, Tensor::FromHost(*be, {1, 4, 3}, g), cache, nullptr);
    std::vector<float> grad = layer->params()[0]->grad.ToHost();
    // Row 2 got positions 0 and 2; row 0 position 1; row 4 position 3; rows 1, 3 nothing.
    std::vector<float> want = {4, 5, 6, 0, 0, 0, 1 + 7, 2 + 8, 3 + 9, 0, 0, 0, 10, 11, 12};
    EXPECT_EQ(grad, want) << be->Describe();
  }
}

TEST(Embedding, IdsOutsideTheVocabularyLookUpZerosAndLearnNothing) {
  LayerConfig c = Cfg("embedding");
  c.Set("vocab", 4);
  c.Set("dim", 2);
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(MakeCpuBackend());
  if (auto gpu = testing::MaybeCuda()) backends.push_back(std::move(gpu));
  for (auto& be : backends) {
    std::string error;
    auto layer = MakeLayer(*be, c, {5}, 3, &error);
    ASSERT_TRUE(layer) << error;
    Tensor ids =
        Tensor::FromHostI32(*be, {1, 5}, std::vector<int32_t>{-1, 4, 1 << 30, -(1 << 30), 3});
    LayerCache cache;
    layer->Forward(ids, cache, ForwardContext{});
    std::vector<float> table = layer->params()[0]->value.ToHost();
    std::vector<float> out = cache.out.ToHost();
    std::vector<float> want = {0, 0, 0, 0, 0, 0, 0, 0, table[6], table[7]};
    EXPECT_EQ(out, want) << be->Describe();
    layer->Backward(ids, Tensor::FromHost(*be, {1, 5, 2}, std::vector<float>(10, 1.0f)), cache,
                    nullptr);
    std::vector<float> grad = layer->params()[0]->grad.ToHost();
    EXPECT_EQ(grad, (std::vector<float>{0, 0, 0, 0, 0, 0, 1, 1})) << be->Describe();
  }
}

TEST(BatchNorm, EvaluationUsesTheRunningStatisticsTrainingUpdates) {
  auto cpu = MakeCpuBackend();
  LayerConfig c = Cfg("batch_norm");
  c.Set("momentum", 0.5f);
  std::string error;
  auto layer = MakeLayer(*cpu, c, {2}, 1, &error);
  ASSERT_TRUE(layer) << error;
  // Column 0: 1, 3 (mean 2, biased var 1, unbiased 2); column 1: 4, 4 (mean 4, var 0).
  Tensor x = Tensor::FromHost(*cpu, {2, 2}, std::vector<float>{1, 4, 3, 4});
  LayerCache cache;
  layer->Forward(x, cache, ForwardContext{true, 0});
  std::vector<float> y = cache.out.ToHost();
  EXPECT_NEAR(y[0], -1.0f, 1e-4f);
  EXPECT_NEAR(y[2], 1.0f, 1e-4f);
  EXPECT_NEAR(y[1], 0.0f, 1e-4f);
  std::vector<Param*> p = layer->params();
  ASSERT_EQ(p.size(), 4u);
  EXPECT_FALSE(p[2]->trainable);
  // running = 0.5 * initial + 0.5 * batch.
  EXPECT_EQ(p[2]->value.ToHost(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(p[3]->value.ToHost(), (std::vector<float>{1.5f, 0.5f}));
  // Eval: (x - running_mean) / sqrt(running_var + eps), and the running stats stay put.
  Tensor z = Tensor::FromHost(*cpu, {1, 2}, std::vector<float>{2.5f, 2.0f});
  layer->Forward(z, cache, ForwardContext{false, 0});
  std::vector<float> e = cache.out.ToHost();
  EXPECT_NEAR(e[0], 1.5f / std::sqrt(1.5f + 1e-5f), 1e-5f);
  EXPECT_NEAR(e[1], 0.0f, 1e-6f);
  EXPECT_EQ(p[2]->value.ToHost(), (std::vector<float>{1.0f, 2.0f}));
}

TEST(Dropout, IsIdentityAtEvalAndMasksGradientsInTraining) {
  auto cpu = MakeCpuBackend();
  LayerConfig c = Cfg("dropout");
  c.Set("rate", 0.5f);
  std::string error;
  auto layer = MakeLayer(*cpu, c, {1000}, 3, &error);
  ASSERT_TRUE(layer);
  std::vector<float> xv = RandomVector(1000, 8);
  Tensor x = Tensor::FromHost(*cpu, {1, 1000}, xv);
  LayerCache cache;
  layer->Forward(x, cache, ForwardContext{false, 1});
  EXPECT_EQ(cache.out.ToHost(), xv);
  layer->Forward(x, cache, ForwardContext{true, 1});
  std::vector<float> y = cache.out.ToHost();
  Tensor dx;
  layer->Backward(x, Tensor::FromHost(*cpu, {1, 1000}, std::vector<float>(1000, 1.0f)), cache, &dx);
  std::vector<float> g = dx.ToHost();
  int dropped = 0;
  for (int i = 0; i < 1000; ++i) {
    if (y[i] == 0.0f) {
      EXPECT_EQ(g[i], 0.0f);
      ++dropped;
    } else {
      EXPECT_FLOAT_EQ(y[i], 2.0f * xv[i]);
      EXPECT_EQ(g[i], 2.0f);
    }
  }
  EXPECT_GT(dropped, 400);
  EXPECT_LT(dropped, 600);
}

TEST(LayerShapes, MismatchesAreReportedWithBothShapes) {
  LayerConfig lin = Cfg("linear", 10);
  lin.Set("in_features", 512);
  Shape out;
  std::string error;
  EXPECT_FALSE(InferLayerShape(lin, {1024}, &out, &error));
  EXPECT_NE(error.find("in_features 512"), std::string::npos) << error;
  EXPECT_NE(error.find("1024"), std::string::npos) << error;
  EXPECT_FALSE(InferLayerShape(Cfg("conv2d", 8), {784}, &out, &error));
  EXPECT_NE(error.find("image input"), std::string::npos) << error;
  EXPECT_FALSE(InferLayerShape(Cfg("max_pool", 0, 5, 1, 0), {3, 3, 1}, &out, &error));
  EXPECT_NE(error.find("does not fit"), std::string::npos) << error;
}

}  // namespace
}  // namespace localpar

namespace localpar {
namespace {

// Forward FLOPs from shapes, against counts worked out by hand: 2 per multiply-add.
TEST(LayerFlops, CountTwoPerMultiplyAddOfEachLayerKind) {
  // Linear on a 3x3x2 image flattened (18 features) to 4: 18 x 4 multiply-adds.
  EXPECT_EQ(LayerForwardFlops(Cfg("linear", 4), {3, 3, 2}), 2.0 * 18 * 4);
  // Dense per position: 5 positions of 8 features to 6.
  EXPECT_EQ(LayerForwardFlops(Cfg("dense", 6), {5, 8}), 2.0 * 5 * 8 * 6);
  // Conv 3x3, stride 2, padding 1, 2 to 7 channels on 9x9: a 5x5 output, 3*3*2 per output.
  EXPECT_EQ(LayerForwardFlops(Cfg("conv2d", 7, 3, 2, 1), {9, 9, 2}), 2.0 * 5 * 5 * 7 * 18);
  // Attention over 4 positions of width 6: four 6x6 projections per position, then 4x4
  // scores of 6 multiply-adds and the 4x4 weighted sums of 6-wide values.
  LayerConfig attn = Cfg("causal_self_attention");
  attn.Set("heads", 2);
  EXPECT_EQ(LayerForwardFlops(attn, {4, 6}), 2.0 * (4 * 4 * 36 + 2 * 4 * 4 * 6));
  // Elementwise layers and lookups: none.
  EXPECT_EQ(LayerForwardFlops(Cfg("relu"), {10}), 0);
  LayerConfig emb = Cfg("embedding");
  emb.Set("vocab", 256);
  emb.Set("dim", 8);
  EXPECT_EQ(LayerForwardFlops(emb, {4}), 0);
  // A residual block adds up its body: layer norm (0), dense 6 -> 24, gelu, dense 24 -> 6.
  LayerConfig res = Cfg("residual");
  res.body = {Cfg("layer_norm"), Cfg("dense", 24), Cfg("gelu"), Cfg("dense", 6)};
  EXPECT_EQ(LayerForwardFlops(res, {4, 6}), 2.0 * (4 * 6 * 24 + 4 * 24 * 6));
  // A stage: linear 8 -> 16 and a ReLU, then a linear head to 10 classes.
  StageConfig stage;
  stage.layers = {Cfg("linear", 16), Cfg("relu")};
  stage.head.kind = HeadConfig::Kind::kLinear;
  const StageFlops f = StageForwardFlops(stage, {8}, 10);
  EXPECT_EQ(f.layers, 2.0 * 8 * 16);
  EXPECT_EQ(f.head, 2.0 * 16 * 10);
}

}  // namespace
}  // namespace localpar
