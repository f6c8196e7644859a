// A worker's statistics (what the Stats RPC returns) and its Prometheus metrics, behind
// their own lock: the compute thread records, RPC handlers read snapshots.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "common/model_io/stage_snapshot.h"
#include "common/nn/executor.h"
#include "proto/localpar.pb.h"
#include "services/common/metrics.h"
#include "services/worker/worker_metrics.h"

namespace localpar {

// One training step as the compute thread saw it.
struct StepRecord {
  uint64_t seq = 0;  // the step's first item
  int64_t rows = 0;
  HeadStats head;
  bool updated = false;
  StepTimes times;
  double receive_wait = 0, send_wait = 0;
  int64_t start_ns = 0, end_ns = 0;  // MonotonicNanos
  int64_t inbound_depth = 0, inbound_capacity = 0, outbound_depth = 0, outbound_capacity = 0;
  int64_t device_bytes = 0;
  double cpu_start = 0, cpu_end = 0;  // ProcessCpuSeconds() at the step's start and end
  double exchange_seconds = 0;        // replicas: all-reduce time and bytes sent, since configured
  int64_t exchange_bytes = 0;
};

class WorkerStats {
 public:
  explicit WorkerStats(WorkerMetrics* metrics);
  WorkerStats(const WorkerStats&) = delete;
  WorkerStats& operator=(const WorkerStats&) = delete;

  // A new configuration: figures start over, except the refusals counted so far.
  // `restored` is the epoch's training figures a restored snapshot carried.
  void Reset(const std::string& job, int stage, int64_t restored_steps, int64_t queue_capacity,
             int64_t state_bytes, int64_t activation_bytes_per_example,
             const EpochProgress& restored);
  // Replicas of the stage (after Reset): the Stats figures and the metrics say which.
  void SetReplica(const std::string& job, int stage, int replica);
  void Reject(const std::string& reason);
  void AddBytes(bool sent, int64_t n);
  void RecordTrainStep(const StepRecord& step);
  // An evaluation batch: its figures, and its compute thread's CPU in the layers and head.
  void RecordEval(const HeadStats& head, double compute_cpu);
  void SetDelays(const DelayStats& delays);
  void SetQueueMaxDepth(int64_t depth);
  // Control items: the epoch's training figures, then its evaluation figures, are kept.
  void EndOfEpoch(int epoch);
  // Returns this stage's figures for the marker to carry: the evaluation's, and at an
  // epoch's end (not `interim`) the epoch's training figures and seconds.
  v1::StageScore EndOfEval(int epoch, bool interim);

  // The compute thread's liveness: Working() when it starts work of its own, Waiting() when
  // it waits on a peer or for input. StuckSeconds() is how long the current stretch of its
  // own work has lasted (0 while it waits).
  void Working();
  void Waiting() { working_since_ns_ = 0; }
  double StuckSeconds() const;

  int64_t steps() const;
  // The epoch's training figures so far, for a checkpoint snapshot.
  EpochProgress progress() const;
  v1::StatsResponse Snapshot(bool include_intervals) const;

 private:
  static constexpr size_t kMaxIntervals = 4096;

  WorkerMetrics* const metrics_;  // may be null
  std::atomic<int64_t> working_since_ns_{0};
  const int64_t baseline_bytes_;  // resident memory before any stage exists
  mutable std::mutex mu_;
  v1::StatsResponse stats_;
  HeadStats recent_, eval_;
  double train_seconds_ = 0;
  std::map<int, v1::EpochStatistics> epochs_;
  std::deque<v1::Interval> intervals_;
  DelayStats delays_;
  int64_t batches_ = 0;
  double first_step_cpu_ = -1;   // ProcessCpuSeconds() as the first training step started
  double pending_eval_cpu_ = 0;  // evaluation compute since the last training step
};

}  // namespace localpar
