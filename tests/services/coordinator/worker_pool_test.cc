// The coordinator's worker pool against real worker processes: configuring every stage,
// statistics, weights, naming the stages that do not answer, and the exit code a worker's
// refusal carries.
#include "services/coordinator/worker_pool.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <thread>

#include "common/job/defaults.h"
#include "common/job/parse.h"
#include "common/job/spec.h"
#include "google/protobuf/text_format.h"
#include "services/common/exit_codes.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::TempDir;

// Two workers on loopback, stopped with the test.
struct Workers {
  TempDir dir;
  std::vector<pid_t> pids;
  std::vector<std::string> addresses;
  Workers() {
    testing::StartedWorkers w = testing::StartWorkers(dir.path(), 2);
    pids = w.pids;
    addresses = w.addresses;
  }
  ~Workers() {
    for (pid_t p : pids) {
      kill(p, SIGTERM);
      testing::WaitProcess(p, 10);
    }
  }
};

v1::Job TwoStages(int out_features) {
  v1::Job job;
  const std::string text = R"(name: "pool" rule: GREEDY batch_size: 4
data { synthetic { train_examples: 8 test_examples: 4 shape: [3] classes: 2 } }
stages { layers { linear { out_features: 5 } } }
stages { layers { linear { out_features: )" +
                           std::to_string(out_features) + " } } }";
  absl::StatusOr<v1::Job> parsed = ParseJob(text, "pool.textproto");
  if (parsed.ok()) return *parsed;
  // An invalid job, as a peer might send it: parsed without checks.
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &job));
  ApplyJobDefaults(job);
  return job;
}

TEST(WorkerPool, ConfiguresEveryStageAndReadsItsStatisticsAndWeights) {
  Workers w;
  SecurityOptions security;
  WorkerPool pool(w.addresses, 1, security);
  EXPECT_EQ(pool.size(), 2);
  EXPECT_EQ(pool.Name(1, 0), "stage 1");
  StageSettings s;
  s.total_steps = 2;
  absl::StatusOr<ConfigureOutcome> out = pool.ConfigureAll(TwoStages(4), s, 10);
  ASSERT_TRUE(out.ok()) << out.status();
  // 3 -> 5 with a 5 -> 2 head, then 5 -> 4 with a 4 -> 2 head.
  EXPECT_EQ(out->parameters, (3 + 1) * 5 + (5 + 1) * 2 + (5 + 1) * 4 + (4 + 1) * 2);
  EXPECT_NE(out->backend.find("cpu"), std::string::npos);
  std::vector<std::optional<v1::StatsResponse>> stats = pool.PollStats(false, 5);
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_TRUE(stats[0] && stats[1]);
  EXPECT_EQ(stats[1]->stage(), 1);
  // The job's tensors are what the weights are checked against.
  absl::StatusOr<std::vector<std::vector<TensorSpec>>> specs =
      StageTensorSpecs(ToModelConfig(TwoStages(4)));
  ASSERT_TRUE(specs.ok()) << specs.status();
  pool.ExpectWeights(*specs, 10);
  absl::StatusOr<v1::StageWeights> weights = pool.Weights(1);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->params_size(), 4);  // the layer's weight and bias, the head's
  // A job that expects other tensors refuses them, naming the stage and the tensor.
  (*specs)[1][0].shape = {5, 9};
  pool.ExpectWeights(*specs, 10);
  weights = pool.Weights(1);
  ASSERT_FALSE(weights.ok());
  EXPECT_NE(weights.status().message().find("stage 1 sent weights that do not match the job (" +
                                            (*specs)[1][0].name + " is ["),
            std::string::npos)
      << weights.status();
  EXPECT_EQ(pool.Unreachable(2), "");
}

TEST(WorkerPool, AWorkersRefusalCarriesItsExitCodeAndALostWorkerIsNamed) {
  Workers w;
  SecurityOptions security;
  WorkerPool pool(w.addresses, 1, security);
  absl::StatusOr<ConfigureOutcome> bad = pool.ConfigureAll(TwoStages(0), StageSettings(), 10);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(ExitCodeOf(bad.status()), kExitBadJob) << bad.status();
  EXPECT_NE(bad.status().message().find("configuring stage 0 at " + w.addresses[0]),
            std::string::npos)
      << bad.status();
  kill(w.pids[1], SIGKILL);
  testing::WaitProcess(w.pids[1], 10);
  EXPECT_EQ(pool.Unreachable(2), "stage 1 (" + w.addresses[1] + ")");
  StageSettings s;
  s.total_steps = 2;
  absl::StatusOr<ConfigureOutcome> lost = pool.ConfigureAll(TwoStages(4), s, 2);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(ExitCodeOf(lost.status()), kExitWorkerLost) << lost.status();
}

}  // namespace
}  // namespace localpar
