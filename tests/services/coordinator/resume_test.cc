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

INSTANTIATE_TEST_SUITE_P(Rules, ResumeMatchesUninterrupted,
                         ::testing::Values("GREEDY", "CHUNKED", "OVERLAP", "BACKPROP"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace localpar
