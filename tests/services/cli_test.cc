// The localpar command line as a user meets it: per-command help, usage errors with exit 2,
// the stage programs a job runs, and run flags that reach the coordinator.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::RunProcess;
using testing::TempDir;

std::string Bin() { return testing::BinDir() + "/localpar"; }
std::string Smoke() {
  return std::string(LOCALPAR_SOURCE_DIR) + "/deploy/jobs/synthetic_smoke.textproto";
}

TEST(Cli, EachCommandHasItsOwnHelpAndExitsZero) {
  auto r = RunProcess({Bin(), "run", "--help"}, 10);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("localpar run JOB_FILE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--checkpoint_dir=DIR"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--recovery_timeout_s=N"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--slow_ms"), std::string::npos) << "testing flags stay unlisted";
  EXPECT_EQ(r.output.find(".cc"), std::string::npos) << "no build paths";
  r = RunProcess({Bin(), "train", "-h"}, 10);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--threads=N"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--checkpoint_dir"), std::string::npos) << "train has no checkpoints";
  r = RunProcess({Bin(), "--version"}, 10);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("localpar 0."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(git "), std::string::npos) << r.output;
}

TEST(Cli, UsageErrorsExitTwoNamingTheFlag) {
  auto r = RunProcess({Bin(), "run", Smoke(), "--checkpoint_evry_steps=2"}, 10);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("did you mean --checkpoint_every_steps?"), std::string::npos) << r.output;
  r = RunProcess({Bin(), "train", Smoke(), "--naive"}, 10);
  EXPECT_EQ(r.exit_code, 2) << "a plan flag is not a train flag";
  r = RunProcess({Bin(), "run", Smoke(), "--epochs=-1"}, 10);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--epochs: must be >= 0"), std::string::npos) << r.output;
  r = RunProcess({Bin(), "run", Smoke(), "--device=gpu"}, 10);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--device=gpu: expected cpu, cuda or auto"), std::string::npos)
      << r.output;
  r = RunProcess({Bin(), "fly"}, 10);
  EXPECT_EQ(r.exit_code, 2);
  r = RunProcess({Bin(), "validate"}, 10);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("expected one job file"), std::string::npos) << r.output;
}

TEST(Cli, ValidateExplainPrintsEveryStagesProgram) {
  TempDir dir;
  std::string job = dir.Write("job.textproto", R"(rule: GREEDY micro_batches: 2
data { synthetic { shape: [4] } }
stages { layers { linear { out_features: 4 } } }
stages { layers { linear { out_features: 4 } } }
)");
  // --rule applies before the job is checked: GREEDY takes no micro-batches, BACKPROP does.
  auto r = RunProcess({Bin(), "validate", job, "--explain"}, 10);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  r = RunProcess({Bin(), "validate", job, "--explain", "--rule=BACKPROP"}, 10);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("# stage 0: receive 0, forward 0, send activations 0, head (probe) 0, "
                          "receive 1"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("# stage 1: receive 0, forward 0, send activations 0, head (local) 0, "
                          "backward head gradient 0 (and input gradient), send input gradient 0"),
            std::string::npos)
      << r.output;
}

TEST(Cli, RunFlagsReachTheCoordinator) {
  TempDir dir;
  // --status_listen= (empty) turns the status service off, so nothing announces it;
  // --keep_checkpoints=1 leaves one checkpoint of the four taken.
  auto r = RunProcess({Bin(), "run", Smoke(), "--quiet", "--status_listen=",
                       "--checkpoint_dir=" + dir.path() + "/ckpt", "--checkpoint_every_steps=1",
                       "--keep_checkpoints=1", "--max_steps=4", "--max_recoveries=0"},
                      60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("watch with"), std::string::npos) << r.output;
  int committed = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() + "/ckpt")) {
    committed += std::filesystem::exists(e.path() / "MANIFEST");
  }
  EXPECT_EQ(committed, 1);
}

}  // namespace
}  // namespace localpar
