// The worker's compute thread: stage programs over the link's queues.
#include "services/worker/compute.h"

#include <chrono>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/job/checkpoint.h"
#include "common/job/tensor_codec.h"
#include "common/nn/rule.h"
#include "services/common/grpc_util.h"
#include "services/worker/item_check.h"
#include "services/worker/replica_exchange.h"

namespace localpar {
namespace {

double SecondsSince(int64_t start_ns) { return (MonotonicNanos() - start_ns) * 1e-9; }

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

// The session's links, with the compute thread's liveness noted around every call: while
// it waits on a peer (or for input) it is not stuck, whatever the wait.
class WatchedLinks final : public ComputeLinks {
 public:
  WatchedLinks(ComputeLinks& links, WorkerStats& stats) : links_(links), stats_(stats) {}
  std::optional<v1::DownItem> NextItem() override {
    Wait w(stats_);
    return links_.NextItem();
  }
  void SendDown(grpc::ByteBuffer item, std::function<void()> ready) override {
    Wait w(stats_);
    links_.SendDown(std::move(item), std::move(ready));
  }
  void SendUp(grpc::ByteBuffer item) override {
    Wait w(stats_);
    links_.SendUp(std::move(item));
  }
  PortState NextGradient(bool wait, v1::Gradient* out) override {
    Wait w(stats_);
    return links_.NextGradient(wait, out);
  }
  void QueueDepths(int64_t* a, int64_t* b, int64_t* c, int64_t* d) override {
    links_.QueueDepths(a, b, c, d);
  }

 private:
  struct Wait {
    explicit Wait(WorkerStats& s) : stats(s) { stats.Waiting(); }
    ~Wait() { stats.Working(); }
    WorkerStats& stats;
  };
  ComputeLinks& links_;
  WorkerStats& stats_;
};

// The ports of one step: its items as they arrive, decoded into per-slot tensors, and the
// framed messages the program sends.
class StageCompute::Ports final : public StagePorts {
 public:
  Ports(const StageSetup& setup, StageHost& host, WorkerStats& stats, StageExecutor& executor)
      : setup_(setup), host_(host), stats_(stats), executor_(executor) {
    const size_t slots = static_cast<size_t>(StageExecutor::SlotsNeeded(setup.program));
    inputs_.resize(slots);
    labels_.resize(slots);
  }

  void Attach(ComputeLinks* links) { links_ = links; }
  void Begin(v1::DownItem first, int micro_batches) {
    items_.assign(static_cast<size_t>(micro_batches), v1::DownItem());
    items_[0] = std::move(first);
    if (exchange_) exchange_->Reset();  // nothing of an abandoned step stays in flight
    receive_wait_ = send_wait_ = 0;
    rows_ = 0;
  }
  uint64_t first_seq() const { return items_[0].batch().seq(); }
  int64_t rows() const { return rows_; }
  double receive_wait() const { return receive_wait_; }
  double send_wait() const { return send_wait_; }

  PortState Receive(int m, const Tensor** x, const Tensor** labels) override {
    if (m > 0 && !NextMicroBatch(m)) return PortState::kGone;
    v1::Batch& b = *items_[m].mutable_batch();
    rows_ += b.activations().shape(0);
    const size_t slot = static_cast<size_t>(executor_.SlotFor(m));
    TakeActivations(b.mutable_activations(), host_.backend(), &inputs_[slot]);
    DecodeTensorInto(b.labels(), host_.backend(), &labels_[slot]);
    *x = &inputs_[slot];
    *labels = &labels_[slot];
    return PortState::kReady;
  }

  // Hands y on as micro-batch m's activations, straight from its memory (see wire.h); the
  // labels move along.
  void SendActivations(int m, const Tensor& y) override {
    if (setup_.last()) return;
    v1::Batch& b = *items_[m].mutable_batch();
    if (returns_gradients_ && b.phase() == v1::TRAIN) {
      owed_.push_back({b.seq(), b.activations().shape(0)});  // a gradient will come for it
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
  void SendInputGradient(int m, const Tensor& dx) override {
    const v1::Batch& b = items_[m].batch();
    v1::Gradient g;
    g.set_seq(b.seq());
    g.set_step(b.step());
    g.set_micro_batch(b.micro_batch());
    WireBytes bytes = PrepareActivations(dx, WireFormat::kF32, host_.host_backend(), &grad_staging_,
                                         g.mutable_grad());
    if (bytes.ready) bytes.ready();
    links_->SendUp(FrameGradient(g, bytes));
  }

  // Replicas: this step's gradient bucket, gathered from every replica and summed.
  PortState ExchangeWithReplicas(Stage& stage) override {
    if (!setup_.group) return PortState::kReady;
    absl::Status s = Exchange(stage).Finish();
    if (!s.ok()) {
      // The replicas can no longer step together: no step is applied from now on, and the
      // coordinator hears why, once (it recovers once the lost replica is back).
      if (!exchange_failed_) links_->SendUp(FrameItem(ErrorItem(first_seq(), setup_.stage, s)));
      exchange_failed_ = true;
      return PortState::kGone;
    }
    return PortState::kReady;
  }

  // Replicas: a group's gather starts while the backward pass goes on (replica_exchange.h).
  void GradientsFinal(Stage& stage, int layer) override {
    if (setup_.group) Exchange(stage).Final(layer);
  }

  // Ends the exchange thread (after what it has in flight), before the group is closed.
  void StopExchange() { exchange_.reset(); }

  PortState AwaitGradient(int, const Tensor** grad) override {
    return TakeGradient(true, grad) == PortState::kReady && *grad ? PortState::kReady
                                                                  : PortState::kGone;
  }

  // The next gradient owed, checked against the batch it is for before anything uses it.
  PortState TakeGradient(bool wait, const Tensor** grad) override {
    *grad = nullptr;
    while (true) {
      v1::Gradient g;
      PortState s = links_->NextGradient(wait, &g);
      if (s != PortState::kReady) return s;
      if (owed_.empty()) {
        Refuse(g.seq(), absl::InvalidArgumentError("gradient: none is owed"));
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
        Refuse(owed.seq, c.status);
        return PortState::kReady;  // nothing to apply for that batch
      }
      DecodeTensorInto(g.grad(), host_.backend(), &returned_);
      *grad = &returned_;
      return PortState::kReady;
    }
  }

 private:
  // Waits for micro-batch m of the step under way. Anything else arriving meanwhile is
  // refused in-band: a step's micro-batches travel together.
  bool NextMicroBatch(int m) {
    const v1::Batch& first = items_[0].batch();
    while (true) {
      const int64_t start = MonotonicNanos();
      std::optional<v1::DownItem> item = links_->NextItem();
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
      links_->SendUp(FrameItem(
          ErrorItem(seq, setup_.stage,
                    absl::FailedPreconditionError(absl::StrCat(
                        "batch.micro_batch: step ", first.step(), " is waiting for micro-batch ", m,
                        " of ", items_.size(), "; this item does not belong there")))));
    }
  }

  // A gradient from downstream that is not what this stage is owed: refused, counted and
  // reported upstream; the batch it was for is not updated from it.
  void Refuse(uint64_t seq, const absl::Status& why) {
    stats_.Reject("bad_gradient");
    links_->SendUp(
        FrameItem(ErrorItem(seq, setup_.stage,
                            absl::Status(why.code(), absl::StrCat("from stage ", setup_.stage + 1,
                                                                  ": ", why.message())))));
  }

  struct Owed {
    uint64_t seq;
    int64_t rows;
  };

  const StageSetup& setup_;
  StageHost& host_;
  WorkerStats& stats_;
  StageExecutor& executor_;
  const bool returns_gradients_ = Rule(setup_.trainer.rule).returns_gradients && !setup_.last();
  std::deque<Owed> owed_;  // training batches sent on whose gradients are still to come
  ComputeLinks* links_ = nullptr;
  std::vector<v1::DownItem> items_;            // this step's, by micro-batch
  std::vector<Tensor> inputs_, labels_;        // by slot: kept until the slot's backward
  Tensor returned_;                            // the gradient being applied
  Tensor staging_, grad_staging_;              // host bytes of converted or device tensors
  std::unique_ptr<ReplicaExchange> exchange_;  // replicas, made on first use
  bool exchange_failed_ = false;
  ReplicaExchange& Exchange(Stage& stage) {
    if (!exchange_) {
      exchange_ =
          std::make_unique<ReplicaExchange>(stage, *setup_.group, setup_.replicas, host_.backend());
    }
    return *exchange_;
  }
  double receive_wait_ = 0, send_wait_ = 0;
  int64_t rows_ = 0;
};

StageCompute::StageCompute(const StageSetup& setup, StageHost& host, WorkerStats& stats,
                           int debug_delay_ms)
    : setup_(setup),
      host_(host),
      stats_(stats),
      debug_delay_ms_(debug_delay_ms),
      executor_(*setup.stage_model, setup.program),
      ports_(std::make_unique<Ports>(setup, host, stats, executor_)) {}

StageCompute::~StageCompute() = default;

void StageCompute::Run(ComputeLinks& session) {
  WatchedLinks links(session, stats_);
  ports_->Attach(&links);
  int64_t wait_start = MonotonicNanos();
  while (std::optional<v1::DownItem> item = links.NextItem()) {
    const double waited = SecondsSince(wait_start);
    if (item->has_control()) {
      Control(links, *item);
    } else {
      RunStep(links, *std::move(item), waited);
    }
    wait_start = MonotonicNanos();
  }
  std::lock_guard<std::timed_mutex> compute(host_.compute_mutex());
  executor_.Flush(*ports_);
  // Replicas: a peer still waiting in an exchange with this one stops waiting now.
  ports_->StopExchange();
  if (setup_.group) setup_.group->Close();
  stats_.SetDelays(executor_.delays());
  ports_->Attach(nullptr);
  stats_.Waiting();
}

void StageCompute::RunStep(ComputeLinks& links, v1::DownItem first, double receive_wait) {
  const v1::Batch& b = first.batch();
  const TrainerOptions& t = setup_.trainer;
  StepContext ctx;
  ctx.train = b.phase() == v1::TRAIN;
  ctx.step = b.step();
  ctx.seed = t.seed;
  ctx.lr = LearningRate(t.schedule, b.step(), t.total_steps);
  ctx.loss_scale = LossScale(b.batch_rows(), setup_.labels_per_example);
  // With replicas, this stage computes one share of the step (the loss stays a mean over
  // the whole batch).
  ctx.micro_batches =
      ctx.train ? StepMicroBatches(setup_.program.micro_batches,
                                   ReplicaRows(b.batch_rows(), setup_.replicas, setup_.replica))
                : 1;
  ctx.micro_batch_offset = ctx.train ? setup_.replica * setup_.program.micro_batches : 0;
  const int64_t start = MonotonicNanos();
  ports_->Begin(std::move(first), ctx.micro_batches);
  executor_.Begin(ctx);
  {
    std::lock_guard<std::timed_mutex> compute(host_.compute_mutex());
    if (executor_.Run(*ports_) != StageExecutor::Result::kDone) return;  // the stream ended
  }
  if (!ctx.train) {
    stats_.RecordEval(executor_.stats());
    return;
  }
  if (debug_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(debug_delay_ms_));
  StepRecord r;
  r.seq = ports_->first_seq();
  r.rows = ports_->rows();
  r.head = executor_.stats();
  r.updated = executor_.stepped();
  r.times = executor_.times();
  r.receive_wait = receive_wait + ports_->receive_wait();
  r.send_wait = ports_->send_wait();
  r.start_ns = start;
  r.end_ns = MonotonicNanos();
  links.QueueDepths(&r.inbound_depth, &r.inbound_capacity, &r.outbound_depth, &r.outbound_capacity);
  r.device_bytes = host_.backend().DeviceBytesInUse();
  if (setup_.group) {
    r.exchange_seconds = setup_.group->seconds();
    r.exchange_bytes = setup_.group->bytes_sent();
  }
  stats_.RecordTrainStep(r);
  if (setup_.program.max_delay > 0) stats_.SetDelays(executor_.delays());
}

// Writes this stage's snapshot into the worker's own storage and reports it upstream;
// false (after telling upstream why) when it cannot, which stops the marker here.
bool StageCompute::SaveCheckpoint(ComputeLinks& links, const v1::Control& c) {
  const std::string& root = host_.checkpoint_dir();
  absl::StatusOr<v1::StageSnapshot> snap =
      root.empty() ? absl::FailedPreconditionError(
                         "this worker has no --checkpoint_dir for its checkpoint snapshots")
                   : SaveStageSnapshot(*setup_.stage_model, setup_.stage, stats_.steps(),
                                       stats_.progress(), setup_.request.fingerprint(), root,
                                       c.checkpoint_id(), setup_.replica);
  if (!snap.ok()) {
    links.SendUp(FrameItem(ErrorItem(c.seq(), setup_.stage, snap.status())));
    return false;
  }
  v1::UpItem up;
  up.mutable_saved()->set_seq(c.seq());
  *up.mutable_saved()->mutable_snapshot() = *snap;
  links.SendUp(FrameItem(up));
  std::vector<uint64_t> keep(c.keep_checkpoint_ids().begin(), c.keep_checkpoint_ids().end());
  keep.push_back(c.checkpoint_id());
  PruneSnapshots(root, keep);
  return true;
}

void StageCompute::Control(ComputeLinks& links, const v1::DownItem& item) {
  const v1::Control& c = item.control();
  {
    std::lock_guard<std::timed_mutex> compute(host_.compute_mutex());
    executor_.Flush(*ports_);
    if (c.kind() == v1::Control::CHECKPOINT && !SaveCheckpoint(links, c)) return;
  }
  if (c.kind() == v1::Control::END_OF_EPOCH) stats_.EndOfEpoch(c.epoch());
  if (c.kind() == v1::Control::END_OF_EVAL) stats_.EndOfEval(c.epoch(), c.seq());
  if (c.kind() == v1::Control::SHUTDOWN) shutdown_ = true;
  if (!setup_.last()) {
    links.SendDown(FrameItem(item), nullptr);
    return;
  }
  v1::UpItem up;
  v1::Ack* ack = up.mutable_ack();
  ack->set_seq(c.seq());
  ack->set_kind(c.kind());
  ack->set_epoch(c.epoch());
  links.SendUp(FrameItem(up));
}

}  // namespace localpar
