// The coordinator's side of the workers: one stub per stage, configuring them (with retry
// while a worker winds down its previous stream), polling statistics, reading weights, and
// naming the stages that do not answer.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_io/model_file.h"
#include "proto/checkpoint.pb.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/grpc_util.h"

namespace localpar {

// What every stage is configured with, besides the job.
struct StageSettings {
  int64_t total_steps = 0;
  v1::ConfigureRequest::NonFinite non_finite = v1::ConfigureRequest::REJECT;
  int overlap_max_delay = 0;
  std::string fingerprint;  // the run's (JobFingerprint)
  // Restore every stage from this checkpoint's snapshots (null: start fresh).
  const v1::CheckpointManifest* restore = nullptr;
  // Otherwise, start every stage from these parameters (--init_from; null: the job's
  // initialisation).
  const v1::ModelWeights* initial = nullptr;
  // Replicas: where they meet (the coordinator's Rendezvous service), under a group name
  // fresh for this configuration, and how long they wait for each other.
  std::string rendezvous;
  std::string rendezvous_group;
  int rendezvous_timeout_s = 0;
};

struct ConfigureOutcome {
  std::string backend;
  int64_t parameters = 0;
};

// Workers are listed stage by stage: replica r of stage k is worker k * replicas + r.
class WorkerPool {
 public:
  // Weights move in pieces of `chunk_bytes` (SetInitial, StreamWeights).
  WorkerPool(std::vector<std::string> addresses, int replicas, const SecurityOptions& security,
             int64_t chunk_bytes = int64_t{4} << 20);
  int size() const { return static_cast<int>(addresses_.size()) / replicas_; }  // stages
  int replicas() const { return replicas_; }
  const std::string& address(int k, int r = 0) const { return addresses_[Index(k, r)]; }
  v1::Worker::Stub& stub(int k, int r = 0) { return *stubs_[Index(k, r)]; }
  // "stage K" or, with replicas, "stage K replica R".
  std::string Name(int k, int r) const;

  // Configures every worker in order. The first failure names the worker and carries its
  // exit code: INVALID_ARGUMENT a bad job (3), DATA_LOSS a checkpoint that does not restore
  // (the status stays DATA_LOSS) and FAILED_PRECONDITION a device that is missing (1),
  // anything else a lost worker (5).
  absl::StatusOr<ConfigureOutcome> ConfigureAll(const v1::Job& job, const StageSettings& settings,
                                                int timeout_s);
  // Each stage's statistics (its replicas' added up: replica_stats.h); nullopt for a stage
  // with a worker that does not answer within the deadline. `workers`, when given,
  // receives every worker's own answer.
  std::vector<std::optional<v1::StatsResponse>> PollStats(
      bool intervals, double deadline_s,
      std::vector<std::optional<v1::StatsResponse>>* workers = nullptr);
  // "stage 1 (HOST:PORT), ..." for the workers that do not answer; empty when all do.
  std::string Unreachable(double deadline_s);
  // What Weights holds the workers to: every stage's tensors by name and shape (from the
  // job), and how long a worker may send nothing.
  void ExpectWeights(std::vector<std::vector<TensorSpec>> specs, int stall_s);
  // A stage's parameters, streamed in pieces (StreamWeights). Never trusting the worker:
  // every piece is checked against the job's tensors (name, shape, place, finite values)
  // before it is kept, nothing is allocated beyond them, every tensor must come once, and
  // a stream silent for the stall bound is given up. Errors name the stage and the tensor.
  // With `non_finite`, a NaN or infinite value is not refused but described there (the
  // first one; a run whose loss diverged has them), for the caller to judge.
  absl::StatusOr<v1::StageWeights> Weights(int k, int r = 0, std::string* non_finite = nullptr);

 private:
  int Index(int k, int r) const { return k * replicas_ + r; }
  // --init_from: the stage's parameters in pieces, after a Configure with initial_follows.
  absl::Status SendInitial(int k, int r, const v1::StageWeights& weights, int timeout_s);

  std::vector<std::string> addresses_;
  const int replicas_;
  const SecurityOptions& security_;
  const int64_t chunk_bytes_;
  std::vector<std::vector<TensorSpec>> expected_;  // per stage (ExpectWeights)
  int stall_s_ = 60;
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
};

// The host part of HOST:PORT ([v6]:port too): where a worker's replica peers reach it.
std::string HostOf(const std::string& address);

}  // namespace localpar
