// OVERLAP: a stage learns from its own head and from the next stage's head, whose gradient
// with respect to this stage's output comes back one stage. Synchronous (exact): the stage
// waits for that gradient before its update. With max_delay > 0 it applies whatever has
// arrived and waits only for gradients that would otherwise be more than max_delay steps old.
#include "common/nn/rule.h"

namespace localpar {
namespace {

StageProgram Overlap(const ProgramSpec& s) {
  StageProgram p = {{Op::kReceive}, {Op::kForward}, {Op::kSendActivations}, {Op::kHead}};
  // Its own head first, which also gives the gradient it owes the stage before.
  p.push_back({Op::kBackwardFromHead, 0, HeadMode::kLocal, !s.first()});
  if (!s.first()) p.push_back({Op::kSendInputGradient});
  if (!s.last() && s.max_delay > 0) p.push_back({Op::kApplyArrived});
  if (!s.last() && s.max_delay == 0) {
    p.push_back({Op::kAwaitGradient});
    p.push_back({Op::kBackwardReturned});
  }
  p.push_back({Op::kStep});
  return p;
}

}  // namespace

// Extern: registry.cc lists it.
extern const RuleSpec kOverlapRule = {UpdateRule::kOverlap,
                                      "OVERLAP",
                                      "a stage's local loss also backpropagates one stage back",
                                      true,
                                      false,
                                      true,
                                      Overlap};

}  // namespace localpar
