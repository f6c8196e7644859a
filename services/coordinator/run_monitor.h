// What a running job shows: every quarter second the monitor polls the workers' statistics,
// publishes the status snapshot (`localpar status`), hands the live progress line and the
// training figures to the ledger, and sets the checkpoint-age metric.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/run/ledger.h"
#include "services/coordinator/checkpointer.h"
#include "services/coordinator/status_service.h"
#include "services/coordinator/worker_pool.h"

namespace localpar {

// What the coordinator is doing, read by the monitor (the steps fed are the ledger's).
struct FeedProgress {
  enum Phase { kConfiguring, kTraining, kEvaluating, kRecovering, kFinishing };
  std::atomic<int> epoch{0};
  std::atomic<Phase> phase{kConfiguring};
};

class RunMonitor {
 public:
  RunMonitor(const v1::Job& job, RunLedger& ledger, WorkerPool& pool, StatusBoard& board,
             const Checkpointer& checkpointer, const FeedProgress& feed);
  ~RunMonitor();
  void Start();
  // Stops polling and ends the progress line.
  void Stop();

 private:
  void Loop();
  void Tick();
  // `workers`: every worker's own answer (a stage's replicas one after another).
  void Publish(const std::vector<std::optional<v1::StatsResponse>>& stats,
               const std::vector<std::optional<v1::StatsResponse>>& workers, double uptime);

  const v1::Job& job_;
  RunLedger& ledger_;
  WorkerPool& pool_;
  StatusBoard& board_;
  const Checkpointer& checkpointer_;
  const FeedProgress& feed_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

}  // namespace localpar
