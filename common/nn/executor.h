// Runs a stage's program (program.h) over ports: the one place where a rule's actions touch
// the stage. The reference trainer runs one executor per stage over in-memory ports
// (local_ports.h); a worker runs one over its network queues (services/worker/compute.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "common/nn/program.h"

namespace localpar {

enum class PortState {
  kReady,    // here it is
  kPending,  // not yet (in-memory ports only; the executor yields and is resumed later)
  kGone,     // it will never come: the batch died downstream, or the link is closed
};

// A stage's view of its neighbours for the step being run.
class StagePorts {
 public:
  virtual ~StagePorts() = default;
  // Micro-batch m's activations and labels, borrowed until the step ends.
  virtual PortState Receive(int micro_batch, const Tensor** x, const Tensor** labels) = 0;
  // y stays valid until this stage's next forward pass on the same slot.
  virtual void SendActivations(int micro_batch, const Tensor& y) = 0;
  // dx stays valid until this stage's next backward pass on the same slot.
  virtual void SendInputGradient(int micro_batch, const Tensor& dx) = 0;
  // The gradient the next stage returns for micro-batch m of this step.
  virtual PortState AwaitGradient(int micro_batch, const Tensor** grad) = 0;
  // Asynchronous rules: the next returned gradient in the order the steps were sent; without
  // `wait`, kPending when none has arrived yet. kReady with a null *grad: that step's batch
  // died downstream and no gradient will come for it.
  virtual PortState TakeGradient(bool wait, const Tensor** grad) {
    (void)wait;
    (void)grad;
    return PortState::kGone;
  }
  // Replicas of a stage (replica_sync.h): just before the update, exchanges the step's
  // gradients with the stage's other replicas, leaving their sum in the stage. kGone when
  // a replica is lost (the step is abandoned without an update). Without replicas, nothing.
  virtual PortState ExchangeWithReplicas(Stage& stage) {
    (void)stage;
    return PortState::kReady;
  }
  // Replicas that synchronise every few steps (StepContext.sync_replicas): after the step's
  // update, the outer step with the stage's other replicas (replica_sync.h's OuterSync).
  // kGone when a replica is lost. Without replicas, nothing.
  virtual PortState SyncReplicas(Stage& stage) {
    (void)stage;
    return PortState::kReady;
  }
  // Replicas: the head's (layer -1) or layer `layer`'s parameter gradients are final for
  // this step (no later action of the program changes them), so their exchange may start
  // while the backward pass goes on. Synchronous rules only; without replicas, nothing.
  virtual void GradientsFinal(Stage& stage, int layer) {
    (void)stage;
    (void)layer;
  }
};

struct StepContext {
  int64_t step = 0;          // the update count before this step
  float lr = 0.0f;           // from the schedule at `step`
  uint64_t seed = 0;         // the job's; dropout masks derive from (seed, step, micro-batch)
  float loss_scale = 1;      // LossScale(batch rows, labels per example)
  bool train = true;         // false: the evaluation program
  bool apply_update = true;  // false: gradients only (finite-difference tests)
  int micro_batches = 1;     // in this step (BACKPROP); 1 otherwise
  // Replica r of a stage numbers its micro-batches from r * (the job's micro-batches), so
  // that dropout masks differ between the replicas' shares of a batch.
  int micro_batch_offset = 0;
  // Replicas that synchronise every few steps (ReplicasStepAlone): the stage steps on its
  // own share's gradients, exchanging none, and after the update synchronises with its
  // replicas through the ports when `sync_replicas` (SyncsAfter).
  bool replicas_step_alone = false;
  bool sync_replicas = false;
};

struct StepTimes {
  double forward = 0;        // receiving and the forward pass
  double backward = 0;       // heads, backward passes, sending gradients
  double gradient_wait = 0;  // waiting for the gradients the next stage returns
  double update = 0;         // the optimizer step
  double exchange = 0;       // replicas: exchanging gradients before the step, or synchronising
  // This thread's CPU seconds inside the layers and heads (forward, backward, update): the
  // model's compute, against which a process's other CPU time is the framework's cost.
  double compute_cpu = 0;
};

// Gradients applied late under asynchronous OVERLAP.
struct DelayStats {
  int64_t applied = 0;
  double sum = 0;
  int64_t max = 0;
};

class StageExecutor {
 public:
  // spec.micro_batches is the job's; a step may use fewer (a short last batch).
  StageExecutor(Stage& stage, const ProgramSpec& spec);

  // Activation slots a stage needs: micro-batches (MicroBatchesInFlight) or delayed steps
  // in flight, plus one kept for evaluation so that it never disturbs a step still waiting
  // for gradients.
  static int SlotsNeeded(const ProgramSpec& spec);

  void Begin(const StepContext& ctx);
  enum class Result { kDone, kBlocked, kAborted };
  // Runs actions until the program ends, a port has nothing yet (kBlocked: call Run again
  // later), or an input will never come (kAborted: the step is abandoned).
  Result Run(StagePorts& ports);
  // Asynchronous OVERLAP: waits for and applies every gradient still owed (before a
  // checkpoint or the end of a stream), without an update.
  void Flush(StagePorts& ports);

  // The stage's activation slot for micro-batch m of the current step.
  int SlotFor(int micro_batch) const;
  size_t position() const { return next_; }
  const StageProgram& program() const { return *program_; }
  const HeadStats& stats() const { return stats_; }  // of the step just run
  const StepTimes& times() const { return times_; }
  bool stepped() const { return stepped_; }
  const DelayStats& delays() const { return delays_; }

 private:
  struct MicroBatch {
    const Tensor* x = nullptr;
    const Tensor* labels = nullptr;
    const Tensor* y = nullptr;
    const Tensor* grad = nullptr;
    bool grad_gone = false;
    bool has_dx = false;
  };
  using Clock = std::chrono::steady_clock;

  // kPending when the action must wait for its port; kGone when its input never comes.
  PortState Execute(const Action& a, StagePorts& ports);
  void Backward(const Action& a, const Tensor& dy, StagePorts& ports);
  void ApplyArrived(StagePorts& ports, bool flush);
  std::function<void(int)> FinalHook(StagePorts& ports);
  ForwardContext Context(int micro_batch) const;
  const StageProgram& TrainProgramFor(int micro_batches);

  Stage& stage_;
  ProgramSpec spec_;
  int eval_slot_;
  std::map<int, StageProgram> train_programs_;  // by micro-batch count
  StageProgram eval_program_;
  const StageProgram* program_ = nullptr;
  size_t next_ = 0;
  // Where the step's gradients become final (GradientsFinal): the last head action and
  // the last backward action of the program; only for synchronous training steps.
  bool announce_final_ = false;
  size_t last_head_ = 0, last_backward_ = 0;
  StepContext ctx_;
  std::vector<MicroBatch> micro_;
  std::vector<Tensor> dx_;        // per slot
  std::deque<int64_t> awaiting_;  // asynchronous: steps whose gradient has not come back
  HeadStats stats_;
  StepTimes times_;
  double exchange_took_ = 0;  // of the last kStep
  bool stepped_ = false;
  DelayStats delays_;
};

}  // namespace localpar
