// The stage a worker holds: Configure builds it from the job (or restores it from a
// checkpoint) on the backend the worker was started for, all or nothing: a refused request
// leaves the stage it had. A restore whose snapshot checks out lets the old stage go before
// building the new one, so a rollback holds one stage at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "common/core/dtype.h"
#include "common/model_io/stage_snapshot.h"
#include "common/nn/model.h"
#include "common/nn/step.h"
#include "proto/config.pb.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/grpc_util.h"
#include "services/worker/item_check.h"
#include "services/worker/replica_group.h"

namespace localpar {

// What a worker was started with: its flags, and the security files they name, read.
struct WorkerOptions {
  v1::WorkerConfig config;
  SecurityOptions security;
  std::ostream* log = nullptr;  // what the worker says of its peers (none: nothing)
};
// How long a peer's stream may go silent before the worker ends it (upstream_stall_s).
inline int UpstreamStallSeconds(const v1::WorkerConfig& config) {
  return config.upstream_stall_s() > 0 ? config.upstream_stall_s() : 60;
}

// What one Configure decided, and the stage it built. The settings never change once built;
// the stage itself (stage_model) is mutable state, touched only by the compute thread, and
// by readers (GetWeights, snapshots) under StageHost::compute_mutex. A stream holds the
// whole while it runs.
struct ConfiguredStage {
  v1::ConfigureRequest request;  // with the job's defaults applied
  int stage = 0;
  int num_stages = 0;
  int replica = 0;  // of the stage (Job.replicas)
  int replicas = 1;
  bool last() const { return stage + 1 == num_stages; }
  int64_t labels_per_example = 1;
  WireFormat wire = WireFormat::kF32;  // how activations go to the next stage
  StepSettings steps;                  // how every step is computed
  ProgramSpec program;
  ItemLimits limits;
  std::unique_ptr<Stage> stage_model;
  EpochProgress restored;                     // the epoch's figures the restored snapshot carried
  std::shared_ptr<grpc::Channel> downstream;  // null for the last stage
  std::shared_ptr<ReplicaGroup> group;        // null without replicas
  // Configured with initial_follows, and SetInitial has not yet set every parameter whole:
  // a Stream is refused.
  mutable std::atomic<bool> initial_pending{false};
};

class StageHost {
 public:
  explicit StageHost(const WorkerOptions& options) : options_(options) {}

  // Builds (or restores) the stage the request asks for. On any error the previous
  // configuration stays in place. Codes: INVALID_ARGUMENT for the job or request,
  // RESOURCE_EXHAUSTED for a stage too large for this worker,
  // FAILED_PRECONDITION when the device cannot be had, DATA_LOSS when the snapshot to
  // restore is missing, damaged, or not the one the manifest describes.
  absl::StatusOr<v1::ConfigureResponse> Configure(const v1::ConfigureRequest& request);

  std::shared_ptr<const ConfiguredStage> setup() const;  // null before the first Configure
  Backend& backend() { return *backend_; }
  // Host memory for activations converted or copied before sending: the compute backend
  // when it is the CPU, else page-locked memory beside it.
  Backend& host_backend() { return host_backend_ ? *host_backend_ : *backend_; }
  // Held while a batch is computed, so that weights are read between batches.
  std::timed_mutex& compute_mutex() { return compute_mu_; }
  // The worker's own storage for its snapshots (empty: none).
  const std::string& checkpoint_dir() const { return options_.config.checkpoint_dir(); }
  // UNAVAILABLE when the stage stays busy (waiting on a peer) for `wait`.
  absl::StatusOr<v1::StageWeights> Weights(std::chrono::milliseconds wait);
  // The same, in pieces of at most `chunk_bytes` of data, each given to `send` (which
  // returns false when the reader has gone); one parameter is copied to the host at a time.
  absl::Status WeightChunks(std::chrono::milliseconds wait, int64_t chunk_bytes,
                            const std::function<bool(const v1::ParamChunk&)>& send);
  // The starting parameters of a stage configured with initial_follows, in pieces from
  // `next` (false: no more). Every piece is checked before it is copied in: a parameter of
  // the stage, its whole shape, the next offset, whole floats within the tensor. The stage
  // trains only once every parameter has arrived whole; an error names the parameter.
  absl::StatusOr<v1::SetInitialResponse> SetInitial(
      const std::function<bool(v1::ParamChunk*)>& next);

 private:
  // The configured stage, with the compute mutex held in *compute (waiting at most
  // `wait`): UNAVAILABLE while the stage stays busy, FAILED_PRECONDITION before Configure.
  absl::StatusOr<std::shared_ptr<const ConfiguredStage>> HoldStage(
      std::chrono::milliseconds wait, std::unique_lock<std::timed_mutex>* compute);
  absl::Status EnsureBackend();
  // The stage itself: fresh, restored from its snapshot (checked whole before `release` lets
  // the live one go), or with the initial parameters of --init_from.
  absl::Status CreateStage(const v1::ConfigureRequest& request, const ModelConfig& config,
                           ConfiguredStage* setup, const std::function<void()>& release);
  absl::Status CheckStageFits(const v1::Job& job, int index) const;
  // `release` runs once the request has passed every check, just before the new stage is
  // allocated (see Configure).
  absl::Status Build(const v1::ConfigureRequest& request, ConfiguredStage* setup,
                     const std::function<void()>& release);

  const WorkerOptions& options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Backend> host_backend_;
  std::timed_mutex compute_mu_;
  mutable std::mutex mu_;
  std::shared_ptr<ConfiguredStage> setup_;
};

}  // namespace localpar
