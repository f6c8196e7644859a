// The run ledger: the one object that keeps a run's books, whether the run is in one process
// (localpar train) or a cluster (the coordinator). It knows the batch plan, what has been
// fed, when a checkpoint is due, every evaluation's figures as they are scored, and from
// those the progress output, metrics.jsonl and the report. The two loops only feed it
// events; neither keeps bookkeeping of its own. Thread-safe: in a cluster the feeder, the
// event loop and the monitor each call it.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/run/batch_plan.h"
#include "common/run/metrics_log.h"
#include "common/run/progress.h"
#include "proto/job.pb.h"
#include "proto/report.pb.h"

namespace localpar {

struct LedgerOptions {
  std::string out_dir;          // metrics.jsonl goes here ("": nowhere)
  bool progress = true;         // the progress line (epoch results are printed regardless)
  bool live = false;            // `log` is a terminal: the line is rewritten in place
  std::ostream* log = nullptr;  // where the progress line goes (null: nowhere)
  // metrics.jsonl's "train" lines: at every N-th step (in one process, where every step is
  // seen), or at most every T seconds when the step has moved (a cluster's monitor), and
  // then also at each step an evaluation follows (Job.eval_every_steps).
  int64_t train_line_every_steps = 10;
  double train_line_every_seconds = 0;
  // When checkpoints are due: every N training steps, every T seconds (0: never), or when
  // asked (RequestCheckpoint).
  int64_t checkpoint_every_steps = 0;
  double checkpoint_every_seconds = 0;
  // What --init_from changed to fit the stages (report.json's init_fresh_heads, ...).
  std::vector<std::string> init_fresh_heads, init_unused_heads;
};

// One evaluation's figures, every stage's.
struct Scores {
  int64_t step = 0;      // training steps done when it began
  int epoch = 0;         // 1-based
  bool interim = false;  // within an epoch (Job.eval_every_steps), not at its end
  std::vector<HeadStats> eval;
  // At an epoch's end: the epoch's training figures, and its seconds (< 0: not measured).
  std::vector<HeadStats> train;
  double seconds = -1;
};

// What the report says about the run beside the figures.
struct RunFacts {
  std::string version;
  std::string backend;
  int64_t parameters = 0;
  int stages = 0;
  int replicas = 1;
};

class RunLedger {
 public:
  // Opens metrics.jsonl (appending) when options.out_dir is set; errors name the file.
  static absl::StatusOr<std::unique_ptr<RunLedger>> Open(const v1::Job& job, int64_t train_examples,
                                                         int64_t test_examples,
                                                         const LedgerOptions& options);
  ~RunLedger();

  // ---- the plan ------------------------------------------------------------------------
  int64_t total_steps() const { return total_steps_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int epochs() const { return EpochsOf(job_, train_n_); }  // the epochs the run touches
  double learning_rate(int64_t step) const;                // the schedule's at 0-based step
  // Resuming at `step` a checkpoint of `before` (the job it was written with): what a change
  // of the run's length does, or "" when the length is the same.
  std::string ResumeNote(const v1::Job& before, int64_t step) const;
  // The batches in order from `start`: the same for the reference run and the coordinator.
  BatchPlan Plan(const DataCursor& start = {}) const;

  // ---- feeding -------------------------------------------------------------------------
  // A run resumed or rolled back to a checkpoint: the figures that checkpoint kept, and
  // where its data stood. Evaluations scored again after it replace those kept.
  void Restore(const v1::RunReport& history, const DataCursor& at);
  // An item of the plan has been fed (a training step counts its rows).
  void Fed(const PlanItem& item);
  int64_t fed_steps() const;
  double train_examples() const;
  int epochs_fed() const;  // epochs whose evaluation has been fed

  // ---- checkpoints ---------------------------------------------------------------------
  // Whether one is due after training step `step` (asked for, every N steps, or every T
  // seconds); asking again after a true answer starts the clock over.
  bool CheckpointDue(int64_t step);
  void RequestCheckpoint();
  void CheckpointStarted(int64_t step);
  int64_t last_checkpoint_step() const;
  // Back to "none started" (after a rollback, markers in flight are gone).
  void ForgetCheckpointInFlight();

  // ---- figures -------------------------------------------------------------------------
  // The live progress line.
  void Progress(const ProgressLine& line, bool force = false);
  // The epoch's training figures so far at `step`: a "train" line in metrics.jsonl when
  // LedgerOptions says one is due.
  void TrainFigures(int64_t step, int epoch, const std::vector<HeadStats>& so_far,
                    double examples_per_second);
  // An evaluation has been scored by every stage: printed, logged, kept for the report.
  void Scored(const Scores& scores);
  // In one process, seconds spent training (not evaluating): the report's throughput is
  // over these; without any, over the wall time.
  void AddTrainSeconds(double seconds);
  // Ends a live progress line.
  void Done();
  // Whether epoch `epoch`'s evaluation has been scored (by this process or a checkpoint).
  bool epoch_scored(int epoch) const;

  // ---- the report ----------------------------------------------------------------------
  // What a checkpoint keeps: epochs and evaluations scored, examples fed, wall time.
  v1::RunReport History() const;
  // The whole run: epochs, evaluations, steps, examples, throughput, bits per byte for a
  // byte-level model, and `facts`. A cluster adds its stage reports.
  v1::RunReport Report(const RunFacts& facts) const;
  double wall_seconds() const;  // this process's, plus a resumed run's before it

 private:
  RunLedger(const v1::Job& job, int64_t train_examples, int64_t test_examples,
            const LedgerOptions& options);
  MetricsPoint Point(const char* kind, int epoch, int64_t step, double eps) const;
  double Uptime() const;

  const v1::Job job_;
  const int64_t train_n_, test_n_, total_steps_, steps_per_epoch_;
  const LedgerOptions options_;
  const bool validation_;  // the held-out figures score a validation split, not a test split
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  mutable std::mutex mu_;
  std::unique_ptr<MetricsLog> metrics_;
  ProgressPrinter progress_;
  // Feeding.
  int64_t fed_steps_ = 0;
  double train_examples_ = 0;
  int epochs_fed_ = 0;
  // Checkpoints.
  bool checkpoint_requested_ = false;
  int64_t last_checkpoint_step_ = -1;
  std::chrono::steady_clock::time_point last_checkpoint_ = std::chrono::steady_clock::now();
  // Figures: epochs by number, evaluations within epochs by step; a resumed run's before.
  std::map<int, v1::EpochFigures> epochs_;
  std::map<int64_t, v1::Evaluation> evaluations_;
  double resumed_wall_seconds_ = 0;
  double resumed_examples_ = 0;  // fed before this process, by the run it resumed
  google::protobuf::RepeatedPtrField<v1::Regroup> regroups_;  // a resumed run's, kept
  double train_seconds_ = 0;
  double first_feed_cpu_ = -1;  // ProcessCpuSeconds() when the first training step was fed
  int64_t logged_step_ = -1;
  double logged_at_ = 0;
};

}  // namespace localpar
