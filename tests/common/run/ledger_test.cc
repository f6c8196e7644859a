// The run ledger on its own: what is fed, when checkpoints are due, every evaluation's
// figures into the report, metrics.jsonl and the history a checkpoint keeps, and a restore.
#include "common/run/ledger.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/job/parse.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::DataDir;

v1::Job SmallJob() {
  absl::StatusOr<v1::Job> job = ParseJob(R"(
name: "ledger" rule: GREEDY batch_size: 4 epochs: 2 eval_every_steps: 2
data { synthetic { train_examples: 10 test_examples: 3 shape: [2] classes: 2 } }
stages { layers { linear { out_features: 2 } } }
stages { layers { linear { out_features: 2 } } }
)",
                                         "ledger.textproto");
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// No progress line; messages into `log`; metrics.jsonl into `dir` when given.
LedgerOptions Quiet(std::ostringstream* log, const std::string& dir = "") {
  LedgerOptions o;
  o.out_dir = dir;
  o.progress = false;
  o.log = log;
  return o;
}

std::unique_ptr<RunLedger> Open(const v1::Job& job, const LedgerOptions& o) {
  absl::StatusOr<std::unique_ptr<RunLedger>> l = RunLedger::Open(job, 10, 3, o);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *std::move(l) : nullptr;
}

// Feeds the whole plan, scoring every evaluation with figures made from its step.
void FeedAll(RunLedger& ledger, BatchPlan plan) {
  for (PlanItem item; plan.Next(&item);) {
    ledger.Fed(item);
    if (item.kind != PlanItem::kEndOfEval) continue;
    Scores s;
    s.step = item.step;
    s.epoch = item.epoch;
    s.interim = item.interim;
    s.eval = {HeadStats{1.0 * item.step, 1, 2}, HeadStats{2.0, 2, 2}};
    if (!item.interim) {
      s.train = {HeadStats{3, 1, 4}, HeadStats{4, 2, 4}};
      s.seconds = 1.5;
    }
    ledger.Scored(s);
  }
}

TEST(RunLedger, BooksEveryStepEpochAndEvaluationIntoTheReport) {
  DataDir dir;
  std::ostringstream log;
  const LedgerOptions o = Quiet(&log, dir.path_string());
  const v1::Job job = SmallJob();
  std::unique_ptr<RunLedger> ledger = Open(job, o);
  EXPECT_EQ(ledger->total_steps(), 6);  // 10 examples in batches of 4: 3 steps, 2 epochs
  EXPECT_EQ(ledger->steps_per_epoch(), 3);
  FeedAll(*ledger, ledger->Plan());
  EXPECT_EQ(ledger->fed_steps(), 6);
  EXPECT_EQ(ledger->train_examples(), 20);
  EXPECT_EQ(ledger->epochs_fed(), 2);
  EXPECT_TRUE(ledger->epoch_scored(2));

  v1::RunReport r = ledger->Report(RunFacts{"v", "cpu", 12, 2, 1});
  EXPECT_EQ(r.steps(), 6);
  EXPECT_EQ(r.stages(), 2);
  EXPECT_EQ(r.backend(), "cpu");
  ASSERT_EQ(r.epochs_size(), 2);
  EXPECT_EQ(r.epochs(0).epoch(), 1);
  EXPECT_DOUBLE_EQ(r.epochs(0).seconds(), 1.5);
  EXPECT_DOUBLE_EQ(r.epochs(0).train(1).loss(), 1.0);  // 4 / 4
  EXPECT_DOUBLE_EQ(r.epochs(0).test(0).accuracy(), 0.5);
  // Evaluations within epochs: after steps 2 (epoch 1) and 4 (epoch 2); never at an
  // epoch's or the run's end (steps 3 and 6), which the epoch's own evaluation covers.
  ASSERT_EQ(r.evaluations_size(), 2);
  EXPECT_EQ(r.evaluations(0).step(), 2);
  EXPECT_EQ(r.evaluations(1).step(), 4);
  EXPECT_DOUBLE_EQ(r.evaluations(1).test(0).loss(), 2.0);  // loss sum 4 over 2

  // metrics.jsonl: an "eval" line per stage for each, "epoch" and "test" lines per epoch.
  int eval = 0, epoch = 0, test = 0;
  for (const std::string& l : Lines(dir.file("metrics.jsonl"))) {
    eval += l.find("\"kind\":\"eval\"") != std::string::npos;
    epoch += l.find("\"kind\":\"epoch\"") != std::string::npos;
    test += l.find("\"kind\":\"test\"") != std::string::npos;
  }
  EXPECT_EQ(eval, 4);
  EXPECT_EQ(epoch, 4);
  EXPECT_EQ(test, 4);
  EXPECT_NE(log.str().find("epoch 2: test accuracy s0 50.00% s1 100.00%"), std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("step 4 (epoch 2)"), std::string::npos) << log.str();
}

TEST(RunLedger, ARestoreKeepsItsOwnFiguresAndTakesTheRestFromTheCheckpoint) {
  std::ostringstream log;
  const LedgerOptions o = Quiet(&log);
  const v1::Job job = SmallJob();
  std::unique_ptr<RunLedger> ledger = Open(job, o);
  v1::RunReport kept;
  kept.set_train_examples(8);
  kept.set_wall_seconds(100);
  v1::EpochFigures* e = kept.add_epochs();
  e->set_epoch(1);
  e->set_seconds(9);
  v1::Evaluation* ev = kept.add_evaluations();
  ev->set_step(2);
  ev->set_epoch(1);
  ledger->Restore(kept, DataCursor{2, 0, 2});
  EXPECT_EQ(ledger->fed_steps(), 2);
  EXPECT_EQ(ledger->train_examples(), 8);
  EXPECT_GE(ledger->wall_seconds(), 100);  // a resumed run's time counts
  EXPECT_TRUE(ledger->epoch_scored(1));
  // The rest of the plan from that cursor, scored again: epoch 1 is replaced.
  FeedAll(*ledger, ledger->Plan(DataCursor{2, 0, 2}));
  v1::RunReport r = ledger->History();
  EXPECT_EQ(r.train_examples(), 8 + 2 + 10);
  // Throughput is this process's: the 12 examples it fed over its 2 seconds, not the 20
  // the run has seen.
  ledger->AddTrainSeconds(2);
  EXPECT_DOUBLE_EQ(ledger->Report(RunFacts()).examples_per_second(), 6);
  ASSERT_EQ(r.epochs_size(), 2);
  EXPECT_DOUBLE_EQ(r.epochs(0).seconds(), 1.5);
  ASSERT_EQ(r.evaluations_size(), 2);
  // A later rollback keeps what this process scored.
  ledger->Restore(kept, DataCursor{2, 0, 2});
  EXPECT_DOUBLE_EQ(ledger->History().epochs(0).seconds(), 1.5);
}

TEST(RunLedger, CheckpointsAreDueEveryNStepsOrWhenAsked) {
  std::ostringstream log;
  LedgerOptions o = Quiet(&log);
  o.checkpoint_every_steps = 3;
  std::unique_ptr<RunLedger> ledger = Open(SmallJob(), o);
  EXPECT_FALSE(ledger->CheckpointDue(1));
  EXPECT_TRUE(ledger->CheckpointDue(3));
  ledger->CheckpointStarted(3);
  EXPECT_EQ(ledger->last_checkpoint_step(), 3);
  EXPECT_FALSE(ledger->CheckpointDue(4));
  ledger->RequestCheckpoint();
  EXPECT_TRUE(ledger->CheckpointDue(4));
  EXPECT_FALSE(ledger->CheckpointDue(5));  // asked once, answered once
  ledger->ForgetCheckpointInFlight();
  EXPECT_EQ(ledger->last_checkpoint_step(), -1);
}

TEST(RunLedger, TrainingLinesGoToMetricsAtEveryNthStep) {
  DataDir dir;
  std::ostringstream log;
  LedgerOptions o = Quiet(&log, dir.path_string());
  o.train_line_every_steps = 2;
  std::unique_ptr<RunLedger> ledger = Open(SmallJob(), o);
  for (int64_t step = 1; step <= 6; ++step) {
    ledger->TrainFigures(step, 1, {HeadStats{1, 1, 1}, HeadStats{1, 1, 1}}, 10);
  }
  // Steps 2, 4 and 6, a line per stage.
  EXPECT_EQ(Lines(dir.file("metrics.jsonl")).size(), 6u);
}

TEST(RunLedger, AMonitorsLinesComeByTimeAndAtOnceBeforeEachEvaluation) {
  DataDir dir;
  std::ostringstream log;
  LedgerOptions o = Quiet(&log, dir.path_string());
  o.train_line_every_steps = 0;
  o.train_line_every_seconds = 3600;  // none is due by time
  v1::Job job = SmallJob();
  job.set_eval_every_steps(4);
  std::unique_ptr<RunLedger> ledger = Open(job, o);
  for (int64_t step : {1, 2, 3, 4, 4, 5, 7, 8, 9}) {
    ledger->TrainFigures(step, 1, {HeadStats{1, 1, 1}, HeadStats{1, 1, 1}}, 10);
  }
  // Steps 4 and 8, which evaluations follow (step 4 once), a line per stage.
  std::vector<std::string> lines = Lines(dir.file("metrics.jsonl"));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_NE(lines[0].find("\"step\":4,"), std::string::npos) << lines[0];
  EXPECT_NE(lines[2].find("\"step\":8,"), std::string::npos) << lines[2];
}

}  // namespace
}  // namespace localpar
