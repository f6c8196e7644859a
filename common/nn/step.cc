// Step arithmetic.
#include "common/nn/step.h"

#include <algorithm>

#include "common/core/rng.h"
#include "common/nn/rule.h"

namespace localpar {

void MicroBatchRange(int64_t rows, int parts, int m, int64_t* begin, int64_t* count) {
  int64_t base = rows / parts, extra = rows % parts;
  *count = base + (m < extra ? 1 : 0);
  *begin = m * base + (m < extra ? m : extra);
}

int64_t ReplicaRows(int64_t rows, int replicas, int replica) {
  int64_t begin, count;
  MicroBatchRange(rows, std::max(1, replicas), replica, &begin, &count);
  return count;
}

int StepMicroBatches(int job_micro_batches, int64_t rows) {
  return static_cast<int>(std::clamp<int64_t>(rows, 1, std::max(1, job_micro_batches)));
}

bool SyncsAfter(const StepSettings& s, int64_t step) {
  return ReplicasStepAlone(s) &&
         ((step + 1) % s.sync_every == 0 || (s.total_steps > 0 && step + 1 >= s.total_steps));
}

uint64_t StepSeed(uint64_t seed, int64_t step, int micro_batch) {
  return HashCombine(HashCombine(seed, static_cast<uint64_t>(step)),
                     static_cast<uint64_t>(micro_batch));
}

ProgramSpec StageProgramSpec(const StepSettings& o, int stage, int num_stages, int max_delay) {
  const RuleSpec& rule = Rule(o.rule);
  ProgramSpec s;
  s.rule = o.rule;
  s.stage = stage;
  s.num_stages = num_stages;
  s.micro_batches = rule.splits_micro_batches ? std::max(1, o.micro_batches) : 1;
  s.max_delay = rule.allows_delay ? max_delay : 0;
  s.pipeline = rule.splits_micro_batches ? o.pipeline : PipelineSchedule::kGpipe;
  return s;
}

}  // namespace localpar
