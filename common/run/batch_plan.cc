// The batch plan.
#include "common/run/batch_plan.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/data/dataset.h"
#include "common/job/data_spec.h"

namespace localpar {

int64_t StepsPerEpoch(const v1::Job& job, int64_t train_examples) {
  return (train_examples + job.batch_size() - 1) / job.batch_size();
}

int64_t TotalSteps(const v1::Job& job, int64_t train_examples) {
  if (job.epochs() <= 0) return std::max<int64_t>(job.max_steps(), 0);
  int64_t total = StepsPerEpoch(job, train_examples) * job.epochs();
  if (job.max_steps() > 0 && job.max_steps() < total) total = job.max_steps();
  return total;
}

int EpochsOf(const v1::Job& job, int64_t train_examples) {
  const int64_t per = std::max<int64_t>(StepsPerEpoch(job, train_examples), 1);
  const int64_t epochs = (TotalSteps(job, train_examples) + per - 1) / per;
  return static_cast<int>(std::clamp<int64_t>(epochs, 1, std::numeric_limits<int>::max()));
}

std::string StepsNote(const v1::Job& job, int64_t train_examples) {
  const int64_t per = StepsPerEpoch(job, train_examples), total = TotalSteps(job, train_examples);
  auto epochs_of = [per](int64_t n) {
    return absl::StrCat(n, n == 1 ? " epoch" : " epochs", " of ", per);
  };
  if (job.epochs() <= 0) {
    return absl::StrCat(total, " steps (max_steps; epochs unset, so as many as that takes: ",
                        epochs_of(EpochsOf(job, train_examples)), ")");
  }
  const int64_t whole = per * job.epochs();
  if (job.max_steps() <= 0) return absl::StrCat(total, " steps (", epochs_of(job.epochs()), ")");
  if (job.max_steps() < whole) {
    return absl::StrCat(total, " steps (max_steps; the job's ", epochs_of(job.epochs()),
                        " would take ", whole, ")");
  }
  return absl::StrCat(total, " steps (", epochs_of(job.epochs()), "; max_steps ", job.max_steps(),
                      " is more)");
}

BatchPlan::BatchPlan(const v1::Job& job, int64_t train_examples, int64_t test_examples,
                     const DataCursor& start)
    : batch_(job.batch_size()),
      eval_batch_(job.eval_batch_size()),
      train_n_(train_examples),
      test_n_(job.eval_limit() > 0 ? std::min(job.eval_limit(), test_examples) : test_examples),
      total_steps_(TotalSteps(job, train_examples)),
      eval_every_(job.eval_every_steps()),
      epochs_(EpochsOf(job, train_examples)),
      seed_(job.seed()),
      epoch_(start.epoch),
      step_(start.step),
      row_(start.batch_in_epoch * job.batch_size()),
      shuffle_(JobShufflesExamples(job)) {
  // A run its length cut short within an epoch ends with that epoch scored, so its final
  // checkpoint says the next epoch. Extended (a larger max_steps), it goes on where it
  // stopped, in that epoch's order: as if it had been this long from the start.
  const int64_t per = std::max<int64_t>(StepsPerEpoch(job, train_examples), 1);
  if (start.batch_in_epoch == 0 && step_ % per != 0 && step_ < total_steps_) {
    epoch_ = static_cast<int>(step_ / per);
    row_ = (step_ % per) * batch_;
  }
}

bool BatchPlan::Next(PlanItem* item) {
  *item = PlanItem();
  item->epoch = epoch_ + 1;
  item->step = step_;
  switch (state_) {
    case kStartEpoch:
      // Done, unless a resumed epoch still owes its end and its evaluation.
      if (epoch_ >= epochs_ || (step_ >= total_steps_ && row_ == 0)) return false;
      // Sources that draw each epoch's examples afresh need no permutation (and a token
      // corpus's would take memory in proportion to it).
      if (shuffle_) order_ = EpochOrder(train_n_, seed_, epoch_);
      state_ = kTraining;
      [[fallthrough]];
    case kTraining:
      if (row_ < train_n_ && step_ < total_steps_) {
        item->kind = PlanItem::kTrain;
        item->begin = row_;
        item->rows = std::min(batch_, train_n_ - row_);
        row_ += batch_;
        ++step_;
        // A checkpoint after an epoch's last batch resumes with that epoch's end and its
        // evaluation, then the next epoch.
        item->after = DataCursor{step_, epoch_, row_ / batch_};
        // An interim evaluation, unless the epoch's (or the run's) own follows at once.
        if (eval_every_ > 0 && step_ % eval_every_ == 0 && row_ < train_n_ &&
            step_ < total_steps_) {
          state_ = kInterimEval;
          eval_row_ = 0;
        }
        return true;
      }
      item->kind = PlanItem::kEndOfEpoch;
      state_ = kEvaluating;
      eval_row_ = 0;
      return true;
    case kEvaluating:
      if (NextEval(item)) return true;
      state_ = kStartEpoch;
      ++epoch_;
      row_ = 0;
      return true;
    case kInterimEval:
      item->interim = true;
      if (!NextEval(item)) state_ = kTraining;
      return true;
  }
  return false;
}

bool BatchPlan::NextEval(PlanItem* item) {
  if (eval_row_ < test_n_) {
    item->kind = PlanItem::kEval;
    item->begin = eval_row_;
    item->rows = std::min(eval_batch_, test_n_ - eval_row_);
    eval_row_ += eval_batch_;
    return true;
  }
  item->kind = PlanItem::kEndOfEval;
  return false;
}

}  // namespace localpar
