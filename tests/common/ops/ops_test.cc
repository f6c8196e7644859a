// Op kernels against independent references: a double-precision GEMM, finite differences
// for the loss, hand-checked values, and every CUDA kernel against its CPU twin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/core/tensor.h"
#include "common/nn/replica_sync.h"
#include "common/ops/activation_math.h"
#include "common/ops/vector_gelu.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::AllClose;
using testing::RandomVector;

std::vector<float> NaiveGemm(bool ta, bool tb, int m, int n, int k, const std::vector<float>& a,
                             const std::vector<float>& b) {
  std::vector<float> c(m * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        s += static_cast<double>(ta ? a[p * m + i] : a[i * k + p]) *
             (tb ? b[j * k + p] : b[p * n + j]);
      }
      c[i * n + j] = static_cast<float>(s);
    }
  }
  return c;
}

class GemmTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GemmTest, MatchesDoublePrecisionReferenceOnEveryBackend) {
  auto [ta, tb] = GetParam();
  const int m = 37, n = 23, k = 51;
  auto a = RandomVector(m * k, 1), b = RandomVector(k * n, 2), c0 = RandomVector(m * n, 3);
  std::vector<float> expected = NaiveGemm(ta, tb, m, n, k, a, b);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = 0.5f * expected[i] + 2.0f * c0[i];

  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(MakeCpuBackend());
  if (auto gpu = testing::MaybeCuda()) backends.push_back(std::move(gpu));
  for (auto& be : backends) {
    Tensor ta_t = Tensor::FromHost(*be, {ta ? k : m, ta ? m : k}, a);
    Tensor tb_t = Tensor::FromHost(*be, {tb ? n : k, tb ? k : n}, b);
    Tensor tc = Tensor::FromHost(*be, {m, n}, c0);
    be->Gemm(ta, tb, m, n, k, 0.5f, ta_t.f32(), tb_t.f32(), 2.0f, tc.f32());
    EXPECT_TRUE(AllClose(tc.ToHost(), expected, 1e-4f, 1e-4f)) << be->Describe();
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

// Rounds to `bits` significant bits, nearest even, in double arithmetic: an independent
// model of bfloat16 (8 bits) and TensorFloat-32 (11 bits) for the reduced-precision GEMMs.
float RoundSignificand(float x, int bits) {
  int e;
  double f = std::frexp(static_cast<double>(x), &e);  // x = f * 2^e, 0.5 <= |f| < 1
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(f, bits)), e - bits));
}

// TF32 and bf16 GEMMs: the inputs rounded, products summed in float32 or better. The CPU
// rounds to nearest even exactly as the model does; the GPU's tensor cores may round their
// inputs differently, so they get the format's own tolerance.
TEST(GemmPrecision, ReducedPrecisionGemmsRoundTheirInputsOnEveryBackend) {
  const int m = 33, n = 29, k = 64;
  auto a = RandomVector(m * k, 7), b = RandomVector(k * n, 8), c0 = RandomVector(m * n, 9);
  struct Mode {
    GemmPrecision p;
    int bits;
    float gpu_tol;
  };
  for (Mode mode : {Mode{GemmPrecision::kBF16, 8, 5e-2f}, Mode{GemmPrecision::kTF32, 11, 5e-3f}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << GemmPrecisionName(mode.p) << " ta " << ta << " tb " << tb);
        std::vector<float> ra = a, rb = b;
        for (float& v : ra) v = RoundSignificand(v, mode.bits);
        for (float& v : rb) v = RoundSignificand(v, mode.bits);
        std::vector<float> expected = NaiveGemm(ta, tb, m, n, k, ra, rb);
        std::vector<float> exact = NaiveGemm(ta, tb, m, n, k, a, b);
        for (size_t i = 0; i < expected.size(); ++i) {
          expected[i] = 0.5f * expected[i] + 2.0f * c0[i];
          exact[i] = 0.5f * exact[i] + 2.0f * c0[i];
        }
        // The model is worth testing against: rounding the inputs changes the result.
        ASSERT_FALSE(AllClose(exact, expected, 1e-4f, 1e-4f));
        std::vector<std::unique_ptr<Backend>> backends;
        backends.push_back(MakeCpuBackend());
        if (auto gpu = testing::MaybeCuda()) backends.push_back(std::move(gpu));
        for (auto& be : backends) {
          be->set_gemm_precision(mode.p);
          Tensor at = Tensor::FromHost(*be, {ta ? k : m, ta ? m : k}, a);
          Tensor bt = Tensor::FromHost(*be, {tb ? n : k, tb ? k : n}, b);
          Tensor ct = Tensor::FromHost(*be, {m, n}, c0);
          be->Gemm(ta, tb, m, n, k, 0.5f, at.f32(), bt.f32(), 2.0f, ct.f32());
          const bool cpu = be->device() == DeviceType::kCPU;
          const float tol = cpu ? 1e-4f : mode.gpu_tol;
          EXPECT_TRUE(AllClose(ct.ToHost(), expected, tol, tol)) << be->Describe();
          // The inputs themselves are left untouched.
          EXPECT_EQ(at.ToHost(), a);
          // Batched GEMMs follow the same setting.
          Tensor cb = Tensor::FromHost(*be, {m, n}, c0);
          be->GemmBatched(ta, tb, m, n, k, 0.5f, at.f32(), 0, bt.f32(), 0, 2.0f, cb.f32(), 0, 1);
          EXPECT_TRUE(AllClose(cb.ToHost(), expected, tol, tol)) << be->Describe();
        }
      }
    }
  }
}

// The linear layer's fused GEMM + bias (+ ReLU) against the double-precision reference, on
// every backend (cuBLASLt epilogues on CUDA), including a single row and an odd shape.
TEST(GemmBias, MatchesTheReferenceWithAndWithoutReluOnEveryBackend) {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(MakeCpuBackend());
  if (auto gpu = testing::MaybeCuda()) backends.push_back(std::move(gpu));
  for (auto [m, n, k] :
       {std::tuple{37, 23, 51}, std::tuple{1, 64, 128}, std::tuple{128, 10, 256}}) {
    auto x = RandomVector(m * k, 11), w = RandomVector(k * n, 12), bias = RandomVector(n, 13);
    std::vector<float> linear = NaiveGemm(false, false, m, n, k, x, w);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) linear[i * n + j] += bias[j];
    for (bool relu : {false, true}) {
      std::vector<float> expected = linear;
      if (relu)
        for (float& v : expected) v = std::max(v, 0.0f);
      for (auto& be : backends) {
        Tensor xt = Tensor::FromHost(*be, {m, k}, x), wt = Tensor::FromHost(*be, {k, n}, w);
        Tensor bt = Tensor::FromHost(*be, {n}, bias);
        Tensor yt = Tensor::Empty(*be, {m, n});
        be->GemmBias(m, n, k, xt.f32(), wt.f32(), bt.f32(), yt.f32(), relu);
        EXPECT_TRUE(AllClose(yt.ToHost(), expected, 1e-4f, 1e-4f))
            << be->Describe() << " m " << m << " relu " << relu;
      }
    }
  }
}

class GemmBatchedTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

// Each of the batch's GEMMs against the double-precision reference, with operand strides
// larger than the operands (gaps between them must be left alone).
TEST_P(GemmBatchedTest, EveryProblemMatchesTheReferenceOnEveryBackend) {
  auto [ta, tb] = GetParam();
  const int m = 9, n = 7, k = 11, batch = 3, gap = 5;
  const int sa = m * k + gap, sb = k * n + gap, sc = m * n + gap;
  auto a = RandomVector(sa * batch, 4), b = RandomVector(sb * batch, 5),
       c0 = RandomVector(sc * batch, 6);
  std::vector<float> expected = c0;
  for (int i = 0; i < batch; ++i) {
    std::vector<float> ai(a.begin() + i * sa, a.begin() + i * sa + m * k);
    std::vector<float> bi(b.begin() + i * sb, b.begin() + i * sb + k * n);
    std::vector<float> ci = NaiveGemm(ta, tb, m, n, k, ai, bi);
    for (int j = 0; j < m * n; ++j) expected[i * sc + j] = 2.0f * ci[j] - c0[i * sc + j];
  }
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(MakeCpuBackend());
  if (auto gpu = testing::MaybeCuda()) backends.push_back(std::move(gpu));
  for (auto& be : backends) {
    Tensor at = Tensor::FromHost(*be, {sa * batch}, a), bt = Tensor::FromHost(*be, {sb * batch}, b);
    Tensor ct = Tensor::FromHost(*be, {sc * batch}, c0);
    be->GemmBatched(ta, tb, m, n, k, 2.0f, at.f32(), sa, bt.f32(), sb, -1.0f, ct.f32(), sc, batch);
    EXPECT_TRUE(AllClose(ct.ToHost(), expected, 1e-4f, 1e-4f)) << be->Describe();
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmBatchedTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

// The CPU GELU computes tanh without libm (so that its loops vectorise); it must stay
// within float rounding of the libm formula the CUDA kernels use, over the whole range.
TEST(Gelu, VectorisedTanhMatchesLibm) {
  auto cpu = MakeCpuBackend();
  const int n = 40001;
  std::vector<float> x(n), ones(n, 1.0f);
  for (int i = 0; i < n; ++i) x[i] = -20.0f + 40.0f * static_cast<float>(i) / (n - 1);
  Tensor xt = Tensor::FromHost(*cpu, {n}, x), dy = Tensor::FromHost(*cpu, {n}, ones);
  Tensor y = Tensor::Empty(*cpu, {n}), dx = Tensor::Empty(*cpu, {n});
  cpu->GeluForward(xt.f32(), y.f32(), n);
  cpu->GeluBackward(xt.f32(), dy.f32(), dx.f32(), n);
  const std::vector<float> got = y.ToHost(), grad = dx.ToHost();
  double worst_y = 0, worst_g = 0;
  for (int i = 0; i < n; ++i) {
    worst_y = std::max(worst_y, std::fabs(got[i] - GeluValue(x[i])) /
                                    std::max(1.0, std::fabs(static_cast<double>(x[i]))));
    worst_g = std::max(worst_g, std::fabs(static_cast<double>(grad[i] - GeluDerivative(x[i]))));
  }
  EXPECT_LT(worst_y, 1e-6);
  EXPECT_LT(worst_g, 1e-6);
}

// The activation loops are also built for AVX2 and AVX-512 and picked at load time; whatever
// this machine picks must give the bits of the scalar functions, computed here one element at
// a time (this file is built for x86-64's baseline, without FMA). An odd length runs both the
// vector body and the scalar tail.
TEST(Activations, EveryVectorWidthGivesTheElementwiseBits) {
  auto cpu = MakeCpuBackend();
  const int n = 4099;
  const std::vector<float> x = RandomVector(n, 11, -6, 6), g = RandomVector(n, 12, -1, 1);
  Tensor xt = Tensor::FromHost(*cpu, {n}, x), gt = Tensor::FromHost(*cpu, {n}, g);
  Tensor y = Tensor::Empty(*cpu, {n}), dx = Tensor::Empty(*cpu, {n});
  Tensor r = Tensor::Empty(*cpu, {n}), dr = Tensor::Empty(*cpu, {n});
  cpu->GeluForward(xt.f32(), y.f32(), n);
  cpu->GeluBackward(xt.f32(), gt.f32(), dx.f32(), n);
  cpu->ReluForward(xt.f32(), r.f32(), n);
  cpu->ReluBackward(r.f32(), gt.f32(), dr.f32(), n);
  const std::vector<float> gy = y.ToHost(), gdx = dx.ToHost(), gr = r.ToHost(), gdr = dr.ToHost();
  auto same = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  int differ = 0;
  for (int i = 0; i < n; ++i) {
    const float want_r = x[i] > 0.0f ? x[i] : 0.0f;
    differ += !same(gy[i], CpuGeluValue(x[i]));
    differ += !same(gdx[i], g[i] * CpuGeluDerivative(x[i]));
    differ += !same(gr[i], want_r);
    differ += !same(gdr[i], want_r > 0.0f ? g[i] : 0.0f);
  }
  EXPECT_EQ(differ, 0);
}

// Batch norm's row loops are built for every vector width too: each must give the bits of
// the scalar code, written out here (this file has no FMA), in training, evaluation and the
// backward pass. 37 columns run a vector body and a scalar tail.
TEST(BatchNorm, EveryVectorWidthGivesTheScalarBits) {
  auto cpu = MakeCpuBackend();
  const int rows = 50, cols = 37;
  const std::vector<float> x = RandomVector(rows * cols, 21, -3, 5),
                           dy = RandomVector(rows * cols, 22), g = RandomVector(cols, 23),
                           bt = RandomVector(cols, 24);
  std::vector<float> y(rows * cols), mean(cols), rstd(cols), rm(cols, 0.5f), rv(cols, 2.0f);
  std::vector<float> dx(rows * cols), dg(cols, 0.0f), db(cols, 0.0f), ye(rows * cols);
  cpu->BatchNormForward(x.data(), g.data(), bt.data(), y.data(), mean.data(), rstd.data(),
                        rm.data(), rv.data(), rows, cols, 1e-5f, 0.1f, true);
  cpu->BatchNormBackward(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(),
                         dg.data(), db.data(), rows, cols);
  cpu->BatchNormForward(x.data(), g.data(), bt.data(), ye.data(), nullptr, nullptr, rm.data(),
                        rv.data(), rows, cols, 1e-5f, 0.1f, false);
  auto same = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  int differ = 0;
  for (int c = 0; c < cols; ++c) {
    double sum = 0, sq = 0, sg = 0, sgx = 0;
    for (int r = 0; r < rows; ++r) sum += x[r * cols + c];
    const float m = static_cast<float>(sum / rows);
    for (int r = 0; r < rows; ++r) {
      double d = x[r * cols + c] - m;
      sq += d * d;
    }
    const float rs = static_cast<float>(1.0 / std::sqrt(sq / rows + 1e-5f));
    differ += !same(mean[c], m) + !same(rstd[c], rs);
    const float scale = g[c] * (1.0f / std::sqrt(rv[c] + 1e-5f)), shift = bt[c] - rm[c] * scale;
    for (int r = 0; r < rows; ++r) {
      const int i = r * cols + c;
      differ += !same(y[i], (x[i] - m) * rs * g[c] + bt[c]);
      differ += !same(ye[i], x[i] * scale + shift);
      const float xhat = (x[i] - m) * rs;
      sg += dy[i];
      sgx += static_cast<double>(dy[i]) * xhat;
    }
    differ += !same(dg[c], static_cast<float>(sgx)) + !same(db[c], static_cast<float>(sg));
    const float k = g[c] * rs, a = static_cast<float>(sg / rows),
                b = static_cast<float>(sgx / rows);
    for (int r = 0; r < rows; ++r) {
      const int i = r * cols + c;
      differ += !same(dx[i], k * (dy[i] - a - (x[i] - m) * rs * b));
    }
  }
  EXPECT_EQ(differ, 0);
}

// Max pooling against a scalar reference: every window pixel in order, the first of equal
// maxima winning (small integers make ties), windows cut by the padding, a NaN first in its
// window kept, and the argmax of each.
TEST(MaxPool, MatchesTheScalarReferenceWithTiesPaddingAndNaN) {
  auto cpu = MakeCpuBackend();
  const int64_t n = 2, h = 7, w = 6, c = 19, k = 3, stride = 2, pad = 1;
  const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  std::vector<float> x = RandomVector(n * h * w * c, 31, -3, 3);
  for (float& v : x) v = std::round(v);
  x[5] = std::numeric_limits<float>::quiet_NaN();  // pixel (0, 0): first in its windows
  std::vector<float> y(n * oh * ow * c);
  std::vector<int32_t> arg(y.size());
  cpu->MaxPoolForward(x.data(), y.data(), arg.data(), n, h, w, c, k, stride, pad, oh, ow);
  int differ = 0;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        for (int64_t ch = 0; ch < c; ++ch) {
          float best = 0.0f;
          int32_t at = -1;
          for (int64_t iy = oy * stride - pad; iy < oy * stride - pad + k; ++iy) {
            for (int64_t ix = ox * stride - pad; ix < ox * stride - pad + k; ++ix) {
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              const float v = x[((b * h + iy) * w + ix) * c + ch];
              if (at < 0 || v > best) {
                best = v;
                at = static_cast<int32_t>(iy * w + ix);
              }
            }
          }
          const int64_t o = ((b * oh + oy) * ow + ox) * c + ch;
          differ += std::memcmp(&y[o], &best, sizeof best) != 0 || arg[o] != at;
        }
      }
    }
  }
  EXPECT_EQ(differ, 0);
  EXPECT_TRUE(std::isnan(y[5]));
}

TEST(Attention, HeadPermutationsAreInversesAndCausalRowsSumToOne) {
  auto cpu = MakeCpuBackend();
  const int b = 2, t = 5, parts = 3, heads = 2, d = 4, n = b * t * parts * heads * d;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  Tensor xt = Tensor::FromHost(*cpu, {n}, x), y = Tensor::Empty(*cpu, {n}),
         back = Tensor::Empty(*cpu, {n});
  cpu->SplitHeads(xt.f32(), y.f32(), b, t, parts, heads, d);
  // Element (batch 1, position 3, part 2, head 1, lane 2) moves to [2][1][1][3][2].
  EXPECT_EQ(y.ToHost()[(((2 * b + 1) * heads + 1) * t + 3) * d + 2],
            x[(((1 * t + 3) * parts + 2) * heads + 1) * d + 2]);
  cpu->MergeHeads(y.f32(), back.f32(), b, t, parts, heads, d);
  EXPECT_EQ(back.ToHost(), x);
  // Causal softmax: row i sees keys 0..i only, and each row sums to 1.
  std::vector<float> s = RandomVector(2 * t * t, 8, -3, 3);
  Tensor st = Tensor::FromHost(*cpu, {2 * t * t}, s), p = Tensor::Empty(*cpu, {2 * t * t});
  cpu->CausalSoftmaxForward(st.f32(), p.f32(), 2, t, 0.5f);
  std::vector<float> ph = p.ToHost();
  for (int r = 0; r < 2 * t; ++r) {
    int i = r % t;
    double sum = 0;
    for (int j = 0; j < t; ++j) {
      if (j > i) {
        EXPECT_EQ(ph[r * t + j], 0.0f);
      }
      sum += ph[r * t + j];
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
    // Relative weights follow exp(0.5 * s).
    if (i >= 1) {
      EXPECT_NEAR(ph[r * t + 1] / ph[r * t], std::exp(0.5 * (s[r * t + 1] - s[r * t])), 1e-4);
    }
  }
}

TEST(CudaParity, AttentionAndEvaluationBatchNormKernels) {
  LP_REQUIRE_CUDA(gpu);
  auto cpu = MakeCpuBackend();
  const int b = 3, t = 7, parts = 3, heads = 2, d = 5, n = b * t * parts * heads * d;
  const int rows = 67, cols = 9;
  auto x = RandomVector(n, 21), s = RandomVector(b * heads * t * t, 22, -4, 4),
       dp = RandomVector(b * heads * t * t, 23), bx = RandomVector(rows * cols, 24, -2, 3),
       gamma = RandomVector(cols, 25), beta = RandomVector(cols, 26),
       rv = RandomVector(cols, 27, 0.5f, 2.0f);
  auto run = [&](Backend& be) {
    std::vector<float> all;
    auto keep = [&all](const Tensor& t) {
      for (float v : t.ToHost()) all.push_back(v);
    };
    Tensor xt = Tensor::FromHost(be, {n}, x), y = Tensor::Empty(be, {n}),
           z = Tensor::Empty(be, {n});
    be.SplitHeads(xt.f32(), y.f32(), b, t, parts, heads, d);
    be.MergeHeads(y.f32(), z.f32(), b, t, parts, heads, d);
    keep(y);
    keep(z);
    const int m = b * heads, sz = m * t * t;
    Tensor st = Tensor::FromHost(be, {sz}, s), p = Tensor::Empty(be, {sz}),
           dpt = Tensor::FromHost(be, {sz}, dp), ds = Tensor::Empty(be, {sz});
    be.CausalSoftmaxForward(st.f32(), p.f32(), m, t, 0.7f);
    be.CausalSoftmaxBackward(p.f32(), dpt.f32(), ds.f32(), m, t, 0.7f);
    keep(p);
    keep(ds);
    // Batch norm in evaluation mode (training mode is covered by the layer parity tests).
    Tensor xb = Tensor::FromHost(be, {rows * cols}, bx), yb = Tensor::Empty(be, {rows * cols});
    Tensor g = Tensor::FromHost(be, {cols}, gamma), bt = Tensor::FromHost(be, {cols}, beta);
    Tensor rm = Tensor::FromHost(be, {cols}, beta), rvt = Tensor::FromHost(be, {cols}, rv);
    be.BatchNormForward(xb.f32(), g.f32(), bt.f32(), yb.f32(), nullptr, nullptr, rm.f32(),
                        rvt.f32(), rows, cols, 1e-5f, 0.1f, false);
    keep(yb);
    return all;
  };
  EXPECT_TRUE(AllClose(run(*gpu), run(*cpu), 1e-5f, 1e-4f));
}

TEST(SoftmaxXent, LossAccuracyAndGradientMatchHandComputedValues) {
  auto cpu = MakeCpuBackend();
  // Row 0: logits (0, ln 3) -> p = (1/4, 3/4); label 1 is the arg-max.
  // Row 1: logits (2, 0), label 1 -> wrong prediction.
  Tensor z = Tensor::FromHost(*cpu, {2, 2}, std::vector<float>{0.0f, std::log(3.0f), 2.0f, 0});
  Tensor y = Tensor::FromHostI32(*cpu, {2}, {1, 1});
  Tensor d = Tensor::Empty(*cpu, {2, 2}), loss = Tensor::Empty(*cpu, {2}),
         ok = Tensor::Empty(*cpu, {2});
  cpu->SoftmaxXent(z.f32(), y.i32(), 2, 2, 0.5f, d.f32(), loss.f32(), ok.f32());
  std::vector<float> l = loss.ToHost(), c = ok.ToHost(), g = d.ToHost();
  EXPECT_NEAR(l[0], -std::log(0.75f), 1e-6);
  EXPECT_NEAR(l[1], std::log(1.0f + std::exp(2.0f)), 1e-6);
  EXPECT_EQ(c, (std::vector<float>{1, 0}));
  EXPECT_NEAR(g[0], 0.5f * 0.25f, 1e-6);
  EXPECT_NEAR(g[1], 0.5f * (0.75f - 1.0f), 1e-6);
}

TEST(SoftmaxXent, GradientMatchesFiniteDifferences) {
  auto cpu = MakeCpuBackend();
  const int rows = 4, cols = 7;
  auto logits = RandomVector(rows * cols, 5, -3, 3);
  std::vector<int32_t> labels = {0, 6, 3, 2};
  Tensor y = Tensor::FromHostI32(*cpu, {rows}, labels);
  Tensor loss = Tensor::Empty(*cpu, {rows}), ok = Tensor::Empty(*cpu, {rows});
  auto total = [&](const std::vector<float>& zz) {
    Tensor z = Tensor::FromHost(*cpu, {rows, cols}, zz);
    cpu->SoftmaxXent(z.f32(), y.i32(), rows, cols, 1.0f, nullptr, loss.f32(), ok.f32());
    double s = 0;
    for (float v : loss.ToHost()) s += v;
    return s;
  };
  Tensor z = Tensor::FromHost(*cpu, {rows, cols}, logits);
  Tensor d = Tensor::Empty(*cpu, {rows, cols});
  cpu->SoftmaxXent(z.f32(), y.i32(), rows, cols, 1.0f, d.f32(), loss.f32(), ok.f32());
  std::vector<float> numeric(logits.size());
  const float eps = 1e-2f;
  for (size_t i = 0; i < logits.size(); ++i) {
    auto p = logits, q = logits;
    p[i] += eps;
    q[i] -= eps;
    numeric[i] = static_cast<float>((total(p) - total(q)) / (2 * eps));
  }
  EXPECT_TRUE(AllClose(d.ToHost(), numeric, 1e-3f, 1e-2f));
}

// Training keeps each row's exponentials in dlogits instead of computing them twice; the
// loss and gradient must keep the bits of the textbook two passes, written out here.
TEST(SoftmaxXent, ComputingEachExponentialOnceKeepsTheTwoPassBits) {
  auto cpu = MakeCpuBackend();
  const int rows = 9, cols = 257;
  const std::vector<float> z = RandomVector(rows * cols, 21, -8, 8);
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = (r * 37) % cols;
  Tensor zt = Tensor::FromHost(*cpu, {rows, cols}, z),
         y = Tensor::FromHostI32(*cpu, {rows}, labels);
  Tensor d = Tensor::Empty(*cpu, {rows, cols}), loss = Tensor::Empty(*cpu, {rows}),
         ok = Tensor::Empty(*cpu, {rows});
  const float scale = 0.125f;
  cpu->SoftmaxXent(zt.f32(), y.i32(), rows, cols, scale, d.f32(), loss.f32(), ok.f32());
  std::vector<float> want_d(z.size()), want_loss(rows);
  for (int r = 0; r < rows; ++r) {
    const float* row = z.data() + r * cols;
    float mx = row[0];
    for (int c = 1; c < cols; ++c) mx = row[c] > mx ? row[c] : mx;
    float sum = 0.0f;
    for (int c = 0; c < cols; ++c) sum += std::exp(row[c] - mx);
    want_loss[r] = mx + std::log(sum) - row[labels[r]];
    const float inv = 1.0f / sum;
    for (int c = 0; c < cols; ++c) {
      const float p = std::exp(row[c] - mx) * inv;
      want_d[r * cols + c] = (p - (c == labels[r] ? 1.0f : 0.0f)) * scale;
    }
  }
  const std::vector<float> got_d = d.ToHost(), got_loss = loss.ToHost();
  EXPECT_EQ(std::memcmp(got_d.data(), want_d.data(), got_d.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(got_loss.data(), want_loss.data(), rows * sizeof(float)), 0);
}

TEST(Dropout, KeepsTheExpectedFractionAndScalesSurvivors) {
  auto cpu = MakeCpuBackend();
  const int n = 100000;
  Tensor x = Tensor::FromHost(*cpu, {n}, std::vector<float>(n, 1.0f));
  Tensor y = Tensor::Empty(*cpu, {n}), mask = Tensor::Empty(*cpu, {n});
  cpu->DropoutForward(x.f32(), y.f32(), mask.f32(), n, 0.25f, 42);
  int kept = 0;
  for (float v : y.ToHost()) {
    ASSERT_TRUE(v == 0.0f || std::fabs(v - 1.0f / 0.75f) < 1e-6f);
    kept += v != 0.0f;
  }
  EXPECT_NEAR(kept / double(n), 0.75, 0.01);
  // A different seed gives a different mask; the same seed the same one.
  Tensor y2 = Tensor::Empty(*cpu, {n});
  cpu->DropoutForward(x.f32(), y2.f32(), mask.f32(), n, 0.25f, 43);
  EXPECT_NE(y.ToHost(), y2.ToHost());
  cpu->DropoutForward(x.f32(), y2.f32(), mask.f32(), n, 0.25f, 42);
  EXPECT_EQ(y.ToHost(), y2.ToHost());
}

// ---- CUDA against CPU, on fresh random inputs ------------------------------------------
TEST(CudaParity, ElementwiseKernels) {
  LP_REQUIRE_CUDA(gpu);
  auto cpu = MakeCpuBackend();
  const int rows = 33, cols = 65, n = rows * cols;
  auto a = RandomVector(n, 11), b = RandomVector(n, 12), bias = RandomVector(cols, 13);
  auto run = [&](Backend& be) {
    Tensor ta = Tensor::FromHost(be, {n}, a), tb = Tensor::FromHost(be, {n}, b);
    Tensor tbias = Tensor::FromHost(be, {cols}, bias), out = Tensor::Empty(be, {n});
    Tensor sums = Tensor::FromHost(be, {cols}, bias);
    be.Add(ta.f32(), tb.f32(), out.f32(), n);
    be.Mul(out.f32(), tb.f32(), out.f32(), n);
    be.Axpy(-0.5f, ta.f32(), out.f32(), n);
    be.AddRowVector(out.f32(), tbias.f32(), rows, cols);
    be.SumRows(out.f32(), sums.f32(), rows, cols);
    Tensor h = Tensor::Empty(be, {n}, DType::kBF16), back = Tensor::Empty(be, {n});
    be.ToBf16(out.f32(), h.bf16(), n);
    be.FromBf16(h.bf16(), back.f32(), n);
    std::vector<float> all = out.ToHost();
    for (float v : sums.ToHost()) all.push_back(v);
    for (float v : back.ToHost()) all.push_back(v);
    return all;
  };
  EXPECT_TRUE(AllClose(run(*gpu), run(*cpu), 1e-5f, 1e-5f));
}

TEST(CudaParity, SoftmaxXentAndActivations) {
  LP_REQUIRE_CUDA(gpu);
  auto cpu = MakeCpuBackend();
  const int rows = 19, cols = 300;
  auto z = RandomVector(rows * cols, 21, -4, 4);
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = (r * 37) % cols;
  auto run = [&](Backend& be) {
    Tensor tz = Tensor::FromHost(be, {rows, cols}, z);
    Tensor ty = Tensor::FromHostI32(be, {rows}, labels);
    Tensor d = Tensor::Empty(be, {rows, cols}), l = Tensor::Empty(be, {rows}),
           c = Tensor::Empty(be, {rows}), g = Tensor::Empty(be, {rows, cols}),
           r = Tensor::Empty(be, {rows, cols});
    be.SoftmaxXent(tz.f32(), ty.i32(), rows, cols, 0.1f, d.f32(), l.f32(), c.f32());
    be.GeluForward(tz.f32(), g.f32(), rows * cols);
    be.GeluBackward(tz.f32(), d.f32(), g.f32(), rows * cols);
    be.ReluForward(tz.f32(), r.f32(), rows * cols);
    be.ReluBackward(r.f32(), g.f32(), r.f32(), rows * cols);
    std::vector<float> all = d.ToHost();
    for (auto& t : {l, c, g, r}) {
      for (float v : t.ToHost()) all.push_back(v);
    }
    return all;
  };
  EXPECT_TRUE(AllClose(run(*gpu), run(*cpu), 1e-5f, 1e-4f));
}

TEST(CudaParity, DropoutMaskIsBitwiseIdentical) {
  LP_REQUIRE_CUDA(gpu);
  auto cpu = MakeCpuBackend();
  const int n = 4097;
  auto x = RandomVector(n, 31);
  auto run = [&](Backend& be) {
    Tensor tx = Tensor::FromHost(be, {n}, x), y = Tensor::Empty(be, {n}),
           m = Tensor::Empty(be, {n});
    be.DropoutForward(tx.f32(), y.f32(), m.f32(), n, 0.3f, 777);
    return m.ToHost();
  };
  EXPECT_EQ(run(*gpu), run(*cpu));
}

TEST(CudaParity, OptimizerSteps) {
  LP_REQUIRE_CUDA(gpu);
  auto cpu = MakeCpuBackend();
  const int n = 1000;
  auto p0 = RandomVector(n, 41), g = RandomVector(n, 42), s = RandomVector(n, 43, 0, 1);
  auto run = [&](Backend& be) {
    Tensor p = Tensor::FromHost(be, {n}, p0), tg = Tensor::FromHost(be, {n}, g);
    Tensor m = Tensor::FromHost(be, {n}, s), v = Tensor::FromHost(be, {n}, s);
    Tensor q = Tensor::FromHost(be, {n}, p0), vel = Tensor::FromHost(be, {n}, s);
    be.AdamWStep(p.f32(), tg.f32(), m.f32(), v.f32(), n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.19f,
                 0.002f);
    be.SgdStep(q.f32(), tg.f32(), vel.f32(), n, 0.1f, 0.9f, 1e-4f, true);
    std::vector<float> all = p.ToHost();
    for (auto& t : {m, v, q, vel}) {
      for (float x : t.ToHost()) all.push_back(x);
    }
    return all;
  };
  EXPECT_TRUE(AllClose(run(*gpu), run(*cpu), 1e-6f, 1e-5f));
}

// The sum of squares that gradient clipping and the replicas' device-side finiteness check
// use: accumulated in double on both backends, so a bucket of large finite values stays
// finite, and one NaN or infinity anywhere makes it non-finite.
TEST(CudaParity, SquaredNormAndTheReplicasFinitenessCheck) {
  LP_REQUIRE_CUDA(gpu);
  auto cpu = MakeCpuBackend();
  const int n = 100000;
  std::vector<float> x = RandomVector(n, 44);
  x[7] = 3e38f;
  x[8] = -3e38f;
  auto run = [&](Backend& be, const std::vector<float>& v) {
    Tensor t = Tensor::FromHost(be, {static_cast<int64_t>(v.size())}, v);
    const double norm = be.SquaredNorm(t.f32(), n);
    return std::make_pair(norm, FirstNonFiniteReplica(be, t.f32(), 2, n / 2));
  };
  auto [gpu_norm, gpu_bad] = run(*gpu, x);
  auto [cpu_norm, cpu_bad] = run(*cpu, x);
  EXPECT_TRUE(std::isfinite(gpu_norm));
  EXPECT_NEAR(gpu_norm, cpu_norm, 1e-9 * cpu_norm);
  EXPECT_EQ(gpu_bad, -1);
  EXPECT_EQ(cpu_bad, -1);
  x[n - 3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(run(*gpu, x).second, 1);
  EXPECT_EQ(run(*cpu, x).second, 1);
}

// ---- convolution -----------------------------------------------------------------------------

// The convolution, its input gradient and its weight and bias gradients, summed in double
// straight from the definition: an independent reference for every backend's Conv ops.
struct ConvReference {
  std::vector<float> y, dx, dw, db;
};
ConvReference NaiveConv(const ConvGeometry& g, const std::vector<float>& x,
                        const std::vector<float>& w, const std::vector<float>& bias,
                        const std::vector<float>& dy) {
  std::vector<double> y(g.n * g.oh * g.ow * g.out_channels), dx(x.size()), dw(w.size()),
      db(bias.size());
  for (int64_t b = 0; b < g.n; ++b) {
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        for (int64_t o = 0; o < g.out_channels; ++o) {
          const int64_t yi = ((b * g.oh + oy) * g.ow + ox) * g.out_channels + o;
          double acc = bias[o];
          db[o] += dy[yi];
          for (int64_t ky = 0; ky < g.kernel; ++ky) {
            for (int64_t kx = 0; kx < g.kernel; ++kx) {
              const int64_t iy = oy * g.stride - g.pad + ky, ix = ox * g.stride - g.pad + kx;
              if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
              for (int64_t ch = 0; ch < g.c; ++ch) {
                const int64_t xi = ((b * g.h + iy) * g.w + ix) * g.c + ch;
                const int64_t wi = ((ky * g.kernel + kx) * g.c + ch) * g.out_channels + o;
                acc += static_cast<double>(x[xi]) * w[wi];
                dx[xi] += static_cast<double>(dy[yi]) * w[wi];
                dw[wi] += static_cast<double>(dy[yi]) * x[xi];
              }
            }
          }
          y[yi] = acc;
        }
      }
    }
  }
  auto to_float = [](const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  };
  return {to_float(y), to_float(dx), to_float(dw), to_float(db)};
}

ConvGeometry MakeGeometry(int64_t n, int64_t h, int64_t w, int64_t c, int64_t oc, int64_t k,
                          int64_t stride, int64_t pad) {
  return {n,
          h,
          w,
          c,
          oc,
          k,
          stride,
          pad,
          (h + 2 * pad - k) / stride + 1,
          (w + 2 * pad - k) / stride + 1};
}

// Runs the three Conv ops (or, with im2col, the im2col path) on `be`. dx starts as garbage
// (the op overwrites it); dw and db start at `grad0` (the op accumulates into them).
ConvReference RunConv(Backend& be, const ConvGeometry& g, const std::vector<float>& x,
                      const std::vector<float>& w, const std::vector<float>& bias,
                      const std::vector<float>& dy, const std::vector<float>& grad0, bool im2col) {
  const int64_t nx = g.n * g.h * g.w * g.c, ny = g.n * g.oh * g.ow * g.out_channels;
  const int64_t nw = g.fan_in() * g.out_channels;
  Tensor xt = Tensor::FromHost(be, {nx}, x), wt = Tensor::FromHost(be, {nw}, w),
         bt = Tensor::FromHost(be, {g.out_channels}, bias), dyt = Tensor::FromHost(be, {ny}, dy);
  Tensor y = Tensor::Empty(be, {ny}), dx = Tensor::FromHost(be, {nx}, RandomVector(nx, 99)),
         dw = Tensor::FromHost(be, {nw}, std::vector<float>(grad0.begin(), grad0.begin() + nw)),
         db = Tensor::FromHost(be, {g.out_channels},
                               std::vector<float>(grad0.begin() + nw, grad0.end()));
  const int64_t ws = im2col ? Backend::ConvIm2ColWorkspaceFloats(g) : be.ConvWorkspaceFloats(g);
  Tensor workspace = Tensor::Empty(be, {std::max<int64_t>(1, ws)});
  if (im2col) {
    be.ConvForwardIm2Col(g, xt.f32(), wt.f32(), bt.f32(), y.f32(), workspace.f32());
    be.ConvBackwardWeightsIm2Col(g, xt.f32(), dyt.f32(), dw.f32(), db.f32(), workspace.f32());
    be.ConvBackwardDataIm2Col(g, dyt.f32(), wt.f32(), dx.f32(), workspace.f32());
  } else {
    be.ConvForward(g, xt.f32(), wt.f32(), bt.f32(), y.f32(), workspace.f32());
    be.ConvBackwardWeights(g, xt.f32(), dyt.f32(), dw.f32(), db.f32(), workspace.f32());
    be.ConvBackwardData(g, dyt.f32(), wt.f32(), dx.f32(), workspace.f32());
  }
  return {y.ToHost(), dx.ToHost(), dw.ToHost(), db.ToHost()};
}

std::unique_ptr<Backend> CpuWithThreads(int threads) {
  CpuOptions options;
  options.threads = threads;
  return MakeCpuBackend(options);
}

class ConvTest : public ::testing::TestWithParam<ConvGeometry> {};

// Padded and unpadded, strided with a dropped edge, one input channel (the stem), 1x1, and
// channel counts that fill the vector registers of the blocked kernels.
INSTANTIATE_TEST_SUITE_P(Geometries, ConvTest,
                         ::testing::Values(MakeGeometry(3, 7, 6, 2, 5, 3, 2, 1),
                                           MakeGeometry(2, 7, 6, 2, 3, 3, 2, 0),
                                           MakeGeometry(2, 6, 6, 1, 32, 3, 1, 1),
                                           MakeGeometry(2, 5, 4, 16, 16, 1, 1, 0),
                                           MakeGeometry(2, 9, 9, 32, 32, 3, 1, 1),
                                           MakeGeometry(3, 8, 8, 32, 64, 3, 2, 1)),
                         [](const ::testing::TestParamInfo<ConvGeometry>& info) {
                           const ConvGeometry& g = info.param;
                           return "n" + std::to_string(g.n) + "_" + std::to_string(g.h) + "x" +
                                  std::to_string(g.w) + "x" + std::to_string(g.c) + "_to_" +
                                  std::to_string(g.out_channels) + "_k" + std::to_string(g.kernel) +
                                  "s" + std::to_string(g.stride) + "p" + std::to_string(g.pad);
                         });

// Random input, weights, bias and output gradient for geometry g.
struct ConvInputs {
  std::vector<float> x, w, bias, dy;
};
ConvInputs RandomConvInputs(const ConvGeometry& g, uint64_t seed) {
  return {RandomVector(g.n * g.h * g.w * g.c, seed),
          RandomVector(g.fan_in() * g.out_channels, seed + 1),
          RandomVector(g.out_channels, seed + 2),
          RandomVector(g.n * g.oh * g.ow * g.out_channels, seed + 3)};
}

TEST_P(ConvTest, EveryPathMatchesTheDirectDefinitionOnEveryBackend) {
  const ConvGeometry g = GetParam();
  const auto [x, w, bias, dy] = RandomConvInputs(g, 1);
  const auto grad0 = RandomVector(g.fan_in() * g.out_channels + g.out_channels, 5);
  ConvReference ref = NaiveConv(g, x, w, bias, dy);
  for (size_t i = 0; i < ref.dw.size(); ++i) ref.dw[i] += grad0[i];
  for (size_t i = 0; i < ref.db.size(); ++i) ref.db[i] += grad0[ref.dw.size() + i];

  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(MakeCpuBackend());
  backends.push_back(CpuWithThreads(2));
  if (auto gpu = testing::MaybeCuda()) backends.push_back(std::move(gpu));
  for (auto& be : backends) {
    for (bool im2col : {false, true}) {
      SCOPED_TRACE(be->Describe() + (im2col ? ", im2col path" : ", the backend's Conv ops"));
      ConvReference got = RunConv(*be, g, x, w, bias, dy, grad0, im2col);
      EXPECT_TRUE(AllClose(got.y, ref.y, 1e-4f, 1e-4f));
      EXPECT_TRUE(AllClose(got.dx, ref.dx, 1e-4f, 1e-4f));
      EXPECT_TRUE(AllClose(got.dw, ref.dw, 1e-4f, 1e-4f));
      EXPECT_TRUE(AllClose(got.db, ref.db, 1e-4f, 1e-4f));
    }
  }
}

// The determinism the cluster's bitwise parity rests on: the same inputs and thread count
// give the same bits on every call, including through a second backend (a worker's and the
// reference trainer's are different objects), with one and with two threads.
TEST_P(ConvTest, RepeatedCallsAreBitwiseIdenticalForAFixedThreadCount) {
  const ConvGeometry g = GetParam();
  const auto [x, w, bias, dy] = RandomConvInputs(g, 11);
  const std::vector<float> grad0(g.fan_in() * g.out_channels + g.out_channels, 0.0f);
  for (int threads : {1, 2}) {
    auto a = CpuWithThreads(threads), b = CpuWithThreads(threads);
    ConvReference first = RunConv(*a, g, x, w, bias, dy, grad0, false);
    int call = 0;
    for (Backend* be : {a.get(), a.get(), b.get()}) {
      ConvReference again = RunConv(*be, g, x, w, bias, dy, grad0, false);
      SCOPED_TRACE("call " + std::to_string(++call));
      EXPECT_EQ(again.y, first.y) << threads << " thread(s)";
      EXPECT_EQ(again.dx, first.dx) << threads << " thread(s)";
      EXPECT_EQ(again.dw, first.dw) << threads << " thread(s)";
      EXPECT_EQ(again.db, first.db) << threads << " thread(s)";
    }
  }
}

}  // namespace
}  // namespace localpar
