// The reference trainer: every stage's program, run in turn over in-memory ports.
#include "common/nn/trainer.h"

#include <algorithm>

#include "common/core/check.h"
#include "common/core/rng.h"
#include "common/nn/replica_sync.h"

namespace localpar {

ReferenceTrainer::ReferenceTrainer(Model& model, const StepSettings& options)
    : ReferenceTrainer(std::vector<Model*>{&model}, options) {}

ReferenceTrainer::ReferenceTrainer(std::vector<Model*> replicas, const StepSettings& options)
    : models_(std::move(replicas)),
      options_(options),
      pipeline_(models_.at(0)->num_stages(), options.wire) {
  LP_CHECK_MSG(static_cast<int>(models_.size()) == std::max(1, options.replicas),
               "%zu models for %d replicas", models_.size(), options.replicas);
  const int n = models_[0]->num_stages();
  for (size_t r = 0; r < models_.size(); ++r) {
    Model& m = *models_[r];
    LP_CHECK(m.num_stages() == n);
    executors_.emplace_back();
    buckets_.emplace_back();
    outer_.emplace_back();
    for (int k = 0; k < n; ++k) {
      executors_[r].push_back(
          std::make_unique<StageExecutor>(m.stage(k), StageProgramSpec(options_, k, n)));
      if (models_.size() == 1) continue;
      buckets_[r].push_back(std::make_unique<ReplicaBucket>(m.stage(k)));
      if (ReplicasStepAlone(options_)) {
        outer_[r].push_back(std::make_unique<OuterSync>(
            m.stage(k), options_.outer_lr, options_.outer_momentum, options_.sync_bf16));
      }
      if (r == 0) continue;
      std::vector<Param*> from = models_[0]->stage(k).params(), to = m.stage(k).params();
      for (size_t i = 0; i < from.size(); ++i) to[i]->value.CopyFrom(from[i]->value);
    }
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

std::vector<HeadStats> ReferenceTrainer::Run(const Tensor& x, const Tensor& labels, bool train,
                                             bool update) {
  const int replicas = static_cast<int>(models_.size());
  const bool splits = train && Rule(options_.rule).splits_micro_batches;
  const bool alone = ReplicasStepAlone(options_);
  const int64_t labels_per_example = labels.numel() / std::max<int64_t>(x.rows(), 1);
  if (alone && train && update && !outer_started_) {
    // The synchronised weights start as the parameters are now (at step 0, or as a
    // checkpoint left them).
    for (Model* m : models_) {
      for (int k = 0; k < m->num_stages(); ++k) OuterSync::Start(m->stage(k));
    }
    outer_started_ = true;
  }
  StepContext ctx;
  ctx.step = step_;
  ctx.lr = current_lr();
  ctx.seed = options_.seed;
  // The mean over the whole batch, whichever replica computes a share of it.
  ctx.loss_scale = LossScale(x.rows(), labels_per_example);
  ctx.train = train;
  // Replicas step together once every one has its gradients (or each alone).
  ctx.apply_update = update && (replicas == 1 || alone);
  ctx.replicas_step_alone = alone;
  std::vector<HeadStats> stats(static_cast<size_t>(models_[0]->num_stages()));
  for (int r = 0; r < replicas; ++r) {
    int64_t begin, rows;
    MicroBatchRange(x.rows(), replicas, r, &begin, &rows);
    if (rows == 0) continue;  // a short evaluation batch leaves the last replicas idle
    // A replica stepping alone follows the mean loss over its own share.
    if (alone && train) ctx.loss_scale = LossScale(rows, labels_per_example);
    ctx.micro_batches = splits ? StepMicroBatches(options_.micro_batches, rows) : 1;
    ctx.micro_batch_offset = train ? r * std::max(1, options_.micro_batches) : 0;
    const bool whole = replicas == 1;
    std::vector<HeadStats> s = RunReplica(r, whole ? x : x.Slice(begin, rows),
                                          whole ? labels : labels.Slice(begin, rows), ctx);
    for (size_t k = 0; k < stats.size(); ++k) stats[k].Add(s[k]);
  }
  if (train && update && replicas > 1) {
    if (!alone) {
      ExchangeAndStep(ctx.lr);
    } else if (SyncsAfter(options_, step_)) {
      SyncReplicas();
    }
  }
  return stats;
}

// Every stage runs until its program ends or it waits on a port, in stage order, round after
// round. A stage's own actions keep their order whatever the interleaving, and stages share
// no state, so the result is the same as any pipeline of workers computes.
std::vector<HeadStats> ReferenceTrainer::RunReplica(int replica, const Tensor& x,
                                                    const Tensor& labels, StepContext ctx) {
  std::vector<std::unique_ptr<StageExecutor>>& executors = executors_[replica];
  const int n = static_cast<int>(executors.size());
  pipeline_.Load(x, labels, ctx.micro_batches);
  for (auto& e : executors) e->Begin(ctx);
  std::vector<bool> done(static_cast<size_t>(n), false);
  for (int remaining = n; remaining > 0;) {
    bool moved = false;
    for (int k = 0; k < n; ++k) {
      if (done[k]) continue;
      size_t before = executors[k]->position();
      StageExecutor::Result r = executors[k]->Run(pipeline_.ports(k));
      LP_CHECK_MSG(r != StageExecutor::Result::kAborted, "stage %d lost its input", k);
      moved = moved || executors[k]->position() != before || r == StageExecutor::Result::kDone;
      if (r == StageExecutor::Result::kDone) {
        done[k] = true;
        --remaining;
      }
    }
    LP_CHECK_MSG(moved, "the stage programs wait on each other (a rule's programs do not match)");
  }
  pipeline_.Clear();
  std::vector<HeadStats> stats;
  for (auto& e : executors) stats.push_back(e->stats());
  return stats;
}

void ReferenceTrainer::ExchangeAndStep(float lr) {
  const int replicas = static_cast<int>(models_.size());
  for (size_t k = 0; k < buckets_[0].size(); ++k) {
    const int64_t n = buckets_[0][k]->size();
    gathered_.resize(static_cast<size_t>(n * replicas));
    for (int r = 0; r < replicas; ++r) buckets_[r][k]->Pack(gathered_.data() + r * n);
    for (int r = 0; r < replicas; ++r) {
      buckets_[r][k]->Unpack(gathered_.data(), replicas);
      models_[r]->stage(static_cast<int>(k)).Step(lr);
    }
  }
}

// Each replica computes the same outer step from the same gathered pseudo-gradients, as
// each worker does.
void ReferenceTrainer::SyncReplicas() {
  const int replicas = static_cast<int>(models_.size());
  for (size_t k = 0; k < outer_[0].size(); ++k) {
    const int64_t n = outer_[0][k]->size();
    gathered_.resize(static_cast<size_t>(n * replicas));
    for (int r = 0; r < replicas; ++r) outer_[r][k]->Pack(gathered_.data() + r * n);
    for (int r = 0; r < replicas; ++r) outer_[r][k]->Apply(gathered_.data(), replicas);
  }
}

}  // namespace localpar
