// GREEDY and CHUNKED: every stage learns from its own head alone; nothing flows back.
// (CHUNKED is the same program over stages of several layers each.)
#include "common/nn/rule.h"

namespace localpar {
namespace {

StageProgram Greedy(const ProgramSpec&) {
  return {{Op::kReceive}, {Op::kForward},          {Op::kSendActivations},
          {Op::kHead},    {Op::kBackwardFromHead}, {Op::kStep}};
}

}  // namespace

// Extern: registry.cc lists it.
extern const RuleSpec kGreedyRule = {
    UpdateRule::kGreedy,
    "GREEDY",
    "each stage learns from its own head; stop-gradient between stages",
    false,
    false,
    false,
    Greedy};

// Extern: registry.cc lists it.
extern const RuleSpec kChunkedRule = {
    UpdateRule::kChunked,
    "CHUNKED",
    "GREEDY with several layers per stage: backprop inside each chunk",
    false,
    false,
    false,
    Greedy};

}  // namespace localpar
