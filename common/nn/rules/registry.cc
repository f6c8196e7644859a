// Every update rule, in the order job.proto lists them.
#include "common/core/check.h"
#include "common/nn/rules/rules.h"

namespace localpar {

const std::vector<const RuleSpec*>& AllRules() {
  static const std::vector<const RuleSpec*> rules = {&kBackpropRule, &kGreedyRule, &kChunkedRule,
                                                     &kOverlapRule};
  return rules;
}

const RuleSpec* FindRule(std::string_view name) {
  for (const RuleSpec* r : AllRules()) {
    if (name == r->name) return r;
  }
  return nullptr;
}

const RuleSpec& Rule(UpdateRule rule) {
  for (const RuleSpec* r : AllRules()) {
    if (r->rule == rule) return *r;
  }
  LP_CHECK_MSG(false, "no update rule %d", static_cast<int>(rule));
  return kGreedyRule;
}

const char* UpdateRuleName(UpdateRule rule) { return Rule(rule).name; }

std::string RuleNameList() {
  std::string out;
  const auto& rules = AllRules();
  for (size_t i = 0; i < rules.size(); ++i) {
    if (i > 0) out += i + 1 == rules.size() ? " or " : ", ";
    out += rules[i]->name;
  }
  return out;
}

}  // namespace localpar
