// The local cluster against the reference trainer: for every update rule, 4 worker
// processes over gRPC on loopback end with weights bitwise identical to the in-process
// reference trainer's. Also: real asynchrony between stages, bounded queues and flat memory
// under a slow stage, asynchronous OVERLAP within its delay bound, and clean failures.
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
#include "common/job/checkpoint.h"
#include "common/job/run.h"
#include "common/job/tensor_codec.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "proto/localpar.pb.h"
#include "proto/report.pb.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::ExpectWeightsFileEquals;
using testing::JsonNumbers;
using testing::ReadFile;
using testing::RunProcess;
using testing::SmallJob;
using testing::TempDir;

v1::ModelWeights ReferenceWeights(const std::string& job_path, const std::string& out) {
  absl::StatusOr<v1::Job> job = LoadJobFile(job_path);
  EXPECT_TRUE(job.ok()) << job.status();
  absl::StatusOr<DataSplit> data = LoadJobData(*job);
  EXPECT_TRUE(data.ok()) << data.status();
  RunOptions o;
  o.progress = false;
  o.out_dir = out;
  std::ostringstream log;
  absl::StatusOr<v1::RunReport> r = RunReference(*job, *data, o, log);
  EXPECT_TRUE(r.ok()) << r.status();
  absl::StatusOr<v1::ModelWeights> w = ReadWeightsFile(out + "/weights.pb");
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *w : v1::ModelWeights();
}

// Runs `job` on a local cluster (output in DIR/cluster) and checks that its weights equal
// the reference trainer's (DIR/ref) bit for bit; returns the reference weights.
v1::ModelWeights ExpectClusterEqualsReference(const TempDir& dir, const std::string& job) {
  v1::ModelWeights want = ReferenceWeights(job, dir.path() + "/ref");
  auto r = RunProcess(
      {testing::BinDir() + "/localpar", "run", job, "--quiet", "--out=" + dir.path() + "/cluster"},
      120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code == 0) ExpectWeightsFileEquals(dir.path() + "/cluster/weights.pb", want);
  return want;
}

class ClusterMatchesReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ClusterMatchesReference, FourWorkersEndWithBitwiseIdenticalWeights) {
  const std::string rule = GetParam();
  TempDir dir;
  std::string job = dir.Write("job.textproto", SmallJob(rule, rule == "BACKPROP" ? 3 : 1));
  ExpectClusterEqualsReference(dir, job);
  if (HasFailure()) return;
  // The two reports agree on every stage's test accuracy too.
  EXPECT_EQ(JsonNumbers(ReadFile(dir.path() + "/cluster/report.json"), "accuracy"),
            JsonNumbers(ReadFile(dir.path() + "/ref/report.json"), "accuracy"));
}

INSTANTIATE_TEST_SUITE_P(Rules, ClusterMatchesReference,
                         ::testing::Values("GREEDY", "CHUNKED", "OVERLAP", "BACKPROP"),
                         [](const auto& info) { return info.param; });

// Stage replicas: 4 stages x 2 or 3 replicas, one worker each (8 or 12 processes), every
// batch split among a stage's replicas, their gradients gathered over Gloo and added in
// replica order. The cluster ends bitwise equal to the reference trainer run with the same
// replicas, every replica of a stage holds the same weights (the coordinator checks), and
// the weights differ from a run without replicas (batch norm sees each share alone).
class ReplicasMatchReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ReplicasMatchReference, EveryReplicaEndsBitwiseEqualToTheReferenceWithReplicas) {
  const std::string rule = GetParam();
  const int replicas = rule == "BACKPROP" ? 3 : 2;
  TempDir dir;
  const std::string base = SmallJob(rule, rule == "BACKPROP" ? 3 : 1);
  std::string job =
      dir.Write("job.textproto", base + "replicas: " + std::to_string(replicas) + "\n");
  v1::ModelWeights want = ExpectClusterEqualsReference(dir, job);
  if (HasFailure()) return;
  EXPECT_EQ(JsonNumbers(ReadFile(dir.path() + "/cluster/report.json"), "accuracy"),
            JsonNumbers(ReadFile(dir.path() + "/ref/report.json"), "accuracy"));
  EXPECT_NE(ReadFile(dir.path() + "/cluster/report.json")
                .find("\"replicas\": " + std::to_string(replicas)),
            std::string::npos);
  std::string plain = dir.Write("plain.textproto", base);
  v1::ModelWeights without = ReferenceWeights(plain, dir.path() + "/plain");
  EXPECT_NE(without.stages(0).params(0).tensor().data(), want.stages(0).params(0).tensor().data());
}

INSTANTIATE_TEST_SUITE_P(Rules, ReplicasMatchReference,
                         ::testing::Values("GREEDY", "CHUNKED", "OVERLAP", "BACKPROP"),
                         [](const auto& info) { return info.param; });

TEST(Replicas, BadReplicaCountsAreRefusedNamingTheField) {
  TempDir dir;
  const std::string bin = testing::BinDir() + "/localpar";
  struct Case {
    int micro_batches;
    int replicas;
    std::string want;
  };
  const std::vector<Case> cases = {
      {1, 31, "replicas: 31 exceeds batch_size 30"},
      {3, 11, "need a batch of at least 33 rows"},
      // 200 examples in batches of 30 leave 20 rows, fewer than 7 x 3 micro-batches need.
      {3, 7, "each epoch's last batch has 20 rows"},
      {1, -1, "replicas: must be in 1..64"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.Write(
        "bad.textproto", SmallJob(c.micro_batches > 1 ? "BACKPROP" : "GREEDY", c.micro_batches) +
                             "replicas: " + std::to_string(c.replicas) + "\n");
    for (const char* command : {"train", "run"}) {
      auto r = RunProcess({bin, command, path, "--quiet"}, 60);
      EXPECT_EQ(r.exit_code, 3) << command << " " << c.replicas << r.output;
      EXPECT_NE(r.output.find(c.want), std::string::npos)
          << command << " " << c.replicas << r.output;
    }
  }
  // A coordinator given one worker for two replicas, or too few workers, refuses to start.
  const std::string job = dir.Write("two.textproto", SmallJob("GREEDY", 1) + "replicas: 2\n");
  const std::string coordinator = testing::BinDir() + "/localpar_coordinator";
  std::string twice = "--workers=127.0.0.1:1";
  for (int i = 2; i <= 8; ++i) twice += ",127.0.0.1:" + std::to_string(i == 2 ? 1 : i);
  auto r = RunProcess({coordinator, "--job=" + job, twice}, 30);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("lists 127.0.0.1:1 twice; every replica of every stage needs its own "
                          "worker"),
            std::string::npos)
      << r.output;
  r = RunProcess({coordinator, "--job=" + job, "--workers=127.0.0.1:1,127.0.0.1:2"}, 30);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("lists 2 addresses but job small4 has 4 stages x 2 replicas"),
            std::string::npos)
      << r.output;
}

// A byte-level transformer language model on a generated corpus: per-position labels
// travel with the batches, every stage predicts the next byte, and the cluster still ends
// bitwise equal to the reference trainer. The 3 job stages are regrouped into 2.
std::string LanguageModelJob(const std::string& corpus, const std::string& rule) {
  std::ostringstream j;
  j << "name: \"lm\"\nrule: " << rule << "\nmicro_batches: " << (rule == "BACKPROP" ? 2 : 1)
    << "\ndata { text { paths: \"" << corpus << "\" seq_len: 8 holdout_fraction: 0.2 } }\n"
    << R"(batch_size: 12
epochs: 1
seed: 3
eval_batch_size: 40
optimizer { adamw {} }
schedule { lr: 0.003 }
stages { layers { embedding { vocab: 256 dim: 16 } } layers { positional_encoding {} }
         layers { transformer_block { heads: 2 } } head { kind: LANGUAGE_MODEL } }
stages { layers { transformer_block { heads: 4 mlp_hidden: 24 } } head { kind: LANGUAGE_MODEL } }
stages { layers { transformer_block { heads: 1 } } head { kind: LANGUAGE_MODEL } }
)";
  return j.str();
}

class LanguageModelCluster : public ::testing::TestWithParam<std::string> {};

TEST_P(LanguageModelCluster, EndsBitwiseEqualToTheReference) {
  const std::string rule = GetParam();
  TempDir dir;
  std::string corpus;
  for (int i = 0; corpus.size() < 3000; ++i) {
    corpus += "fortune " + std::to_string(i * 7919 % 1000) + ": the quick brown fox.\n%\n";
  }
  std::string corpus_path = dir.Write("corpus.txt", corpus);
  std::string job = dir.Write("job.textproto", LanguageModelJob(corpus_path, rule));
  absl::StatusOr<v1::Job> parsed = LoadJobFile(job);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<v1::Job> two = RegroupStages(*parsed, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  absl::StatusOr<DataSplit> data = LoadJobData(*two);
  ASSERT_TRUE(data.ok()) << data.status();
  RunOptions o;
  o.progress = false;
  o.out_dir = dir.path() + "/ref";
  std::ostringstream log;
  absl::StatusOr<v1::RunReport> ref = RunReference(*two, *data, o, log);
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(o.out_dir + "/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job, "--quiet", "--stages=2",
                       "--out=" + dir.path() + "/cluster"},
                      120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectWeightsFileEquals(dir.path() + "/cluster/weights.pb", *want);
  std::vector<double> losses = JsonNumbers(ReadFile(dir.path() + "/cluster/report.json"), "loss");
  EXPECT_EQ(losses, JsonNumbers(ReadFile(dir.path() + "/ref/report.json"), "loss"));
  // Per-token losses, and the model learned something: below the uniform 8 bits per byte.
  ASSERT_EQ(losses.size(), 4u);  // (train, test) x 2 stages
  EXPECT_LT(losses.back(), std::log(256.0));
}

INSTANTIATE_TEST_SUITE_P(Rules, LanguageModelCluster,
                         ::testing::Values("GREEDY", "OVERLAP", "BACKPROP"),
                         [](const auto& info) { return info.param; });

// Activations compressed on the wire: the cluster still equals the reference trainer (which
// rounds the same way) bit for bit, labels arrive intact (every stage's test accuracy
// matches), and the compression is real (the weights differ from an uncompressed run).
TEST(WireCompression, Bf16AndF16RunsEqualTheReferenceAndDifferFromF32) {
  for (auto [wire, rule] : {std::pair{"WIRE_BF16", "GREEDY"}, std::pair{"WIRE_F16", "BACKPROP"}}) {
    TempDir dir;
    const int micro = std::string(rule) == "BACKPROP" ? 3 : 1;
    std::string job =
        dir.Write("job.textproto", SmallJob(rule, micro) + "wire: " + std::string(wire) + "\n");
    std::string plain = dir.Write("plain.textproto", SmallJob(rule, micro));
    v1::ModelWeights want = ExpectClusterEqualsReference(dir, job);
    v1::ModelWeights exact = ReferenceWeights(plain, dir.path() + "/ref_f32");
    if (HasFailure()) return;
    EXPECT_EQ(JsonNumbers(ReadFile(dir.path() + "/cluster/report.json"), "accuracy"),
              JsonNumbers(ReadFile(dir.path() + "/ref/report.json"), "accuracy"))
        << wire;
    // GREEDY's stage 0 sees the same (uncompressed) data either way; later stages do not.
    ASSERT_EQ(want.stages_size(), exact.stages_size());
    if (std::string(rule) == "GREEDY") {
      EXPECT_EQ(want.stages(0).SerializeAsString(), exact.stages(0).SerializeAsString());
    }
    EXPECT_NE(want.stages(1).SerializeAsString(), exact.stages(1).SerializeAsString()) << wire;
  }
}

// Reduced-precision GEMMs (bf16 inputs, float32 accumulation and master weights): workers
// and the reference trainer round alike, so the cluster is still bitwise equal to it, and
// every stage's weights differ from a float32 run (every GEMM really rounds).
TEST(GemmPrecision, Bf16GemmClusterEqualsTheReferenceAndDiffersFromF32) {
  TempDir dir;
  std::string job =
      dir.Write("job.textproto", SmallJob("GREEDY", 1) + "gemm_precision: GEMM_BF16\n");
  std::string plain = dir.Write("plain.textproto", SmallJob("GREEDY", 1));
  v1::ModelWeights want = ExpectClusterEqualsReference(dir, job);
  v1::ModelWeights exact = ReferenceWeights(plain, dir.path() + "/ref_f32");
  if (HasFailure()) return;
  ASSERT_EQ(want.stages_size(), exact.stages_size());
  for (int k = 0; k < want.stages_size(); ++k) {
    EXPECT_NE(want.stages(k).SerializeAsString(), exact.stages(k).SerializeAsString())
        << "stage " << k;
  }
  EXPECT_NE(ReadFile(dir.path() + "/ref/report.json").find("bf16 GEMMs"), std::string::npos);
}

// Runs `job` uninterrupted (into DIR/full), then again checkpointing every 2 steps into
// `ckpt` and stopping after step 5; returns the second run.
testing::ProcessResult RunFullThenStopAfterFive(const TempDir& dir, const std::string& job,
                                                const std::string& ckpt) {
  const std::string bin = testing::BinDir() + "/localpar";
  auto full = RunProcess({bin, "run", job, "--quiet", "--out=" + dir.path() + "/full"}, 120);
  EXPECT_EQ(full.exit_code, 0) << full.output;
  auto first = RunProcess({bin, "run", job, "--quiet", "--checkpoint_dir=" + ckpt,
                           "--checkpoint_every_steps=2", "--stop_after_steps=5"},
                          120);
  EXPECT_EQ(first.exit_code, 0) << first.output;
  return first;
}

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
  testing::ProcessResult first = RunFullThenStopAfterFive(dir, job, ckpt);
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

// With replicas every replica writes its own snapshot to its own storage; the manifest
// lists them all, and a resumed run ends bitwise equal to an uninterrupted one.
TEST(Replicas, StopAndResumeEndsBitwiseEqualWithEveryReplicasSnapshotInTheManifest) {
  TempDir dir;
  std::string job = dir.Write("job.textproto", SmallJob("BACKPROP", 3) + "replicas: 2\n");
  const std::string bin = testing::BinDir() + "/localpar", ckpt = dir.path() + "/ckpt";
  RunFullThenStopAfterFive(dir, job, ckpt);
  if (HasFailure()) return;
  absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(ckpt + "/ckpt-000003");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->replicas(), 2);
  ASSERT_EQ(m->stages_size(), 4);
  ASSERT_EQ(m->replica_stages_size(), 4);
  EXPECT_EQ(m->replica_stages(2).stage(), 2);
  EXPECT_EQ(m->replica_stages(2).replica(), 1);
  EXPECT_TRUE(
      std::filesystem::exists(ckpt + "/stage-2-replica-1/ckpt-000003/stage-2-replica-1.ckpt"));
  auto second = RunProcess(
      {bin, "run", job, "--quiet", "--resume=" + ckpt, "--out=" + dir.path() + "/resumed"}, 120);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/full/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  ExpectWeightsFileEquals(dir.path() + "/resumed/weights.pb", *want);
  // The epochs' figures after the resume are whole: every replica's share restored.
  EXPECT_EQ(JsonNumbers(ReadFile(dir.path() + "/resumed/report.json"), "accuracy"),
            JsonNumbers(ReadFile(dir.path() + "/full/report.json"), "accuracy"));
}

INSTANTIATE_TEST_SUITE_P(Rules, ResumeMatchesUninterrupted,
                         ::testing::Values("GREEDY", "CHUNKED", "OVERLAP", "BACKPROP"),
                         [](const auto& info) { return info.param; });

// Waits (up to 30 s) until a checkpoint directory under `ckpt` has its MANIFEST. Tests that
// need a checkpoint to exist before they break something wait on this, not on a fixed delay
// from start-up, which the sanitizer build under load can outrun.
void WaitForACommittedCheckpoint(const std::string& ckpt) {
  for (int i = 0; i < 3000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(ckpt, ec)) {
      if (std::filesystem::exists(entry.path() / "MANIFEST", ec)) return;
    }
  }
  ADD_FAILURE() << "no checkpoint committed in " << ckpt << " within 30 s";
}

// Long enough (12 epochs, a slowed last stage) to be interrupted mid-run.
struct RecoveryRun {
  TempDir dir;
  std::string job, ckpt, bin = testing::BinDir() + "/localpar";
  size_t processes;  // the workers and the coordinator
  explicit RecoveryRun(int replicas = 1) : processes(4 * replicas + 1) {
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
  // Starts the run, waits `delay_ms`, sends `signal` to child `index` of the launcher
  // (the workers in stage order, a stage's replicas together, then the coordinator), and
  // waits for the run to end.
  // With `after_a_checkpoint`, the delay counts from the first committed checkpoint rather
  // than from the processes' start, however slow they are.
  testing::ProcessResult KillAndFinish(int index, int delay_ms, int signal = SIGKILL,
                                       bool after_a_checkpoint = false) {
    pid_t launcher = testing::StartProcess(
        {bin, "run", job, "--quiet", "--checkpoint_dir=" + ckpt, "--checkpoint_every_steps=3",
         "--slow_stage=3", "--slow_ms=15", "--out=" + dir.path() + "/run"},
        dir.path() + "/log");
    std::vector<pid_t> children;
    for (int i = 0; i < 500 && children.size() < processes; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      children = testing::LaunchedProcesses(launcher);
    }
    if (after_a_checkpoint) WaitForACommittedCheckpoint(ckpt);
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
  int stage = static_cast<int>(rd() % 4), delay = 300 + static_cast<int>(rd() % 900);
  auto r = run.KillAndFinish(stage, delay);
  ASSERT_EQ(r.exit_code, 0) << "killed stage " << stage << " after " << delay << " ms\n"
                            << r.output;
  EXPECT_NE(r.output.find("restarting it"), std::string::npos) << r.output;
  // Killed before the first checkpoint committed, the run starts over; after, it rolls back.
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
  const int delay = 600 + static_cast<int>(rd() % 600);
  auto r = run.KillAndFinish(3, delay);  // stage 1, replica 1
  ASSERT_EQ(r.exit_code, 0) << "killed after " << delay << " ms\n" << r.output;
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
  auto r = run.KillAndFinish(4, 50, SIGKILL, true);
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
  auto r = run.KillAndFinish(4, 50, SIGSTOP, true);
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
  WaitForACommittedCheckpoint(run.ckpt);  // so the message has one to name
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(workers[1], SIGKILL);
  EXPECT_EQ(testing::WaitProcess(coordinator, 60), 5);
  std::string log = ReadFile(run.dir.path() + "/coordinator.log");
  EXPECT_NE(log.find("stage 1 (" + addresses[1] + ") did not come back within 2 s"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("last checkpoint: " + run.ckpt + "/ckpt-"), std::string::npos) << log;
  for (pid_t w : workers) {
    kill(w, SIGKILL);
    testing::WaitProcess(w, 10);
  }
}

// A job with enough compute per stage that overlap in time is visible. Activation messages
// are batch x width x 4 bytes.
std::string PipelineJob(int epochs, int train_examples, int width = 256, int batch = 64) {
  std::ostringstream j;
  j << "name: \"pipe\" rule: GREEDY seed: 3 batch_size: " << batch << " epochs: " << epochs
    << "\ndata { synthetic { train_examples: " << train_examples << " test_examples: " << batch
    << " shape: [" << width << "] classes: 10 seed: 1 } }\n";
  for (int k = 0; k < 4; ++k) {
    j << "stages { layers { linear { out_features: " << width << " } } layers { relu {} } }\n";
  }
  return j.str();
}

struct Interval {
  double seq, start, end;
};

// Reads trace.json (a localpar.v1.Trace in JSON): each stage's intervals.
std::vector<std::vector<Interval>> ReadTrace(const std::string& text) {
  v1::Trace trace;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &trace).ok()) << text;
  std::vector<std::vector<Interval>> stages;
  for (const v1::StageTrace& st : trace.stages()) {
    std::vector<Interval> ivs;
    for (const v1::TraceInterval& iv : st.intervals())
      ivs.push_back({iv.seq(), iv.start_ns(), iv.end_ns()});
    stages.push_back(ivs);
  }
  return stages;
}

TEST(Pipeline, StageComputesALaterBatchWhileTheNextStageComputesAnEarlierOne) {
  TempDir dir;
  std::string job = dir.Write("job.textproto", PipelineJob(1, 64 * 40));
  auto r = RunProcess(
      {testing::BinDir() + "/localpar", "run", job, "--quiet", "--trace", "--out=" + dir.path()},
      120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto trace = ReadTrace(ReadFile(dir.path() + "/trace.json"));
  ASSERT_EQ(trace.size(), 4u);
  for (int k = 1; k < 4; ++k) {
    ASSERT_EQ(trace[k].size(), 40u);
    int overlapping = 0;
    for (const Interval& down : trace[k]) {
      for (const Interval& up : trace[k - 1]) {
        // Stage k-1 works on a later batch while stage k works on an earlier one.
        if (up.seq > down.seq && up.start < down.end && down.start < up.end) ++overlapping;
      }
    }
    EXPECT_GT(overlapping, 0) << "stages " << k - 1 << " and " << k << " never overlapped";
  }
}

TEST(Pipeline, QueuesStayBoundedAndMemoryFlatWhenTheLastStageIsSlow) {
  TempDir dir;
  // 1 MiB activation messages, 30 batches an epoch, the last stage 20 ms slower per batch.
  std::string job = dir.Write("job.textproto", PipelineJob(5, 256 * 30, 1024, 256));
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job, "--quiet", "--queue_capacity=2",
                       "--slow_stage=3", "--slow_ms=20", "--out=" + dir.path()},
                      120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string report = ReadFile(dir.path() + "/report.json");
  std::vector<double> depth = JsonNumbers(report, "queue_max_depth");
  std::vector<double> cap = JsonNumbers(report, "queue_capacity");
  v1::RunReport parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(report, &parsed).ok()) << report;
  ASSERT_EQ(depth.size(), 4u);
  ASSERT_EQ(parsed.stage_reports_size(), 4);
  for (int k = 0; k < 4; ++k) {
    EXPECT_LE(depth[k], cap[k]) << "stage " << k;
    // Three more epochs through a pipeline throttled by its last stage, after two that bring
    // the allocator's per-thread caches to their steady state. Unbounded buffering would hold
    // up to 90 more 1 MiB batches per link. Allocator and gRPC buffer noise is a few MB on an
    // idle machine and was once 24 MB with the whole test suite running beside it, so the
    // bound sits at 40 MB: under half of what unbounded buffering would add.
    const auto& rss = parsed.stage_reports(k).resident_bytes_by_epoch();
    ASSERT_EQ(rss.size(), 5);
    std::ostringstream series;
    for (double b : rss) series << " " << static_cast<int64_t>(b);
    EXPECT_LT(parsed.stage_reports(k).resident_bytes() - rss[1], 40e6)
        << "stage " << k << ", resident bytes by epoch:" << series.str();
  }
  // The upstream queues filled up: backpressure, not unbounded buffering.
  EXPECT_EQ(depth[0], cap[0]);
}

// The per-stage phase figures in report.json. Each link's bytes are counted by the sender
// and by the receiver, two processes that must agree exactly. With the last stage 100 ms
// slower per batch, the stage before it spends its time waiting to hand batches on, and the
// slow stage does not wait for input.
TEST(Pipeline, PhaseFiguresNameTheSlowStageAndBothEndsOfEachLinkCountTheSameBytes) {
  TempDir dir;
  // 80 batches of 1 MiB activations (more than the queues and socket buffers between two
  // stages hold), light to compute: 1024 rows of width 256.
  std::string job = dir.Write("job.textproto", PipelineJob(1, 1024 * 80, 256, 1024));
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job, "--quiet", "--slow_stage=3",
                       "--slow_ms=100", "--out=" + dir.path()},
                      120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string report = ReadFile(dir.path() + "/report.json");
  v1::RunReport parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(report, &parsed).ok()) << report;
  ASSERT_EQ(parsed.stage_reports_size(), 4);
  for (int k = 0; k < 4; ++k) {
    const v1::StageFigures& f = parsed.stage_reports(k);
    const v1::PhaseSeconds& p = f.phase_seconds();
    EXPECT_GT(p.forward(), 0) << "stage " << k;
    EXPECT_GT(p.backward(), 0) << "stage " << k;
    EXPECT_GT(p.update(), 0) << "stage " << k;
    EXPECT_LT(p.receive_wait() + p.forward() + p.backward() + p.update() + p.send_wait(),
              parsed.wall_seconds())
        << "stage " << k;
    if (k < 3) {
      EXPECT_GT(f.bytes_sent(), 80.0 * 1024 * 256 * 4) << "stage " << k;
      EXPECT_EQ(f.bytes_sent(), parsed.stage_reports(k + 1).bytes_received()) << "link " << k;
    }
  }
  // About 70 of the 80 batches wait 100 ms each for the slow stage to take them, while the
  // slow stage waits for input only as the pipeline fills, and when a busy machine
  // deschedules the stages before it (up to 1.1 s with three copies of this test at once).
  const double held = parsed.stage_reports(2).phase_seconds().send_wait();
  EXPECT_GT(held, 3.0) << report;
  EXPECT_LT(parsed.stage_reports(3).phase_seconds().receive_wait(), 0.4 * held) << report;
}

TEST(AsyncOverlap, TrainsAndKeepsTheMeasuredDelayWithinItsBound) {
  TempDir dir;
  std::string job = dir.Write("job.textproto", SmallJob("OVERLAP", 1));
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job, "--quiet",
                       "--overlap_max_delay=2", "--epochs=6", "--out=" + dir.path()},
                      120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string report = ReadFile(dir.path() + "/report.json");
  std::vector<double> max_delay = JsonNumbers(report, "overlap_max_delay");
  std::vector<double> mean_delay = JsonNumbers(report, "overlap_mean_delay");
  ASSERT_EQ(max_delay.size(), 4u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_LE(max_delay[k], 2) << "stage " << k;
    EXPECT_GT(mean_delay[k], 0) << "stage " << k << ": gradients were applied late at least once";
  }
  // It learns: every stage's training loss falls from epoch 1 to epoch 6, and the last
  // stage beats chance (0.2) by a wide margin. (Asynchronous runs are not reproducible, so
  // no exact figures.)
  std::vector<double> loss = JsonNumbers(report, "loss");  // per epoch: 4 train, 4 test
  std::vector<double> acc = JsonNumbers(report, "accuracy");
  ASSERT_EQ(loss.size(), 6u * 8);
  for (int k = 0; k < 4; ++k) EXPECT_LT(loss[5 * 8 + k], loss[k]) << "stage " << k;
  EXPECT_GE(acc.back(), 0.4);
}

TEST(Cluster, FashionMlpGreedyOnFourWorkersReachesTheReferenceAccuracy) {
  TempDir dir;
  auto r = RunProcess({testing::BinDir() + "/localpar", "run",
                       std::string(LOCALPAR_SOURCE_DIR) + "/deploy/jobs/fashion_mlp.textproto",
                       "--quiet", "--out=" + dir.path()},
                      600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::cout << r.output;
  std::vector<double> acc = JsonNumbers(ReadFile(dir.path() + "/report.json"), "accuracy");
  ASSERT_EQ(acc.size(), 3u * 8);  // 3 epochs x (train, test) x 4 stages
  // Bitwise equal to the reference trainer, so the same bar as accuracy_test.cc.
  EXPECT_GE(acc.back(), 0.855);
  for (int k = 0; k < 4; ++k) EXPECT_GE(acc[acc.size() - 4 + k], 0.84) << "stage " << k;
}

TEST(Launcher, RefusesAnInvalidJobBeforeStartingAnything) {
  TempDir dir;
  std::string job = dir.Write("bad.textproto", "rule: GREEDY\nstages { layers { linear { } } }\n");
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job}, 30);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("stages[0].layers[0].linear.out_features"), std::string::npos)
      << r.output;
}

TEST(Launcher, AStageThatDoesNotFitTheNextIsRefusedNamingBothStagesAndShapes) {
  TempDir dir;
  std::string job = dir.Write("bad.textproto", R"(rule: GREEDY
data { synthetic { shape: [6, 6, 1] } }
stages { name: "conv" layers { conv2d { out_channels: 4 padding: 1 } } }
stages { name: "mlp" layers { linear { in_features: 100 out_features: 8 } } }
)");
  auto r =
      RunProcess({testing::BinDir() + "/localpar", "run", job, "--out=" + dir.path() + "/o"}, 30);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  for (const char* want : {"stages[1] (mlp)", "in_features 100", "[6,6,4]", "stages[0] (conv)"}) {
    EXPECT_NE(r.output.find(want), std::string::npos) << want << " in " << r.output;
  }
  // Nothing started: no worker logs, no report.
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/o/report.json"));
  EXPECT_EQ(r.output.find("worker"), std::string::npos) << r.output;
}

TEST(Launcher, AMissingOrEmptyCorpusIsAClearDataError) {
  TempDir dir;
  auto job_for = [&](const std::string& path) {
    return dir.Write("lm.textproto", "rule: GREEDY data { text { paths: \"" + path +
                                         "\" seq_len: 4 } }\n"
                                         "stages { layers { embedding { vocab: 256 dim: 4 } } "
                                         "head { kind: LANGUAGE_MODEL } }\n");
  };
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job_for(dir.path() + "/none")}, 30);
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find(dir.path() + "/none: no such file"), std::string::npos) << r.output;
  std::string empty = dir.Write("empty.txt", "");
  r = RunProcess({testing::BinDir() + "/localpar", "run", job_for(empty)}, 30);
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("text corpus " + empty + " is empty"), std::string::npos) << r.output;
}

// `localpar plan` prints a valid job with the same layers in K stages, balanced by measured
// time: on the unbalanced MLP (four wide layers, then four narrow ones) the first stage
// gets fewer layers than an equal split would give it.
TEST(Plan, PrintsAValidJobThatBalancesAnUnbalancedModel) {
  std::string job = std::string(LOCALPAR_SOURCE_DIR) + "/tests/bench/unbalanced_mlp.textproto";
  auto r = RunProcess({testing::BinDir() + "/localpar", "plan", job, "--stages=2"}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string text = r.output.substr(r.output.find("# localpar plan"));
  absl::StatusOr<v1::Job> planned = ParseJob(text, "plan output");
  ASSERT_TRUE(planned.ok()) << planned.status() << "\n" << r.output;
  ASSERT_EQ(planned->stages_size(), 2);
  int a = planned->stages(0).layers_size(), b = planned->stages(1).layers_size();
  EXPECT_EQ(a + b, 16);
  EXPECT_LT(a, 8) << r.output;
  EXPECT_NE(r.output.find("predicted pipeline throughput, balanced / equal split"),
            std::string::npos);
  auto naive =
      RunProcess({testing::BinDir() + "/localpar", "plan", job, "--stages=2", "--naive"}, 120);
  ASSERT_EQ(naive.exit_code, 0) << naive.output;
  absl::StatusOr<v1::Job> equal =
      ParseJob(naive.output.substr(naive.output.find("# localpar plan")), "naive");
  ASSERT_TRUE(equal.ok()) << equal.status();
  EXPECT_EQ(equal->stages(0).layers_size(), 8);
  // 16 layers, 8 of them ReLUs that stay with the linear before them: at most 8 stages.
  auto bad = RunProcess({testing::BinDir() + "/localpar", "plan", job, "--stages=9"}, 120);
  EXPECT_EQ(bad.exit_code, 3) << bad.output;
  EXPECT_NE(bad.output.find("8 layers with their activations, so 1..8 stages"), std::string::npos)
      << bad.output;
}

// IDX files of the user's own: 12x12 images and 3 classes, uncompressed. The shape and the
// class count come from the files, for the cluster's workers as for the reference trainer.
TEST(Launcher, OwnIdxDataOfAnyShapeTrainsBitwiseEqualToTheReference) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  std::filesystem::create_directories(data);
  auto write_split = [&](const std::string& prefix, uint32_t n) {
    auto be = [](std::string* b, uint32_t v) {
      for (int s = 24; s >= 0; s -= 8) b->push_back(static_cast<char>(v >> s));
    };
    std::string images("\0\0\x08\x03", 4), labels("\0\0\x08\x01", 4);
    be(&images, n), be(&images, 12), be(&images, 12), be(&labels, n);
    uint32_t x = prefix.size();
    for (uint32_t i = 0; i < n; ++i) {
      labels.push_back(static_cast<char>(i % 3));
      for (int p = 0; p < 144; ++p) {
        x = x * 1103515245u + 12345u;  // pixels: noise plus a bright band per class
        images.push_back(
            static_cast<char>((x >> 24) / 2 + (p / 48 == static_cast<int>(i % 3)) * 120));
      }
    }
    std::ofstream(data + "/" + prefix + "-images-idx3-ubyte", std::ios::binary) << images;
    std::ofstream(data + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary) << labels;
  };
  write_split("train", 192);
  write_split("t10k", 48);
  std::string job = dir.Write("own.textproto", absl::StrCat(R"(name: "own"
rule: GREEDY
batch_size: 16
epochs: 2
seed: 4
data { fashion_mnist { dir: ")",
                                                            data, R"(" } }
optimizer { adamw {} }
schedule { lr: 0.003 }
stages { layers { linear { out_features: 32 } } layers { relu {} } head { kind: LINEAR } }
stages { layers { linear { out_features: 32 } } layers { relu {} } head { kind: LINEAR } }
stages { layers { linear { out_features: 16 } } layers { relu {} } head { kind: LINEAR } }
)"));
  const std::string bin = testing::BinDir() + "/localpar";
  auto ref = RunProcess({bin, "train", job, "--quiet", "--out=" + dir.path() + "/ref"}, 120);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  auto run = RunProcess({bin, "run", job, "--quiet", "--out=" + dir.path() + "/run"}, 120);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("refused"), std::string::npos) << run.output;
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/ref/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  const v1::Tensor& w0 = want->stages(0).params(0).tensor();  // Linear [in, out]
  ASSERT_EQ(w0.shape_size(), 2);
  EXPECT_EQ(w0.shape(0), 144) << "12 x 12 x 1 inputs";
  const v1::Tensor& head = want->stages(2).params(2).tensor();  // the last head's Linear
  EXPECT_EQ(head.shape(head.shape_size() - 1), 3) << "3 classes";
  testing::ExpectWeightsFileEquals(dir.path() + "/run/weights.pb", *want);
  auto info = RunProcess({bin, "data", job}, 60);
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("\"classes\": 3"), std::string::npos) << info.output;
}

// metrics.jsonl: the cluster and the reference trainer log the same figures for every
// epoch (training and test, per stage), and the lines parse as JSON; report.json says what
// ran.
TEST(Launcher, MetricsJsonlOfRunAndTrainAgreeAtEveryEpoch) {
  TempDir dir;
  std::string job = dir.Write("job.textproto", testing::SmallJob("GREEDY", 1));
  const std::string bin = testing::BinDir() + "/localpar";
  for (const char* command : {"train", "run"}) {
    auto r = RunProcess({bin, command, job, "--quiet", "--out=" + dir.path() + "/" + command}, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // Every field but the wall time and the throughput, of the lines logged at epoch ends.
  auto epoch_lines = [&](const std::string& command) {
    std::vector<std::string> out;
    std::istringstream in(ReadFile(dir.path() + "/" + command + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      google::protobuf::Struct parsed;
      EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(line, &parsed).ok()) << line;
      const auto& f = parsed.fields();
      if (f.at("kind").string_value() != "train") {
        out.push_back(line.substr(0, line.find(",\"examples_per_second\"")));
      }
    }
    return out;
  };
  std::vector<std::string> train = epoch_lines("train"), run = epoch_lines("run");
  EXPECT_EQ(run, train);
  EXPECT_GE(train.size(), 2u * 2 * 2) << "2 epochs x training and test x at least 2 heads";
  EXPECT_NE(train[0].find("{\"kind\":\"epoch\",\"step\":7,\"epoch\":1,\"stage\":0,"),
            std::string::npos)
      << train[0];  // 200 examples in batches of 30: 7 steps an epoch
  // report.json records what ran: the same normalised job, the seed and the version.
  v1::RunReport from_train, from_run;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  ReadFile(dir.path() + "/train/report.json"), &from_train)
                  .ok());
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(dir.path() + "/run/report.json"),
                                                          &from_run)
                  .ok());
  EXPECT_EQ(from_run.job_text(), from_train.job_text());
  v1::Job ran;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(from_run.job_text(), &ran))
      << from_run.job_text();
  EXPECT_EQ(ran.name(), "small4");
  EXPECT_EQ(ran.batch_size(), 30);
  EXPECT_EQ(from_run.seed(), 5);
  EXPECT_EQ(from_run.version().rfind("localpar ", 0), 0u) << from_run.version();
  EXPECT_NE(from_run.version().find("(git "), std::string::npos) << from_run.version();
}

// eval_every_steps: evaluations within epochs give the same figures in run and train, land in
// metrics.jsonl (kind "eval") and report.json, and leave the weights untouched.
TEST(Launcher, EvaluationsWithinEpochsAgreeBetweenRunAndTrainAndChangeNoWeight) {
  TempDir dir;
  const std::string plain = dir.Write("plain.textproto", testing::SmallJob("GREEDY", 1));
  const std::string job = dir.Write(
      "job.textproto", testing::SmallJob("GREEDY", 1) + "eval_every_steps: 3\neval_limit: 20\n");
  const std::string bin = testing::BinDir() + "/localpar";
  for (const char* command : {"train", "run"}) {
    auto r = RunProcess({bin, command, job, "--out=" + dir.path() + "/" + command}, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // 7 steps an epoch: within epoch 1 at steps 3 and 6, within epoch 2 at 9 and 12.
    EXPECT_NE(r.output.find("step 3 (epoch 1): test accuracy"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("step 12 (epoch 2): test accuracy"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 7 (epoch"), std::string::npos) << r.output;
  }
  auto r = RunProcess({bin, "train", plain, "--quiet", "--out=" + dir.path() + "/plain"}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto eval_lines = [&](const std::string& command) {
    std::vector<std::string> out;
    std::istringstream in(ReadFile(dir.path() + "/" + command + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      if (line.find("{\"kind\":\"eval\"") == 0) {
        out.push_back(line.substr(0, line.find(",\"examples_per_second\"")));
      }
    }
    return out;
  };
  std::vector<std::string> train = eval_lines("train"), run = eval_lines("run");
  EXPECT_EQ(run, train);
  ASSERT_EQ(train.size(), 4u * 4) << "4 evaluations x 4 heads";
  EXPECT_NE(train[0].find("\"step\":3,\"epoch\":1,\"stage\":0,"), std::string::npos) << train[0];
  EXPECT_NE(train[0].find("\"examples\":20"), std::string::npos) << train[0];
  v1::RunReport report;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(dir.path() + "/run/report.json"),
                                                          &report)
                  .ok());
  ASSERT_EQ(report.evaluations_size(), 4);
  EXPECT_EQ(report.evaluations(3).step(), 12);
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/plain/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  testing::ExpectWeightsFileEquals(dir.path() + "/run/weights.pb", *want);
  testing::ExpectWeightsFileEquals(dir.path() + "/train/weights.pb", *want);
}

// A run whose loss goes non-finite has failed: run and train both exit 6 and say why.
TEST(Launcher, ARunThatDivergesExitsSixSayingWhy) {
  TempDir dir;
  std::string job = dir.Write("nan.textproto", R"(name: "nan"
rule: GREEDY
batch_size: 32
data { synthetic { train_examples: 320 test_examples: 64 shape: [8] classes: 3 } }
optimizer { sgd {} }
schedule { lr: 1e8 }
stages { layers { linear { out_features: 16 } } layers { relu {} } head { kind: LINEAR } }
stages { layers { linear { out_features: 16 } } layers { relu {} } head { kind: LINEAR } }
)");
  for (const char* command : {"run", "train"}) {
    auto r = RunProcess({testing::BinDir() + "/localpar", command, job, "--quiet"}, 60);
    EXPECT_EQ(r.exit_code, 6) << command << "\n" << r.output;
    EXPECT_NE(r.output.find("training loss is NaN in epoch 1: training diverged"),
              std::string::npos)
        << command << "\n"
        << r.output;
  }
}

// A directory of the user's own: the error names the files looked for, and does not send
// the user to the Debian package (that hint is for the default directory only).
TEST(Launcher, AMissingDataSetIsADataErrorNamingTheFiles) {
  TempDir dir;
  std::string job = dir.Write("job.textproto",
                              "rule: GREEDY data { fashion_mnist { dir: \"/nonexistent\" } }\n"
                              "stages { layers { linear { out_features: 4 } } }\n");
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job}, 30);
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/train-images-idx3-ubyte.gz (or "
                          "/nonexistent/train-images-idx3-ubyte): no such file"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("dataset-fashion-mnist"), std::string::npos) << r.output;
}

TEST(Worker, APortInUseIsAClearStartupError) {
  TempDir dir;
  std::string port_file = dir.path() + "/port";
  pid_t first = testing::StartProcess(
      {testing::BinDir() + "/localpar_worker", "--port_file=" + port_file}, dir.path() + "/a");
  int port = 0;
  for (int i = 0; i < 500 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream(port_file) >> port;
  }
  ASSERT_GT(port, 0);
  auto r = RunProcess(
      {testing::BinDir() + "/localpar_worker", "--listen=127.0.0.1:" + std::to_string(port)}, 30);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << r.output;
  // The first worker is still serving, as the standard gRPC health check says.
  std::string address = "127.0.0.1:" + std::to_string(port);
  auto probe = RunProcess({testing::BinDir() + "/localpar", "probe", address}, 10);
  EXPECT_EQ(probe.exit_code, 0) << probe.output;
  EXPECT_NE(probe.output.find("SERVING"), std::string::npos) << probe.output;
  kill(first, SIGTERM);
  // SIGTERM drains, then exits with 128 + SIGTERM: stopped from outside, so that a supervisor
  // knows to start it again (the job's own SHUTDOWN exits 0).
  EXPECT_EQ(testing::WaitProcess(first, 10), 128 + SIGTERM);
  probe = RunProcess({testing::BinDir() + "/localpar", "probe", address, "--timeout_ms=500"}, 10);
  EXPECT_EQ(probe.exit_code, 1) << probe.output;
}

// Starts a long run, waits until all four workers are up, then does something to it.
struct LongRun {
  TempDir dir;
  pid_t launcher = -1;
  std::vector<pid_t> children;
  explicit LongRun(const std::vector<std::string>& extra = {}) {
    std::string job = dir.Write("job.textproto", PipelineJob(50, 64 * 10));
    std::vector<std::string> argv = {
        testing::BinDir() + "/localpar", "run", job, "--quiet", "--slow_stage=3", "--slow_ms=20"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    launcher = testing::StartProcess(argv, dir.path() + "/log");
    for (int i = 0; i < 500 && children.size() < 5; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      children = testing::LaunchedProcesses(launcher);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // training under way
  }
};

TEST(Launcher, StatusShowsEveryStageOfTheRunningJob) {
  LongRun run;
  ASSERT_EQ(run.children.size(), 5u) << ReadFile(run.dir.path() + "/log");
  std::string log;
  std::smatch m;
  std::regex announce("localpar status (127\\.0\\.0\\.1:[0-9]+)");
  for (int i = 0; i < 100 && !std::regex_search(log, m, announce); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log = ReadFile(run.dir.path() + "/log");
  }
  ASSERT_TRUE(std::regex_search(log, m, announce)) << log;
  // One row per stage, each with a positive examples/s (the column after the address).
  // The status port opens before the workers are configured, so allow start-up time.
  std::regex row("\\n +([0-3]) +127\\.0\\.0\\.1:[0-9]+ +([0-9]+) ");
  testing::ProcessResult r;
  int rows = 0, moving = 0;
  for (int attempt = 0; attempt < 15 && moving < 4; ++attempt) {
    r = RunProcess({testing::BinDir() + "/localpar", "status", m[1].str()}, 30);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    rows = moving = 0;
    for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), row);
         it != std::sregex_iterator(); ++it) {
      ++rows;
      moving += std::stoi((*it)[2]) > 0;
    }
  }
  EXPECT_NE(r.output.find("pipe (GREEDY): epoch"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(", (training|evaluating), step [0-9]+/500 "
                                                     "\\(the last stage; [0-9]+ fed\\)")))
      << r.output;
  EXPECT_NE(r.output.find("checkpoints: off"), std::string::npos) << r.output;
  EXPECT_EQ(rows, 4) << r.output;
  EXPECT_EQ(moving, 4) << r.output;
  // --json: the JobStatus message, every stage in it.
  auto json = RunProcess({testing::BinDir() + "/localpar", "status", m[1].str(), "--json"}, 30);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  v1::JobStatus parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.output, &parsed).ok())
      << json.output;
  EXPECT_EQ(parsed.stages_size(), 4);
  EXPECT_EQ(parsed.total_steps(), 500);
  // Pointed at a worker, it says what is wrong.
  std::smatch worker;
  std::string first_row = r.output.substr(r.output.find("\n    0 "));
  ASSERT_TRUE(std::regex_search(first_row, worker, std::regex("127\\.0\\.0\\.1:[0-9]+")));
  auto wrong = RunProcess({testing::BinDir() + "/localpar", "status", worker[0].str()}, 30);
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
  EXPECT_NE(wrong.output.find(worker[0].str() + " is not a coordinator"), std::string::npos)
      << wrong.output;
  // --watch_s: it prints until the coordinator goes away, then exits 0.
  pid_t watch = testing::StartProcess(
      {testing::BinDir() + "/localpar", "status", m[1].str(), "--watch_s=0.2"},
      run.dir.path() + "/watch.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // each round samples 1 s
  kill(run.launcher, SIGINT);
  testing::WaitProcess(run.launcher, 30);
  EXPECT_EQ(testing::WaitProcess(watch, 30), 0) << ReadFile(run.dir.path() + "/watch.log");
  std::string watched = ReadFile(run.dir.path() + "/watch.log");
  EXPECT_NE(watched.find("stopped answering"), std::string::npos) << watched;
  size_t rounds = 0;
  for (size_t at = 0; (at = watched.find("pipe (GREEDY): epoch", at)) != std::string::npos; ++at) {
    ++rounds;
  }
  EXPECT_GE(rounds, 2u) << watched;
}

std::string StatusAddress(const LongRun& run) {
  std::string log;
  std::smatch m;
  std::regex announce("localpar status (127\\.0\\.0\\.1:[0-9]+)");
  for (int i = 0; i < 100 && !std::regex_search(log, m, announce); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log = ReadFile(run.dir.path() + "/log");
  }
  return std::regex_search(log, m, announce) ? m[1].str() : "";
}

TEST(Launcher, ACheckpointOnDemandCommitsAndStatusShowsIt) {
  TempDir ckpt;
  LongRun run({"--checkpoint_dir=" + ckpt.path()});
  ASSERT_EQ(run.children.size(), 5u) << ReadFile(run.dir.path() + "/log");
  const std::string address = StatusAddress(run);
  ASSERT_FALSE(address.empty()) << ReadFile(run.dir.path() + "/log");
  auto before = RunProcess({testing::BinDir() + "/localpar", "status", address}, 30);
  ASSERT_EQ(before.exit_code, 0) << before.output;
  EXPECT_NE(before.output.find("checkpoints: none committed yet"), std::string::npos)
      << before.output;
  auto asked = RunProcess({testing::BinDir() + "/localpar", "checkpoint", address}, 30);
  ASSERT_EQ(asked.exit_code, 0) << asked.output;
  EXPECT_NE(asked.output.find("a checkpoint follows the next step fed (step "), std::string::npos)
      << asked.output;
  EXPECT_NE(asked.output.find("the last stage is at step "), std::string::npos) << asked.output;
  testing::ProcessResult r;
  for (int i = 0; i < 60; ++i) {
    r = RunProcess({testing::BinDir() + "/localpar", "status", address}, 30);
    if (r.output.find("last checkpoint: " + ckpt.path() + "/ckpt-000001") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_NE(r.output.find("last checkpoint: " + ckpt.path() + "/ckpt-000001 ("), std::string::npos)
      << r.output;
  EXPECT_TRUE(std::filesystem::exists(ckpt.path() + "/ckpt-000001/MANIFEST")) << r.output;
  kill(run.launcher, SIGINT);
  testing::WaitProcess(run.launcher, 30);
}

TEST(Launcher, CtrlCStopsEveryProcess) {
  LongRun run;
  ASSERT_EQ(run.children.size(), 5u) << ReadFile(run.dir.path() + "/log");
  kill(run.launcher, SIGINT);
  EXPECT_EQ(testing::WaitProcess(run.launcher, 30), 130) << ReadFile(run.dir.path() + "/log");
  for (pid_t c : run.children) EXPECT_FALSE(testing::ProcessAlive(c)) << c;
}

TEST(Launcher, AKilledWorkerStopsTheJobWithWorkerLost) {
  LongRun run;
  ASSERT_EQ(run.children.size(), 5u) << ReadFile(run.dir.path() + "/log");
  // Children are started in stage order, the coordinator last.
  kill(run.children[2], SIGKILL);
  EXPECT_EQ(testing::WaitProcess(run.launcher, 60), 5) << ReadFile(run.dir.path() + "/log");
  std::string log = ReadFile(run.dir.path() + "/log");
  EXPECT_NE(log.find("worker for stage"), std::string::npos) << log;
  for (pid_t c : run.children) EXPECT_FALSE(testing::ProcessAlive(c)) << c;
}

}  // namespace
}  // namespace localpar
