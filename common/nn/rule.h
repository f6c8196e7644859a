// The update rules as data: what each rule is called, which job settings it takes, and the
// program it gives every stage. Adding a rule is one file in common/nn/rules/, its value in
// job.proto's UpdateRule (and UpdateRule in program.h), and a line in rules/registry.cc.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/nn/program.h"

namespace localpar {

struct RuleSpec {
  UpdateRule rule;
  const char* name;     // as written in job files: "GREEDY"
  const char* summary;  // one line, for help texts
  // Stages after the first return d(loss)/d(input) upstream, so the link carries gradients.
  bool returns_gradients = false;
  // A batch may be split into micro-batches whose gradients accumulate (job.micro_batches).
  bool splits_micro_batches = false;
  // Returned gradients may be applied up to max_delay steps late (overlap_max_delay).
  bool allows_delay = false;
  StageProgram (*train_program)(const ProgramSpec& spec) = nullptr;
};

const RuleSpec& Rule(UpdateRule rule);
// nullptr for a name that is no rule.
const RuleSpec* FindRule(std::string_view name);
const std::vector<const RuleSpec*>& AllRules();
const char* UpdateRuleName(UpdateRule rule);
// "BACKPROP, GREEDY, CHUNKED or OVERLAP", for error messages.
std::string RuleNameList();

}  // namespace localpar
