// The coordinator's checkpoints: when one is due, the CHECKPOINT marker that starts it, the
// commit (the MANIFEST) once the marker comes back acknowledged, pruning, and finding the
// checkpoint to resume or roll back to.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "common/job/batch_plan.h"
#include "common/job/checkpoint.h"
#include "proto/config.pb.h"
#include "proto/localpar.pb.h"
#include "services/common/metrics.h"

namespace localpar {

class Checkpointer {
 public:
  Checkpointer(const v1::CoordinatorConfig& config, const v1::Job& job,
               CoordinatorMetrics* metrics);

  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }

  // The newest complete checkpoint, for --resume; damaged ones are reported on `log`, and
  // newer ones that never committed are removed.
  absl::StatusOr<FoundCheckpoint> FindResume(std::ostream& log);
  // After a pipeline break: markers in flight are forgotten, uncommitted directories
  // removed, and the newest committed checkpoint (if any) is what every stage rolls back to.
  std::optional<FoundCheckpoint> RollBack(std::ostream& log);

  // Whether one is due after training step `step`: asked for (Request), every N steps, or
  // every T seconds.
  bool Due(int64_t step);
  void Request() { requested_ = true; }
  // The marker for a checkpoint after `step`, with the run then at `cursor`; nullopt when
  // its directory cannot be made (that checkpoint is skipped, and said so).
  std::optional<v1::DownItem> Start(uint64_t seq, int64_t step, const DataCursor& cursor);
  int64_t last_started_step() const { return last_started_step_; }

  // From the event loop. OnAck commits the checkpoint whose marker `seq` was; OnError gives
  // it up. Both return false when `seq` was no checkpoint's marker.
  bool OnAck(uint64_t seq);
  bool OnError(const v1::ItemError& error);

  std::string last_committed() const;
  double seconds_since_commit() const;

 private:
  struct Pending {
    std::string dir;
    v1::CheckpointManifest manifest;
    std::chrono::steady_clock::time_point started;
  };

  const std::string dir_;
  const int64_t every_steps_;
  const double every_seconds_;
  const int keep_;
  const v1::Job& job_;
  CoordinatorMetrics* const metrics_;
  std::atomic<bool> requested_{false};
  uint64_t next_id_ = 1;
  int64_t last_started_step_ = -1;
  std::chrono::steady_clock::time_point last_start_ = std::chrono::steady_clock::now();
  mutable std::mutex mu_;  // the event loop commits while the feeder starts new ones
  std::map<uint64_t, Pending> pending_;
  std::string last_committed_;
  std::chrono::steady_clock::time_point last_commit_ = std::chrono::steady_clock::now();
};

}  // namespace localpar
