// BACKPROP: end-to-end backpropagation from the last head. Every micro-batch goes forward
// (side heads train as probes, detached), the last stage turns each into a gradient at once,
// and the others backpropagate the returned gradients in micro-batch order before one
// update per batch. Two schedules (job.pipeline_schedule) order the same actions:
//   GPipe: every forward, then every backward;
//   1F1B:  min(M, K - s - 1) forwards ahead, then one forward and one backward, then the
//          backwards left (PipeDream-Flush), so stage s holds at most K - s micro-batches;
//   ZB:    1F1B's order with every stage but the first splitting each backward pass (Zero
//          Bubble's B and W): the input gradient is computed and sent upstream first, and
//          the parameter gradients follow while the stage before works on it.
// All backpropagate (and so add parameter gradients) in micro-batch order, and the heads
// run in micro-batch order too, so their weights are the same, bit for bit.
#include <algorithm>

#include "common/nn/rule.h"

namespace localpar {
namespace {

// A backward pass (`op`) on micro-batch m and the return of its input gradient; under the
// zero-bubble schedule split, the input half first and the weight half after the send.
void AddBackwardPass(const ProgramSpec& s, Op op, int m, StageProgram* p) {
  const bool dx = !s.first();
  const bool split = dx && s.pipeline == PipelineSchedule::kZeroBubble;
  p->push_back({op, m, HeadMode::kLocal, dx, split});
  if (dx) p->push_back({Op::kSendInputGradient, m});
  if (split) p->push_back({Op::kWeightGradient, m});
}

// Micro-batch m's forward actions; on the last stage also its backward pass.
void AddForward(const ProgramSpec& s, int m, StageProgram* p) {
  p->push_back({Op::kReceive, m});
  p->push_back({Op::kForward, m});
  p->push_back({Op::kSendActivations, m});
  p->push_back({Op::kHead, m, s.last() ? HeadMode::kLocal : HeadMode::kProbe});
  if (s.last()) AddBackwardPass(s, Op::kBackwardFromHead, m, p);
}

// Micro-batch m's backward pass of the gradient the next stage returns (not the last stage).
void AddBackward(const ProgramSpec& s, int m, StageProgram* p) {
  p->push_back({Op::kAwaitGradient, m});
  AddBackwardPass(s, Op::kBackwardReturned, m, p);
}

StageProgram Backprop(const ProgramSpec& s) {
  StageProgram p;
  const int micro = s.micro_batches;
  // Forwards that run ahead of the first backward; the last stage needs none.
  int ahead = micro;
  if (s.last()) {
    ahead = 0;
  } else if (s.pipeline != PipelineSchedule::kGpipe) {
    ahead = std::min(micro, s.num_stages - s.stage - 1);
  }
  for (int m = 0; m < ahead; ++m) AddForward(s, m, &p);
  for (int m = ahead; m < micro; ++m) {
    AddForward(s, m, &p);
    if (!s.last()) AddBackward(s, m - ahead, &p);
  }
  for (int m = micro - ahead; m < micro && !s.last(); ++m) AddBackward(s, m, &p);
  p.push_back({Op::kStep});
  return p;
}

}  // namespace

// Extern: registry.cc lists it.
extern const RuleSpec kBackpropRule = {
    UpdateRule::kBackprop,
    "BACKPROP",
    "one loss at the end, gradients through every stage (the baseline)",
    true,
    true,
    false,
    Backprop};

}  // namespace localpar
