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
#include "common/nn/step.h"

namespace localpar {

class OuterSync;
class ReplicaBucket;

class ReferenceTrainer {
 public:
  ReferenceTrainer(Model& model, const StepSettings& options);
  // options.replicas models of the same network: each holds one replica of every stage.
  // The others start from the first one's parameters.
  ReferenceTrainer(std::vector<Model*> replicas, const StepSettings& options);
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
  // Continues a run resumed from a checkpoint after `step` training steps (the schedule and
  // dropout's masks go on from there).
  void ResumeAt(int64_t step) { step_ = step; }
  float current_lr() const;

 private:
  std::vector<HeadStats> Run(const Tensor& x, const Tensor& labels, bool train, bool update);
  // One replica's programs on its share of the batch.
  std::vector<HeadStats> RunReplica(int replica, const Tensor& x, const Tensor& labels,
                                    StepContext ctx);
  // Every stage's replicas: the gradients' sum in replica order, then the same step.
  void ExchangeAndStep(float lr);
  // Replicas that synchronise every few steps: every stage's outer step (OuterSync).
  void SyncReplicas();

  std::vector<Model*> models_;  // by replica
  StepSettings options_;
  LocalPipeline pipeline_;
  std::vector<std::vector<std::unique_ptr<StageExecutor>>> executors_;  // [replica][stage]
  std::vector<std::vector<std::unique_ptr<ReplicaBucket>>> buckets_;    // [replica][stage]
  std::vector<std::vector<std::unique_ptr<OuterSync>>> outer_;          // [replica][stage]
  bool outer_started_ = false;
  std::vector<float> gathered_;
  int64_t step_ = 0;
};

}  // namespace localpar
