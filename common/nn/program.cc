// Stage programs: the evaluation program and printing.
#include "common/nn/program.h"

#include "common/nn/rule.h"

namespace localpar {

StageProgram TrainProgram(const ProgramSpec& spec) { return Rule(spec.rule).train_program(spec); }

StageProgram EvalProgram() {
  return {{Op::kReceive}, {Op::kForward}, {Op::kSendActivations}, {Op::kHead, 0, HeadMode::kEval}};
}

namespace {

const char* OpName(Op op) {
  switch (op) {
    case Op::kReceive:
      return "receive";
    case Op::kForward:
      return "forward";
    case Op::kSendActivations:
      return "send activations";
    case Op::kHead:
      return "head";
    case Op::kBackwardHead:
      return "backward head gradient";
    case Op::kAwaitGradient:
      return "await gradient";
    case Op::kBackwardReturned:
      return "backward returned gradient";
    case Op::kSendInputGradient:
      return "send input gradient";
    case Op::kApplyArrived:
      return "apply arrived gradients";
    case Op::kStep:
      return "step";
  }
  return "?";
}

const char* ModeName(HeadMode mode) {
  switch (mode) {
    case HeadMode::kEval:
      return "eval";
    case HeadMode::kProbe:
      return "probe";
    case HeadMode::kLocal:
      return "local";
  }
  return "?";
}

}  // namespace

std::string ProgramString(const StageProgram& program) {
  std::string out;
  for (size_t i = 0; i < program.size(); ++i) {
    const Action& a = program[i];
    if (i > 0) out += ", ";
    out += OpName(a.op);
    if (a.op == Op::kHead) out += std::string(" (") + ModeName(a.mode) + ")";
    if (a.op != Op::kStep && a.op != Op::kApplyArrived) out += " " + std::to_string(a.micro_batch);
    if (a.input_gradient) out += " (and input gradient)";
  }
  return out;
}

}  // namespace localpar
