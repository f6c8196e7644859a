// The coordinator's checkpoints. A checkpoint is a CHECKPOINT marker in the batch stream;
// each worker writes its stage's snapshot to its own storage and reports it (StageSaved),
// and once the marker comes back acknowledged the coordinator commits the MANIFEST, which
// records every snapshot's size and checksum. So no process needs another's filesystem,
// and no process carries another's bytes. Also: when one is due, pruning, and finding the
// checkpoint to resume or roll back to.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_io/checkpoint.h"
#include "common/run/batch_plan.h"
#include "common/run/ledger.h"
#include "proto/config.pb.h"
#include "proto/localpar.pb.h"
#include "proto/report.pb.h"
#include "services/common/metrics.h"
#include "services/coordinator/coordinator_metrics.h"

namespace localpar {

// The most checkpoint markers in flight at once; see Feeder::Feed.
constexpr int kMaxCheckpointsInFlight = 4;

class Checkpointer {
 public:
  // `fingerprint` identifies the run (JobFingerprint). The ledger says when one is due and
  // gives the report so far when one commits, so that a restarted coordinator reports the
  // whole run. Messages go to `log`.
  Checkpointer(const v1::CoordinatorConfig& config, const v1::Job& job, std::string fingerprint,
               CoordinatorMetrics* metrics, RunLedger& ledger, std::ostream& log);

  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  const std::string& fingerprint() const { return fingerprint_; }
  // The run's network whatever its layout (NetworkFingerprint), recorded in every manifest
  // with the job, so that a resume with another --stages or --replicas finds them.
  void SetNetwork(std::string network) { network_ = std::move(network); }
  const std::string& network() const { return network_; }

  // A fresh run must not mix its checkpoints with another run's: FAILED_PRECONDITION when
  // the directory already holds committed checkpoints.
  absl::Status CheckFresh() const;
  // The newest complete checkpoint of this run, for --resume; others are reported on
  // `log`, and newer directories that never committed are removed. When the newest is the
  // same network's in another layout, it is regrouped into a new checkpoint of this run
  // (regroup.h), which needs every snapshot on this machine (--local_snapshots).
  absl::StatusOr<FoundCheckpoint> FindResume(std::ostream& log);
  // The newest committed checkpoint of this run older than `id`.
  std::optional<FoundCheckpoint> OlderThan(uint64_t id) const;
  // After a pipeline break: markers in flight are forgotten, uncommitted directories
  // removed, and the newest committed checkpoint (if any) is what every stage rolls back to.
  std::optional<FoundCheckpoint> RollBack(std::ostream& log);

  // Asks for one after the next complete training step (localpar checkpoint).
  void Request() { ledger_.RequestCheckpoint(); }
  // The marker for a checkpoint after `step`, with the run then at `cursor` and
  // `train_examples` fed; nullopt when its directory cannot be made (that checkpoint is
  // skipped, and said so).
  std::optional<v1::DownItem> Start(uint64_t seq, int64_t step, const DataCursor& cursor,
                                    double train_examples);

  // From the event loop. OnSaved records a stage's snapshot; OnAck commits the checkpoint
  // whose marker `seq` was; OnError gives it up. Each returns false when `seq` was no
  // checkpoint's marker.
  bool OnSaved(const v1::StageSaved& saved);
  bool OnAck(uint64_t seq);
  bool OnError(const v1::ItemError& error);

  std::string last_committed() const;
  double seconds_since_commit() const;
  int started() const { return started_; }
  int committed() const { return committed_; }
  // A periodic checkpoint after `step` was not started (kMaxCheckpointsInFlight): said on
  // the log the first time.
  void Skipped(int64_t step);
  // Markers sent whose checkpoint has neither committed nor failed.
  int in_flight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(pending_.size());
  }

 private:
  struct Pending {
    std::string dir;
    v1::CheckpointManifest manifest;
    std::map<std::pair<int, int>, v1::StageSnapshot> snapshots;  // by (stage, replica)
    double train_examples = 0;
    std::chrono::steady_clock::time_point started;
  };
  bool Commit(Pending& p);
  std::vector<uint64_t> KeptIds() const;

  const std::string dir_;
  const int keep_;
  const v1::Job& job_;
  const std::string fingerprint_;
  std::string network_;
  const bool local_snapshots_;
  const uint64_t resume_id_;  // --resume=DIR/ckpt-N: that checkpoint (0: the newest)
  CoordinatorMetrics* const metrics_;
  RunLedger& ledger_;
  std::ostream& log_;
  uint64_t next_id_ = 1;
  std::atomic<int> started_{0}, committed_{0};
  bool said_skipped_ = false;
  mutable std::mutex mu_;  // the event loop commits while the feeder starts new ones
  std::map<uint64_t, Pending> pending_;
  std::string last_committed_;
  std::chrono::steady_clock::time_point last_commit_ = std::chrono::steady_clock::now();
};

}  // namespace localpar
