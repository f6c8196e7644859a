// Resuming with another layout: a cluster checkpointed as K x R and resumed as K' x R' (and
// perhaps another rule) ends bitwise equal to the reference trainer restarted the same way
// from the same checkpoint; the reference's own resume is bitwise equal to an uninterrupted
// run; what cannot change is refused by name, and `validate --resume` says what carries over.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/model_io/tensor_proto.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::ExpectWeightsFileEquals;
using testing::JsonNumbers;
using testing::ReadFile;
using testing::RunProcess;
using testing::SmallJob;
using testing::TempDir;

struct Layouts {
  std::string rule;  // before
  int stages, replicas;
  std::string rule_after;
  int stages_after, replicas_after;
  std::string regrouped;  // what report.json's regroup says
};

std::vector<std::string> With(std::vector<std::string> argv, int stages, int replicas,
                              const std::string& rule) {
  argv.push_back(absl::StrCat("--stages=", stages));
  argv.push_back(absl::StrCat("--replicas=", replicas));
  argv.push_back("--rule=" + rule);
  return argv;
}

// `localpar run JOB` (with `flags`), checkpointing every 2 steps into `ckpt`, stopped after
// step 5.
void StopAfterFive(const std::string& job, const std::string& ckpt,
                   const std::vector<std::string>& flags = {}) {
  std::vector<std::string> argv = {testing::BinDir() + "/localpar",
                                   "run",
                                   job,
                                   "--quiet",
                                   "--checkpoint_dir=" + ckpt,
                                   "--checkpoint_every_steps=2",
                                   "--stop_after_steps=5"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto first = RunProcess(argv, 120);
  ASSERT_EQ(first.exit_code, 0) << first.output;
}

class RegroupResume : public ::testing::TestWithParam<Layouts> {};

TEST_P(RegroupResume, EndsBitwiseEqualToTheReferenceRestartedTheSameWay) {
  const Layouts& l = GetParam();
  TempDir dir;
  const std::string job = dir.Write("job.textproto", SmallJob(l.rule, 1));
  const std::string bin = testing::BinDir() + "/localpar", ckpt = dir.path() + "/ckpt",
                    copy = dir.path() + "/ckpt-for-the-reference";
  StopAfterFive(job, ckpt, With({}, l.stages, l.replicas, l.rule));
  if (HasFatalFailure()) return;
  std::filesystem::copy(ckpt, copy, std::filesystem::copy_options::recursive);

  auto resumed = RunProcess(
      With({bin, "run", job, "--quiet", "--resume=" + ckpt, "--out=" + dir.path() + "/cluster"},
           l.stages_after, l.replicas_after, l.rule_after),
      120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("regrouping the checkpoint at step 5 from " + l.regrouped),
            std::string::npos)
      << resumed.output;
  auto reference = RunProcess(
      With({bin, "train", job, "--quiet", "--resume=" + copy, "--out=" + dir.path() + "/ref"},
           l.stages_after, l.replicas_after, l.rule_after),
      120);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  EXPECT_NE(reference.output.find("resuming from " + copy + "/ckpt-000003 at step 5"),
            std::string::npos)
      << reference.output;

  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/ref/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(want->stages_size(), l.stages_after);
  ExpectWeightsFileEquals(dir.path() + "/cluster/weights.pb", *want);
  const std::string cluster_report = ReadFile(dir.path() + "/cluster/report.json");
  EXPECT_EQ(JsonNumbers(cluster_report, "accuracy"),
            JsonNumbers(ReadFile(dir.path() + "/ref/report.json"), "accuracy"));
  EXPECT_NE(cluster_report.find("\"regroups\""), std::string::npos) << cluster_report;

  // The regrouped run's own checkpoints resume as usual: its last one holds the final state.
  auto again = RunProcess(
      With({bin, "run", job, "--quiet", "--resume=" + ckpt, "--out=" + dir.path() + "/again"},
           l.stages_after, l.replicas_after, l.rule_after),
      120);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(again.output.find("regrouping"), std::string::npos) << again.output;
  ExpectWeightsFileEquals(dir.path() + "/again/weights.pb", *want);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RegroupResume,
    ::testing::Values(
        // More replicas (exact: replicas hold identical weights).
        Layouts{"GREEDY", 2, 2, "GREEDY", 2, 3, "2 stages x 2 replicas to 2 stages x 3 replicas"},
        // Fewer replicas, every tensor kept.
        Layouts{"GREEDY", 4, 2, "GREEDY", 4, 1, "4 stages x 2 replicas to 4 stages x 1 replica"},
        // Fewer stages: two heads left out.
        Layouts{"CHUNKED", 4, 2, "CHUNKED", 2, 2, "4 stages x 2 replicas to 2 stages x 2 replicas"},
        // More stages: two new boundaries' heads start fresh.
        Layouts{"OVERLAP", 2, 1, "OVERLAP", 4, 1, "2 stages x 1 replica to 4 stages x 1 replica"},
        // Another rule in the same layout.
        Layouts{"GREEDY", 4, 1, "BACKPROP", 4, 1,
                "4 stages x 1 replica to 4 stages x 1 replica, and the rule from GREEDY to "
                "BACKPROP"}),
    [](const auto& info) {
      const Layouts& l = info.param;
      return absl::StrCat(l.rule, l.stages, "x", l.replicas, "To", l.rule_after, l.stages_after,
                          "x", l.replicas_after);
    });

// The reference's resume is checked on its own: stopped and resumed, it ends bitwise equal
// to an uninterrupted run, report figures included.
TEST(RegroupResumeReference, AResumeInTheSameLayoutEqualsAnUninterruptedRun) {
  TempDir dir;
  const std::string job = dir.Write("job.textproto", SmallJob("BACKPROP", 3));
  const std::string bin = testing::BinDir() + "/localpar", ckpt = dir.path() + "/ckpt";
  auto full = RunProcess({bin, "train", job, "--quiet", "--out=" + dir.path() + "/full"}, 120);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  auto first = RunProcess({bin, "run", job, "--quiet", "--checkpoint_dir=" + ckpt,
                           "--checkpoint_every_steps=3", "--stop_after_steps=9"},
                          120);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto resumed = RunProcess(
      {bin, "train", job, "--quiet", "--resume=" + ckpt, "--out=" + dir.path() + "/resumed"}, 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("regrouping"), std::string::npos) << resumed.output;
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/full/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  ExpectWeightsFileEquals(dir.path() + "/resumed/weights.pb", *want);
  EXPECT_EQ(JsonNumbers(ReadFile(dir.path() + "/resumed/report.json"), "accuracy"),
            JsonNumbers(ReadFile(dir.path() + "/full/report.json"), "accuracy"));
  EXPECT_EQ(JsonNumbers(ReadFile(dir.path() + "/resumed/report.json"), "loss"),
            JsonNumbers(ReadFile(dir.path() + "/full/report.json"), "loss"));
}

TEST(RegroupResumeReference, WhatCannotChangeIsRefusedAndValidateSaysWhatCarriesOver) {
  TempDir dir;
  const std::string job = dir.Write("job.textproto", SmallJob("GREEDY", 1));
  const std::string bin = testing::BinDir() + "/localpar", ckpt = dir.path() + "/ckpt";
  StopAfterFive(job, ckpt);
  if (HasFatalFailure()) return;
  const std::string before = ReadFile(ckpt + "/ckpt-000003/MANIFEST");

  auto explain = RunProcess({bin, "validate", job, "--stages=2", "--resume=" + ckpt}, 60);
  ASSERT_EQ(explain.exit_code, 0) << explain.output;
  for (const char* said :
       {"# resume from " /* dir */,
        "written as 4 stages x 1 replica; this job is 2 stages x 1 replica",
        "heads kept: heads.6, heads.10", "the checkpoint's heads left out: heads.2, heads.9",
        "snapshots: 4 of 4 under", "cannot change on resume"}) {
    EXPECT_NE(explain.output.find(said), std::string::npos) << said << "\n" << explain.output;
  }
  auto more = RunProcess({bin, "validate", job, "--stages=4", "--resume=" + ckpt}, 60);
  EXPECT_EQ(more.output.find("heads starting fresh"), std::string::npos) << more.output;

  // Another seed, another batch size, a wider layer: refused, naming each, before training.
  auto seed = RunProcess({bin, "run", job, "--quiet", "--seed=6", "--stages=2", "--resume=" + ckpt,
                          "--out=" + dir.path() + "/x"},
                         120);
  EXPECT_EQ(seed.exit_code, 2) << seed.output;
  EXPECT_NE(seed.output.find("the seed (the checkpoint's 5, this job's 6)"), std::string::npos)
      << seed.output;
  auto batch =
      RunProcess({bin, "train", job, "--quiet", "--batch_size=20", "--resume=" + ckpt}, 60);
  EXPECT_EQ(batch.exit_code, 2) << batch.output;
  EXPECT_NE(batch.output.find("the batch_size (the checkpoint's 30, this job's 20)"),
            std::string::npos)
      << batch.output;
  std::string wider_text = SmallJob("GREEDY", 1);
  wider_text.replace(wider_text.find("out_features: 16"), 16, "out_features: 12");
  const std::string wider = dir.Write("wider.textproto", wider_text);
  auto layers = RunProcess({bin, "validate", wider, "--resume=" + ckpt}, 60);
  EXPECT_EQ(layers.exit_code, 2) << layers.output;
  EXPECT_NE(layers.output.find("layer 4 differs"), std::string::npos) << layers.output;
  // Nothing was written over.
  EXPECT_EQ(ReadFile(ckpt + "/ckpt-000003/MANIFEST"), before);
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/ckpt-000004"));
}

// A coordinator whose workers keep their snapshots on their own storage (Compose,
// Kubernetes) cannot read them to regroup: it refuses another layout, saying what to do, and
// leaves the checkpoint as it was.
TEST(RegroupResumeReference, ACoordinatorWithoutTheSnapshotsRefusesAnotherLayout) {
  TempDir dir;
  const std::string job = dir.Write("job.textproto", SmallJob("GREEDY", 1));
  const std::string bin = testing::BinDir() + "/localpar", ckpt = dir.path() + "/ckpt";
  StopAfterFive(job, ckpt);
  if (HasFatalFailure()) return;
  testing::StartedWorkers workers = testing::StartWorkers(dir.path(), 2);
  auto r = RunProcess({testing::BinDir() + "/localpar_coordinator", "--job=" + job,
                       "--workers=" + workers.list(), "--stages=2", "--quiet", "--resume=" + ckpt},
                      60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("was written as 4 stages x 1 replica and this run is 2 stages x 1 "
                          "replica: regrouping it needs every worker's snapshots on this machine"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/ckpt-000004"));
  for (pid_t w : workers.pids) {
    kill(w, SIGTERM);
    testing::WaitProcess(w, 10);
  }
}

}  // namespace
}  // namespace localpar
