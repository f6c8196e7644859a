// Stage replicas: bitwise equal to the reference with replicas, bad counts refused, and a
// stop and resume that keeps every replica's snapshot.
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

using testing::ExpectClusterEqualsReference;
using testing::ExpectWeightsFileEquals;
using testing::JsonNumbers;
using testing::ReadFile;
using testing::ReferenceWeights;
using testing::RunProcess;
using testing::SmallJob;
using testing::TempDir;

// Stage replicas: 4 stages x 2 or 3 replicas, one worker each (8 or 12 processes), every
// batch split among a stage's replicas, their gradients gathered over their mesh and added in
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

// BACKPROP's 1F1B and ZB schedules with replicas: the exchange starts as each layer's
// gradients become final (after the weight half, under ZB), and the cluster still ends
// bitwise equal to the reference trainer, and to GPipe's weights.
TEST(Replicas, OneForwardOneBackwardAndZeroBubbleWithReplicasMatchTheReferenceAndGPipe) {
  TempDir dir;
  const std::string base = SmallJob("BACKPROP", 3) + "replicas: 2\n";
  v1::ModelWeights gpipe =
      ReferenceWeights(dir.Write("gpipe.textproto", base), dir.path() + "/gpipe");
  for (const char* schedule : {"PIPELINE_1F1B", "PIPELINE_ZB"}) {
    SCOPED_TRACE(schedule);
    TempDir run;
    std::string job =
        run.Write("job.textproto", base + "pipeline_schedule: " + std::string(schedule) + "\n");
    v1::ModelWeights want = ExpectClusterEqualsReference(run, job);
    if (HasFailure()) return;
    testing::ExpectBitwiseEqual(want, gpipe);
  }
}

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

// With replicas every replica writes its own snapshot to its own storage; the manifest
// lists them all, and a resumed run ends bitwise equal to an uninterrupted one.
TEST(Replicas, StopAndResumeEndsBitwiseEqualWithEveryReplicasSnapshotInTheManifest) {
  TempDir dir;
  std::string job = dir.Write("job.textproto", SmallJob("BACKPROP", 3) + "replicas: 2\n");
  const std::string bin = testing::BinDir() + "/localpar", ckpt = dir.path() + "/ckpt";
  testing::RunFullThenStopAfterFive(dir, job, ckpt);
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

}  // namespace
}  // namespace localpar
