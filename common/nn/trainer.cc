// The reference trainer's update rules.
#include "common/nn/trainer.h"

#include "common/core/rng.h"

namespace localpar {

const char* UpdateRuleName(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::kBackprop:
      return "BACKPROP";
    case UpdateRule::kGreedy:
      return "GREEDY";
    case UpdateRule::kChunked:
      return "CHUNKED";
    case UpdateRule::kOverlap:
      return "OVERLAP";
  }
  return "?";
}

void MicroBatchRange(int64_t rows, int parts, int m, int64_t* begin, int64_t* count) {
  int64_t base = rows / parts, extra = rows % parts;
  *count = base + (m < extra ? 1 : 0);
  *begin = m * base + (m < extra ? m : extra);
}

uint64_t StepSeed(uint64_t seed, int64_t step, int micro_batch) {
  return HashCombine(HashCombine(seed, static_cast<uint64_t>(step)),
                     static_cast<uint64_t>(micro_batch));
}

ReferenceTrainer::ReferenceTrainer(Model& model, const TrainerOptions& options)
    : model_(model), options_(options), wire_(model.num_stages()), back_(model.num_stages()) {
  if (options_.micro_batches < 1) options_.micro_batches = 1;
}

const Tensor& ReferenceTrainer::OverWire(int k, const Tensor& y) {
  if (options_.wire == WireFormat::kF32 || k + 1 >= model_.num_stages()) return y;
  // Through the host, with the same conversion a worker applies when it encodes.
  wire_host_.resize(static_cast<size_t>(y.numel()));
  y.backend().CopyToHost(wire_host_.data(), y.raw(), y.nbytes());
  RoundThroughWire(options_.wire, wire_host_.data(), wire_host_.size());
  wire_[k].Ensure(y.backend(), y.shape());
  y.backend().CopyFromHost(wire_[k].raw(), wire_host_.data(), y.nbytes());
  return wire_[k];
}

float ReferenceTrainer::current_lr() const {
  return LearningRate(options_.schedule, step_, options_.total_steps);
}

std::vector<HeadStats> ReferenceTrainer::TrainStep(const Tensor& x, const Tensor& labels) {
  std::vector<HeadStats> stats = Run(x, labels);
  ++step_;
  return stats;
}

std::vector<HeadStats> ReferenceTrainer::ComputeGradients(const Tensor& x, const Tensor& labels) {
  apply_updates_ = false;
  std::vector<HeadStats> stats = Run(x, labels);
  apply_updates_ = true;
  return stats;
}

std::vector<HeadStats> ReferenceTrainer::Run(const Tensor& x, const Tensor& labels) {
  std::vector<HeadStats> stats(model_.num_stages());
  float lr = current_lr();
  switch (options_.rule) {
    case UpdateRule::kGreedy:
    case UpdateRule::kChunked:
      Greedy(x, labels, lr, &stats);
      break;
    case UpdateRule::kOverlap:
      Overlap(x, labels, lr, &stats);
      break;
    case UpdateRule::kBackprop:
      Backprop(x, labels, lr, &stats);
      break;
  }
  return stats;
}

// Stage by stage: forward, own head, backward (no input gradient), update. Stage k+1
// consumes stage k's output, computed before stage k's update, exactly as a pipeline of
// workers does.
void ReferenceTrainer::Greedy(const Tensor& x, const Tensor& labels, float lr,
                              std::vector<HeadStats>* out) {
  ForwardContext ctx{true, StepSeed(options_.seed, step_, 0)};
  float scale = LossScale(x.rows(), labels.numel() / x.rows());
  const Tensor* in = &x;
  for (int k = 0; k < model_.num_stages(); ++k) {
    Stage& st = model_.stage(k);
    const Tensor& y = st.Forward(*in, 0, ctx);
    (*out)[k] = st.Head(0, labels, HeadMode::kLocal, scale, ctx);
    st.Backward(0, st.head_grad(0), nullptr);
    Update(st, lr);
    in = &OverWire(k, y);
  }
}

// Synchronous OVERLAP. Each stage backpropagates its own head's gradient first (which also
// yields the gradient it returns to the stage before), then the gradient returned by the
// next stage, then updates. A worker does the same two passes in the same order.
void ReferenceTrainer::Overlap(const Tensor& x, const Tensor& labels, float lr,
                               std::vector<HeadStats>* out) {
  ForwardContext ctx{true, StepSeed(options_.seed, step_, 0)};
  float scale = LossScale(x.rows(), labels.numel() / x.rows());
  int n = model_.num_stages();
  const Tensor* in = &x;
  for (int k = 0; k < n; ++k) in = &OverWire(k, model_.stage(k).Forward(*in, 0, ctx));
  for (int k = 0; k < n; ++k) {
    Stage& st = model_.stage(k);
    (*out)[k] = st.Head(0, labels, HeadMode::kLocal, scale, ctx);
    st.Backward(0, st.head_grad(0), k > 0 ? &back_[k] : nullptr);
  }
  for (int k = 0; k + 1 < n; ++k) model_.stage(k).Backward(0, back_[k + 1], nullptr);
  for (int k = 0; k < n; ++k) Update(model_.stage(k), lr);
}

// End-to-end backprop from the last head, micro-batch by micro-batch, gradients
// accumulating in micro-batch order; one update per batch. Side heads train as probes.
void ReferenceTrainer::Backprop(const Tensor& x, const Tensor& labels, float lr,
                                std::vector<HeadStats>* out) {
  int n = model_.num_stages();
  float scale = LossScale(x.rows(), labels.numel() / x.rows());
  for (int m = 0; m < options_.micro_batches; ++m) {
    int64_t begin, count;
    MicroBatchRange(x.rows(), options_.micro_batches, m, &begin, &count);
    if (count == 0) continue;
    ForwardContext ctx{true, StepSeed(options_.seed, step_, m)};
    Tensor xm = x.Slice(begin, count), lm = labels.Slice(begin, count);
    const Tensor* in = &xm;
    for (int k = 0; k < n; ++k) in = &OverWire(k, model_.stage(k).Forward(*in, 0, ctx));
    for (int k = 0; k < n; ++k) {
      HeadMode mode = k + 1 == n ? HeadMode::kLocal : HeadMode::kProbe;
      (*out)[k].Add(model_.stage(k).Head(0, lm, mode, scale, ctx));
    }
    const Tensor* g = &model_.stage(n - 1).head_grad(0);
    for (int k = n - 1; k >= 0; --k) {
      model_.stage(k).Backward(0, *g, k > 0 ? &back_[k] : nullptr);
      g = &back_[k];
    }
  }
  for (int k = 0; k < n; ++k) Update(model_.stage(k), lr);
}

std::vector<HeadStats> ReferenceTrainer::EvalBatch(const Tensor& x, const Tensor& labels) {
  std::vector<HeadStats> stats(model_.num_stages());
  ForwardContext ctx{false, 0};
  const Tensor* in = &x;
  for (int k = 0; k < model_.num_stages(); ++k) {
    Stage& st = model_.stage(k);
    const Tensor& y = st.Forward(*in, 0, ctx);
    stats[k] = st.Head(0, labels, HeadMode::kEval, 1.0f, ctx);
    in = &OverWire(k, y);
  }
  return stats;
}

}  // namespace localpar
