// The batch plan on its own: every example once per epoch in a seeded order, evaluations at
// each epoch's end and every N steps within it, max_steps, and resuming from a cursor.
#include "common/run/batch_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace localpar {
namespace {

v1::Job Job(int batch, int epochs, int64_t max_steps = 0, int64_t eval_every = 0) {
  v1::Job job;
  job.set_batch_size(batch);
  job.set_epochs(epochs);
  job.set_max_steps(max_steps);
  job.set_eval_every_steps(eval_every);
  job.set_eval_batch_size(2);
  job.set_seed(7);
  return job;
}

std::vector<PlanItem> All(BatchPlan plan) {
  std::vector<PlanItem> out;
  for (PlanItem item; plan.Next(&item);) out.push_back(item);
  return out;
}

TEST(BatchPlan, EveryExampleOncePerEpochThenTheEpochsEvaluation) {
  const v1::Job job = Job(4, 2);
  BatchPlan plan(job, 10, 3);
  EXPECT_EQ(plan.total_steps(), 6);
  std::vector<std::vector<int64_t>> orders;
  std::vector<int64_t> rows;
  std::string kinds;
  for (PlanItem item; plan.Next(&item);) {
    kinds += "TEVe"[item.kind];
    if (item.kind == PlanItem::kTrain) {
      rows.push_back(item.rows);
      if (item.begin == 0) orders.push_back(plan.order());
    }
  }
  // Per epoch: 3 steps (4, 4, 2 rows), its end, 2 evaluation batches (2 + 1 rows), their end.
  EXPECT_EQ(kinds, "TTTEVVeTTTEVVe");
  EXPECT_EQ(rows, (std::vector<int64_t>{4, 4, 2, 4, 4, 2}));
  ASSERT_EQ(orders.size(), 2u);
  for (const auto& o : orders) {
    EXPECT_EQ(std::set<int64_t>(o.begin(), o.end()).size(), 10u);
  }
  EXPECT_NE(orders[0], orders[1]);  // shuffled afresh each epoch
  EXPECT_EQ(orders, [&] {           // and the same for the same seed
    std::vector<std::vector<int64_t>> again;
    BatchPlan p(job, 10, 3);
    for (PlanItem item; p.Next(&item);) {
      if (item.kind == PlanItem::kTrain && item.begin == 0) again.push_back(p.order());
    }
    return again;
  }());
}

TEST(BatchPlan, MaxStepsEndsTheRunWithAnEvaluation) {
  std::vector<PlanItem> items = All(BatchPlan(Job(4, 5, /*max_steps=*/4), 10, 3));
  int steps = 0;
  for (const PlanItem& i : items) steps += i.kind == PlanItem::kTrain;
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(items.back().kind, PlanItem::kEndOfEval);
  EXPECT_FALSE(items.back().interim);
  EXPECT_EQ(items.back().epoch, 2);
}

TEST(BatchPlan, MaxStepsWithoutEpochsRunsAsManyEpochsAsItTakes) {
  std::vector<PlanItem> items = All(BatchPlan(Job(4, /*epochs=*/0, /*max_steps=*/7), 10, 3));
  int steps = 0, ends = 0;
  for (const PlanItem& i : items) {
    steps += i.kind == PlanItem::kTrain;
    ends += i.kind == PlanItem::kEndOfEpoch;
  }
  EXPECT_EQ(steps, 7);
  EXPECT_EQ(ends, 3);  // 3 + 3 + 1 steps
  EXPECT_EQ(items.back().epoch, 3);
  EXPECT_EQ(EpochsOf(Job(4, 0, 7), 10), 3);
  EXPECT_EQ(EpochsOf(Job(4, 5, 4), 10), 2);  // max_steps ends it in the second of five
}

TEST(BatchPlan, InterimEvaluationsFollowEveryNthStepThatEndsNothing) {
  std::vector<int64_t> interim_steps;
  for (const PlanItem& i : All(BatchPlan(Job(2, 1, 0, /*eval_every=*/2), 10, 3))) {
    if (i.kind == PlanItem::kEndOfEval && i.interim) interim_steps.push_back(i.step);
  }
  EXPECT_EQ(interim_steps, (std::vector<int64_t>{2, 4}));  // not 5: the epoch ends there
}

TEST(BatchPlan, ResumingFromACursorContinuesExactlyWhereTheRunWas) {
  const v1::Job job = Job(3, 3);
  std::vector<PlanItem> full = All(BatchPlan(job, 10, 3));
  // Every training step's cursor resumes into the same remaining items.
  for (size_t i = 0; i < full.size(); ++i) {
    if (full[i].kind != PlanItem::kTrain) continue;
    std::vector<PlanItem> rest = All(BatchPlan(job, 10, 3, full[i].after));
    ASSERT_EQ(rest.size(), full.size() - i - 1) << "after step " << full[i].step;
    for (size_t j = 0; j < rest.size(); ++j) {
      EXPECT_EQ(rest[j].kind, full[i + 1 + j].kind);
      EXPECT_EQ(rest[j].step, full[i + 1 + j].step);
      EXPECT_EQ(rest[j].begin, full[i + 1 + j].begin);
    }
  }
}

}  // namespace
}  // namespace localpar
