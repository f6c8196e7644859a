// Each update rule's gradients against finite differences of the losses the rule claims
// to follow; micro-batching; determinism; and that every rule learns.
#include "common/nn/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/core/dtype.h"
#include "common/nn/replica_sync.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::AllClose;
using testing::RandomVector;

constexpr int kBatch = 6, kIn = 5, kClasses = 3;

LayerConfig L(const std::string& kind, int64_t out = 0) {
  LayerConfig c(kind);
  if (out > 0) c.Set("out_features", static_cast<double>(out));
  return c;
}

// Smooth activations (GELU) keep finite differences honest.
ModelConfig SmallModel(int stages, uint64_t seed = 17) {
  ModelConfig m;
  m.input_shape = {kIn};
  m.classes = kClasses;
  m.seed = seed;
  m.optimizer.kind = OptimizerConfig::Kind::kSgd;
  for (int k = 0; k < stages; ++k) {
    StageConfig s;
    s.name = "s" + std::to_string(k);
    s.layers = {L("linear", 6), L("gelu")};
    if (k == 1) s.head.kind = HeadConfig::Kind::kMlp, s.head.hidden = 4;
    m.stages.push_back(s);
  }
  return m;
}

struct Fixture {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::unique_ptr<Model> model;
  Tensor x, y;
  explicit Fixture(const ModelConfig& config) {
    std::string error;
    model = Model::Create(*cpu, config, &error);
    EXPECT_TRUE(model) << error;
    x = Tensor::FromHost(*cpu, {kBatch, kIn}, RandomVector(kBatch * kIn, 3));
    y = Tensor::FromHostI32(*cpu, {kBatch}, {0, 1, 2, 2, 1, 0});
  }
  // Mean eval loss of the heads in `heads`, summed.
  double Loss(ReferenceTrainer& t, std::initializer_list<int> heads) {
    std::vector<HeadStats> s = t.EvalBatch(x, y);
    double total = 0;
    for (int k : heads) total += s[k].mean_loss();
    return total;
  }
  // Finite-difference gradient of Loss(heads) w.r.t. every element of `p`.
  std::vector<float> Numeric(ReferenceTrainer& t, Param* p, std::initializer_list<int> heads) {
    const float eps = 1e-2f;
    std::vector<float> g(static_cast<size_t>(p->value.numel()));
    for (size_t i = 0; i < g.size(); ++i) {
      float orig = p->value.f32()[i];
      p->value.f32()[i] = orig + eps;
      double up = Loss(t, heads);
      p->value.f32()[i] = orig - eps;
      double down = Loss(t, heads);
      p->value.f32()[i] = orig;
      g[i] = static_cast<float>((up - down) / (2 * eps));
    }
    return g;
  }
};

StepSettings Options(UpdateRule rule, int micro_batches = 1) {
  StepSettings o;
  o.rule = rule;
  o.micro_batches = micro_batches;
  o.schedule.lr = 0.1f;
  return o;
}

TEST(GreedyRule, EachStageFollowsOnlyItsOwnHeadLoss) {
  Fixture f(SmallModel(3));
  ReferenceTrainer t(*f.model, Options(UpdateRule::kGreedy));
  t.ComputeGradients(f.x, f.y);
  for (int k = 0; k < 3; ++k) {
    Param* w = f.model->stage(k).params()[0];
    std::vector<float> analytic = w->grad.ToHost();
    EXPECT_TRUE(AllClose(analytic, f.Numeric(t, w, {k}), 2e-3f, 2e-2f)) << "stage " << k;
  }
}

TEST(OverlapRule, StageGradientAddsTheNextStagesLossButNotFurther) {
  Fixture f(SmallModel(3));
  ReferenceTrainer t(*f.model, Options(UpdateRule::kOverlap));
  t.ComputeGradients(f.x, f.y);
  Param* w0 = f.model->stage(0).params()[0];
  EXPECT_TRUE(AllClose(w0->grad.ToHost(), f.Numeric(t, w0, {0, 1}), 2e-3f, 2e-2f));
  Param* w1 = f.model->stage(1).params()[0];
  EXPECT_TRUE(AllClose(w1->grad.ToHost(), f.Numeric(t, w1, {1, 2}), 2e-3f, 2e-2f));
  Param* w2 = f.model->stage(2).params()[0];
  EXPECT_TRUE(AllClose(w2->grad.ToHost(), f.Numeric(t, w2, {2}), 2e-3f, 2e-2f));
}

TEST(BackpropRule, EveryStageFollowsTheLastHeadAndSideHeadsAreProbes) {
  Fixture f(SmallModel(3));
  ReferenceTrainer t(*f.model, Options(UpdateRule::kBackprop));
  t.ComputeGradients(f.x, f.y);
  for (int k = 0; k < 3; ++k) {
    Param* w = f.model->stage(k).params()[0];
    EXPECT_TRUE(AllClose(w->grad.ToHost(), f.Numeric(t, w, {2}), 2e-3f, 2e-2f)) << "stage " << k;
  }
  // Stage 0's head (params after the two layer params) learns from its own loss.
  Param* probe = f.model->stage(0).params()[2];
  EXPECT_TRUE(AllClose(probe->grad.ToHost(), f.Numeric(t, probe, {0}), 2e-3f, 2e-2f));
}

TEST(BackpropRule, MicroBatchesAccumulateToTheFullBatchGradient) {
  Fixture whole(SmallModel(2)), split(SmallModel(2));
  ReferenceTrainer tw(*whole.model, Options(UpdateRule::kBackprop, 1));
  ReferenceTrainer ts(*split.model, Options(UpdateRule::kBackprop, 4));  // 2+2+1+1 rows
  auto sw = tw.ComputeGradients(whole.x, whole.y);
  auto ss = ts.ComputeGradients(split.x, split.y);
  EXPECT_NEAR(sw[1].loss_sum, ss[1].loss_sum, 1e-5);
  EXPECT_EQ(ss[1].count, kBatch);
  for (int k = 0; k < 2; ++k) {
    auto pw = whole.model->stage(k).params(), ps = split.model->stage(k).params();
    for (size_t i = 0; i < pw.size(); ++i) {
      EXPECT_TRUE(AllClose(ps[i]->grad.ToHost(), pw[i]->grad.ToHost(), 1e-6f, 1e-5f));
    }
  }
}

// 1F1B runs the same backward passes as GPipe in the same micro-batch order, with fewer
// activation slots, and ZB splits each into its input and weight halves: the weights after
// several steps (one with a short batch, fewer micro-batches than the job's) are the same,
// bit for bit.
class Schedules : public ::testing::TestWithParam<PipelineSchedule> {};

TEST_P(Schedules, GiveGPipesWeightsBitForBit) {
  for (int stages : {2, 3, 4}) {
    Fixture gpipe(SmallModel(stages)), f1b(SmallModel(stages));
    StepSettings o = Options(UpdateRule::kBackprop, 5);
    ReferenceTrainer tg(*gpipe.model, o);
    o.pipeline = GetParam();
    ReferenceTrainer tf(*f1b.model, o);
    const Tensor short_x = gpipe.x.Slice(0, 3), short_y = gpipe.y.Slice(0, 3);
    for (int step = 0; step < 4; ++step) {
      const bool short_batch = step == 2;  // 3 micro-batches of one row
      auto a = tg.TrainStep(short_batch ? short_x : gpipe.x, short_batch ? short_y : gpipe.y);
      auto b = tf.TrainStep(short_batch ? short_x : gpipe.x, short_batch ? short_y : gpipe.y);
      for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k].loss_sum, b[k].loss_sum);
    }
    for (int k = 0; k < stages; ++k) {
      auto p = gpipe.model->stage(k).params(), q = f1b.model->stage(k).params();
      for (size_t i = 0; i < p.size(); ++i) {
        EXPECT_EQ(q[i]->value.ToHost(), p[i]->value.ToHost())
            << stages << " stages, stage " << k << " " << p[i]->name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BackpropRule, Schedules,
                         ::testing::Values(PipelineSchedule::k1F1B, PipelineSchedule::kZeroBubble),
                         [](const auto& info) {
                           return std::string(PipelineScheduleName(info.param));
                         });

// Replicas (Job.replicas): each replica's gradient on its share, added in replica order,
// is the whole batch's gradient, so R replicas take the step one model takes (up to
// rounding) and stay identical to each other bit for bit.
class Replicas : public ::testing::TestWithParam<UpdateRule> {};

TEST_P(Replicas, ThreeReplicasStepAsOneModelOnTheWholeBatchAndStayIdentical) {
  const UpdateRule rule = GetParam();
  const int micro = rule == UpdateRule::kBackprop ? 2 : 1;
  Fixture one(SmallModel(3)), r0(SmallModel(3)), r1(SmallModel(3)), r2(SmallModel(3));
  ReferenceTrainer single(*one.model, Options(rule, micro));
  StepSettings o = Options(rule, micro);
  o.replicas = 3;  // 6 rows: 2 each, in 2 micro-batches of 1 under BACKPROP
  ReferenceTrainer replicated({r0.model.get(), r1.model.get(), r2.model.get()}, o);
  for (int step = 0; step < 5; ++step) {
    std::vector<HeadStats> a = single.TrainStep(one.x, one.y);
    std::vector<HeadStats> b = replicated.TrainStep(r0.x, r0.y);
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_EQ(b[k].count, a[k].count);
      EXPECT_NEAR(b[k].loss_sum, a[k].loss_sum, 1e-4);
    }
  }
  for (int k = 0; k < 3; ++k) {
    auto p = one.model->stage(k).params(), q0 = r0.model->stage(k).params();
    auto q1 = r1.model->stage(k).params(), q2 = r2.model->stage(k).params();
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_TRUE(AllClose(q0[i]->value.ToHost(), p[i]->value.ToHost(), 1e-5f, 1e-4f))
          << "stage " << k << " " << p[i]->name;
      EXPECT_EQ(q1[i]->value.ToHost(), q0[i]->value.ToHost()) << "stage " << k << " " << p[i]->name;
      EXPECT_EQ(q2[i]->value.ToHost(), q0[i]->value.ToHost()) << "stage " << k << " " << p[i]->name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, Replicas,
                         ::testing::Values(UpdateRule::kBackprop, UpdateRule::kGreedy,
                                           UpdateRule::kOverlap),
                         [](const auto& info) { return std::string(UpdateRuleName(info.param)); });

TEST(Replicas, TheFirstReplicaWithANonFiniteValueIsFoundWithoutCopyingToTheHost) {
  auto cpu = MakeCpuBackend();
  const float big = 3e38f;  // finite; its square overflows a float, not a double
  std::vector<float> parts = {big, -big, 1.0f, 2.0f, 3.0f, 4.0f};  // 3 replicas x 2 floats
  EXPECT_EQ(FirstNonFiniteReplica(*cpu, parts.data(), 3, 2), -1);
  parts[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(FirstNonFiniteReplica(*cpu, parts.data(), 3, 2), 2);
  parts[2] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstNonFiniteReplica(*cpu, parts.data(), 3, 2), 1);
}

TEST(Replicas, GradientsAddInReplicaOrderAndRunningStatisticsAverage) {
  float parts[] = {1e8f, 1.0f, -1e8f, 2.0f, 1.0f, 0.5f};  // 3 replicas x 2 floats
  float out[2];
  SumInReplicaOrder(parts, 3, 2, out);
  EXPECT_EQ(out[0], (1e8f + -1e8f) + 1.0f);  // = 1: left to right
  EXPECT_EQ(out[1], 3.5f);
  // A batch-norm stage: gradients are summed, running statistics averaged.
  ModelConfig m = SmallModel(1);
  m.stages[0].layers = {L("linear", 6), L("batch_norm"), L("gelu")};
  Fixture a(m), b(m);
  StepSettings o = Options(UpdateRule::kGreedy);
  o.replicas = 2;
  ReferenceTrainer t({a.model.get(), b.model.get()}, o);
  t.TrainStep(a.x, a.y);
  Param* mean_a = nullptr;
  for (Param* p : a.model->stage(0).params()) {
    if (p->name == "running_mean") mean_a = p;
  }
  ASSERT_TRUE(mean_a);
  // Each replica saw 3 of the 6 rows; the average of their updates is the update from the
  // mean of the two halves' means, which is the whole batch's mean: 0.1 * mean(x W + b).
  Fixture whole(m);
  ReferenceTrainer t1(*whole.model, Options(UpdateRule::kGreedy));
  t1.TrainStep(whole.x, whole.y);
  Param* mean_w = nullptr;
  for (Param* p : whole.model->stage(0).params()) {
    if (p->name == "running_mean") mean_w = p;
  }
  EXPECT_TRUE(AllClose(mean_a->value.ToHost(), mean_w->value.ToHost(), 1e-6f, 1e-5f));
  ReplicaBucket bucket(a.model->stage(0));
  EXPECT_EQ(bucket.size(), a.model->stage(0).num_parameters());
}

// Replicas that synchronise every H steps (DiLoCo): between synchronisations each replica
// is a model trained alone on its share of every batch (the loss a mean over that share),
// bit for bit; at each synchronisation every replica takes the outer Nesterov step from the
// weights at the last one, recomputed here in double precision from the lone models.
TEST(ReplicaSync, ReplicasTrainAloneThenTakeTheOuterNesterovStepTogether) {
  ModelConfig m = SmallModel(2);
  m.optimizer.kind = OptimizerConfig::Kind::kAdamW;  // the inner optimizer DiLoCo uses
  Fixture r0(m), r1(m), a(m), b(m);
  StepSettings o = Options(UpdateRule::kGreedy);
  o.schedule.lr = 0.01f;
  o.replicas = 2;
  o.sync_every = 3;
  o.outer_lr = 0.7f;
  o.outer_momentum = 0.9f;
  o.total_steps = 7;  // synchronised after steps 3, 6 and the last, 7
  ReferenceTrainer together({r0.model.get(), r1.model.get()}, o);
  StepSettings one = Options(UpdateRule::kGreedy);
  one.schedule.lr = 0.01f;
  ReferenceTrainer ta(*a.model, one), tb(*b.model, one);
  const Tensor xa = r0.x.Slice(0, 3), ya = r0.y.Slice(0, 3);
  const Tensor xb = r0.x.Slice(3, 3), yb = r0.y.Slice(3, 3);
  auto all_params = [](Model& model) {
    std::vector<Param*> out;
    for (int k = 0; k < model.num_stages(); ++k) {
      for (Param* p : model.stage(k).params()) out.push_back(p);
    }
    return out;
  };
  const std::vector<Param*> p0 = all_params(*r0.model), p1 = all_params(*r1.model);
  const std::vector<Param*> pa = all_params(*a.model), pb = all_params(*b.model);
  std::vector<std::vector<double>> w, mom;
  for (Param* p : p0) {
    std::vector<float> v = p->value.ToHost();
    w.emplace_back(v.begin(), v.end());
    mom.emplace_back(v.size(), 0.0);
  }
  int syncs = 0;
  for (int step = 0; step < 7; ++step) {
    together.TrainStep(r0.x, r0.y);
    ta.TrainStep(xa, ya);
    tb.TrainStep(xb, yb);
    if ((step + 1) % 3 != 0 && step != 6) {
      for (size_t i = 0; i < p0.size(); ++i) {
        EXPECT_EQ(p0[i]->value.ToHost(), pa[i]->value.ToHost()) << step << " " << p0[i]->name;
        EXPECT_EQ(p1[i]->value.ToHost(), pb[i]->value.ToHost()) << step << " " << p1[i]->name;
      }
      continue;
    }
    ++syncs;
    for (size_t i = 0; i < p0.size(); ++i) {
      const std::vector<float> va = pa[i]->value.ToHost(), vb = pb[i]->value.ToHost();
      std::vector<float> want(va.size());
      for (size_t j = 0; j < va.size(); ++j) {
        const double g = ((w[i][j] - va[j]) + (w[i][j] - vb[j])) / 2;
        mom[i][j] = 0.9 * mom[i][j] + g;
        w[i][j] -= 0.7 * (g + 0.9 * mom[i][j]);
        want[j] = static_cast<float>(w[i][j]);
      }
      EXPECT_TRUE(AllClose(p0[i]->value.ToHost(), want, 1e-5f, 1e-4f))
          << step << " " << p0[i]->name;
      EXPECT_EQ(p1[i]->value.ToHost(), p0[i]->value.ToHost()) << step << " " << p0[i]->name;
      EXPECT_NE(va, vb) << step << " " << p0[i]->name;  // the replicas had moved apart
      // The lone models go on from the synchronised weights with their own optimizer state.
      pa[i]->value.CopyFrom(p0[i]->value);
      pb[i]->value.CopyFrom(p0[i]->value);
    }
  }
  EXPECT_EQ(syncs, 3);
}

// bfloat16 pseudo-gradients: each replica's contribution is its float32 pseudo-gradient
// rounded to the nearest bfloat16 (and differs from it somewhere), and the outer step rounds
// the replicas' sum again before dividing by the replica count.
TEST(ReplicaSync, Bf16PseudoGradientsAreRoundedBeforeAndAfterTheSum) {
  Fixture f(SmallModel(2));
  Stage& stage = f.model->stage(0);
  OuterSync::Start(stage);
  int moved = 0;
  for (Param* p : stage.params()) {
    std::vector<float> v = p->value.ToHost();
    for (size_t j = 0; j < v.size(); ++j) v[j] += 1e-3f * std::sin(static_cast<float>(++moved));
    p->value = Tensor::FromHost(*f.cpu, p->value.shape(), v);
  }
  OuterSync exact(stage, 1.0f, 0.0f), half(stage, 1.0f, 0.0f, /*bf16=*/true);
  ASSERT_EQ(half.pseudo_gradients(), half.size()) << "no running statistics in this stage";
  const size_t n = static_cast<size_t>(half.size());
  std::vector<float> a(n), b(n);
  exact.Pack(a.data());
  half.Pack(b.data());
  int rounded = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(b[i], Bf16ToFloat(FloatToBf16(a[i]))) << i;
    rounded += b[i] != a[i];
  }
  EXPECT_GT(rounded, static_cast<int>(n / 2));
  // Two replicas' contributions added (the second's shifted by one), rounded, then halved.
  std::vector<float> outer, sum(n);
  for (Param* p : stage.params()) {
    std::vector<float> o = p->outer.ToHost();
    outer.insert(outer.end(), o.begin(), o.end());
  }
  int inexact = 0;
  for (size_t i = 0; i < n; ++i) {
    sum[i] = b[i] + b[(i + 1) % n];
    inexact += Bf16ToFloat(FloatToBf16(sum[i])) != sum[i];
  }
  EXPECT_GT(inexact, 0) << "the sum needs rounding somewhere";
  half.ApplySum(sum.data(), 2);
  size_t i = 0;
  for (Param* p : stage.params()) {
    for (float v : p->value.ToHost()) {
      EXPECT_EQ(v, outer[i] - Bf16ToFloat(FloatToBf16(sum[i])) * 0.5f) << i;
      ++i;
    }
  }
}

// What a stage's program tells its ports about final gradients, so that replicas can start
// exchanging a group while the backward pass goes on: the head after the last head
// action, then each layer, the last first, during the last backward action only, and all
// before the step.
struct RecordingPorts final : StagePorts {
  explicit RecordingPorts(StagePorts& p) : inner(p) {}
  PortState Receive(int m, const Tensor** x, const Tensor** labels) override {
    log.push_back("receive " + std::to_string(m));
    return inner.Receive(m, x, labels);
  }
  void SendActivations(int m, const Tensor& y) override { inner.SendActivations(m, y); }
  void SendInputGradient(int m, const Tensor& dx) override { inner.SendInputGradient(m, dx); }
  PortState AwaitGradient(int m, const Tensor** grad) override {
    return inner.AwaitGradient(m, grad);
  }
  PortState ExchangeWithReplicas(Stage&) override {
    log.push_back("exchange");
    return PortState::kReady;
  }
  void GradientsFinal(Stage&, int layer) override {
    log.push_back("final " + std::to_string(layer));
  }
  StagePorts& inner;
  std::vector<std::string> log;
};

TEST(Replicas, GradientsAreAnnouncedFinalOnceEachInTheOrderTheyComplete) {
  for (UpdateRule rule : {UpdateRule::kGreedy, UpdateRule::kBackprop}) {
    Fixture f(SmallModel(1));  // linear, gelu, and a head
    StepSettings o = Options(rule, rule == UpdateRule::kBackprop ? 2 : 1);
    StageExecutor e(f.model->stage(0), StageProgramSpec(o, 0, 1));
    LocalPipeline pipe(1, WireFormat::kF32);
    StepContext ctx;
    ctx.lr = 0.1f;
    ctx.loss_scale = 1.0f / kBatch;
    ctx.micro_batches = rule == UpdateRule::kBackprop ? 2 : 1;
    pipe.Load(f.x, f.y, ctx.micro_batches);
    RecordingPorts ports(pipe.ports(0));
    e.Begin(ctx);
    ASSERT_EQ(e.Run(ports), StageExecutor::Result::kDone);
    pipe.Clear();
    std::vector<std::string> want = {"receive 0", "final -1", "final 1", "final 0", "exchange"};
    if (rule == UpdateRule::kBackprop) {
      want = {"receive 0", "receive 1", "final -1", "final 1", "final 0", "exchange"};
    }
    EXPECT_EQ(ports.log, want) << UpdateRuleName(rule);
    // Without an update (or evaluating) nothing is announced.
    ctx.apply_update = false;
    pipe.Load(f.x, f.y, ctx.micro_batches);
    RecordingPorts quiet(pipe.ports(0));
    e.Begin(ctx);
    ASSERT_EQ(e.Run(quiet), StageExecutor::Result::kDone);
    pipe.Clear();
    for (const std::string& line : quiet.log) EXPECT_EQ(line.rfind("receive", 0), 0u) << line;
  }
  // The groups: the head's first, then the layers with parameters, the last first.
  Fixture f(SmallModel(2));
  ParamGroups g = GroupParams(f.model->stage(1));  // linear, gelu; an MLP head
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_EQ(g.head, 0);
  EXPECT_EQ(g.layer, (std::vector<int>{1, -1}));
  EXPECT_EQ(g.groups[1], f.model->stage(1).layer_params(0));
}

TEST(MicroBatchRange, SplitsRowsWithTheRemainderFirst) {
  int64_t b, c;
  MicroBatchRange(10, 4, 0, &b, &c);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(c, 3);
  MicroBatchRange(10, 4, 1, &b, &c);
  EXPECT_EQ(b, 3);
  EXPECT_EQ(c, 3);
  MicroBatchRange(10, 4, 3, &b, &c);
  EXPECT_EQ(b, 8);
  EXPECT_EQ(c, 2);
}

std::vector<std::vector<float>> Weights(Model& m) {
  std::vector<std::vector<float>> out;
  for (int k = 0; k < m.num_stages(); ++k) {
    for (Param* p : m.stage(k).params()) out.push_back(p->value.ToHost());
  }
  return out;
}

TEST(Initialisation, SameSeedSameWeightsOtherSeedOtherWeights) {
  Fixture a(SmallModel(2, 1)), b(SmallModel(2, 1)), c(SmallModel(2, 2));
  EXPECT_EQ(Weights(*a.model), Weights(*b.model));
  EXPECT_NE(Weights(*a.model), Weights(*c.model));
}

TEST(Rules, GreedyAndBackpropAgreeBitwiseOnOneStage) {
  Fixture g(SmallModel(1)), b(SmallModel(1));
  ReferenceTrainer tg(*g.model, Options(UpdateRule::kGreedy));
  ReferenceTrainer tb(*b.model, Options(UpdateRule::kBackprop));
  for (int i = 0; i < 5; ++i) {
    tg.TrainStep(g.x, g.y);
    tb.TrainStep(b.x, b.y);
  }
  EXPECT_EQ(Weights(*g.model), Weights(*b.model));
}

TEST(Rules, RepeatedRunsAreBitwiseIdentical) {
  for (UpdateRule rule : {UpdateRule::kGreedy, UpdateRule::kOverlap, UpdateRule::kBackprop}) {
    Fixture a(SmallModel(3)), b(SmallModel(3));
    ReferenceTrainer ta(*a.model, Options(rule, rule == UpdateRule::kBackprop ? 2 : 1));
    ReferenceTrainer tb(*b.model, Options(rule, rule == UpdateRule::kBackprop ? 2 : 1));
    for (int i = 0; i < 3; ++i) {
      ta.TrainStep(a.x, a.y);
      tb.TrainStep(b.x, b.y);
    }
    EXPECT_EQ(Weights(*a.model), Weights(*b.model)) << UpdateRuleName(rule);
  }
}

// A two-stage byte-level transformer LM: token ids in, one prediction per position.
ModelConfig TinyLanguageModel() {
  constexpr int kVocab = 7;
  ModelConfig m;
  m.input_shape = {4};
  m.classes = kVocab;
  m.seed = 5;
  m.optimizer.kind = OptimizerConfig::Kind::kSgd;
  LayerConfig emb = L("embedding");
  emb.Set("vocab", kVocab);
  emb.Set("dim", 8);
  LayerConfig attn = L("causal_self_attention");
  attn.Set("heads", 2);
  LayerConfig attn_block = L("residual");
  attn_block.body = {L("layer_norm"), attn};
  LayerConfig mlp_block = L("residual");
  mlp_block.body = {L("layer_norm"), L("dense", 16), L("gelu"), L("dense", 8)};
  StageConfig s0, s1;
  s0.layers = {emb, L("positional_encoding"), attn_block};
  s1.layers = {attn_block, mlp_block};
  s0.head.kind = s1.head.kind = HeadConfig::Kind::kLanguageModel;
  m.stages = {s0, s1};
  return m;
}

TEST(LanguageModel, EveryRulesGradientIsThatOfTheMeanPerTokenLoss) {
  auto cpu = MakeCpuBackend();
  // Token ids; labels: the next token at every position.
  Tensor x = Tensor::FromHostI32(*cpu, {3, 4}, {1, 4, 2, 6, 0, 0, 3, 5, 6, 2, 2, 1});
  Tensor y = Tensor::FromHostI32(*cpu, {3, 4}, {4, 2, 6, 3, 0, 3, 5, 1, 2, 2, 1, 0});
  struct Want {
    UpdateRule rule;
    int stage;
    std::initializer_list<int> heads;
  };
  for (const Want& w :
       {Want{UpdateRule::kGreedy, 0, {0}}, Want{UpdateRule::kGreedy, 1, {1}},
        Want{UpdateRule::kOverlap, 0, {0, 1}}, Want{UpdateRule::kBackprop, 0, {1}}}) {
    std::string error;
    auto model = Model::Create(*cpu, TinyLanguageModel(), &error);
    ASSERT_TRUE(model) << error;
    ReferenceTrainer t(*model, Options(w.rule));
    std::vector<HeadStats> s = t.ComputeGradients(x, y);
    EXPECT_EQ(s[1].count, 12);  // one prediction per token
    // The stage's first parameter: the embedding table, or the attention's qkv weight.
    Param* p = model->stage(w.stage).params()[0];
    std::vector<float> numeric(static_cast<size_t>(p->value.numel()));
    const float eps = 1e-2f;
    auto loss = [&]() {
      std::vector<HeadStats> e = t.EvalBatch(x, y);
      double total = 0;
      for (int k : w.heads) total += e[k].mean_loss();
      return total;
    };
    for (size_t i = 0; i < numeric.size(); ++i) {
      float orig = p->value.f32()[i];
      p->value.f32()[i] = orig + eps;
      double up = loss();
      p->value.f32()[i] = orig - eps;
      double down = loss();
      p->value.f32()[i] = orig;
      numeric[i] = static_cast<float>((up - down) / (2 * eps));
    }
    EXPECT_TRUE(AllClose(p->grad.ToHost(), numeric, 2e-3f, 2e-2f))
        << UpdateRuleName(w.rule) << " stage " << w.stage;
  }
}

// Stage 0 with a learned position embedding and its output projection tied to its token
// embedding: the table's gradient is that of the loss through both uses.
TEST(LanguageModel, ATiedOutputProjectionsGradientAddsBothUsesOfTheTable) {
  auto cpu = MakeCpuBackend();
  ModelConfig m = TinyLanguageModel();
  m.stages[0].layers[1] = L("position_embedding");
  m.stages[0].head.tie_embedding = true;
  std::string error;
  ASSERT_TRUE(ValidateModel(m, &error)) << error;
  auto model = Model::Create(*cpu, m, &error);
  ASSERT_TRUE(model) << error;
  // The head owns only its bias: the projection's weight is the table.
  EXPECT_EQ(StageParameterCount(m.stages[0], m.input_shape, m.classes),
            model->stage(0).num_parameters());
  EXPECT_EQ(model->stage(0).head_params().size(), 3u);  // layer norm's two, the bias
  Tensor x = Tensor::FromHostI32(*cpu, {3, 4}, {1, 4, 2, 6, 0, 0, 3, 5, 6, 2, 2, 1});
  Tensor y = Tensor::FromHostI32(*cpu, {3, 4}, {4, 2, 6, 3, 0, 3, 5, 1, 2, 2, 1, 0});
  ReferenceTrainer t(*model, Options(UpdateRule::kGreedy));
  t.ComputeGradients(x, y);
  for (int which : {0, 1}) {  // the token table, then the position table
    Param* p = model->stage(0).params()[which];
    std::vector<float> numeric(static_cast<size_t>(p->value.numel()));
    const float eps = 1e-2f;
    for (size_t i = 0; i < numeric.size(); ++i) {
      const float orig = p->value.f32()[i];
      p->value.f32()[i] = orig + eps;
      const double up = t.EvalBatch(x, y)[0].mean_loss();
      p->value.f32()[i] = orig - eps;
      const double down = t.EvalBatch(x, y)[0].mean_loss();
      p->value.f32()[i] = orig;
      numeric[i] = static_cast<float>((up - down) / (2 * eps));
    }
    EXPECT_TRUE(AllClose(p->grad.ToHost(), numeric, 2e-3f, 2e-2f)) << "parameter " << which;
  }
  // Only a language model head over the embedding's vocabulary and width can tie.
  m.stages[1].head.tie_embedding = true;
  EXPECT_FALSE(ValidateModel(m, &error));
  EXPECT_NE(error.find("stages[1].head.tie_embedding"), std::string::npos) << error;
}

// Global-norm clipping, as PyTorch's clip_grad_norm_: above the bound, every gradient of
// the stage is scaled by clip / (norm + 1e-6) before the update; below it, none is.
TEST(Optimizer, ClippingScalesTheStagesGradientsToTheBoundOnlyAboveIt) {
  for (float clip : {0.05f, 1e6f}) {
    Fixture plain(SmallModel(2));
    OptimizerConfig with;
    with.kind = OptimizerConfig::Kind::kSgd;
    with.clip_norm = clip;
    Optimizer o(*plain.cpu, with);
    ReferenceTrainer tp(*plain.model, Options(UpdateRule::kGreedy));
    tp.ComputeGradients(plain.x, plain.y);
    std::vector<Param*> ps = plain.model->stage(0).params();
    double squares = 0;
    for (Param* p : ps) {
      for (float g : p->grad.ToHost()) squares += static_cast<double>(g) * g;
    }
    const double norm = std::sqrt(squares);
    std::vector<std::vector<float>> before;
    for (Param* p : ps) before.push_back(p->value.ToHost());
    std::vector<std::vector<float>> grads;
    for (Param* p : ps) grads.push_back(p->grad.ToHost());
    o.Step(ps, 1.0f);  // plain SGD, lr 1: the update is the (clipped) gradient
    EXPECT_NEAR(o.last_grad_norm(), norm, 1e-9 * norm);
    const double scale = clip < norm ? clip / (norm + 1e-6) : 1.0;
    for (size_t i = 0; i < ps.size(); ++i) {
      std::vector<float> after = ps[i]->value.ToHost();
      for (size_t j = 0; j < after.size(); ++j) {
        EXPECT_NEAR(before[i][j] - after[j], scale * grads[i][j], 1e-6) << i << "," << j;
      }
    }
  }
}

class EveryRule : public ::testing::TestWithParam<UpdateRule> {};

TEST_P(EveryRule, LearnsTheBatchAtEveryStage) {
  Fixture f(SmallModel(3));
  StepSettings o = Options(GetParam());
  o.schedule.lr = 0.5f;
  ReferenceTrainer t(*f.model, o);
  std::vector<HeadStats> before = t.EvalBatch(f.x, f.y);
  for (int i = 0; i < 200; ++i) t.TrainStep(f.x, f.y);
  std::vector<HeadStats> after = t.EvalBatch(f.x, f.y);
  // The last head always learns; local rules make every head learn.
  EXPECT_LT(after[2].mean_loss(), 0.3 * before[2].mean_loss());
  EXPECT_EQ(after[2].accuracy(), 1.0);
  for (int k = 0; k < 3; ++k) EXPECT_LT(after[k].mean_loss(), before[k].mean_loss()) << k;
}

INSTANTIATE_TEST_SUITE_P(Rules, EveryRule,
                         ::testing::Values(UpdateRule::kBackprop, UpdateRule::kGreedy,
                                           UpdateRule::kChunked, UpdateRule::kOverlap),
                         [](const auto& info) { return std::string(UpdateRuleName(info.param)); });

}  // namespace
}  // namespace localpar
