// A worker's ports: a step's items, the gradients it is owed, and the links' framing.
#include "services/worker/link_ports.h"

#include "absl/strings/str_cat.h"
#include "common/nn/rule.h"
#include "services/common/grpc_util.h"
#include "services/common/wire.h"
#include "services/worker/item_check.h"
#include "services/worker/mesh_wire.h"

namespace localpar {
namespace {

double SecondsSince(int64_t start_ns) { return (MonotonicNanos() - start_ns) * 1e-9; }

// Marks the compute thread as waiting for as long as it lives.
struct Wait {
  explicit Wait(WorkerStats& s) : stats(s) { stats.Waiting(); }
  ~Wait() { stats.Working(); }
  WorkerStats& stats;
};

}  // namespace

v1::UpItem ErrorItem(uint64_t seq, int stage, const absl::Status& s) {
  v1::UpItem up;
  v1::ItemError* e = up.mutable_error();
  e->set_seq(seq);
  e->set_stage(stage);
  e->set_code(static_cast<int>(s.code()));
  e->set_message(std::string(s.message()));
  return up;
}

// ---- WatchedLinks ---------------------------------------------------------------------

std::optional<v1::DownItem> WatchedLinks::NextItem() {
  Wait w(stats_);
  return links_.NextItem();
}

void WatchedLinks::SendDown(grpc::ByteBuffer item, std::function<void()> ready) {
  Wait w(stats_);
  links_.SendDown(std::move(item), std::move(ready));
}

void WatchedLinks::SendUp(grpc::ByteBuffer item) {
  Wait w(stats_);
  links_.SendUp(std::move(item));
}

PortState WatchedLinks::NextGradient(bool wait, v1::Gradient* out) {
  Wait w(stats_);
  return links_.NextGradient(wait, out);
}

// ---- StepItems ------------------------------------------------------------------------

StepItems::StepItems(const ConfiguredStage& setup, StageHost& host, WorkerStats& stats, int slots)
    : setup_(setup), host_(host), stats_(stats) {
  inputs_.resize(static_cast<size_t>(slots));
  labels_.resize(static_cast<size_t>(slots));
}

void StepItems::Begin(v1::DownItem first, int micro_batches) {
  items_.assign(static_cast<size_t>(micro_batches), v1::DownItem());
  items_[0] = std::move(first);
  receive_wait_ = 0;
  rows_ = 0;
}

bool StepItems::Receive(ComputeLinks& links, int m, int slot, const Tensor** x,
                        const Tensor** labels) {
  if (m > 0 && !NextMicroBatch(links, m)) return false;
  v1::Batch& b = batch(m);
  rows_ += b.activations().shape(0);
  TakeActivations(b.mutable_activations(), host_.backend(), &inputs_[slot]);
  DecodeTensorInto(b.labels(), host_.backend(), &labels_[slot]);
  *x = &inputs_[slot];
  *labels = &labels_[slot];
  return true;
}

bool StepItems::NextMicroBatch(ComputeLinks& links, int m) {
  const v1::Batch& first = items_[0].batch();
  while (true) {
    const int64_t start = MonotonicNanos();
    std::optional<v1::DownItem> item = links.NextItem();
    receive_wait_ += SecondsSince(start);
    if (!item) return false;
    if (item->has_batch() && item->batch().phase() == v1::TRAIN &&
        item->batch().step() == first.step() && item->batch().micro_batch() == m &&
        item->batch().batch_rows() == first.batch_rows()) {
      items_[m] = std::move(*item);
      return true;
    }
    stats_.Reject("bad_micro_batch");
    const uint64_t seq = item->has_batch() ? item->batch().seq() : item->control().seq();
    // (a control item or another step's batch: refused, the step goes on waiting)
    links.SendUp(FrameItem(
        ErrorItem(seq, setup_.stage,
                  absl::FailedPreconditionError(absl::StrCat(
                      "batch.micro_batch: step ", first.step(), " is waiting for micro-batch ", m,
                      " of ", items_.size(), "; this item does not belong there")))));
  }
}

// ---- OwedGradients --------------------------------------------------------------------

PortState OwedGradients::Take(ComputeLinks& links, bool wait, const Tensor** grad) {
  *grad = nullptr;
  while (true) {
    v1::Gradient g;
    PortState s = links.NextGradient(wait, &g);
    if (s != PortState::kReady) return s;
    if (owed_.empty()) {
      Refuse(links, g.seq(), absl::InvalidArgumentError("gradient: none is owed"));
      continue;
    }
    const Owed owed = owed_.front();
    if (!g.has_grad()) {                  // a batch died downstream
      if (g.seq() != owed.seq) continue;  // not a training batch of ours
      owed_.pop_front();
      return PortState::kReady;
    }
    owed_.pop_front();
    ItemCheck c = CheckGradient(g, owed.seq, owed.rows, setup_.stage_model->output_shape());
    if (c.verdict != ItemCheck::kAccept) {
      Refuse(links, owed.seq, c.status);
      return PortState::kReady;  // nothing to apply for that batch
    }
    DecodeTensorInto(g.grad(), host_.backend(), &returned_);
    *grad = &returned_;
    return PortState::kReady;
  }
}

void OwedGradients::Refuse(ComputeLinks& links, uint64_t seq, const absl::Status& why) {
  stats_.Reject("bad_gradient");
  links.SendUp(
      FrameItem(ErrorItem(seq, setup_.stage,
                          absl::Status(why.code(), absl::StrCat("from stage ", setup_.stage + 1,
                                                                ": ", why.message())))));
}

// ---- LinkPorts ------------------------------------------------------------------------

LinkPorts::LinkPorts(const ConfiguredStage& setup, StageHost& host, WorkerStats& stats,
                     StageExecutor& executor)
    : setup_(setup),
      host_(host),
      executor_(executor),
      returns_gradients_(Rule(setup.steps.rule).returns_gradients && !setup.last()),
      items_(setup, host, stats, StageExecutor::SlotsNeeded(setup.program)),
      owed_(setup, host, stats) {}

void LinkPorts::Begin(v1::DownItem first, int micro_batches) {
  items_.Begin(std::move(first), micro_batches);
  if (exchange_) exchange_->Reset();  // nothing of an abandoned step stays in flight
  send_wait_ = 0;
}

PortState LinkPorts::Receive(int m, const Tensor** x, const Tensor** labels) {
  return items_.Receive(*links_, m, executor_.SlotFor(m), x, labels) ? PortState::kReady
                                                                     : PortState::kGone;
}

// Hands y on as micro-batch m's activations, straight from its memory (see wire.h); the
// labels move along.
void LinkPorts::SendActivations(int m, const Tensor& y) {
  if (setup_.last()) return;
  v1::Batch& b = items_.batch(m);
  if (returns_gradients_ && b.phase() == v1::TRAIN) {
    owed_.Owe(b.seq(), b.activations().shape(0));  // a gradient will come for it
    links_->OweGradient();
  }
  v1::Batch next;
  next.set_seq(b.seq());
  next.set_epoch(b.epoch());
  next.set_phase(b.phase());
  next.set_step(b.step());
  next.set_micro_batch(b.micro_batch());
  next.set_micro_batches(b.micro_batches());
  next.set_batch_rows(b.batch_rows());
  WireBytes bytes = PrepareActivations(y, setup_.wire, host_.host_backend(), &staging_,
                                       next.mutable_activations());
  *next.mutable_labels() = std::move(*b.mutable_labels());
  const int64_t start = MonotonicNanos();
  links_->SendDown(FrameBatch(next, bytes), std::move(bytes.ready));
  send_wait_ += SecondsSince(start);
}

// Returns dx upstream, straight from its memory like activations (always float32).
void LinkPorts::SendInputGradient(int m, const Tensor& dx) {
  const v1::Batch& b = items_.batch(m);
  v1::Gradient g;
  g.set_seq(b.seq());
  g.set_step(b.step());
  g.set_micro_batch(b.micro_batch());
  WireBytes bytes = PrepareActivations(dx, WireFormat::kF32, host_.host_backend(), &grad_staging_,
                                       g.mutable_grad());
  if (bytes.ready) bytes.ready();
  links_->SendUp(FrameGradient(g, bytes));
}

PortState LinkPorts::AwaitGradient(int, const Tensor** grad) {
  return TakeGradient(true, grad) == PortState::kReady && *grad ? PortState::kReady
                                                                : PortState::kGone;
}

PortState LinkPorts::TakeGradient(bool wait, const Tensor** grad) {
  return owed_.Take(*links_, wait, grad);
}

ReplicaExchange& LinkPorts::Exchange(Stage& stage) {
  if (!exchange_) {
    exchange_ =
        std::make_unique<ReplicaExchange>(stage, *setup_.group, setup_.replicas, host_.backend());
  }
  return *exchange_;
}

// Replicas: this step's gradient bucket, summed over every replica.
PortState LinkPorts::ExchangeWithReplicas(Stage& stage) {
  if (!setup_.group) return PortState::kReady;
  absl::Status s = Exchange(stage).Finish();
  if (!s.ok()) {
    ExchangeFailed(s);
    return PortState::kGone;
  }
  return PortState::kReady;
}

// The replicas can no longer step together: no step is applied from now on, and the
// coordinator hears why, once (it recovers once the lost replica is back).
void LinkPorts::ExchangeFailed(const absl::Status& s) {
  if (!exchange_failed_) links_->SendUp(FrameItem(ErrorItem(items_.first_seq(), setup_.stage, s)));
  exchange_failed_ = true;
}

// Replicas that synchronise every few steps: the pseudo-gradients summed over every
// replica (on this, the compute thread: no gradient exchange runs in this mode), checked,
// then the outer step.
PortState LinkPorts::SyncReplicas(Stage& stage) {
  if (!setup_.group) return PortState::kReady;
  if (exchange_failed_) return PortState::kGone;
  if (!outer_) {
    outer_ = std::make_unique<OuterSync>(stage, setup_.steps.outer_lr, setup_.steps.outer_momentum,
                                         setup_.steps.sync_bf16);
  }
  const int64_t n = outer_->size();
  outer_send_.resize(static_cast<size_t>(n));
  outer_sum_.resize(static_cast<size_t>(n));
  outer_->Pack(outer_send_.data());
  NonFiniteParts bad;
  absl::Status s;
  if (outer_->bf16()) {
    s = ReduceBf16(outer_->pseudo_gradients(), &bad);
  } else {
    s = setup_.group->AllReduce(outer_send_.data(), n, outer_sum_.data(), &bad);
  }
  if (s.ok()) s = NonFiniteError(bad, setup_.stage, n, "a pseudo-gradient");
  if (!s.ok()) {
    ExchangeFailed(s);
    return PortState::kGone;
  }
  outer_->ApplySum(outer_sum_.data(), setup_.replicas);
  return PortState::kReady;
}

// The pseudo-gradients (the first t floats of outer_send_, bfloat16 values already) as
// bfloat16 pairs, then the running statistics as floats; their sums into outer_sum_.
absl::Status LinkPorts::ReduceBf16(int64_t t, NonFiniteParts* bad) {
  const int64_t n = static_cast<int64_t>(outer_send_.size()), words = (t + 1) / 2;
  std::vector<float>& pairs = outer_pairs_;
  pairs.resize(static_cast<size_t>(2 * words));  // sent, then their sums
  mesh::PackBf16Pairs(outer_send_.data(), t, pairs.data());
  absl::Status s = setup_.group->AllReduce(pairs.data(), words, pairs.data() + words, bad,
                                           ReduceFormat::kBf16Pairs);
  if (!s.ok() || bad->replica >= 0) return s;
  mesh::UnpackBf16Pairs(pairs.data() + words, t, outer_sum_.data());
  if (n == t) return s;
  s = setup_.group->AllReduce(outer_send_.data() + t, n - t, outer_sum_.data() + t, bad);
  if (bad->replica >= 0) bad->first += t;  // an index in the whole contribution
  return s;
}

// Replicas: a group's gather starts while the backward pass goes on (replica_exchange.h).
void LinkPorts::GradientsFinal(Stage& stage, int layer) {
  if (setup_.group) Exchange(stage).Final(layer);
}

}  // namespace localpar
