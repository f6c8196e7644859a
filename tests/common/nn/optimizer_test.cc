// Optimizer updates and learning-rate schedules against values worked out by hand.
#include "common/nn/optimizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/ops/optim_math.h"

namespace localpar {
namespace {

struct OneParam {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  Param p;
  OneParam() {
    p.value = Tensor::FromHost(*cpu, {1}, std::vector<float>{1.0f});
    p.grad = Tensor::Zeros(*cpu, {1});
  }
  float Step(Optimizer& opt, float grad, float lr) {
    p.grad.f32()[0] = grad;
    opt.Step({&p}, lr);
    EXPECT_EQ(p.grad.f32()[0], 0.0f) << "gradients are cleared after a step";
    return p.value.f32()[0];
  }
};

TEST(Sgd, MomentumAndWeightDecayMatchHandComputedSteps) {
  OneParam t;
  OptimizerConfig c;
  c.kind = OptimizerConfig::Kind::kSgd;
  c.momentum = 0.9f;
  c.weight_decay = 0.1f;
  Optimizer opt(*t.cpu, c);
  // d = 0.5 + 0.1*1 = 0.6, v = 0.6, p = 1 - 0.1*0.6
  EXPECT_NEAR(t.Step(opt, 0.5f, 0.1f), 0.94f, 1e-6f);
  // d = 0.5 + 0.1*0.94 = 0.594, v = 0.9*0.6 + 0.594 = 1.134, p = 0.94 - 0.1134
  EXPECT_NEAR(t.Step(opt, 0.5f, 0.1f), 0.8266f, 1e-6f);
}

TEST(Sgd, NesterovLooksAhead) {
  OneParam t;
  OptimizerConfig c;
  c.kind = OptimizerConfig::Kind::kSgd;
  c.momentum = 0.5f;
  c.nesterov = true;
  Optimizer opt(*t.cpu, c);
  // v = 1, step = g + 0.5*v = 1.5
  EXPECT_NEAR(t.Step(opt, 1.0f, 0.1f), 0.85f, 1e-6f);
}

TEST(AdamW, MatchesHandComputedSteps) {
  OneParam t;
  OptimizerConfig c;
  c.kind = OptimizerConfig::Kind::kAdamW;
  c.weight_decay = 0.01f;
  Optimizer opt(*t.cpu, c);
  // Step 1: decay to 0.999; m = 0.05, v = 2.5e-4; mhat/sqrt(vhat) = 0.5/0.5 = 1.
  EXPECT_NEAR(t.Step(opt, 0.5f, 0.1f), 0.899f, 1e-6f);
  // Step 2 (g = -0.25): worked out in double precision.
  EXPECT_NEAR(t.Step(opt, -0.25f, 0.1f), 0.8714673f, 2e-6f);
  EXPECT_EQ(opt.steps(), 2);
}

// The backend's update loops are built for AVX-512 and AVX2 too, picked at load time; on any
// machine they must give the scalar update's bits (no fused multiply-add, the same order).
// An odd length exercises the vector body and the scalar tail.
TEST(Optimizer, TheBackendsUpdateLoopsGiveTheScalarUpdatesBits) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  constexpr int64_t n = 1037;
  constexpr int kSteps = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> start(n);
  for (float& x : start) x = normal(rng);
  std::vector<std::vector<float>> grads(kSteps, std::vector<float>(n));
  for (auto& g : grads) {
    for (float& x : g) x = 0.1f * normal(rng);
  }
  std::vector<float> p = start, m(n, 0.0f), v(n, 0.0f), sp = start, vel(n, 0.0f);
  std::vector<float> rp = start, rm = m, rv = v, rsp = start, rvel = vel;
  for (int step = 1; step <= kSteps; ++step) {
    const float c1 = 1.0f - std::pow(0.9f, static_cast<float>(step));
    const float c2 = 1.0f - std::pow(0.999f, static_cast<float>(step));
    std::vector<float> g = grads[step - 1], g2 = grads[step - 1];
    cpu->AdamWStep(p.data(), g.data(), m.data(), v.data(), n, 3e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, c1,
                   c2);
    cpu->SgdStep(sp.data(), g2.data(), vel.data(), n, 0.05f, 0.9f, 0.001f, true);
    EXPECT_EQ(g, std::vector<float>(n, 0.0f)) << "gradients are cleared after a step";
    EXPECT_EQ(g2, std::vector<float>(n, 0.0f));
    for (int64_t i = 0; i < n; ++i) {  // the reference, one element at a time
      const float gi = grads[step - 1][i];
      AdamWUpdate(rp[i], gi, rm[i], rv[i], 3e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, c1, c2);
      SgdUpdate(rsp[i], gi, rvel[i], 0.05f, 0.9f, 0.001f, true);
    }
  }
  const size_t bytes = n * sizeof(float);
  EXPECT_EQ(std::memcmp(p.data(), rp.data(), bytes), 0) << "AdamW's parameters";
  EXPECT_EQ(std::memcmp(m.data(), rm.data(), bytes), 0) << "AdamW's first moments";
  EXPECT_EQ(std::memcmp(v.data(), rv.data(), bytes), 0) << "AdamW's second moments";
  EXPECT_EQ(std::memcmp(sp.data(), rsp.data(), bytes), 0) << "SGD's parameters";
  EXPECT_EQ(std::memcmp(vel.data(), rvel.data(), bytes), 0) << "SGD's velocities";
  EXPECT_NE(std::memcmp(p.data(), start.data(), bytes), 0) << "the steps moved the parameters";
}

TEST(Schedule, ConstantWarmupAndCosine) {
  ScheduleConfig s;
  s.lr = 0.1f;
  EXPECT_FLOAT_EQ(LearningRate(s, 0, 100), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(s, 99, 100), 0.1f);
  s.warmup_steps = 4;
  EXPECT_FLOAT_EQ(LearningRate(s, 0, 100), 0.025f);
  EXPECT_FLOAT_EQ(LearningRate(s, 3, 100), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(s, 50, 100), 0.1f);
  s.kind = ScheduleConfig::Kind::kCosine;
  s.min_lr = 0.02f;
  EXPECT_FLOAT_EQ(LearningRate(s, 4, 104), 0.1f);     // start of the cosine
  EXPECT_FLOAT_EQ(LearningRate(s, 54, 104), 0.06f);   // half way: the mean
  EXPECT_FLOAT_EQ(LearningRate(s, 104, 104), 0.02f);  // the floor
  EXPECT_FLOAT_EQ(LearningRate(s, 500, 104), 0.02f);  // stays there
}

}  // namespace
}  // namespace localpar
