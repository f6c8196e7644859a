// Killed, stopped and lost processes mid-run: restarted and rolled back, bitwise equal.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
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
using testing::ReadFile;
using testing::RunProcess;
using testing::SmallJob;
using testing::TempDir;

// Polls `found` every 10 ms for up to 30 s; a test failure names `what` if it never holds.
void WaitFor(const std::string& what, const std::function<bool()>& found) {
  for (int i = 0; i < 3000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (found()) return;
  }
  ADD_FAILURE() << what << " within 30 s";
}

// Until a checkpoint directory under `ckpt` has its MANIFEST. Tests that need the run to be
// that far before they break something wait on this, not on a fixed delay from start-up,
// which a loaded machine or the sanitizer build can outrun.
void WaitForACheckpoint(const std::string& ckpt) {
  WaitFor("no checkpoint committed in " + ckpt, [&] {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(ckpt, ec)) {
      if (std::filesystem::exists(entry.path() / "MANIFEST", ec)) return true;
    }
    return false;
  });
}

// Until a file called `name` exists anywhere under `ckpt`: a worker's snapshot, written once
// it has trained the checkpoint's step.
void WaitForASnapshot(const std::string& ckpt, const std::string& name) {
  WaitFor("no " + name + " under " + ckpt, [&] {
    std::error_code ec;
    // Checkpoints are written and pruned meanwhile: any error just means "look again".
    for (std::filesystem::recursive_directory_iterator it(ckpt, ec), end; !ec && it != end;
         it.increment(ec)) {
      if (it->path().filename() == name) return true;
    }
    return false;
  });
}

// Long enough (12 epochs, a slowed last stage) to be interrupted mid-run.
struct RecoveryRun {
  TempDir dir;
  std::string job, ckpt, bin = testing::BinDir() + "/localpar";
  int replicas;
  size_t processes;  // the workers and the coordinator
  explicit RecoveryRun(int replicas = 1) : replicas(replicas), processes(4 * replicas + 1) {
    std::string text = SmallJob("GREEDY", 1);
    text.replace(text.find("epochs: 2"), 9, "epochs: 12");
    if (replicas > 1) text += "replicas: " + std::to_string(replicas) + "\n";
    job = dir.Write("job.textproto", text);
    ckpt = dir.path() + "/ckpt";
  }
  v1::ModelWeights Uninterrupted() {
    auto r = RunProcess({bin, "run", job, "--quiet", "--out=" + dir.path() + "/full"}, 120);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return *ReadWeightsFile(dir.path() + "/full/weights.pb");
  }
  // Where a kill's delay counts from.
  enum class From {
    kStart,      // the processes' start
    kSnapshot,   // the killed worker's first snapshot: it holds state the run must not lose
    kCommitted,  // the first committed checkpoint
  };
  // Starts the run, waits `delay_ms` from `from`, sends `signal` to child `index` of the
  // launcher (the workers in stage order, a stage's replicas together, then the
  // coordinator), and waits for the run to end.
  testing::ProcessResult KillAndFinish(int index, int delay_ms, int signal = SIGKILL,
                                       From from = From::kStart) {
    pid_t launcher = testing::StartProcess(
        {bin, "run", job, "--quiet", "--checkpoint_dir=" + ckpt, "--checkpoint_every_steps=3",
         "--slow_stage=3", "--slow_ms=15", "--out=" + dir.path() + "/run"},
        dir.path() + "/log");
    std::vector<pid_t> children;
    for (int i = 0; i < 500 && children.size() < processes; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      children = testing::LaunchedProcesses(launcher);
    }
    if (from == From::kCommitted) WaitForACheckpoint(ckpt);
    if (from == From::kSnapshot) {
      // Replica 0's snapshot is stage-K.ckpt, another replica's stage-K-replica-R.ckpt.
      const int stage = index / replicas, replica = index % replicas;
      WaitForASnapshot(ckpt, "stage-" + std::to_string(stage) +
                                 (replica > 0 ? "-replica-" + std::to_string(replica) : "") +
                                 ".ckpt");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    EXPECT_EQ(children.size(), processes);
    if (children.size() == processes) kill(children[index], signal);
    testing::ProcessResult r;
    r.exit_code = testing::WaitProcess(launcher, 180);
    r.output = ReadFile(dir.path() + "/log");
    return r;
  }
};

TEST(Recovery, AWorkerKilledAtARandomMomentIsRestartedAndTheRunEndsBitwiseEqual) {
  RecoveryRun run;
  v1::ModelWeights want = run.Uninterrupted();
  std::random_device rd;
  // Counted from the killed worker's first snapshot, not from start-up: a worker lost before
  // it has trained a step is only restarted, with nothing to roll back or restart. Killed
  // before that checkpoint commits (every stage's snapshot in), the run starts over; after,
  // it rolls back.
  int stage = static_cast<int>(rd() % 4), delay = static_cast<int>(rd() % 900);
  auto r = run.KillAndFinish(stage, delay, SIGKILL, RecoveryRun::From::kSnapshot);
  ASSERT_EQ(r.exit_code, 0) << "killed stage " << stage << " " << delay
                            << " ms after its first snapshot\n"
                            << r.output;
  EXPECT_NE(r.output.find("restarting it"), std::string::npos) << r.output;
  EXPECT_TRUE(r.output.find("rolling every stage back to") != std::string::npos ||
              r.output.find("no committed checkpoint yet; restarting from step 0") !=
                  std::string::npos)
      << r.output;
  ExpectWeightsFileEquals(run.dir.path() + "/run/weights.pb", want);
}

// Stage 1's second replica killed mid-run: it is restarted, every replica of every stage
// rolls back to the last checkpoint (each from its own snapshot) and replays, bitwise
// equal to an uninterrupted run with replicas.
TEST(Recovery, AKilledReplicaIsRestartedAndEveryStageRollsBackBitwiseEqual) {
  RecoveryRun run(2);
  v1::ModelWeights want = run.Uninterrupted();
  std::random_device rd;
  const int delay = static_cast<int>(rd() % 600);
  auto r =
      run.KillAndFinish(3, delay, SIGKILL, RecoveryRun::From::kSnapshot);  // stage 1, replica 1
  ASSERT_EQ(r.exit_code, 0) << "killed " << delay << " ms after its first snapshot\n" << r.output;
  EXPECT_NE(r.output.find("worker for stage 1 replica 1 was killed by signal 9; restarting it"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(r.output.find("rolling every stage back to") != std::string::npos ||
              r.output.find("no committed checkpoint yet; restarting from step 0") !=
                  std::string::npos)
      << r.output;
  ExpectWeightsFileEquals(run.dir.path() + "/run/weights.pb", want);
}

TEST(Recovery, AKilledCoordinatorIsRestartedFromTheLastManifestBitwiseEqual) {
  RecoveryRun run;
  v1::ModelWeights want = run.Uninterrupted();
  // Killed once a checkpoint is committed, so there is always one to resume from (under
  // the sanitizers a fixed delay from start-up could come before the first).
  auto r = run.KillAndFinish(4, 50, SIGKILL, RecoveryRun::From::kCommitted);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("coordinator was killed by signal 9; restarting it"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resuming from"), std::string::npos) << r.output;
  ExpectWeightsFileEquals(run.dir.path() + "/run/weights.pb", want);
}

// Liveness: a stopped process answers no health check; the launcher kills it after 5 s and
// restarts it as it would a crashed one, and the run still ends bitwise equal.
TEST(Recovery, AStoppedWorkerIsKilledRestartedAndTheRunEndsBitwiseEqual) {
  RecoveryRun run;
  v1::ModelWeights want = run.Uninterrupted();
  auto r = run.KillAndFinish(2, 400, SIGSTOP);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("worker for stage 2 answered no health check for 5 s (hung or "
                          "stopped); the launcher killed it; restarting it in"),
            std::string::npos)
      << r.output;
  ExpectWeightsFileEquals(run.dir.path() + "/run/weights.pb", want);
}

TEST(Recovery, AStoppedCoordinatorIsKilledRestartedAndResumes) {
  RecoveryRun run;
  v1::ModelWeights want = run.Uninterrupted();
  auto r = run.KillAndFinish(4, 50, SIGSTOP, RecoveryRun::From::kCommitted);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("coordinator answered no health check for 5 s"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resuming from"), std::string::npos) << r.output;
  ExpectWeightsFileEquals(run.dir.path() + "/run/weights.pb", want);
}

// A worker stopped with SIGTERM drains and exits 143; the launcher restarts it.
TEST(Recovery, AWorkerStoppedWithSigtermIsRestartedAndTheRunEndsBitwiseEqual) {
  RecoveryRun run;
  v1::ModelWeights want = run.Uninterrupted();
  auto r = run.KillAndFinish(1, 500, SIGTERM);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("worker for stage 1 was stopped by SIGTERM"), std::string::npos)
      << r.output;
  ExpectWeightsFileEquals(run.dir.path() + "/run/weights.pb", want);
}

TEST(Recovery, AWorkerThatNeverReturnsStopsTheJobNamingTheStageAndCheckpoint) {
  RecoveryRun run;
  // Workers started here, not by the launcher: nobody restarts the one we kill.
  std::vector<pid_t> workers;
  std::vector<std::string> addresses;
  for (int k = 0; k < 4; ++k) {
    std::string pf = run.dir.path() + "/w" + std::to_string(k);
    workers.push_back(
        testing::StartProcess({testing::BinDir() + "/localpar_worker", "--port_file=" + pf,
                               "--checkpoint_dir=" + run.ckpt + "/stage-" + std::to_string(k),
                               k == 3 ? "--debug_delay_ms=15" : "--debug_delay_ms=0"},
                              pf + ".log"));
    int port = 0;
    for (int i = 0; i < 500 && port == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::ifstream(pf) >> port;
    }
    addresses.push_back("127.0.0.1:" + std::to_string(port));
  }
  std::string list = addresses[0] + "," + addresses[1] + "," + addresses[2] + "," + addresses[3];
  pid_t coordinator =
      testing::StartProcess({testing::BinDir() + "/localpar_coordinator", "--job=" + run.job,
                             "--workers=" + list, "--quiet", "--checkpoint_dir=" + run.ckpt,
                             "--checkpoint_every_steps=3", "--recovery_timeout_s=2"},
                            run.dir.path() + "/coordinator.log");
  WaitForACheckpoint(run.ckpt);  // so the message has one to name
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(workers[1], SIGKILL);
  EXPECT_EQ(testing::WaitProcess(coordinator, 60), 5);
  std::string log = ReadFile(run.dir.path() + "/coordinator.log");
  // Under a loaded machine (the sanitizer build) a slow stage may miss its health check as
  // well and be named beside it; the killed one must be named in the line that gives up.
  const size_t gave_up = log.find(" did not come back within 2 s");
  ASSERT_NE(gave_up, std::string::npos) << log;
  const size_t line = log.rfind('\n', gave_up) + 1;  // npos + 1 == 0: the first line
  EXPECT_NE(log.substr(line, gave_up - line).find("stage 1 (" + addresses[1] + ")"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("last checkpoint: " + run.ckpt + "/ckpt-"), std::string::npos) << log;
  for (pid_t w : workers) {
    kill(w, SIGKILL);
    testing::WaitProcess(w, 10);
  }
}

}  // namespace
}  // namespace localpar
