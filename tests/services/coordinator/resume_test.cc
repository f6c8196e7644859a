// Stopping at a checkpoint and resuming, past a damaged snapshot: bitwise equal to an
// uninterrupted run.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/model_io/checkpoint.h"
#include "common/model_io/tensor_proto.h"
#include "common/run/reference_run.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "proto/localpar.pb.h"
#include "proto/report.pb.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::ExpectWeightsFileEquals;
using testing::RunProcess;
using testing::SmallJob;
using testing::TempDir;

class ResumeMatchesUninterrupted : public ::testing::TestWithParam<std::string> {};

// Stop after 5 steps (mid-epoch), then resume: the weights equal an uninterrupted run's, bit
// for bit. Checkpoints every 2 steps leave ckpt 1 (step 2), 2 (step 4) and 3 (step 5); stage
// 2's snapshot of the newest is corrupted in its worker's own directory before resuming, so
// that stage refuses it and the run must fall back to step 4 and still match.
TEST_P(ResumeMatchesUninterrupted, StopCorruptResumeEndsBitwiseEqual) {
  const std::string rule = GetParam();
  TempDir dir;
  std::string job = dir.Write("job.textproto", SmallJob(rule, rule == "BACKPROP" ? 3 : 1));
  const std::string bin = testing::BinDir() + "/localpar", ckpt = dir.path() + "/ckpt";
  testing::ProcessResult first = testing::RunFullThenStopAfterFive(dir, job, ckpt);
  if (HasFailure()) return;
  EXPECT_NE(first.output.find("stopped after step 5"), std::string::npos) << first.output;
  {
    std::ofstream f(ckpt + "/stage-2/ckpt-000003/stage-2.ckpt", std::ios::binary | std::ios::app);
    f << "garbage";
  }
  auto second = RunProcess(
      {bin, "run", job, "--quiet", "--resume=" + ckpt, "--out=" + dir.path() + "/resumed"}, 120);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(
      second.output.find("stage 2, checkpoint 3: " + ckpt + "/stage-2/ckpt-000003/stage-2.ckpt"),
      std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("falling back to " + ckpt + "/ckpt-000002 (step 4)"),
            std::string::npos)
      << second.output;
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/full/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  ExpectWeightsFileEquals(dir.path() + "/resumed/weights.pb", *want);
}

// A finished run extended with a larger max_steps, and a rollback to an older checkpoint
// (--resume=DIR/ckpt-N): each ends bitwise equal to a run that long from the start (a
// constant schedule), and says what the new length does to the schedule.
TEST(Resume, AFinishedRunExtendsAndRollsBackBitwiseEqual) {
  TempDir dir;
  std::string text = SmallJob("GREEDY", 1);
  const std::string cosine = "schedule { kind: COSINE lr: 0.01 warmup_steps: 3 }";
  ASSERT_NE(text.find(cosine), std::string::npos);
  text.replace(text.find(cosine), cosine.size(), "schedule { lr: 0.01 }");
  const std::string job = dir.Write("job.textproto", text);
  const std::string bin = testing::BinDir() + "/localpar", ckpt = dir.path() + "/ckpt";
  auto straight = RunProcess(
      {bin, "train", job, "--quiet", "--max_steps=10", "--out=" + dir.path() + "/straight"}, 120);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/straight/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  // 4 steps, checkpoints at step 3 and (the final one, within the first epoch of 7) 4.
  auto first = RunProcess({bin, "run", job, "--quiet", "--max_steps=4", "--checkpoint_dir=" + ckpt,
                           "--checkpoint_every_steps=3"},
                          120);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto longer = RunProcess({bin, "run", job, "--quiet", "--max_steps=10", "--resume=" + ckpt,
                            "--out=" + dir.path() + "/longer"},
                           120);
  ASSERT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_NE(longer.output.find("resuming from " + ckpt + "/ckpt-000002 at step 4"),
            std::string::npos)
      << longer.output;
  EXPECT_NE(longer.output.find("the run is 10 steps now; the checkpoint's run had 4; the "
                               "constant schedule goes on as it was"),
            std::string::npos)
      << longer.output;
  ExpectWeightsFileEquals(dir.path() + "/longer/weights.pb", *want);
  // Back to step 3, then on to 10 again.
  auto back = RunProcess({bin, "run", job, "--quiet", "--max_steps=10",
                          "--resume=" + ckpt + "/ckpt-000001", "--out=" + dir.path() + "/back"},
                         120);
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_NE(back.output.find("resuming from " + ckpt + "/ckpt-000001 at step 3"), std::string::npos)
      << back.output;
  ExpectWeightsFileEquals(dir.path() + "/back/weights.pb", *want);
  auto missing =
      RunProcess({bin, "train", job, "--quiet", "--resume=" + ckpt + "/ckpt-000009"}, 60);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find(ckpt + "/ckpt-000009: no such complete checkpoint"),
            std::string::npos)
      << missing.output;
  // A decaying schedule is stretched, and says so.
  const std::string decaying = dir.Write("cosine.textproto", SmallJob("GREEDY", 1));
  const std::string ckpt2 = dir.path() + "/ckpt2";
  ASSERT_EQ(
      RunProcess({bin, "run", decaying, "--quiet", "--max_steps=4", "--checkpoint_dir=" + ckpt2},
                 120)
          .exit_code,
      0);
  auto stretched = RunProcess({bin, "train", decaying, "--quiet", "--max_steps=10",
                               "--resume=" + ckpt2, "--out=" + dir.path() + "/stretched"},
                              120);
  ASSERT_EQ(stretched.exit_code, 0) << stretched.output;
  EXPECT_NE(stretched.output.find("the COSINE schedule is stretched over 10 steps: at step 4"),
            std::string::npos)
      << stretched.output;
}

INSTANTIATE_TEST_SUITE_P(Rules, ResumeMatchesUninterrupted,
                         ::testing::Values("GREEDY", "CHUNKED", "OVERLAP", "BACKPROP"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace localpar
