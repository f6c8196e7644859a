// BACKPROP: end-to-end backpropagation from the last head, GPipe style. Every micro-batch
// goes forward (side heads train as probes, detached), the last stage turns each into a
// gradient at once, and the others backpropagate the returned gradients in micro-batch
// order before one update per batch.
#include "common/nn/rule.h"

namespace localpar {
namespace {

StageProgram Backprop(const ProgramSpec& s) {
  StageProgram p;
  const bool dx = !s.first();
  for (int m = 0; m < s.micro_batches; ++m) {
    p.push_back({Op::kReceive, m});
    p.push_back({Op::kForward, m});
    p.push_back({Op::kSendActivations, m});
    p.push_back({Op::kHead, m, s.last() ? HeadMode::kLocal : HeadMode::kProbe});
    if (s.last()) {
      p.push_back({Op::kBackwardFromHead, m, HeadMode::kLocal, dx});
      if (dx) p.push_back({Op::kSendInputGradient, m});
    }
  }
  for (int m = 0; m < s.micro_batches && !s.last(); ++m) {
    p.push_back({Op::kAwaitGradient, m});
    p.push_back({Op::kBackwardReturned, m, HeadMode::kLocal, dx});
    if (dx) p.push_back({Op::kSendInputGradient, m});
  }
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
