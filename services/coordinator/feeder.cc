// Feeding the plan.
#include "services/coordinator/feeder.h"

#include <algorithm>

#include "common/job/spec.h"
#include "common/nn/rule.h"
#include "common/nn/step.h"
#include "services/common/interrupt.h"
#include "services/coordinator/coordinator_metrics.h"

namespace localpar {

Feeder::Feeder(const v1::CoordinatorConfig& config, const v1::Job& job, const DataSplit& data,
               RunLedger& ledger, Checkpointer& checkpointer, FeedProgress& progress,
               CoordinatorMetrics* metrics)
    : config_(config),
      job_(job),
      data_(data),
      ledger_(ledger),
      checkpointer_(checkpointer),
      progress_(progress),
      metrics_(metrics),
      job_micro_batches_(Rule(ToUpdateRule(job.rule())).splits_micro_batches ? job.micro_batches()
                                                                             : 1) {}

bool Feeder::SendControl(PipelineLink& link, v1::Control::Kind kind, uint64_t* seq) {
  v1::DownItem item;
  v1::Control* c = item.mutable_control();
  c->set_seq(NextSeq());
  c->set_kind(kind);
  if (seq) *seq = c->seq();
  return link.Send(item);
}

// End of an epoch's training, or of an evaluation (with the step it began at, so that its
// figures come back labelled).
bool Feeder::SendMarker(PipelineLink& link, const PlanItem& item) {
  v1::DownItem down;
  v1::Control* c = down.mutable_control();
  c->set_seq(NextSeq());
  c->set_epoch(item.epoch);
  if (item.kind == PlanItem::kEndOfEpoch) {
    c->set_kind(v1::Control::END_OF_EPOCH);
  } else {
    c->set_kind(v1::Control::END_OF_EVAL);
    c->set_step(item.step);
    c->set_interim(item.interim);
  }
  return link.Send(down);
}

bool Feeder::SendRows(PipelineLink& link, int replica, const BatchAssembler& a, int64_t begin,
                      int64_t rows, const v1::Batch& meta) {
  v1::DownItem item = MakeBatchItem(a, begin, rows, meta);
  item.mutable_batch()->set_seq(NextSeq());
  return link.SendTo(replica, item);
}

// Replica r takes rows MicroBatchRange(rows, replicas, r) and splits them into its
// micro-batches; every share of a step goes out before the next step's, so no replica
// waits in its exchange for a share still queued behind another step.
bool Feeder::SendStep(PipelineLink& link, const BatchAssembler& a, int64_t rows, v1::Batch meta) {
  meta.set_phase(v1::TRAIN);
  meta.set_batch_rows(rows);
  for (int r = 0; r < link.replicas(); ++r) {
    int64_t share_begin, share;
    MicroBatchRange(rows, link.replicas(), r, &share_begin, &share);
    const int parts = StepMicroBatches(job_micro_batches_, share);
    meta.set_micro_batches(parts);
    for (int m = 0; m < parts; ++m) {
      int64_t begin, count;
      MicroBatchRange(share, parts, m, &begin, &count);
      meta.set_micro_batch(m);
      if (!SendRows(link, r, a, share_begin + begin, count, meta)) return false;
    }
  }
  return true;
}

// Each replica scores its share (a short batch may leave the last ones none).
bool Feeder::SendEval(PipelineLink& link, const BatchAssembler& a, int64_t rows, v1::Batch meta) {
  meta.set_phase(v1::EVAL);
  meta.set_batch_rows(rows);
  meta.set_micro_batches(1);
  for (int r = 0; r < link.replicas(); ++r) {
    int64_t begin, share;
    MicroBatchRange(rows, link.replicas(), r, &begin, &share);
    if (share > 0 && !SendRows(link, r, a, begin, share, meta)) return false;
  }
  return true;
}

bool Feeder::StartCheckpoint(PipelineLink& link, int64_t step, const DataCursor& cursor) {
  std::optional<v1::DownItem> marker =
      checkpointer_.Start(NextSeq(), step, cursor, ledger_.train_examples());
  return !marker || link.Send(*marker);  // a checkpoint that cannot start is skipped
}

// The same batches in the same order as the reference run (RunReference).
bool Feeder::Feed(PipelineLink& link, const DataCursor& start) {
  stopped_early_ = false;
  interrupted_ = false;
  data_error_ = absl::OkStatus();
  BatchPlan plan = ledger_.Plan(start);
  BatchAssembler train(data_.train, job_.batch_size()), test(data_.test, job_.eval_batch_size());
  for (PlanItem item; plan.Next(&item);) {
    v1::Batch meta;
    meta.set_epoch(item.epoch);
    meta.set_step(item.step);
    if (item.kind == PlanItem::kTrain) {
      progress_.epoch = item.epoch;
      progress_.phase = FeedProgress::kTraining;
      if (metrics_) metrics_->SetEpoch(item.epoch);
      if (data_error_ = train.Gather(plan.order(), item.begin, item.rows, item.epoch - 1);
          !data_error_.ok()) {
        return false;
      }
      if (!SendStep(link, train, item.rows, meta)) return false;
      ledger_.Fed(item);
      const int64_t done = item.step + 1;
      if (metrics_) {
        metrics_->AddIngested(item.rows);
        metrics_->SetLearningRate(ledger_.learning_rate(item.step));
        metrics_->SetProgress(static_cast<double>(done) /
                              static_cast<double>(std::max<int64_t>(ledger_.total_steps(), 1)));
      }
      // While kMaxCheckpointsInFlight markers travel the pipeline (the feeder runs ahead of
      // the stages), no periodic one starts: every worker then keeps at most keep_checkpoints
      // + kMaxCheckpointsInFlight snapshot sets. One asked for waits for the next step.
      if (checkpointer_.enabled() && checkpointer_.in_flight() >= kMaxCheckpointsInFlight) {
        if (config_.checkpoint_every_steps() > 0 && done % config_.checkpoint_every_steps() == 0) {
          checkpointer_.Skipped(done);
        }
      } else if (checkpointer_.enabled() && ledger_.CheckpointDue(done) &&
                 !StartCheckpoint(link, done, item.after)) {
        return false;
      }
      const int64_t stop = config_.stop_after_steps();
      const bool asked = InterruptRequested().load();
      if ((asked || (stop > 0 && done >= stop)) && done < ledger_.total_steps()) {
        if (checkpointer_.enabled() && ledger_.last_checkpoint_step() != done &&
            !StartCheckpoint(link, done, item.after)) {
          return false;
        }
        stopped_early_ = true;
        interrupted_ = asked;
        return true;
      }
      continue;
    }
    if (item.kind == PlanItem::kEval) {
      progress_.phase = FeedProgress::kEvaluating;
      if (data_error_ = test.Gather(plan.test_order(), item.begin, item.rows); !data_error_.ok()) {
        return false;
      }
      if (!SendEval(link, test, item.rows, meta)) return false;
    } else if (!SendMarker(link, item)) {
      return false;
    }
    ledger_.Fed(item);
  }
  progress_.phase = FeedProgress::kFinishing;
  // A final checkpoint, so a finished run can be extended or evaluated later.
  const int64_t steps = ledger_.fed_steps();
  if (checkpointer_.enabled() && ledger_.last_checkpoint_step() != steps) {
    DataCursor end{steps, std::min(ledger_.epochs(), ledger_.epochs_fed()), 0};
    if (!StartCheckpoint(link, steps, end)) return false;
  }
  return true;
}

}  // namespace localpar
