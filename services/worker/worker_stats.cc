// Worker statistics and metrics.
#include "services/worker/worker_stats.h"

#include "services/common/grpc_util.h"
#include "services/worker/worker_metrics.h"

namespace localpar {
namespace {

void ToProto(const HeadStats& s, v1::HeadStatistics* out) {
  out->set_loss_sum(s.loss_sum);
  out->set_correct(s.correct);
  out->set_count(s.count);
}

}  // namespace

WorkerStats::WorkerStats(WorkerMetrics* metrics)
    : metrics_(metrics), baseline_bytes_(ResidentBytes()) {}

void WorkerStats::Reset(const std::string& job, int stage, int64_t restored_steps,
                        int64_t queue_capacity, int64_t state_bytes,
                        int64_t activation_bytes_per_example, const EpochProgress& restored) {
  if (metrics_) metrics_->Configure(job, stage);
  std::lock_guard<std::mutex> lock(mu_);
  auto rejected = stats_.rejected();
  stats_ = v1::StatsResponse();
  *stats_.mutable_rejected() = rejected;
  stats_.set_stage(stage);
  stats_.set_steps(restored_steps);
  stats_.set_queue_capacity(queue_capacity);
  stats_.set_state_bytes(state_bytes);
  stats_.set_activation_bytes_per_example(activation_bytes_per_example);
  recent_ = restored.head;
  eval_ = HeadStats();
  train_seconds_ = restored.train_seconds;
  epochs_.clear();
  intervals_.clear();
  delays_ = DelayStats();
  first_step_cpu_ = -1;
  pending_eval_cpu_ = 0;
}

void WorkerStats::SetReplica(const std::string& job, int stage, int replica) {
  if (metrics_) metrics_->Configure(job, stage, replica);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.set_replica(replica);
}

void WorkerStats::Reject(const std::string& reason) {
  if (metrics_) metrics_->AddRejected(reason);
  std::lock_guard<std::mutex> lock(mu_);
  (*stats_.mutable_rejected())[reason] += 1;
}

void WorkerStats::AddBytes(bool sent, int64_t n) {
  if (metrics_) metrics_->AddBytes(sent, n);
  std::lock_guard<std::mutex> lock(mu_);
  if (sent) {
    stats_.set_bytes_sent(stats_.bytes_sent() + n);
  } else {
    stats_.set_bytes_received(stats_.bytes_received() + n);
  }
}

void WorkerStats::RecordTrainStep(const StepRecord& r) {
  if (metrics_) {
    metrics_->ObservePhase("receive_wait", r.receive_wait);
    metrics_->ObservePhase("forward", r.times.forward);
    metrics_->ObservePhase("backward", r.times.backward);
    metrics_->ObservePhase("gradient_wait", r.times.gradient_wait);
    metrics_->ObservePhase("update", r.times.update);
    metrics_->ObservePhase("send_wait", r.send_wait);
    if (r.times.exchange > 0) metrics_->ObservePhase("allreduce", r.times.exchange);
    metrics_->AddExamples(true, r.rows);
    if (r.updated) metrics_->AddStep();
    if (r.head.count > 0) metrics_->SetTrainHead(r.head.mean_loss(), r.head.accuracy());
    metrics_->SetQueue(true, r.inbound_depth, r.inbound_capacity);
    metrics_->SetQueue(false, r.outbound_depth, r.outbound_capacity);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (metrics_ && ++batches_ % 16 == 1) metrics_->SetMemory(ResidentBytes(), r.device_bytes);
  stats_.set_queue_depth(r.inbound_depth);
  stats_.set_queue_max_depth(
      std::max<int64_t>(stats_.queue_max_depth(), std::max(r.inbound_depth, r.outbound_depth)));
  recent_.Add(r.head);
  if (r.updated) stats_.set_steps(stats_.steps() + 1);
  stats_.set_examples(stats_.examples() + r.rows);
  v1::PhaseSeconds& phases = *stats_.mutable_phase_seconds();
  phases.set_receive_wait(phases.receive_wait() + r.receive_wait);
  phases.set_forward(phases.forward() + r.times.forward);
  phases.set_backward(phases.backward() + r.times.backward);
  phases.set_gradient_wait(phases.gradient_wait() + r.times.gradient_wait);
  phases.set_update(phases.update() + r.times.update);
  phases.set_send_wait(phases.send_wait() + r.send_wait);
  phases.set_allreduce(phases.allreduce() + r.times.exchange);
  if (first_step_cpu_ < 0) first_step_cpu_ = r.cpu_start;
  stats_.set_train_cpu_seconds(r.cpu_end - first_step_cpu_);
  stats_.set_compute_cpu_seconds(stats_.compute_cpu_seconds() + r.times.compute_cpu +
                                 pending_eval_cpu_);
  pending_eval_cpu_ = 0;
  stats_.set_allreduce_seconds(r.exchange_seconds);
  stats_.set_allreduce_bytes(r.exchange_bytes);
  train_seconds_ += static_cast<double>(r.end_ns - r.start_ns) * 1e-9;
  v1::Interval iv;
  iv.set_seq(r.seq);
  iv.set_start_ns(r.start_ns);
  iv.set_end_ns(r.end_ns);
  intervals_.push_back(iv);
  if (intervals_.size() > kMaxIntervals) intervals_.pop_front();
}

void WorkerStats::RecordEval(const HeadStats& head, double compute_cpu) {
  if (metrics_) metrics_->AddExamples(false, head.count);
  std::lock_guard<std::mutex> lock(mu_);
  eval_.Add(head);
  // Counted once a later training step ends: only between training steps is the process's
  // CPU counted too.
  if (first_step_cpu_ >= 0) pending_eval_cpu_ += compute_cpu;
}

void WorkerStats::SetDelays(const DelayStats& delays) {
  std::lock_guard<std::mutex> lock(mu_);
  delays_ = delays;
}

void WorkerStats::SetQueueMaxDepth(int64_t depth) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.set_queue_max_depth(std::max(stats_.queue_max_depth(), depth));
}

void WorkerStats::EndOfEpoch(int epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::EpochStatistics& e = epochs_[epoch];
  e.set_epoch(epoch);
  ToProto(recent_, e.mutable_train());
  e.set_train_seconds(train_seconds_);
  e.set_resident_bytes(ResidentBytes());
  recent_ = HeadStats();
  train_seconds_ = 0;
}

v1::StageScore WorkerStats::EndOfEval(int epoch, bool interim) {
  std::lock_guard<std::mutex> lock(mu_);
  if (metrics_) metrics_->SetEvalAccuracy(eval_.accuracy());
  v1::EpochStatistics& e = epochs_[epoch];
  e.set_epoch(epoch);
  ToProto(eval_, e.mutable_eval());
  v1::StageScore score;
  score.set_stage(stats_.stage());
  ToProto(eval_, score.mutable_eval());
  if (!interim) {
    *score.mutable_train() = e.train();
    score.set_train_seconds(e.train_seconds());
  }
  eval_ = HeadStats();
  return score;
}

EpochProgress WorkerStats::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return EpochProgress{recent_, train_seconds_};
}

void WorkerStats::Working() {
  int64_t idle = 0;
  working_since_ns_.compare_exchange_strong(idle, MonotonicNanos());
}

double WorkerStats::StuckSeconds() const {
  const int64_t since = working_since_ns_;
  return since ? static_cast<double>(MonotonicNanos() - since) * 1e-9 : 0.0;
}

int64_t WorkerStats::steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.steps();
}

v1::StatsResponse WorkerStats::Snapshot(bool include_intervals) const {
  std::lock_guard<std::mutex> lock(mu_);
  v1::StatsResponse out = stats_;
  ToProto(recent_, out.mutable_recent());
  for (const auto& [epoch, e] : epochs_) *out.add_epochs() = e;
  out.set_resident_bytes(ResidentBytes());
  out.set_peak_resident_bytes(PeakResidentBytes());
  out.set_baseline_bytes(baseline_bytes_);
  if (delays_.applied > 0) {
    out.set_overlap_mean_delay(delays_.sum / static_cast<double>(delays_.applied));
    out.set_overlap_max_delay_seen(delays_.max);
  }
  if (include_intervals) {
    for (const v1::Interval& iv : intervals_) *out.add_intervals() = iv;
  }
  return out;
}

}  // namespace localpar
