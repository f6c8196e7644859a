// The worker's compute thread: stage programs over the link's queues.
#include "services/worker/compute.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/core/cpu_clock.h"
#include "common/model_io/stage_snapshot.h"
#include "common/model_io/tensor_proto.h"
#include "common/nn/rule.h"
#include "services/common/grpc_util.h"
#include "services/worker/item_check.h"
#include "services/worker/replica_exchange.h"

namespace localpar {
namespace {

double SecondsSince(int64_t start_ns) { return (MonotonicNanos() - start_ns) * 1e-9; }

}  // namespace

StageCompute::StageCompute(const ConfiguredStage& setup, StageHost& host, WorkerStats& stats,
                           int debug_delay_ms)
    : setup_(setup),
      host_(host),
      stats_(stats),
      debug_delay_ms_(debug_delay_ms),
      executor_(*setup.stage_model, setup.program),
      ports_(std::make_unique<LinkPorts>(setup, host, stats, executor_)) {}

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
  const StepSettings& t = setup_.steps;
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
  if (ctx.train && ReplicasStepAlone(t)) {
    // Each replica steps alone on the mean loss over its own share, and synchronises with
    // the others every few steps from the weights as they were first trained here (set
    // once, unless a checkpoint restored them).
    ctx.replicas_step_alone = true;
    ctx.loss_scale = LossScale(ReplicaRows(b.batch_rows(), setup_.replicas, setup_.replica),
                               setup_.labels_per_example);
    ctx.sync_replicas = SyncsAfter(t, b.step());
  }
  const int64_t start = MonotonicNanos();
  const double cpu_start = ProcessCpuSeconds();
  ports_->Begin(std::move(first), ctx.micro_batches);
  executor_.Begin(ctx);
  {
    std::lock_guard<std::timed_mutex> compute(host_.compute_mutex());
    if (ctx.replicas_step_alone) OuterSync::Start(*setup_.stage_model);
    if (executor_.Run(*ports_) != StageExecutor::Result::kDone) return;  // the stream ended
  }
  if (!ctx.train) {
    stats_.RecordEval(executor_.stats(), executor_.times().compute_cpu);
    return;
  }
  if (debug_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(debug_delay_ms_));
  StepRecord r;
  r.seq = ports_->items().first_seq();
  r.rows = ports_->items().rows();
  r.head = executor_.stats();
  r.updated = executor_.stepped();
  r.times = executor_.times();
  // The forward phase timed the waits for micro-batches after the first too; they are
  // receive_wait's, so that the phases add up to the step.
  r.times.forward = std::max(0.0, r.times.forward - ports_->items().receive_wait());
  r.receive_wait = receive_wait + ports_->items().receive_wait();
  r.send_wait = ports_->send_wait();
  r.start_ns = start;
  r.end_ns = MonotonicNanos();
  r.cpu_start = cpu_start;
  r.cpu_end = ProcessCpuSeconds();
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
  if (c.kind() == v1::Control::SHUTDOWN) shutdown_ = true;
  v1::DownItem passed = item;
  if (c.kind() == v1::Control::END_OF_EVAL) {
    // This stage's figures ride on with the marker.
    *passed.mutable_control()->add_scores() = stats_.EndOfEval(c.epoch(), c.interim());
  }
  if (!setup_.last()) {
    links.SendDown(FrameItem(passed), nullptr);
    return;
  }
  v1::UpItem up;
  v1::Ack* ack = up.mutable_ack();
  ack->set_seq(c.seq());
  ack->set_kind(c.kind());
  ack->set_epoch(c.epoch());
  ack->set_step(c.step());
  ack->set_interim(c.interim());
  *ack->mutable_scores() = std::move(*passed.mutable_control()->mutable_scores());
  links.SendUp(FrameItem(up));
}

}  // namespace localpar
