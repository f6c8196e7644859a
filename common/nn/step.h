// Step arithmetic every participant computes the same way: how a batch splits into replicas'
// shares and micro-batches, the loss scale, the seed a step's layers see, the settings a
// step is computed under and the program a stage runs. The reference trainer, the executor,
// the worker and the coordinator all include this; it includes no runner.
#pragma once

#include <cstdint>

#include "common/core/dtype.h"
#include "common/nn/optimizer.h"
#include "common/nn/program.h"

namespace localpar {

// What every training step is computed under (from the job: ToStepSettings).
struct StepSettings {
  UpdateRule rule = UpdateRule::kGreedy;
  // BACKPROP only: the batch is split into this many micro-batches whose gradients
  // accumulate (in order) before one update, as a GPipe pipeline computes it.
  int micro_batches = 1;
  // BACKPROP only: the order of those micro-batches' passes (the weights do not depend on it).
  PipelineSchedule pipeline = PipelineSchedule::kGpipe;
  // Replicas of every stage (Job.replicas): each computes on its share of the batch
  // (MicroBatchRange over the replicas), then the replicas add their gradients in replica
  // order (replica_sync.h) and take the same step, as a cluster of replicas does.
  int replicas = 1;
  // Replicas that synchronise every `sync_every` > 1 steps instead (Job.replica_sync,
  // DiLoCo): each steps alone on its share (the loss a mean over it); then the outer step
  // (replica_sync.h's OuterSync) at outer_lr with Nesterov momentum outer_momentum.
  int sync_every = 1;
  float outer_lr = 0.7f;
  float outer_momentum = 0.9f;
  bool sync_bf16 = false;  // the pseudo-gradients cross as bfloat16 (OuterSync)
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

// Whether each replica steps alone between synchronisations (sync_every > 1 with replicas).
inline bool ReplicasStepAlone(const StepSettings& s) { return s.replicas > 1 && s.sync_every > 1; }
// Under ReplicasStepAlone: whether the replicas synchronise after step `step` (0-based):
// after every sync_every-th step, and after the run's last.
bool SyncsAfter(const StepSettings& s, int64_t step);

// The factor that turns summed per-prediction loss gradients into the gradient of the
// batch's mean loss: 1 / (examples * labels per example).
inline float LossScale(int64_t batch_rows, int64_t labels_per_example) {
  int64_t n = batch_rows * labels_per_example;
  return 1.0f / static_cast<float>(n > 0 ? n : 1);
}

// The seed the layers see at a given step and micro-batch.
uint64_t StepSeed(uint64_t seed, int64_t step, int micro_batch);

// What stage k of `num_stages` runs under `settings` (delay: asynchronous OVERLAP's bound).
ProgramSpec StageProgramSpec(const StepSettings& settings, int stage, int num_stages,
                             int max_delay = 0);

}  // namespace localpar
