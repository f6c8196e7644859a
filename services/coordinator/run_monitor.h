// What a running job shows: every quarter second the monitor polls the workers' statistics,
// publishes the status snapshot (`localpar status`), updates the progress line, prints each
// epoch's results once the epoch is scored, and sets the checkpoint-age metric.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/job/metrics_log.h"
#include "common/job/progress.h"
#include "common/nn/optimizer.h"
#include "services/coordinator/checkpointer.h"
#include "services/coordinator/status_service.h"
#include "services/coordinator/worker_pool.h"

namespace localpar {

// Every stage's statistics as they were when each epoch's evaluation ended: written by the
// event loop, read by the monitor and the report. They survive a recovery, which
// configures the workers again (and so resets their figures).
class EpochStatsStore {
 public:
  void Put(int epoch, std::vector<v1::StatsResponse> stats);
  std::optional<std::vector<v1::StatsResponse>> Get(int epoch) const;
  std::map<int, std::vector<v1::StatsResponse>> All() const;

 private:
  mutable std::mutex mu_;
  std::map<int, std::vector<v1::StatsResponse>> by_epoch_;
};

// The feeder's position, read by the monitor.
struct FeedProgress {
  enum Phase { kConfiguring, kTraining, kEvaluating, kRecovering, kFinishing };
  std::atomic<int64_t> fed_steps{0};
  std::atomic<int> epoch{0};
  std::atomic<Phase> phase{kConfiguring};
};

class RunMonitor {
 public:
  RunMonitor(const v1::Job& job, int64_t total_steps, int64_t steps_per_epoch, bool quiet,
             WorkerPool& pool, StatusBoard& board, const Checkpointer& checkpointer,
             CoordinatorMetrics* metrics, const FeedProgress& feed, const EpochStatsStore& epochs);
  ~RunMonitor();
  void Start();
  // Stops polling, clears the progress line and prints the epochs not printed yet.
  void Stop();
  // An evaluation within an epoch, from the event loop: printed and logged by the monitor's
  // thread, before any later epoch's result.
  void AddInterim(int64_t step, int epoch, std::vector<HeadStats> test);
  // Appends the run's figures to metrics.jsonl as it goes (before Start).
  void LogTo(std::unique_ptr<MetricsLog> log) {
    log_ = std::move(log);
    log_->set_bytes(job_.data().has_text());
  }

 private:
  void Loop();
  void Tick();
  void PrintFinishedEpochs();
  void PrintInterim();
  MetricsPoint Point(const char* kind, int epoch, int64_t step, double uptime,
                     double examples_per_second) const;
  // `workers`: every worker's own answer (a stage's replicas one after another).
  void Publish(const std::vector<std::optional<v1::StatsResponse>>& stats,
               const std::vector<std::optional<v1::StatsResponse>>& workers, double uptime);

  const v1::Job& job_;
  const int64_t total_steps_, steps_per_epoch_;
  WorkerPool& pool_;
  StatusBoard& board_;
  const Checkpointer& checkpointer_;
  CoordinatorMetrics* const metrics_;
  const FeedProgress& feed_;
  const EpochStatsStore& epochs_;
  struct Interim {
    int64_t step;
    int epoch;
    std::vector<HeadStats> test;
  };
  std::mutex interim_mu_;
  std::vector<Interim> interim_;  // not printed yet
  ProgressPrinter progress_;
  std::unique_ptr<MetricsLog> log_;
  ScheduleConfig schedule_;
  int64_t logged_step_ = -1;
  double logged_at_ = 0;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  int printed_epochs_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

}  // namespace localpar
