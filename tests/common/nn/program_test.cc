// Stage programs as data: each rule's programs read as the rule is described, neighbouring
// stages' programs fit each other (every send has its receive), and the registry is whole.
#include "common/nn/program.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "common/nn/rule.h"
#include "common/nn/trainer.h"

namespace localpar {
namespace {

std::string Program(UpdateRule rule, int stage, int stages, int micro = 1, int delay = 0) {
  StepSettings o;
  o.rule = rule;
  o.micro_batches = micro;
  return ProgramString(TrainProgram(StageProgramSpec(o, stage, stages, delay)));
}

TEST(StageProgram, GreedyStagesLearnFromTheirOwnHeadOnly) {
  const std::string want =
      "receive 0, forward 0, send activations 0, head (local) 0, backward head gradient 0, step";
  for (int k = 0; k < 3; ++k) EXPECT_EQ(Program(UpdateRule::kGreedy, k, 3), want) << k;
  EXPECT_EQ(Program(UpdateRule::kChunked, 1, 3), want);
}

TEST(StageProgram, OverlapReturnsItsInputGradientAndWaitsForTheNextStages) {
  EXPECT_EQ(Program(UpdateRule::kOverlap, 0, 3),
            "receive 0, forward 0, send activations 0, head (local) 0, backward head gradient 0, "
            "await gradient 0, backward returned gradient 0, step");
  EXPECT_EQ(Program(UpdateRule::kOverlap, 1, 3),
            "receive 0, forward 0, send activations 0, head (local) 0, backward head gradient 0 "
            "(and input gradient), send input gradient 0, await gradient 0, backward returned "
            "gradient 0, step");
  EXPECT_EQ(Program(UpdateRule::kOverlap, 2, 3),
            "receive 0, forward 0, send activations 0, head (local) 0, backward head gradient 0 "
            "(and input gradient), send input gradient 0, step");
  // Asynchronous: arrived gradients are applied instead of waited for.
  EXPECT_EQ(Program(UpdateRule::kOverlap, 0, 2, 1, 2),
            "receive 0, forward 0, send activations 0, head (local) 0, backward head gradient 0, "
            "apply arrived gradients, step");
}

TEST(StageProgram, BackpropIsAGPipeScheduleOverMicroBatches) {
  EXPECT_EQ(Program(UpdateRule::kBackprop, 0, 2, 2),
            "receive 0, forward 0, send activations 0, head (probe) 0, receive 1, forward 1, send "
            "activations 1, head (probe) 1, await gradient 0, backward returned gradient 0, await "
            "gradient 1, backward returned gradient 1, step");
  EXPECT_EQ(
      Program(UpdateRule::kBackprop, 1, 2, 2),
      "receive 0, forward 0, send activations 0, head (local) 0, backward head gradient 0 "
      "(and input gradient), send input gradient 0, receive 1, forward 1, send activations 1, "
      "head (local) 1, backward head gradient 1 (and input gradient), send input gradient 1, "
      "step");
}

// What a program sends and expects, per micro-batch: neighbours must agree.
struct Traffic {
  std::map<int, int> receives, sends, awaits, returns;
};

Traffic Count(const StageProgram& p) {
  Traffic t;
  for (const Action& a : p) {
    if (a.op == Op::kReceive) ++t.receives[a.micro_batch];
    if (a.op == Op::kSendActivations) ++t.sends[a.micro_batch];
    if (a.op == Op::kAwaitGradient) ++t.awaits[a.micro_batch];
    if (a.op == Op::kSendInputGradient) ++t.returns[a.micro_batch];
  }
  return t;
}

TEST(StageProgram, NeighbouringProgramsFitEachOtherForEveryRule) {
  for (const RuleSpec* rule : AllRules()) {
    for (int stages = 1; stages <= 4; ++stages) {
      for (int micro = 1; micro <= 3; ++micro) {
        StepSettings o;
        o.rule = rule->rule;
        o.micro_batches = micro;
        std::vector<Traffic> t;
        for (int k = 0; k < stages; ++k) {
          StageProgram p = TrainProgram(StageProgramSpec(o, k, stages));
          ASSERT_FALSE(p.empty());
          EXPECT_EQ(p.back().op, Op::kStep) << rule->name;
          t.push_back(Count(p));
        }
        const std::string at = std::string(rule->name) + " " + std::to_string(stages) +
                               " stages, " + std::to_string(micro) + " micro-batches";
        for (int k = 0; k + 1 < stages; ++k) {
          EXPECT_EQ(t[k].sends, t[k + 1].receives) << at << ", stage " << k;
          EXPECT_EQ(t[k].awaits, t[k + 1].returns) << at << ", stage " << k;
          EXPECT_EQ(!t[k].awaits.empty(), rule->returns_gradients) << at << ", stage " << k;
        }
        EXPECT_TRUE(t[0].returns.empty()) << at << ": stage 0 has no stage before it";
        EXPECT_TRUE(t[stages - 1].awaits.empty()) << at << ": the last stage has none after";
      }
    }
  }
}

TEST(Rules, EveryRuleHasOneNameAndIsFoundByIt) {
  std::set<std::string> names;
  for (const RuleSpec* r : AllRules()) {
    EXPECT_TRUE(names.insert(r->name).second) << r->name;
    EXPECT_EQ(FindRule(r->name), r);
    EXPECT_EQ(&Rule(r->rule), r);
  }
  EXPECT_EQ(FindRule("SIDEWAYS"), nullptr);
  EXPECT_EQ(RuleNameList(), "BACKPROP, GREEDY, CHUNKED or OVERLAP");
}

}  // namespace
}  // namespace localpar
