// Stage programs: the evaluation program and printing.
#include "common/nn/program.h"

#include <algorithm>
#include <iterator>

#include "common/nn/rule.h"

namespace localpar {

StageProgram TrainProgram(const ProgramSpec& spec) { return Rule(spec.rule).train_program(spec); }

int MicroBatchesInFlight(const ProgramSpec& spec) {
  // The last stage backpropagates each micro-batch as soon as it has gone forward.
  if (spec.last()) return 1;
  if (spec.pipeline != PipelineSchedule::kGpipe) {
    return std::max(1, std::min(spec.micro_batches, spec.num_stages - spec.stage));
  }
  return spec.micro_batches;
}

const char* PipelineScheduleName(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::k1F1B:
      return "1F1B";
    case PipelineSchedule::kZeroBubble:
      return "ZB";
    default:
      return "GPipe";
  }
}

StageProgram EvalProgram() {
  return {{Op::kReceive}, {Op::kForward}, {Op::kSendActivations}, {Op::kHead, 0, HeadMode::kEval}};
}

namespace {

// Indexed by Op and HeadMode, in their declaration order.
constexpr const char* kOpNames[] = {"receive",
                                    "forward",
                                    "send activations",
                                    "head",
                                    "backward head gradient",
                                    "await gradient",
                                    "backward returned gradient",
                                    "send input gradient",
                                    "weight gradient",
                                    "apply arrived gradients",
                                    "step"};
constexpr const char* kModeNames[] = {"eval", "probe", "local"};
static_assert(std::size(kOpNames) == static_cast<size_t>(Op::kStep) + 1);
static_assert(std::size(kModeNames) == static_cast<size_t>(HeadMode::kLocal) + 1);

}  // namespace

std::string ProgramString(const StageProgram& program) {
  std::string out;
  for (size_t i = 0; i < program.size(); ++i) {
    const Action& a = program[i];
    if (i > 0) out += ", ";
    out += kOpNames[static_cast<int>(a.op)];
    if (a.op == Op::kHead) out += std::string(" (") + kModeNames[static_cast<int>(a.mode)] + ")";
    if (a.op != Op::kStep && a.op != Op::kApplyArrived) out += " " + std::to_string(a.micro_batch);
    if (a.split) {
      out += " (input gradient only)";
    } else if (a.input_gradient) {
      out += " (and input gradient)";
    }
  }
  return out;
}

}  // namespace localpar
