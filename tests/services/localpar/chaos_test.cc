// Chaos: a seeded sequence of SIGKILL, SIGSTOP and SIGTERM sent to random processes of a
// local cluster (workers and the coordinator) at random times, the first second and the
// last second of the run included. Every run must complete with weights bitwise equal to
// `localpar train` of the same job.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <random>
#include <thread>

#include "common/model_io/tensor_proto.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

struct Event {
  double at_s;  // after the last process appeared
  int target;   // 0..3 the workers in stage order, 4 the coordinator
  int signal;
};

std::string Name(int signal) {
  return signal == SIGKILL ? "SIGKILL" : signal == SIGSTOP ? "SIGSTOP" : "SIGTERM";
}

class Chaos : public ::testing::TestWithParam<std::string> {};

TEST_P(Chaos, RandomKillsStopsAndTermsStillEndBitwiseEqualToTheReferenceTrainer) {
  const std::string rule = GetParam();
  testing::TempDir dir;
  std::string text = testing::SmallJob(rule, rule == "BACKPROP" ? 3 : 1);
  text.replace(text.find("epochs: 2"), 9, "epochs: 6");
  const std::string job = dir.Write("job.textproto", text);
  const std::string bin = testing::BinDir() + "/localpar";
  auto ref =
      testing::RunProcess({bin, "train", job, "--quiet", "--out=" + dir.path() + "/ref"}, 120);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/ref/weights.pb");
  ASSERT_TRUE(want.ok());
  const std::vector<std::string> run = {
      bin, "run", job, "--quiet", "--slow_stage=3", "--slow_ms=20", "--checkpoint_every_steps=3"};

  // How long an undisturbed run takes, so that "the last second" means something.
  auto start = Clock::now();
  auto calm = testing::RunProcess({run[0], run[1], run[2], run[3], run[4], run[5]}, 120);
  ASSERT_EQ(calm.exit_code, 0) << calm.output;
  const double length = std::chrono::duration<double>(Clock::now() - start).count();

  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(rule)) % 1000 + 17);
  const int signals[] = {SIGKILL, SIGSTOP, SIGTERM};
  for (int round = 0; round < 2; ++round) {
    // One event in the first second, one in the last second of an undisturbed run.
    std::vector<Event> events = {
        {std::uniform_real_distribution<double>(0.0, 1.0)(rng), static_cast<int>(rng() % 5),
         signals[rng() % 3]},
        {std::max(1.0, length - std::uniform_real_distribution<double>(0.0, 1.0)(rng)),
         static_cast<int>(rng() % 5), signals[rng() % 3]}};
    const std::string at = dir.path() + "/round" + std::to_string(round);
    std::vector<std::string> argv = run;
    argv.push_back("--checkpoint_dir=" + at + "/ckpt");
    argv.push_back("--out=" + at + "/out");
    pid_t launcher = testing::StartProcess(argv, at + ".log");
    std::vector<pid_t> children;
    for (int i = 0; i < 500 && children.size() < 5; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      children = testing::LaunchedProcesses(launcher);
    }
    ASSERT_EQ(children.size(), 5u) << testing::ReadFile(at + ".log");
    const auto t0 = Clock::now();
    std::string plan;
    for (const Event& e : events) {
      std::this_thread::sleep_until(t0 + std::chrono::duration<double>(e.at_s));
      std::vector<pid_t> now = testing::LaunchedProcesses(launcher);  // restarts have new pids
      if (e.target < static_cast<int>(now.size())) kill(now[e.target], e.signal);
      plan += " " + Name(e.signal) + " to " +
              (e.target == 4 ? "the coordinator" : "stage " + std::to_string(e.target)) + " at " +
              std::to_string(e.at_s) + " s;";
    }
    const int rc = testing::WaitProcess(launcher, 240);
    const std::string log = testing::ReadFile(at + ".log");
    ASSERT_EQ(rc, 0) << rule << ", round " << round << ":" << plan << "\n" << log;
    testing::ExpectWeightsFileEquals(at + "/out/weights.pb", *want);
    if (HasFailure()) ADD_FAILURE() << plan << "\n" << log;
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, Chaos, ::testing::Values("GREEDY", "OVERLAP", "BACKPROP"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace localpar
