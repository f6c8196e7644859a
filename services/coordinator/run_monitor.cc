// The run monitor.
#include "services/coordinator/run_monitor.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "common/job/job.h"

namespace localpar {
namespace {

HeadStats FromProto(const v1::HeadStatistics& s) { return {s.loss_sum(), s.correct(), s.count()}; }

}  // namespace

void EpochStatsStore::Put(int epoch, std::vector<v1::StatsResponse> stats) {
  std::lock_guard<std::mutex> lock(mu_);
  by_epoch_[epoch] = std::move(stats);
}

std::optional<std::vector<v1::StatsResponse>> EpochStatsStore::Get(int epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_epoch_.find(epoch);
  if (it == by_epoch_.end()) return std::nullopt;
  return it->second;
}

std::map<int, std::vector<v1::StatsResponse>> EpochStatsStore::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_epoch_;
}

RunMonitor::RunMonitor(const v1::Job& job, int64_t total_steps, int64_t steps_per_epoch, bool quiet,
                       WorkerPool& pool, StatusBoard& board, const Checkpointer& checkpointer,
                       CoordinatorMetrics* metrics, const FeedProgress& feed,
                       const EpochStatsStore& epochs)
    : job_(job),
      total_steps_(total_steps),
      steps_per_epoch_(steps_per_epoch),
      pool_(pool),
      board_(board),
      checkpointer_(checkpointer),
      metrics_(metrics),
      feed_(feed),
      epochs_(epochs),
      progress_(std::cerr, isatty(STDERR_FILENO), !quiet),
      schedule_(ToTrainerOptions(job, total_steps).schedule) {
  progress_.set_bytes(job.data().has_text());
}

RunMonitor::~RunMonitor() { Stop(); }

void RunMonitor::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void RunMonitor::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
  progress_.Done();
  PrintInterim();
  PrintFinishedEpochs();
}

void RunMonitor::AddInterim(int64_t step, int epoch, std::vector<HeadStats> test) {
  std::lock_guard<std::mutex> lock(interim_mu_);
  interim_.push_back({step, epoch, std::move(test)});
}

void RunMonitor::PrintInterim() {
  std::vector<Interim> pending;
  {
    std::lock_guard<std::mutex> lock(interim_mu_);
    pending.swap(interim_);
  }
  for (const Interim& e : pending) {
    progress_.InterimResult(e.step, e.epoch, e.test);
    if (log_) {
      const double uptime =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      log_->Write(Point("eval", e.epoch, e.step, uptime, 0), e.test);
    }
  }
}

void RunMonitor::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(250), [&] { return done_; });
      if (done_) return;
    }
    Tick();
  }
}

void RunMonitor::Tick() {
  const double uptime =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  std::vector<std::optional<v1::StatsResponse>> workers;
  std::vector<std::optional<v1::StatsResponse>> stats = pool_.PollStats(false, 1, &workers);
  Publish(stats, workers, uptime);
  PrintInterim();
  PrintFinishedEpochs();
  if (metrics_) metrics_->SetCheckpointAge(checkpointer_.seconds_since_commit());
  ProgressLine line;
  line.epochs = job_.epochs();
  line.total_steps = total_steps_;
  line.elapsed_seconds = uptime;
  if (!stats.empty() && stats.back()) {
    line.step = stats.back()->steps();
    line.examples_per_second =
        static_cast<double>(stats.back()->examples()) / std::max(uptime, 1e-9);
  }
  // The epoch the last stage is in, as the bar and the step are (the feeder runs ahead).
  line.epoch = static_cast<int>(std::min<int64_t>(
      job_.epochs(),
      (std::max<int64_t>(line.step, 1) - 1) / std::max<int64_t>(steps_per_epoch_, 1) + 1));
  for (const auto& s : stats) line.recent.push_back(s ? FromProto(s->recent()) : HeadStats());
  // Done with an epoch's training steps and its result not in yet: scoring its test split.
  line.evaluating = line.step > 0 && line.step % std::max<int64_t>(steps_per_epoch_, 1) == 0 &&
                    printed_epochs_ < line.epoch;
  progress_.Update(line);
  // metrics.jsonl: the epoch so far, at most once a second, when the last stage has moved.
  if (log_ && line.step != logged_step_ && uptime - logged_at_ >= 1.0) {
    logged_step_ = line.step;
    logged_at_ = uptime;
    log_->Write(Point("train", line.epoch, line.step, uptime, line.examples_per_second),
                line.recent);
  }
}

MetricsPoint RunMonitor::Point(const char* kind, int epoch, int64_t step, double uptime,
                               double examples_per_second) const {
  MetricsPoint p;
  p.kind = kind;
  p.step = step;
  p.epoch = epoch;
  p.wall_seconds = uptime;
  p.lr = LearningRate(schedule_, step, total_steps_);
  p.examples_per_second = examples_per_second;
  return p;
}

void RunMonitor::PrintFinishedEpochs() {
  while (std::optional<std::vector<v1::StatsResponse>> s = epochs_.Get(printed_epochs_ + 1)) {
    ++printed_epochs_;
    std::vector<HeadStats> train, test;
    for (const v1::StatsResponse& st : *s) {
      HeadStats t, h;
      for (const auto& e : st.epochs()) {
        if (e.epoch() != printed_epochs_) continue;
        t = FromProto(e.train());
        h = FromProto(e.eval());
      }
      train.push_back(t);
      test.push_back(h);
    }
    progress_.EpochResult(printed_epochs_, test, -1);
    if (log_) {
      const double uptime =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      // The steps done when this epoch's evaluation began: every step of the epochs so far.
      const int64_t step = std::min<int64_t>(total_steps_, printed_epochs_ * steps_per_epoch_);
      log_->Write(Point("epoch", printed_epochs_, step, uptime, 0), train);
      log_->Write(Point("test", printed_epochs_, step, uptime, 0), test);
    }
  }
}

void RunMonitor::Publish(const std::vector<std::optional<v1::StatsResponse>>& stats,
                         const std::vector<std::optional<v1::StatsResponse>>& workers,
                         double uptime) {
  v1::JobStatus out;
  out.set_job(job_.name());
  out.set_rule(v1::UpdateRule_Name(job_.rule()));
  out.set_byte_tokens(job_.data().has_text());
  out.set_epoch(feed_.epoch);
  static constexpr const char* kPhases[] = {"configuring", "training", "evaluating", "recovering",
                                            "finishing"};
  out.set_phase(kPhases[feed_.phase.load()]);
  out.set_epochs(job_.epochs());
  out.set_progress(total_steps_ > 0 ? static_cast<double>(feed_.fed_steps) / total_steps_ : 0.0);
  out.set_uptime_seconds(uptime);
  out.set_total_steps(total_steps_);
  out.set_fed_steps(feed_.fed_steps);
  out.set_checkpoints(checkpointer_.enabled());
  if (std::string last = checkpointer_.last_committed(); !last.empty()) {
    out.set_last_checkpoint(last);
    out.set_checkpoint_age_seconds(checkpointer_.seconds_since_commit());
  }
  for (size_t k = 0; k < stats.size(); ++k) {
    v1::StageStatus* s = out.add_stages();
    s->set_stage(static_cast<int>(k));
    s->set_address(pool_.address(static_cast<int>(k)));
    s->set_reachable(stats[k].has_value());
    s->set_replicas(pool_.replicas());
    if (pool_.replicas() > 1) {
      for (int r = 0; r < pool_.replicas(); ++r) {
        const std::optional<v1::StatsResponse>& w = workers[k * pool_.replicas() + r];
        s->add_replica_addresses(pool_.address(static_cast<int>(k), r));
        s->add_replica_reachable(w.has_value());
        s->add_replica_examples(w ? w->examples() : 0);
        s->add_replica_allreduce_seconds(w ? w->allreduce_seconds() : 0);
      }
    }
    if (!stats[k]) continue;
    const v1::StatsResponse& st = *stats[k];
    s->set_examples(st.examples());
    s->set_steps(st.steps());
    s->set_loss(FromProto(st.recent()).mean_loss());
    s->set_queue_depth(st.queue_depth());
    s->set_queue_capacity(st.queue_capacity());
    int64_t rejected = 0;
    for (const auto& [reason, n] : st.rejected()) rejected += n;
    s->set_rejected(rejected);
  }
  board_.Publish(std::move(out));
}

}  // namespace localpar
