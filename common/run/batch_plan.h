// The order in which a run feeds its data: training batches of each epoch (shuffled by
// EpochOrder(seed, epoch)), then the epoch's evaluation batches; with eval_every_steps, an
// evaluation also follows every N-th step that does not end an epoch or the run. The reference
// trainer and the coordinator walk the same plan, so they feed the same examples in the same order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/job.pb.h"

namespace localpar {

// Where a run stands in its data; what a checkpoint records to resume from.
struct DataCursor {
  int64_t step = 0;            // training steps done
  int epoch = 0;               // 0-based epoch of the next batch
  int64_t batch_in_epoch = 0;  // batches of that epoch already fed
};

struct PlanItem {
  enum Kind { kTrain, kEndOfEpoch, kEval, kEndOfEval };
  Kind kind = kTrain;
  int epoch = 0;      // 1-based
  int64_t step = 0;   // kTrain: this batch's step; otherwise the steps done so far
  int64_t begin = 0;  // first row, into order() (kTrain) or test_order() (kEval)
  int64_t rows = 0;
  DataCursor after;  // kTrain: where the run stands once this step is done
  // kEval, kEndOfEval: an evaluation within the epoch (Job.eval_every_steps), not its end's.
  bool interim = false;
};

// Training steps in one epoch of `train_examples` (the last batch may be short).
int64_t StepsPerEpoch(const v1::Job& job, int64_t train_examples);
// Total training steps of a job over `train_examples`: max_steps alone (epochs 0: as many
// as it takes), its epochs alone, or the smaller of the two.
int64_t TotalSteps(const v1::Job& job, int64_t train_examples);
// The epochs the run touches: those its TotalSteps reach (at least 1).
int EpochsOf(const v1::Job& job, int64_t train_examples);
// What sets a run's length, for the console: "2000 steps (max_steps; 2 epochs of 1308)".
std::string StepsNote(const v1::Job& job, int64_t train_examples);

class BatchPlan {
 public:
  BatchPlan(const v1::Job& job, int64_t train_examples, int64_t test_examples,
            const DataCursor& start = {});
  // The next item; false once the run is complete.
  bool Next(PlanItem* item);
  // The current epoch's order of training examples; empty when the source draws them afresh
  // every epoch (BatchAssembler::Gather then takes rows in order, and the epoch).
  const std::vector<int64_t>& order() const { return order_; }
  // Evaluation batches take the evaluation split in order.
  const std::vector<int64_t>& test_order() const { return test_order_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  enum State { kStartEpoch, kTraining, kEvaluating, kInterimEval };
  // The evaluation's next batch (true), or its end (false, item set to kEndOfEval).
  bool NextEval(PlanItem* item);
  const int64_t batch_, eval_batch_, train_n_, test_n_, total_steps_, eval_every_;
  const int epochs_;
  const uint64_t seed_;
  State state_ = kStartEpoch;
  int epoch_;
  int64_t step_, row_, eval_row_ = 0;
  const bool shuffle_;
  std::vector<int64_t> order_;
  const std::vector<int64_t> test_order_;  // empty: in order
};

}  // namespace localpar
