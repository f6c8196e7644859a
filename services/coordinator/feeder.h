// The coordinator's feeder: the batch plan into the pipeline. Training steps are split into
// the replicas' shares and their micro-batches, evaluation batches into shares, and the
// plan's markers (end of epoch, end of evaluation) go down every chain; a checkpoint's
// marker follows the step it is due after, and --stop_after_steps ends the feed at one.
// Every item fed is entered in the ledger.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/run/job_data.h"
#include "common/run/ledger.h"
#include "proto/config.pb.h"
#include "services/common/metrics.h"
#include "services/coordinator/checkpointer.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/pipeline_link.h"
#include "services/coordinator/run_monitor.h"

namespace localpar {

class Feeder {
 public:
  Feeder(const v1::CoordinatorConfig& config, const v1::Job& job, const DataSplit& data,
         RunLedger& ledger, Checkpointer& checkpointer, FeedProgress& progress,
         CoordinatorMetrics* metrics);

  // The plan from `start` to its end (then a final checkpoint, when checkpoints are on);
  // false as soon as the link breaks.
  bool Feed(PipelineLink& link, const DataCursor& start);
  // A control item down every chain, with a fresh sequence number (returned in *seq).
  bool SendControl(PipelineLink& link, v1::Control::Kind kind, uint64_t* seq = nullptr);
  // Whether the last Feed stopped before the plan's end: at --stop_after_steps, or
  // because the process was asked to stop (SIGINT, SIGTERM), after a checkpoint when
  // checkpoints are on.
  bool stopped_early() const { return stopped_early_; }
  bool interrupted() const { return interrupted_; }
  // Why Feed returned false when it was not the link: a batch that could not be read (a
  // token file changed under the run). No recovery can help it.
  const absl::Status& data_error() const { return data_error_; }

 private:
  uint64_t NextSeq() { return ++seq_; }
  bool SendMarker(PipelineLink& link, const PlanItem& item);
  bool SendRows(PipelineLink& link, int replica, const BatchAssembler& batch, int64_t begin,
                int64_t rows, const v1::Batch& meta);
  // A training step's rows [0, rows) of `batch`: each replica's share, in its micro-batches.
  bool SendStep(PipelineLink& link, const BatchAssembler& batch, int64_t rows, v1::Batch meta);
  bool SendEval(PipelineLink& link, const BatchAssembler& batch, int64_t rows, v1::Batch meta);
  bool StartCheckpoint(PipelineLink& link, int64_t step, const DataCursor& cursor);

  const v1::CoordinatorConfig& config_;
  const v1::Job& job_;
  const DataSplit& data_;
  RunLedger& ledger_;
  Checkpointer& checkpointer_;
  FeedProgress& progress_;
  CoordinatorMetrics* const metrics_;
  const int job_micro_batches_;  // the rule's: 1 unless it splits batches
  std::atomic<uint64_t> seq_{0};
  bool stopped_early_ = false;
  bool interrupted_ = false;
  absl::Status data_error_;
};

}  // namespace localpar
