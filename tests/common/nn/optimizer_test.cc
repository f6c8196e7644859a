// Optimizer updates and learning-rate schedules against values worked out by hand.
#include "common/nn/optimizer.h"

#include <gtest/gtest.h>

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
