// A job on running workers: configure every stage, feed the batch plan into stage 0, drain,
// collect the report and the weights. When the pipeline breaks and checkpoints exist, it
// waits for every stage to come back (the launcher, Compose or Kubernetes restarts them),
// rolls all of them back to the last committed checkpoint and replays from its data cursor.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "common/data/dataset.h"
#include "common/job/run.h"
#include "proto/config.pb.h"
#include "services/coordinator/checkpointer.h"
#include "services/coordinator/pipeline_link.h"
#include "services/coordinator/rendezvous_service.h"
#include "services/coordinator/run_monitor.h"
#include "services/coordinator/status_service.h"
#include "services/coordinator/worker_pool.h"

namespace localpar {

class JobRunner {
 public:
  // `fingerprint` identifies the run in its checkpoints (JobFingerprint).
  JobRunner(const v1::CoordinatorConfig& config, const SecurityOptions& security, v1::Job job,
            DataSplit data, std::string fingerprint, CoordinatorMetrics* metrics);
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
  // Returns the exit code (ExitCode).
  int Run();

 private:
  // One attempt's event loop: acknowledgements (checkpoint commits, each epoch's figures)
  // and in-band errors, in the order they came back.
  void EventLoop(PipelineLink& link);
  void StartEvents(PipelineLink& link);
  void StopEvents(PipelineLink& link);
  bool WaitAck(uint64_t seq);
  uint64_t NextSeq() { return ++seq_; }

  bool Feed(PipelineLink& link);
  bool SendControl(PipelineLink& link, v1::Control::Kind kind, int epoch, uint64_t seq);
  bool SendRows(PipelineLink& link, int replica, const BatchAssembler& batch, int64_t begin,
                int64_t rows, const v1::Batch& meta);
  // A training step's rows [0, rows) of `batch`: each replica's share, in its micro-batches.
  bool SendStep(PipelineLink& link, const BatchAssembler& batch, int64_t rows, int job_micro,
                v1::Batch meta);
  // With replicas, every stage's replicas must hold the same weights at the end.
  int CheckReplicasAgree(const v1::ModelWeights& weights);
  bool StartCheckpoint(PipelineLink& link, int64_t step, const DataCursor& cursor);
  int Configure();
  // After a break (`why`): waits for every stage, then rolls back to the last commit.
  int Recover(const grpc::Status& why, int attempt);
  int Collect();
  int LostWorker(const grpc::Status& final_status);
  // The report so far (epochs scored, wall time): what a checkpoint keeps of it.
  v1::RunReport History();

  const v1::CoordinatorConfig& config_;
  const SecurityOptions& security_;
  const v1::Job job_;
  const DataSplit data_;
  CoordinatorMetrics* const metrics_;
  WorkerPool pool_;
  Checkpointer checkpointer_;
  StatusBoard board_;
  std::optional<FoundCheckpoint> resume_;
  std::optional<v1::ModelWeights> initial_;
  RendezvousService* rendezvous_ = nullptr;
  std::string rendezvous_address_;
  int configurations_ = 0;
  v1::RunReport history_;  // of the run before a resume: its epochs, examples and time
  const int64_t total_steps_;
  std::atomic<uint64_t> seq_{0};
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  // The event loop's state (guarded by mu_).
  std::thread events_;
  std::mutex mu_;
  std::condition_variable acked_cv_;
  std::set<uint64_t> acked_;
  bool link_ended_ = false;
  EpochStatsStore epoch_stats_;
  // Evaluations within epochs (Job.eval_every_steps): the control markers that end one, by
  // sequence number, with their (step, epoch); and their figures by step (a replay after a
  // recovery scores the same step again and replaces them).
  std::map<uint64_t, std::pair<int64_t, int>> interim_seqs_;
  std::map<int64_t, v1::Evaluation> evaluations_;
  // The report's evaluations: the resumed run's before its checkpoint, then this process's.
  void AddEvaluations(v1::RunReport* report);

  FeedProgress feed_;
  int epochs_sent_ = 0;
  int64_t steps_ = 0;
  double train_examples_ = 0;
  bool stopped_early_ = false;
  std::string backend_;
  int64_t parameters_ = 0;
  RunMonitor monitor_;
};

}  // namespace localpar
