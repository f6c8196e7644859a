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

std::string Program(UpdateRule rule, int stage, int stages, int micro = 1, int delay = 0,
                    PipelineSchedule pipeline = PipelineSchedule::kGpipe) {
  StepSettings o;
  o.rule = rule;
  o.micro_batches = micro;
  o.pipeline = pipeline;
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

TEST(StageProgram, OneForwardOneBackwardRunsKMinusSMinusOneForwardsAhead) {
  const auto f1b = PipelineSchedule::k1F1B;
  // Stage 0 of 3, 4 micro-batches: two forwards ahead, then alternating, then the rest.
  EXPECT_EQ(
      Program(UpdateRule::kBackprop, 0, 3, 4, 0, f1b),
      "receive 0, forward 0, send activations 0, head (probe) 0, receive 1, forward 1, send "
      "activations 1, head (probe) 1, receive 2, forward 2, send activations 2, head (probe) "
      "2, await gradient 0, backward returned gradient 0, receive 3, forward 3, send "
      "activations 3, head (probe) 3, await gradient 1, backward returned gradient 1, await "
      "gradient 2, backward returned gradient 2, await gradient 3, backward returned gradient "
      "3, step");
  // The last stage turns every forward into a backward at once under either schedule.
  EXPECT_EQ(Program(UpdateRule::kBackprop, 2, 3, 4, 0, f1b),
            Program(UpdateRule::kBackprop, 2, 3, 4));
  // Fewer micro-batches than stages ahead: every forward first, as GPipe.
  EXPECT_EQ(Program(UpdateRule::kBackprop, 0, 4, 2, 0, f1b),
            Program(UpdateRule::kBackprop, 0, 4, 2));
  // The zero-bubble schedule: 1F1B's order, the backward split where there is an input
  // gradient to send (not on stage 0), the weight half after the send.
  EXPECT_EQ(Program(UpdateRule::kBackprop, 1, 2, 2, 0, PipelineSchedule::kZeroBubble),
            "receive 0, forward 0, send activations 0, head (local) 0, backward head gradient 0 "
            "(input gradient only), send input gradient 0, weight gradient 0, receive 1, forward "
            "1, send activations 1, head (local) 1, backward head gradient 1 (input gradient "
            "only), send input gradient 1, weight gradient 1, step");
  EXPECT_EQ(Program(UpdateRule::kBackprop, 0, 2, 2, 0, PipelineSchedule::kZeroBubble),
            Program(UpdateRule::kBackprop, 0, 2, 2, 0, f1b));
  // Rules without micro-batches keep their one program.
  EXPECT_EQ(Program(UpdateRule::kGreedy, 0, 3, 1, 0, f1b), Program(UpdateRule::kGreedy, 0, 3));
}

// Runs every stage's program with each action one time unit long, an action waiting for
// what it receives (a neighbour's send in an earlier unit), as a pipeline does; returns the
// units the step took, and checks slot use: a micro-batch's slot (SlotFor's rule) must not
// be taken by another micro-batch before its backward pass is done.
int Simulate(const StepSettings& o, int stages, std::string* error) {
  const int micro = o.micro_batches;
  std::vector<StageProgram> programs;
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<std::vector<int>> owner(static_cast<size_t>(stages));
  // sent[k][m]: the unit stage k sent m's activations; returned[k][m]: its input gradient.
  std::vector<std::vector<int>> sent(stages, std::vector<int>(micro, -1)), returned = sent;
  for (int k = 0; k < stages; ++k) {
    ProgramSpec spec = StageProgramSpec(o, k, stages);
    programs.push_back(TrainProgram(spec));
    owner[k].assign(static_cast<size_t>(MicroBatchesInFlight(spec)), -1);
  }
  for (int unit = 0;; ++unit) {
    bool all_done = true, moved = false;
    for (int k = 0; k < stages; ++k) {
      if (next[k] == programs[k].size()) continue;
      all_done = false;
      const Action& a = programs[k][next[k]];
      const int m = a.micro_batch, held = static_cast<int>(owner[k].size());
      if (a.op == Op::kReceive && k > 0 && (sent[k - 1][m] < 0 || sent[k - 1][m] >= unit)) continue;
      if (a.op == Op::kAwaitGradient && (returned[k + 1][m] < 0 || returned[k + 1][m] >= unit)) {
        continue;
      }
      if (a.op == Op::kForward) {
        if (owner[k][m % held] >= 0) {
          *error = "stage " + std::to_string(k) + ": micro-batch " + std::to_string(m) +
                   " takes the slot of " + std::to_string(owner[k][m % held]);
          return -1;
        }
        owner[k][m % held] = m;
      }
      const bool backward = a.op == Op::kBackwardFromHead || a.op == Op::kBackwardReturned;
      if ((backward && !a.split) || a.op == Op::kWeightGradient) owner[k][m % held] = -1;
      if (a.op == Op::kSendActivations) sent[k][m] = unit;
      if (a.op == Op::kSendInputGradient) returned[k][m] = unit;
      ++next[k];
      moved = true;
    }
    if (all_done) return unit;
    if (!moved) {
      *error = "deadlock at unit " + std::to_string(unit);
      return -1;
    }
  }
}

TEST(StageProgram, OneForwardOneBackwardReusesItsSlotsSafelyAndNeverDeadlocks) {
  for (int stages = 1; stages <= 5; ++stages) {
    for (int micro = 1; micro <= 9; ++micro) {
      for (PipelineSchedule pipeline :
           {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B, PipelineSchedule::kZeroBubble}) {
        StepSettings o;
        o.rule = UpdateRule::kBackprop;
        o.micro_batches = micro;
        o.pipeline = pipeline;
        std::string error;
        const int units = Simulate(o, stages, &error);
        EXPECT_GT(units, 0) << PipelineScheduleName(pipeline) << ", " << stages << " stages, "
                            << micro << " micro-batches: " << error;
      }
      StepSettings o;
      o.rule = UpdateRule::kBackprop;
      o.micro_batches = micro;
      o.pipeline = PipelineSchedule::k1F1B;
      for (int k = 0; k < stages; ++k) {
        EXPECT_EQ(MicroBatchesInFlight(StageProgramSpec(o, k, stages)),
                  std::max(1, std::min(micro, stages - k)));
      }
      // GPipe holds every micro-batch but on the last stage, which holds one at a time.
      o.pipeline = PipelineSchedule::kGpipe;
      for (int k = 0; k < stages; ++k) {
        EXPECT_EQ(MicroBatchesInFlight(StageProgramSpec(o, k, stages)),
                  k + 1 == stages ? 1 : micro);
      }
    }
  }
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
        o.pipeline = static_cast<PipelineSchedule>(micro - 1);  // GPipe, 1F1B, ZB
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
