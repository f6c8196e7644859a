// The stage executor: each action of a program applied to the stage.
#include "common/nn/executor.h"

#include <algorithm>

#include "common/core/check.h"
#include "common/core/cpu_clock.h"
#include "common/nn/step.h"

namespace localpar {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Adds the calling thread's CPU time over its lifetime to *sum.
class CpuSpan {
 public:
  explicit CpuSpan(double* sum) : sum_(sum), start_(ThreadCpuSeconds()) {}
  ~CpuSpan() { *sum_ += ThreadCpuSeconds() - start_; }
  CpuSpan(const CpuSpan&) = delete;
  CpuSpan& operator=(const CpuSpan&) = delete;

 private:
  double* sum_;
  double start_;
};

}  // namespace

int StageExecutor::SlotsNeeded(const ProgramSpec& spec) {
  return std::max(MicroBatchesInFlight(spec), spec.max_delay + 1) + 1;
}

StageExecutor::StageExecutor(Stage& stage, const ProgramSpec& spec)
    : stage_(stage),
      spec_(spec),
      eval_slot_(SlotsNeeded(spec) - 1),
      eval_program_(EvalProgram()),
      dx_(static_cast<size_t>(SlotsNeeded(spec))) {}

const StageProgram& StageExecutor::TrainProgramFor(int micro_batches) {
  auto it = train_programs_.find(micro_batches);
  if (it != train_programs_.end()) return it->second;
  ProgramSpec s = spec_;
  s.micro_batches = micro_batches;
  return train_programs_[micro_batches] = TrainProgram(s);
}

void StageExecutor::Begin(const StepContext& ctx) {
  LP_CHECK(ctx.micro_batches >= 1 && ctx.micro_batches <= std::max(1, spec_.micro_batches));
  ctx_ = ctx;
  program_ = ctx.train ? &TrainProgramFor(ctx.micro_batches) : &eval_program_;
  next_ = 0;
  announce_final_ =
      ctx.train && ctx.apply_update && !ctx.replicas_step_alone && spec_.max_delay == 0;
  last_head_ = last_backward_ = program_->size();
  for (size_t i = 0; i < program_->size(); ++i) {
    const Op op = (*program_)[i].op;
    if (op == Op::kHead) last_head_ = i;
    if (op == Op::kBackwardFromHead || op == Op::kBackwardReturned || op == Op::kWeightGradient) {
      last_backward_ = i;
    }
  }
  micro_.assign(static_cast<size_t>(ctx.train ? ctx.micro_batches : 1), MicroBatch());
  stats_ = HeadStats();
  times_ = StepTimes();
  stepped_ = false;
}

int StageExecutor::SlotFor(int micro_batch) const {
  if (!ctx_.train) return eval_slot_;
  if (spec_.max_delay > 0) return static_cast<int>(ctx_.step % (spec_.max_delay + 1));
  // 1F1B: micro-batch m + K - s starts its forward pass only after m's backward pass.
  return micro_batch % MicroBatchesInFlight(spec_);
}

ForwardContext StageExecutor::Context(int micro_batch) const {
  if (!ctx_.train) return ForwardContext{false, 0};
  return ForwardContext{true,
                        StepSeed(ctx_.seed, ctx_.step, ctx_.micro_batch_offset + micro_batch)};
}

StageExecutor::Result StageExecutor::Run(StagePorts& ports) {
  while (next_ < program_->size()) {
    const Action& a = (*program_)[next_];
    Clock::time_point start = Clock::now();
    PortState s = Execute(a, ports);
    double took = Since(start);
    if (a.op == Op::kReceive || a.op == Op::kForward) {
      times_.forward += took;
    } else if (a.op == Op::kAwaitGradient) {
      times_.gradient_wait += took;
    } else if (a.op == Op::kStep) {
      times_.update += took - exchange_took_;
    } else if (a.op != Op::kSendActivations) {
      times_.backward += took;
    }
    if (s == PortState::kPending) return Result::kBlocked;
    if (s == PortState::kGone) return Result::kAborted;
    ++next_;
  }
  return Result::kDone;
}

PortState StageExecutor::Execute(const Action& a, StagePorts& ports) {
  MicroBatch& mb = micro_[static_cast<size_t>(a.micro_batch)];
  const int slot = SlotFor(a.micro_batch);
  switch (a.op) {
    case Op::kReceive:
      return ports.Receive(a.micro_batch, &mb.x, &mb.labels);
    case Op::kForward: {
      CpuSpan cpu(&times_.compute_cpu);
      mb.y = &stage_.Forward(*mb.x, slot, Context(a.micro_batch));
      break;
    }
    case Op::kSendActivations:
      ports.SendActivations(a.micro_batch, *mb.y);
      break;
    case Op::kHead: {
      HeadMode mode = ctx_.train ? a.mode : HeadMode::kEval;
      float scale = ctx_.train ? ctx_.loss_scale : 1.0f;
      {
        CpuSpan cpu(&times_.compute_cpu);
        stats_.Add(stage_.Head(slot, *mb.labels, mode, scale, Context(a.micro_batch)));
      }
      if (announce_final_ && next_ == last_head_) ports.GradientsFinal(stage_, -1);
      break;
    }
    case Op::kBackwardFromHead:
      Backward(a, stage_.head_grad(slot), ports);
      break;
    case Op::kAwaitGradient: {
      PortState s = ports.AwaitGradient(a.micro_batch, &mb.grad);
      if (s == PortState::kPending) return s;
      mb.grad_gone = s == PortState::kGone;  // that batch died downstream: skip its backward
      break;
    }
    case Op::kBackwardReturned:
      if (!mb.grad_gone) Backward(a, *mb.grad, ports);
      break;
    case Op::kSendInputGradient:
      if (mb.has_dx) ports.SendInputGradient(a.micro_batch, dx_[static_cast<size_t>(slot)]);
      break;
    case Op::kWeightGradient:
      if (!mb.grad_gone) {
        CpuSpan cpu(&times_.compute_cpu);
        stage_.BackwardWeights(slot, FinalHook(ports));
      }
      break;
    case Op::kApplyArrived:
      awaiting_.push_back(ctx_.step);
      ApplyArrived(ports, false);
      break;
    case Op::kStep:
      exchange_took_ = 0;
      if (ctx_.apply_update) {
        if (!ctx_.replicas_step_alone) {
          Clock::time_point start = Clock::now();
          PortState s = ports.ExchangeWithReplicas(stage_);
          exchange_took_ = Since(start);
          times_.exchange += exchange_took_;
          if (s != PortState::kReady) return PortState::kGone;
        }
        {
          CpuSpan cpu(&times_.compute_cpu);
          stage_.Step(ctx_.lr);
        }
        stepped_ = true;
        if (ctx_.sync_replicas) {
          Clock::time_point start = Clock::now();
          PortState s = ports.SyncReplicas(stage_);
          exchange_took_ = Since(start);
          times_.exchange += exchange_took_;
          if (s != PortState::kReady) return PortState::kGone;
        }
      }
      break;
  }
  return PortState::kReady;
}

void StageExecutor::Backward(const Action& a, const Tensor& dy, StagePorts& ports) {
  const int slot = SlotFor(a.micro_batch);
  MicroBatch& mb = micro_[static_cast<size_t>(a.micro_batch)];
  Tensor* dx = a.input_gradient ? &dx_[static_cast<size_t>(slot)] : nullptr;
  CpuSpan cpu(&times_.compute_cpu);
  if (a.split) {
    stage_.BackwardInput(slot, dy, dx);
  } else {
    stage_.Backward(slot, dy, dx, FinalHook(ports));
  }
  mb.has_dx = a.input_gradient;
}

// Replicas: on the program's last backward action, each layer's gradients are final as soon
// as its pass is done.
std::function<void(int)> StageExecutor::FinalHook(StagePorts& ports) {
  if (!announce_final_ || next_ != last_backward_) return {};
  return [this, &ports](int layer) { ports.GradientsFinal(stage_, layer); };
}

// Applies returned gradients oldest first: those that have arrived, and those that must not
// wait any longer (all of them when flushing).
void StageExecutor::ApplyArrived(StagePorts& ports, bool flush) {
  const int64_t now = ctx_.step;
  while (!awaiting_.empty()) {
    const bool must_wait = flush || awaiting_.front() + spec_.max_delay <= now;
    const Tensor* grad = nullptr;
    PortState s = ports.TakeGradient(must_wait, &grad);
    if (s == PortState::kPending) return;  // not arrived, and not due yet
    if (s == PortState::kGone) {
      awaiting_.clear();  // the link is down: nothing more will come
      return;
    }
    const int64_t sent = awaiting_.front();
    awaiting_.pop_front();
    // No tensor: that batch died downstream, so there is nothing to apply for it.
    if (grad) stage_.Backward(static_cast<int>(sent % (spec_.max_delay + 1)), *grad, nullptr);
    const int64_t delay = now - sent;
    ++delays_.applied;
    delays_.sum += static_cast<double>(delay);
    delays_.max = std::max(delays_.max, delay);
  }
}

void StageExecutor::Flush(StagePorts& ports) {
  if (spec_.max_delay > 0) ApplyArrived(ports, true);
}

}  // namespace localpar
