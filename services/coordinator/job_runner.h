// A job on running workers: configure every stage, feed the batch plan into stage 0 (the
// feeder), drain, collect the report and the weights. When the pipeline breaks and
// checkpoints exist, it waits for every stage to come back (the launcher, Compose or
// Kubernetes restarts them), rolls all of them back to the last committed checkpoint and
// replays from its data cursor. The books are the run ledger's.
#pragma once

#include <optional>
#include <ostream>

#include "common/run/job_data.h"
#include "common/run/ledger.h"
#include "proto/config.pb.h"
#include "services/coordinator/checkpointer.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/feeder.h"
#include "services/coordinator/pipeline_link.h"
#include "services/coordinator/rendezvous_service.h"
#include "services/coordinator/run_monitor.h"
#include "services/coordinator/status_service.h"
#include "services/coordinator/upstream_events.h"
#include "services/coordinator/worker_pool.h"

namespace localpar {

class JobRunner {
 public:
  // `fingerprint` identifies the run in its checkpoints (JobFingerprint); messages go to
  // `log`, the report's table and the files written to `out`.
  JobRunner(const v1::CoordinatorConfig& config, const SecurityOptions& security, v1::Job job,
            DataSplit data, std::string fingerprint, RunLedger& ledger, CoordinatorMetrics* metrics,
            std::ostream& log, std::ostream& out);
  ~JobRunner();

  Checkpointer& checkpointer() { return checkpointer_; }
  const StatusBoard& status_board() const { return board_; }
  // Start from this checkpoint instead of step 0 (--resume), with its report history.
  void ResumeFrom(FoundCheckpoint found);
  // Replicas meet at this Rendezvous service, which workers reach at `address`; it is
  // cleared before every configuration.
  void UseRendezvous(RendezvousService* service, std::string address) {
    rendezvous_ = service;
    rendezvous_address_ = std::move(address);
  }
  // Start step 0 from these parameters (--init_from) rather than the job's initialisation.
  void InitFrom(v1::ModelWeights weights) { initial_ = std::move(weights); }
  // The whole run; an error carries its exit code (exit_codes.h).
  absl::Status Run();

 private:
  // Every stage configured, from resume_ when set; a stage that cannot restore its snapshot
  // of that checkpoint falls back to the next older one.
  absl::Status Configure();
  // After a break (`why`): waits for every stage, then rolls back to the last commit. OK
  // when the run can go on.
  absl::Status Recover(const grpc::Status& why, int attempt);
  absl::Status CollectFailed(const std::string& what);
  absl::Status Collect();
  absl::Status Interrupted(const absl::Status& collected) const;
  // With replicas, every stage's replicas must hold the same weights at the end.
  // `steps`: training steps every replica took (replicas that synchronise every few steps
  // agree only after a synchronisation).
  absl::Status CheckReplicasAgree(const v1::ModelWeights& weights, int64_t steps);
  DataCursor StartCursor() const;

  const v1::CoordinatorConfig& config_;
  const SecurityOptions& security_;
  const v1::Job job_;
  const DataSplit data_;
  RunLedger& ledger_;
  std::ostream& log_;
  std::ostream& out_;
  WorkerPool pool_;
  Checkpointer checkpointer_;
  StatusBoard board_;
  FeedProgress progress_;
  Feeder feeder_;
  UpstreamEvents events_;
  RunMonitor monitor_;
  std::optional<FoundCheckpoint> resume_;
  std::optional<v1::ModelWeights> initial_;
  RendezvousService* rendezvous_ = nullptr;
  std::string rendezvous_address_;
  int configurations_ = 0;
  std::string backend_;
  int64_t parameters_ = 0;
};

}  // namespace localpar
