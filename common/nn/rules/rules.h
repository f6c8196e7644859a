// The rule definitions, one per file in this directory, listed in registry.cc.
#pragma once

#include "common/nn/rule.h"

namespace localpar {

extern const RuleSpec kBackpropRule;
extern const RuleSpec kGreedyRule;
extern const RuleSpec kChunkedRule;
extern const RuleSpec kOverlapRule;

}  // namespace localpar
