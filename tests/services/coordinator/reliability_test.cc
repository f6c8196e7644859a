// Checkpoints and runs at the edges: a reused checkpoint directory, a worker that lost its
// volume, a checkpoint write that fails on one stage, a run whose every checkpoint fails,
// settings refused before anything starts, the report of a resumed run, run directories
// left by a killed launcher, and a stage whose state is far larger than a gRPC message.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/model_io/tensor_proto.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::JsonNumbers;
using testing::ReadFile;
using testing::RunProcess;
using testing::TempDir;

struct Runs {
  TempDir dir;
  std::string bin = testing::BinDir() + "/localpar";
  std::string job = dir.Write("job.textproto", testing::SmallJob("GREEDY", 1));
  std::string ckpt = dir.path() + "/ckpt";
  testing::ProcessResult Run(std::vector<std::string> extra, int timeout_s = 120) {
    std::vector<std::string> argv = {bin, "run", job, "--quiet"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunProcess(argv, timeout_s);
  }
  int Manifests() const {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(ckpt)) {
      n += std::filesystem::exists(e.path() / "MANIFEST");
    }
    return n;
  }
};

TEST(Reliability, AFreshRunRefusesADirectoryHoldingAnotherRunsCheckpoints) {
  Runs runs;
  auto first = runs.Run({"--checkpoint_dir=" + runs.ckpt, "--checkpoint_every_steps=4"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto again = runs.Run({"--checkpoint_dir=" + runs.ckpt, "--seed=6"});
  EXPECT_EQ(again.exit_code, 2) << again.output;  // a usage error, as README's exit codes say
  EXPECT_NE(again.output.find(runs.ckpt + " already holds checkpoints"), std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("continue it with --resume"), std::string::npos) << again.output;
  // Resuming it with another seed is another run: refused as a usage error, naming the
  // field and both values.
  auto other = runs.Run({"--resume=" + runs.ckpt, "--seed=6"});
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("these differ: the seed (the checkpoint's 5, this job's 6)"),
            std::string::npos)
      << other.output;
  EXPECT_GE(runs.Manifests(), 1) << "nothing of the first run was pruned";
}

TEST(Reliability, AWorkerThatLostItsVolumeIsDetectedNamingStageAndFile) {
  Runs runs;
  auto first = runs.Run(
      {"--checkpoint_dir=" + runs.ckpt, "--checkpoint_every_steps=2", "--stop_after_steps=5"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::filesystem::remove_all(runs.ckpt + "/stage-1");  // its volume came back empty
  auto second = runs.Run({"--resume=" + runs.ckpt});
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_NE(second.output.find("stage 1, checkpoint 3: " + runs.ckpt +
                               "/stage-1/ckpt-000003/stage-1.ckpt"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("no older checkpoint under " + runs.ckpt), std::string::npos)
      << second.output;
}

TEST(Reliability, AFailedSnapshotWriteFailsThatCheckpointOnlyAndTheRunGoesOn) {
  Runs runs;
  v1::ModelWeights want;
  {
    auto full = runs.Run({"--out=" + runs.dir.path() + "/full"});
    ASSERT_EQ(full.exit_code, 0) << full.output;
    want = *ReadWeightsFile(runs.dir.path() + "/full/weights.pb");
  }
  // Where stage 2 would put checkpoint 2 there is a file: its snapshot cannot be written.
  std::filesystem::create_directories(runs.ckpt + "/stage-2");
  std::ofstream(runs.ckpt + "/stage-2/ckpt-000002") << "in the way";
  auto r = runs.Run({"--checkpoint_dir=" + runs.ckpt, "--checkpoint_every_steps=2",
                     "--out=" + runs.dir.path() + "/run"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint " + runs.ckpt + "/ckpt-000002 failed at stage 2: " +
                          runs.ckpt + "/stage-2/ckpt-000002: cannot create"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(runs.ckpt + "/ckpt-000002")) << "no partial checkpoint";
  // Later ones commit (how many depends on how far the feeder runs ahead: at most 4 travel
  // at once), the final one among them.
  EXPECT_GE(runs.Manifests(), 1) << r.output;
  testing::ExpectWeightsFileEquals(runs.dir.path() + "/run/weights.pb", want);
}

TEST(Reliability, SettingsThatCannotWorkAreRefusedBeforeAnythingStarts) {
  Runs runs;
  auto r = runs.Run({"--stop_after_steps=3"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--stop_after_steps needs --checkpoint_dir"), std::string::npos)
      << r.output;
  std::string file = runs.dir.Write("plain_file", "x");
  r = runs.Run({"--out=" + file + "/out"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--out=" + file + "/out: cannot create"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("workers up"), std::string::npos) << "nothing started";
  r = RunProcess({runs.bin, "train", runs.job, "--quiet", "--out=" + file + "/out"}, 30);
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST(Reliability, AResumedRunReportsTheWholeRun) {
  Runs runs;
  auto full = runs.Run({"--out=" + runs.dir.path() + "/full"});
  ASSERT_EQ(full.exit_code, 0) << full.output;
  // 7 steps an epoch: stop in the second epoch, then resume.
  auto first = runs.Run(
      {"--checkpoint_dir=" + runs.ckpt, "--checkpoint_every_steps=4", "--stop_after_steps=9"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = runs.Run({"--resume=" + runs.ckpt, "--out=" + runs.dir.path() + "/resumed"});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  std::string a = ReadFile(runs.dir.path() + "/full/report.json");
  std::string b = ReadFile(runs.dir.path() + "/resumed/report.json");
  EXPECT_EQ(JsonNumbers(a, "accuracy"), JsonNumbers(b, "accuracy")) << b;
  EXPECT_EQ(JsonNumbers(a, "loss"), JsonNumbers(b, "loss"));
  EXPECT_EQ(JsonNumbers(a, "train_examples"), JsonNumbers(b, "train_examples"));
  EXPECT_GT(JsonNumbers(b, "wall_seconds")[0], 0);
}

TEST(Reliability, EveryCheckpointFailingIsAFailedRun) {
  TempDir dir;
  std::string job = dir.Write("job.textproto", testing::SmallJob("GREEDY", 1));
  // Workers started without storage of their own: no snapshot can be written.
  testing::StartedWorkers started = testing::StartWorkers(dir.path(), 4);
  const std::vector<pid_t>& workers = started.pids;
  const std::string list = started.list();
  auto r = RunProcess(
      {testing::BinDir() + "/localpar_coordinator", "--job=" + job, "--workers=" + list, "--quiet",
       "--checkpoint_dir=" + dir.path() + "/ckpt", "--checkpoint_every_steps=5"},
      60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("this worker has no --checkpoint_dir"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every checkpoint of this run failed"), std::string::npos) << r.output;
  for (pid_t w : workers) {
    kill(w, SIGTERM);
    testing::WaitProcess(w, 10);
  }
}

TEST(Reliability, ARunDirectoryLeftByAKilledLauncherIsRemovedByTheNextLaunch) {
  pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);  // a pid nobody holds now
  std::string stale = "/tmp/localpar.reliability-test-" + std::to_string(getpid());
  std::filesystem::create_directories(stale);
  std::ofstream(stale + "/launcher.pid") << gone << "\n";
  std::string kept = stale + "-kept";  // a failed run's logs: no launcher.pid
  std::filesystem::create_directories(kept);
  Runs runs;
  auto r = runs.Run({"--max_steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(kept));
  std::filesystem::remove_all(kept);
}

// A stage with 64 MiB of weights (a 4096x4096 linear layer; 192 MiB with AdamW's moments):
// its snapshots are written and read by its own worker, the manifest records their size and
// CRC, the resumed run ends bitwise equal to the reference trainer, and the final weights
// cross gRPC to the coordinator's weights.pb.
TEST(Reliability, AStageWith64MiBOfStateCheckpointsAndResumesBitwiseEqual) {
  TempDir dir;
  std::string job = dir.Write("big.textproto", R"(name: "big"
rule: GREEDY
batch_size: 8
epochs: 1
seed: 3
data { synthetic { train_examples: 64 test_examples: 16 shape: [32] classes: 4 seed: 1 } }
optimizer { adamw {} }
schedule { lr: 0.001 }
stages { layers { linear { out_features: 4096 } } layers { relu {} } head { kind: LINEAR } }
stages { layers { linear { out_features: 4096 } } layers { relu {} } head { kind: LINEAR } }
stages { layers { linear { out_features: 16 } } layers { relu {} } head { kind: LINEAR } }
)");
  const std::string bin = testing::BinDir() + "/localpar", ckpt = dir.path() + "/ckpt";
  auto ref = RunProcess({bin, "train", job, "--quiet", "--out=" + dir.path() + "/ref"}, 300);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  auto first = RunProcess({bin, "run", job, "--quiet", "--checkpoint_dir=" + ckpt,
                           "--checkpoint_every_steps=2", "--stop_after_steps=3"},
                          300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string snapshot = ckpt + "/stage-1/ckpt-000001/stage-1.ckpt";
  ASSERT_TRUE(std::filesystem::exists(snapshot)) << first.output;
  EXPECT_GE(std::filesystem::file_size(snapshot), 3u * 64 * 1024 * 1024) << snapshot;
  auto resumed = RunProcess(
      {bin, "run", job, "--quiet", "--resume=" + ckpt, "--out=" + dir.path() + "/resumed"}, 300);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/ref/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(want->stages(1).params(0).tensor().data().size(), 4096u * 4096 * 4);
  testing::ExpectWeightsFileEquals(dir.path() + "/resumed/weights.pb", *want);
}

}  // namespace
}  // namespace localpar

namespace localpar {
namespace {

// The feeder runs ahead of the stages, so checkpoints asked for every step pile up in the
// pipeline; workers used to keep every one in flight (10 sets with --keep_checkpoints=3).
// Now at most kMaxCheckpointsInFlight travel at once, so a worker keeps at most
// --keep_checkpoints + 4 snapshot sets, and the run still ends bitwise equal.
TEST(Reliability, WorkersKeepAtMostKeepCheckpointsPlusThoseInFlight) {
  Runs runs;
  auto r = runs.Run({"--checkpoint_dir=" + runs.ckpt, "--checkpoint_every_steps=1",
                     "--keep_checkpoints=1", "--out=" + runs.dir.path() + "/out"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 4; ++k) {
    int sets = 0;
    for (const auto& e :
         std::filesystem::directory_iterator(runs.ckpt + "/stage-" + std::to_string(k))) {
      sets += e.path().filename().string().rfind("ckpt-", 0) == 0;
    }
    EXPECT_LE(sets, 1 + 4) << "stage " << k << "\n" << r.output;
    EXPECT_GE(sets, 1) << "stage " << k;
  }
  EXPECT_LE(runs.Manifests(), 1) << r.output;
  auto train = RunProcess(
      {runs.bin, "train", runs.job, "--quiet", "--out=" + runs.dir.path() + "/ref"}, 120);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_EQ(ReadFile(runs.dir.path() + "/out/weights.pb"),
            ReadFile(runs.dir.path() + "/ref/weights.pb"));
}

}  // namespace
}  // namespace localpar
