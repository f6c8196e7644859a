// Every update rule, one line each, in the order job.proto lists them: the RuleSpec its file
// in this folder defines. Adding a rule is its file plus a line here, and its value in
// job.proto's UpdateRule and in UpdateRule in program.h (docs/architecture.md).
#include "common/core/check.h"
#include "common/nn/rule.h"

namespace localpar {

#define LOCALPAR_RULES(X) \
  X(kBackpropRule)        \
  X(kGreedyRule)          \
  X(kChunkedRule)         \
  X(kOverlapRule)

#define LOCALPAR_DECLARE_RULE(r) extern const RuleSpec r;
LOCALPAR_RULES(LOCALPAR_DECLARE_RULE)
#undef LOCALPAR_DECLARE_RULE

const std::vector<const RuleSpec*>& AllRules() {
#define LOCALPAR_LIST_RULE(r) &r,
  static const std::vector<const RuleSpec*> rules = {LOCALPAR_RULES(LOCALPAR_LIST_RULE)};
#undef LOCALPAR_LIST_RULE
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
