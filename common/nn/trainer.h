// The reference trainer: runs a Model in one process, batch by batch, for every update rule.
// Each stage runs its rule's program (program.h) through the same executor a worker uses,
// over in-memory ports; the rules' losses are checked against finite differences
// (tests/common/nn/trainer_test.cc), and the distributed system is compared against this,
// bit for bit on CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/nn/executor.h"
#include "common/nn/local_ports.h"
#include "common/nn/model.h"
#include "common/nn/rule.h"

namespace localpar {

struct TrainerOptions {
  UpdateRule rule = UpdateRule::kGreedy;
  // BACKPROP only: the batch is split into this many micro-batches whose gradients
  // accumulate (in order) before one update, as a GPipe pipeline computes it.
  int micro_batches = 1;
  // Replicas of every stage (Job.replicas): each computes on its share of the batch
  // (MicroBatchRange over the replicas), then the replicas add their gradients in replica
  // order (replica_sync.h) and take the same step, as a cluster of replicas does.
  int replicas = 1;
  ScheduleConfig schedule;
  int64_t total_steps = 0;  // for the cosine schedule
  uint64_t seed = 0;        // drives dropout masks
  // Activations between stages pass through this format, as they do between workers.
  WireFormat wire = WireFormat::kF32;
};

// Rows [begin, begin + count) of micro-batch m when `rows` are split into `parts`: the
// first rows % parts micro-batches get one extra row.
void MicroBatchRange(int64_t rows, int parts, int m, int64_t* begin, int64_t* count);
// Rows of replica r's share of a batch of `rows` rows (MicroBatchRange over the replicas).
int64_t ReplicaRows(int64_t rows, int replicas, int replica);
// Micro-batches in a step of `rows` rows: the job's count, but never an empty one.
int StepMicroBatches(int job_micro_batches, int64_t rows);

// The factor that turns summed per-prediction loss gradients into the gradient of the
// batch's mean loss: 1 / (examples * labels per example).
inline float LossScale(int64_t batch_rows, int64_t labels_per_example) {
  int64_t n = batch_rows * labels_per_example;
  return 1.0f / static_cast<float>(n > 0 ? n : 1);
}

// The seed the layers see at a given step and micro-batch.
uint64_t StepSeed(uint64_t seed, int64_t step, int micro_batch);

// What stage k of `num_stages` runs under `options` (delay: asynchronous OVERLAP's bound).
ProgramSpec StageProgramSpec(const TrainerOptions& options, int stage, int num_stages,
                             int max_delay = 0);

class ReplicaBucket;

class ReferenceTrainer {
 public:
  ReferenceTrainer(Model& model, const TrainerOptions& options);
  // options.replicas models of the same network: each holds one replica of every stage.
  // The others start from the first one's parameters.
  ReferenceTrainer(std::vector<Model*> replicas, const TrainerOptions& options);
  ~ReferenceTrainer();

  // One training step on a batch. Returns each stage's head statistics on that batch
  // (computed before the update).
  std::vector<HeadStats> TrainStep(const Tensor& x, const Tensor& labels);
  // The rule's gradients for a batch, left in each Param's grad: no update, no step count.
  // Tests compare them with finite differences of the losses each rule claims to follow.
  std::vector<HeadStats> ComputeGradients(const Tensor& x, const Tensor& labels);
  // Forward only; every stage's head is scored.
  std::vector<HeadStats> EvalBatch(const Tensor& x, const Tensor& labels);

  int64_t step() const { return step_; }
  float current_lr() const;

 private:
  std::vector<HeadStats> Run(const Tensor& x, const Tensor& labels, bool train, bool update);
  // One replica's programs on its share of the batch.
  std::vector<HeadStats> RunReplica(int replica, const Tensor& x, const Tensor& labels,
                                    StepContext ctx);
  // Every stage's replicas: the gradients' sum in replica order, then the same step.
  void ExchangeAndStep(float lr);

  std::vector<Model*> models_;  // by replica
  TrainerOptions options_;
  LocalPipeline pipeline_;
  std::vector<std::vector<std::unique_ptr<StageExecutor>>> executors_;  // [replica][stage]
  std::vector<std::vector<std::unique_ptr<ReplicaBucket>>> buckets_;    // [replica][stage]
  std::vector<float> gathered_;
  int64_t step_ = 0;
};

}  // namespace localpar
