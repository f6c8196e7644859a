// The reference trainer: every stage's program, run in turn over in-memory ports.
#include "common/nn/trainer.h"

#include <algorithm>

#include "common/core/check.h"
#include "common/core/rng.h"

namespace localpar {

void MicroBatchRange(int64_t rows, int parts, int m, int64_t* begin, int64_t* count) {
  int64_t base = rows / parts, extra = rows % parts;
  *count = base + (m < extra ? 1 : 0);
  *begin = m * base + (m < extra ? m : extra);
}

int StepMicroBatches(int job_micro_batches, int64_t rows) {
  return static_cast<int>(std::clamp<int64_t>(rows, 1, std::max(1, job_micro_batches)));
}

uint64_t StepSeed(uint64_t seed, int64_t step, int micro_batch) {
  return HashCombine(HashCombine(seed, static_cast<uint64_t>(step)),
                     static_cast<uint64_t>(micro_batch));
}

ProgramSpec StageProgramSpec(const TrainerOptions& o, int stage, int num_stages, int max_delay) {
  const RuleSpec& rule = Rule(o.rule);
  ProgramSpec s;
  s.rule = o.rule;
  s.stage = stage;
  s.num_stages = num_stages;
  s.micro_batches = rule.splits_micro_batches ? std::max(1, o.micro_batches) : 1;
  s.max_delay = rule.allows_delay ? max_delay : 0;
  return s;
}

ReferenceTrainer::ReferenceTrainer(Model& model, const TrainerOptions& options)
    : model_(model), options_(options), pipeline_(model.num_stages(), options.wire) {
  for (int k = 0; k < model.num_stages(); ++k) {
    executors_.push_back(std::make_unique<StageExecutor>(
        model.stage(k), StageProgramSpec(options_, k, model.num_stages())));
  }
}

ReferenceTrainer::~ReferenceTrainer() = default;

float ReferenceTrainer::current_lr() const {
  return LearningRate(options_.schedule, step_, options_.total_steps);
}

std::vector<HeadStats> ReferenceTrainer::TrainStep(const Tensor& x, const Tensor& labels) {
  std::vector<HeadStats> stats = Run(x, labels, true, true);
  ++step_;
  return stats;
}

std::vector<HeadStats> ReferenceTrainer::ComputeGradients(const Tensor& x, const Tensor& labels) {
  return Run(x, labels, true, false);
}

std::vector<HeadStats> ReferenceTrainer::EvalBatch(const Tensor& x, const Tensor& labels) {
  return Run(x, labels, false, false);
}

// Every stage runs until its program ends or it waits on a port, in stage order, round after
// round. A stage's own actions keep their order whatever the interleaving, and stages share
// no state, so the result is the same as any pipeline of workers computes.
std::vector<HeadStats> ReferenceTrainer::Run(const Tensor& x, const Tensor& labels, bool train,
                                             bool update) {
  const int n = model_.num_stages();
  StepContext ctx;
  ctx.step = step_;
  ctx.lr = current_lr();
  ctx.seed = options_.seed;
  ctx.loss_scale = LossScale(x.rows(), labels.numel() / std::max<int64_t>(x.rows(), 1));
  ctx.train = train;
  ctx.apply_update = update;
  ctx.micro_batches = train && Rule(options_.rule).splits_micro_batches
                          ? StepMicroBatches(options_.micro_batches, x.rows())
                          : 1;
  pipeline_.Load(x, labels, ctx.micro_batches);
  for (auto& e : executors_) e->Begin(ctx);
  std::vector<bool> done(static_cast<size_t>(n), false);
  for (int remaining = n; remaining > 0;) {
    bool moved = false;
    for (int k = 0; k < n; ++k) {
      if (done[k]) continue;
      size_t before = executors_[k]->position();
      StageExecutor::Result r = executors_[k]->Run(pipeline_.ports(k));
      LP_CHECK_MSG(r != StageExecutor::Result::kAborted, "stage %d lost its input", k);
      moved = moved || executors_[k]->position() != before || r == StageExecutor::Result::kDone;
      if (r == StageExecutor::Result::kDone) {
        done[k] = true;
        --remaining;
      }
    }
    LP_CHECK_MSG(moved, "the stage programs wait on each other (a rule's programs do not match)");
  }
  pipeline_.Clear();
  std::vector<HeadStats> stats;
  for (auto& e : executors_) stats.push_back(e->stats());
  return stats;
}

}  // namespace localpar
