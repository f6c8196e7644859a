// BACKPROP's pipeline schedules (job.pipeline_schedule, --schedule): 1F1B orders the same
// passes as GPipe and ZB splits each backward in two, so `localpar train` gives the same
// weights bit for bit under each, and a `localpar run` cluster does again, on the shipped
// MLP, ResNet and character transformer with 4 micro-batches over their 4 stages.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/model_io/tensor_proto.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::ReadFile;
using testing::RunProcess;
using testing::TempDir;

struct Shipped {
  const char* job;
  std::vector<std::string> extra_flags;
};

void ExpectSchedulesAgree(const Shipped& s) {
  TempDir dir;
  const std::string text =
      ReadFile(std::string(LOCALPAR_SOURCE_DIR) + "/deploy/jobs/" + s.job + ".textproto");
  const std::string job = dir.Write("job.textproto", text + "\neval_limit: 64\n");
  auto run = [&](const std::string& command, const std::string& schedule) {
    const std::string out = dir.path() + "/" + command + "-" + schedule;
    std::vector<std::string> argv = {testing::BinDir() + "/localpar",
                                     command,
                                     job,
                                     "--out=" + out,
                                     "--rule=BACKPROP",
                                     "--micro_batches=4",
                                     "--schedule=" + schedule,
                                     "--max_steps=3",
                                     "--quiet"};
    argv.insert(argv.end(), s.extra_flags.begin(), s.extra_flags.end());
    testing::ProcessResult r = RunProcess(argv, 300);
    EXPECT_EQ(r.exit_code, 0) << command << " --schedule=" << schedule << ": " << r.output;
    return out + "/weights.pb";
  };
  absl::StatusOr<v1::ModelWeights> gpipe = ReadWeightsFile(run("train", "gpipe"));
  ASSERT_TRUE(gpipe.ok()) << s.job << ": " << gpipe.status();
  SCOPED_TRACE(s.job);
  for (const char* schedule : {"1f1b", "zb"}) {
    SCOPED_TRACE(schedule);
    testing::ExpectWeightsFileEquals(run("train", schedule), *gpipe);
    testing::ExpectWeightsFileEquals(run("run", schedule), *gpipe);
  }
}

TEST(PipelineSchedule, OneForwardOneBackwardAndZeroBubbleEqualGPipeInTrainAndRun) {
  ExpectSchedulesAgree({"fashion_mlp", {}});
  ExpectSchedulesAgree({"fashion_resnet", {}});
  const std::string corpus =
      std::string(LOCALPAR_SOURCE_DIR) + "/../shared/data/tinyshakespeare.txt";
  if (!std::filesystem::exists(corpus)) GTEST_SKIP() << corpus << " is not here";
  // Its batches of 12 leave a last batch of 1 row, too few for 4 micro-batches.
  ExpectSchedulesAgree({"shakespeare_char", {"--data_path=" + corpus, "--batch_size=16"}});
}

// The schedule is not part of the state: a cluster's GPipe checkpoint resumes under ZB, says
// so, and ends bitwise equal to a straight GPipe run.
TEST(PipelineSchedule, ACheckpointResumesUnderAnotherScheduleBitwise) {
  TempDir dir;
  const std::string job = std::string(LOCALPAR_SOURCE_DIR) + "/deploy/jobs/fashion_mlp.textproto";
  const std::string bin = testing::BinDir() + "/localpar";
  const std::vector<std::string> common = {"--rule=BACKPROP", "--micro_batches=4", "--quiet"};
  auto with = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), bin);
    argv.insert(argv.end(), common.begin(), common.end());
    return RunProcess(argv, 300);
  };
  testing::ProcessResult r =
      with({"run", job, "--schedule=gpipe", "--max_steps=4", "--checkpoint_every_steps=2",
            "--checkpoint_dir=" + dir.path() + "/ck", "--out=" + dir.path() + "/first"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = with({"train", job, "--schedule=zb", "--max_steps=8", "--resume=" + dir.path() + "/ck",
            "--out=" + dir.path() + "/resumed"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the rule from BACKPROP (GPipe schedule) to BACKPROP (ZB schedule)"),
            std::string::npos)
      << r.output;
  r = with(
      {"train", job, "--schedule=gpipe", "--max_steps=8", "--out=" + dir.path() + "/straight"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/straight/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  testing::ExpectWeightsFileEquals(dir.path() + "/resumed/weights.pb", *want);
}

TEST(PipelineSchedule, AScheduleWithoutMicroBatchesIsRefusedNamingTheField) {
  TempDir dir;
  const std::string job = std::string(LOCALPAR_SOURCE_DIR) + "/deploy/jobs/fashion_mlp.textproto";
  testing::ProcessResult r = RunProcess(
      {testing::BinDir() + "/localpar", "validate", job, "--rule=GREEDY", "--schedule=1f1b"}, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("pipeline_schedule"), std::string::npos) << r.output;
  r = RunProcess({testing::BinDir() + "/localpar", "validate", job, "--schedule=2f2b"}, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("gpipe"), std::string::npos) << r.output;
  r = RunProcess({testing::BinDir() + "/localpar", "validate", job, "--rule=BACKPROP",
                  "--micro_batches=8", "--schedule=1f1b", "--explain"},
                 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("8 micro-batches, 1F1B schedule"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(holds 4 micro-batches)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(holds 1 micro-batch)"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace localpar
