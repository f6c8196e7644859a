// The reference trainer: runs a Model in one process, batch by batch, for every update rule.
// It is the ground truth the distributed system is compared against, bit for bit on CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/nn/model.h"

namespace localpar {

enum class UpdateRule {
  kBackprop,  // one loss at the end, gradients through every stage (side heads are probes)
  kGreedy,    // each stage learns from its own head; stop-gradient at every stage input
  kChunked,   // GREEDY with several layers per stage: backprop inside, stop-gradient between
  kOverlap,   // a stage's loss also reaches one stage back
};

const char* UpdateRuleName(UpdateRule rule);

struct TrainerOptions {
  UpdateRule rule = UpdateRule::kGreedy;
  // BACKPROP only: the batch is split into this many micro-batches whose gradients
  // accumulate (in order) before one update, as a GPipe pipeline computes it.
  int micro_batches = 1;
  ScheduleConfig schedule;
  int64_t total_steps = 0;  // for the cosine schedule
  uint64_t seed = 0;        // drives dropout masks
  // Activations between stages pass through this format, as they do between workers.
  WireFormat wire = WireFormat::kF32;
};

// Rows [begin, begin + count) of micro-batch m when `rows` are split into `parts`: the
// first rows % parts micro-batches get one extra row.
void MicroBatchRange(int64_t rows, int parts, int m, int64_t* begin, int64_t* count);

// The factor that turns summed per-prediction loss gradients into the gradient of the
// batch's mean loss: 1 / (examples * labels per example).
inline float LossScale(int64_t batch_rows, int64_t labels_per_example) {
  int64_t n = batch_rows * labels_per_example;
  return 1.0f / static_cast<float>(n > 0 ? n : 1);
}

// The seed the layers see at a given step and micro-batch.
uint64_t StepSeed(uint64_t seed, int64_t step, int micro_batch);

class ReferenceTrainer {
 public:
  ReferenceTrainer(Model& model, const TrainerOptions& options);

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
  void Greedy(const Tensor& x, const Tensor& labels, float lr, std::vector<HeadStats>* out);
  void Overlap(const Tensor& x, const Tensor& labels, float lr, std::vector<HeadStats>* out);
  void Backprop(const Tensor& x, const Tensor& labels, float lr, std::vector<HeadStats>* out);

  std::vector<HeadStats> Run(const Tensor& x, const Tensor& labels);
  void Update(Stage& stage, float lr) {
    if (apply_updates_) stage.Step(lr);
  }

  // Stage k's output as stage k+1 receives it: itself, or its wire-rounded copy.
  const Tensor& OverWire(int k, const Tensor& y);

  Model& model_;
  TrainerOptions options_;
  std::vector<Tensor> wire_;      // wire_[k]: stage k's output after the trip
  std::vector<float> wire_host_;  // staging for the rounding
  bool apply_updates_ = true;
  int64_t step_ = 0;
  std::vector<Tensor> back_;  // back_[k]: gradient w.r.t. stage k's input
};

}  // namespace localpar
