// The run monitor.
#include "services/coordinator/run_monitor.h"

#include <unistd.h>

#include <algorithm>

#include "common/job/data_spec.h"

namespace localpar {
namespace {

HeadStats FromProto(const v1::HeadStatistics& s) { return {s.loss_sum(), s.correct(), s.count()}; }

}  // namespace

RunMonitor::RunMonitor(const v1::Job& job, RunLedger& ledger, WorkerPool& pool, StatusBoard& board,
                       const Checkpointer& checkpointer, const FeedProgress& feed)
    : job_(job),
      ledger_(ledger),
      pool_(pool),
      board_(board),
      checkpointer_(checkpointer),
      feed_(feed) {}

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
  ledger_.Done();
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
  const int64_t steps_per_epoch = std::max<int64_t>(ledger_.steps_per_epoch(), 1);
  ProgressLine line;
  line.epochs = ledger_.epochs();
  line.total_steps = ledger_.total_steps();
  line.elapsed_seconds = uptime;
  if (!stats.empty() && stats.back()) {
    line.step = stats.back()->steps();
    line.examples_per_second =
        static_cast<double>(stats.back()->examples()) / std::max(uptime, 1e-9);
  }
  // The epoch the last stage is in, as the bar and the step are (the feeder runs ahead).
  line.epoch = static_cast<int>(std::min<int64_t>(
      ledger_.epochs(), (std::max<int64_t>(line.step, 1) - 1) / steps_per_epoch + 1));
  for (const auto& s : stats) line.recent.push_back(s ? FromProto(s->recent()) : HeadStats());
  // Done with an epoch's training steps and its result not in yet: scoring its test split.
  line.evaluating =
      line.step > 0 && line.step % steps_per_epoch == 0 && !ledger_.epoch_scored(line.epoch);
  ledger_.Progress(line);
  ledger_.TrainFigures(line.step, line.epoch, line.recent, line.examples_per_second);
}

void RunMonitor::Publish(const std::vector<std::optional<v1::StatsResponse>>& stats,
                         const std::vector<std::optional<v1::StatsResponse>>& workers,
                         double uptime) {
  v1::JobStatus out;
  out.set_job(job_.name());
  out.set_rule(v1::UpdateRule_Name(job_.rule()));
  out.set_byte_tokens(JobReadsBytes(job_));
  out.set_epoch(feed_.epoch);
  static constexpr const char* kPhases[] = {"configuring", "training", "evaluating", "recovering",
                                            "finishing"};
  out.set_phase(kPhases[feed_.phase.load()]);
  out.set_epochs(ledger_.epochs());
  const int64_t total = ledger_.total_steps(), fed = ledger_.fed_steps();
  out.set_progress(total > 0 ? static_cast<double>(fed) / total : 0.0);
  out.set_uptime_seconds(uptime);
  out.set_total_steps(total);
  out.set_fed_steps(fed);
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
