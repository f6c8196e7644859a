// Planning: balanced partitions, projections, layer profiles.
#include "common/plan/plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/job/parse.h"
#include "common/job/validate.h"

namespace localpar {
namespace {

TEST(Plan, TheBalancedSplitIsTheBestOfEveryContiguousSplit) {
  // Unit times and head times (a negative head: no stage may end there).
  std::vector<UnitProfile> units;
  std::vector<std::pair<double, double>> t = {{9, 1}, {1, 1}, {1, -1},  {4, 0.5},
                                              {2, 2}, {7, 1}, {1, 0.1}, {3, 1}};
  // Inside a stage each unit but the first also passes a gradient back: 0.25 x i more.
  for (auto [s, h] : t) units.push_back({"u", s, h});
  for (size_t i = 0; i < units.size(); ++i) units[i].input_grad_seconds = 0.25 * i;
  for (int stages = 1; stages <= 5; ++stages) {
    absl::StatusOr<Partition> best = BestPartition(units, stages);
    ASSERT_TRUE(best.ok()) << best.status();
    // Brute force over every placement of stages-1 cuts among the 7 gaps.
    double want = 1e9;
    for (int mask = 0; mask < (1 << 7); ++mask) {
      if (__builtin_popcount(mask) != stages - 1) continue;
      double worst = 0, cur = 0;
      for (int i = 0; i < 8; ++i) {
        const bool first_of_stage = i == 0 || (mask >> (i - 1) & 1);
        cur += t[i].first + (first_of_stage ? 0.0 : 0.25 * i);
        if (i == 7 || (mask >> i & 1)) {
          worst = std::max(worst, t[i].second < 0 ? 1e18 : cur + t[i].second);
          cur = 0;
        }
      }
      want = std::min(want, worst);
    }
    EXPECT_DOUBLE_EQ(best->bottleneck(), want) << stages << " stages";
    int total = 0;
    for (int s : best->sizes) total += s;
    EXPECT_EQ(total, 8);
  }
  absl::StatusOr<Partition> equal = EqualPartition(units, 3);  // 3, 3, 2 units
  ASSERT_TRUE(equal.ok());
  EXPECT_EQ(equal->sizes, (std::vector<int>{3, 3, 2}));
  EXPECT_TRUE(std::isinf(equal->stage_seconds[0]));  // ends on the unit with no head
  EXPECT_FALSE(BestPartition(units, 9).ok());
}

// The projection with replicas against figures worked by hand: each replica computes its
// share, then sums the buckets in two rounds that move 2 (R - 1) / R of one over the link;
// the exchange also takes core time.
TEST(Plan, ProjectionWithReplicasAddsTheExchangeToEachStageAndToTheCores) {
  LinkModel link;
  link.bytes_per_second = 1e9;
  link.latency_seconds = 1e-4;
  link.replicas = 3;
  link.exchange_bytes = {4e6, 1e6};
  // Stage 0: 10 ms + 2 x 0.1 ms + 4/3 x 4 ms = 15.5333 ms; stage 1: 5 + 0.2 + 4/3 x 1 =
  // 6.5333 ms.
  const std::vector<double> exchange = ExchangeSeconds(link, 2);
  ASSERT_EQ(exchange.size(), 2u);
  EXPECT_NEAR(exchange[0], 0.0002 + 4.0 / 3 * 0.004, 1e-12);
  EXPECT_NEAR(exchange[1], 0.0002 + 4.0 / 3 * 0.001, 1e-12);
  const double s0 = 0.010 + exchange[0], s1 = 0.005 + exchange[1];
  EXPECT_NEAR(PredictExamplesPerSecond({0.010, 0.005}, {1e5}, 96, link), 96 / s0, 1e-6);
  // On 2 cores: 3 replicas x (15.53 + 6.53) ms / 2 = 33.1 ms bounds the period.
  link.cores = 2;
  EXPECT_NEAR(PredictExamplesPerSecond({0.010, 0.005}, {1e5}, 96, link), 96 / (3 * (s0 + s1) / 2),
              1e-6);
  // Without replicas nothing changes: the slowest stage.
  LinkModel one;
  EXPECT_NEAR(PredictExamplesPerSecond({0.010, 0.005}, {1e5}, 96, one), 96 / 0.010, 1e-9);
  // The bucket of each stage of a regrouped job: its parameters, float32.
  absl::StatusOr<v1::Job> j = ParseJob(R"(
rule: GREEDY
batch_size: 16
data { synthetic { shape: [32] classes: 3 } }
stages { layers { linear { out_features: 8 } } layers { relu {} } head { kind: LINEAR } }
stages { layers { linear { out_features: 4 } } head { kind: LINEAR } }
)",
                                       "t");
  ASSERT_TRUE(j.ok()) << j.status();
  Partition p;
  p.sizes = {1, 1};
  p.stage_seconds = {1, 1};
  EXPECT_EQ(ExchangeBytes(*j, p),
            (std::vector<double>{4.0 * (32 * 8 + 8 + 8 * 3 + 3), 4.0 * (8 * 4 + 4 + 4 * 3 + 3)}));
}

TEST(Plan, ProfilesEveryLayerAndRegroupsTheJob) {
  absl::StatusOr<v1::Job> j = ParseJob(R"(
rule: GREEDY
batch_size: 16
data { synthetic { shape: [32] classes: 3 } }
stages { name: "a" layers { linear { out_features: 256 } } layers { relu {} } head { kind: MLP hidden: 4 } }
stages { name: "b" layers { linear { out_features: 8 } } layers { relu {} } }
)",
                                       "t");
  ASSERT_TRUE(j.ok()) << j.status();
  auto cpu = MakeCpuBackend();
  absl::StatusOr<std::vector<UnitProfile>> units = ProfileUnits(*j, *cpu, 16, 3);
  ASSERT_TRUE(units.ok()) << units.status();
  ASSERT_EQ(units->size(), 2u);  // each linear keeps its relu
  EXPECT_NE((*units)[0].label.find("a.layers[0] linear+relu"), std::string::npos)
      << (*units)[0].label;
  for (const UnitProfile& u : *units) {
    EXPECT_GT(u.seconds, 0);
    EXPECT_GT(u.head_seconds, 0);
    EXPECT_EQ(u.layers, 2);
  }
  Partition p;
  p.sizes = {1, 1};
  v1::Job out = ApplyPartition(*j, p);
  ASSERT_EQ(out.stages_size(), 2);
  EXPECT_EQ(out.stages(0).layers_size(), 2);
  EXPECT_EQ(out.stages(0).head().kind(), v1::Head::MLP);  // from job stage 0
  EXPECT_EQ(out.stages(0).name(), "a");
  EXPECT_EQ(out.stages(1).layers_size(), 2);
  EXPECT_FALSE(out.stages(1).has_head());  // job stage 1 has the default head
  EXPECT_EQ(out.stages(1).name(), "b");
  EXPECT_TRUE(ValidateJob(out).ok());
}

TEST(Plan, NeverCutsAnActivationFromTheLayerItFollows) {
  // The job itself puts b's relu after a's linear: the plan keeps them together, and the
  // stage that holds them is named after both.
  absl::StatusOr<v1::Job> j = ParseJob(R"(
rule: GREEDY
batch_size: 8
data { synthetic { shape: [16] classes: 3 } }
stages { name: "a" layers { linear { out_features: 16 } } }
stages { name: "b" layers { relu {} } layers { dropout { rate: 0.1 } } layers { linear { out_features: 8 } } layers { gelu {} } }
)",
                                       "t");
  ASSERT_TRUE(j.ok()) << j.status();
  auto cpu = MakeCpuBackend();
  absl::StatusOr<std::vector<UnitProfile>> units = ProfileUnits(*j, *cpu, 8, 3);
  ASSERT_TRUE(units.ok()) << units.status();
  ASSERT_EQ(units->size(), 2u);
  EXPECT_EQ((*units)[0].layers, 3);  // linear, relu, dropout
  EXPECT_EQ((*units)[1].layers, 2);  // linear, gelu
  for (int stages : {1, 2}) {
    absl::StatusOr<Partition> best = BestPartition(*units, stages);
    ASSERT_TRUE(best.ok()) << best.status();
    v1::Job out = ApplyPartition(*j, *best);
    for (const v1::Stage& st : out.stages()) {
      EXPECT_FALSE(st.layers(0).has_relu() || st.layers(0).has_gelu() || st.layers(0).has_dropout())
          << "a stage starts with an activation: " << st.ShortDebugString();
    }
  }
  Partition two;
  two.sizes = {1, 1};
  EXPECT_EQ(ApplyPartition(*j, two).stages(0).name(), "a+b");
}

}  // namespace
}  // namespace localpar
