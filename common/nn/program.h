// A stage's schedule as data: the list of actions one stage takes for one training step (or
// one evaluation batch). Each update rule builds these lists (common/nn/rules/); one
// executor (executor.h) runs any of them, in the reference trainer and in the worker alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/nn/stage.h"

namespace localpar {

enum class UpdateRule {
  kBackprop = 1,  // one loss at the end, gradients through every stage (side heads are probes)
  kGreedy = 2,    // each stage learns from its own head; stop-gradient at every stage input
  kChunked = 3,   // GREEDY with several layers per stage: backprop inside, stop-gradient between
  kOverlap = 4,   // a stage's loss also reaches one stage back
};                // the numbers are job.proto's, so a job's rule converts by value

// The order of a BACKPROP pipeline's micro-batches (job.proto's PipelineSchedule, by value).
enum class PipelineSchedule {
  kGpipe = 0,       // every forward, then every backward
  k1F1B = 1,        // min(M, K - s - 1) forwards ahead, then one forward and one backward
  kZeroBubble = 2,  // 1F1B's order, each backward split: the input gradient is sent first
};

enum class Op {
  kReceive,            // take micro-batch m's input (activations and labels) from upstream
  kForward,            // run the stage's layers on it
  kSendActivations,    // hand the output to the next stage
  kHead,               // score the head; in kLocal mode also d(head loss)/d(output)
  kBackwardFromHead,   // backpropagate the head's gradient through the layers
  kAwaitGradient,      // wait for the gradient the next stage returns for micro-batch m
  kBackwardReturned,   // backpropagate that gradient through the layers
  kSendInputGradient,  // return d/d(input) of the last backward on m to the stage before
  kWeightGradient,     // the weight half of micro-batch m's split backward pass (split below)
  kApplyArrived,       // asynchronous: apply returned gradients that have arrived, waiting only
                       // for those that would fall more than max_delay steps behind
  kStep,               // the optimizer update
};

struct Action {
  Op op;
  int micro_batch = 0;
  HeadMode mode = HeadMode::kLocal;  // kHead
  bool input_gradient = false;       // backward actions: also compute d/d(input)
  // Backward actions: the input half only (Stage::BackwardInput); a later kWeightGradient
  // on the same micro-batch adds the parameter gradients.
  bool split = false;
};

using StageProgram = std::vector<Action>;

// What a stage's program depends on.
struct ProgramSpec {
  UpdateRule rule = UpdateRule::kGreedy;
  int stage = 0;
  int num_stages = 1;
  int micro_batches = 1;  // in this step (BACKPROP splits a batch; other rules take 1)
  int max_delay = 0;      // asynchronous OVERLAP: how late a returned gradient may be applied
  PipelineSchedule pipeline = PipelineSchedule::kGpipe;  // rules that split micro-batches
  bool last() const { return stage + 1 == num_stages; }
  bool first() const { return stage == 0; }
};

// Micro-batches whose activations a stage holds at once in a training step: all of them
// under GPipe, at most K - s under 1F1B and the zero-bubble schedule; one on the last stage,
// which backpropagates each as soon as it has gone forward, under every schedule.
int MicroBatchesInFlight(const ProgramSpec& spec);
// "GPipe", "1F1B" or "ZB".
const char* PipelineScheduleName(PipelineSchedule schedule);

// The training step of stage spec.stage under spec.rule.
StageProgram TrainProgram(const ProgramSpec& spec);
// An evaluation batch, the same for every rule: receive, forward, send, score.
StageProgram EvalProgram();

// "receive 0, forward 0, send activations 0, head local 0, ..." (localpar validate --explain).
std::string ProgramString(const StageProgram& program);

}  // namespace localpar
