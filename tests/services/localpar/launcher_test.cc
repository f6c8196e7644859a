// `localpar run` as a user runs it: refusals before anything starts, own data, metrics,
// evaluations, divergence, status, checkpoints on demand, Ctrl-C and lost workers; and
// `localpar plan` and a worker whose port is taken.
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
#include "common/job/parse.h"
#include "common/model_io/checkpoint.h"
#include "common/model_io/tensor_proto.h"
#include "common/run/reference_run.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "proto/localpar.pb.h"
#include "proto/report.pb.h"
#include "services/common/spawn.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::ExpectWeightsFileEquals;
using testing::PipelineJob;
using testing::ReadFile;
using testing::RunProcess;
using testing::SmallJob;
using testing::TempDir;

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

// A directory of the user's own: the error names the field and the folder (and, for a
// folder that is there, the files looked for), and does not send the user to the Debian
// package (that hint is for the default directory only).
TEST(Launcher, AMissingDataSetIsADataErrorNamingTheFiles) {
  TempDir dir;
  std::string job = dir.Write("job.textproto",
                              "rule: GREEDY data { fashion_mnist { dir: \"/nonexistent\" } }\n"
                              "stages { layers { linear { out_features: 4 } } }\n");
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job}, 30);
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("data.fashion_mnist.dir: /nonexistent: no such file or folder"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("dataset-fashion-mnist"), std::string::npos) << r.output;
  std::filesystem::create_directories(dir.path() + "/idx");
  job = dir.Write("job.textproto",
                  "rule: GREEDY data { fashion_mnist { dir: \"idx\" } }\n"
                  "stages { layers { linear { out_features: 4 } } }\n");
  r = RunProcess({testing::BinDir() + "/localpar", "run", job}, 30);
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find(dir.path() + "/idx/train-images-idx3-ubyte.gz (or " + dir.path() +
                          "/idx/train-images-idx3-ubyte): no such file"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("dataset-fashion-mnist"), std::string::npos) << r.output;
}

// --pin_workers: each worker process on a CPU of its own, as on its own machine (the cost
// model's one device per stage). The kernel's own view of a pinned child, then a whole run.
TEST(Launcher, PinnedWorkersEachRunOnOneCpu) {
  TempDir dir;
  const std::vector<int> cpus = AllowedCpus();
  const std::string seen = dir.path() + "/affinity";
  pid_t pid = SpawnProcess({"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"}, seen,
                           cpus.back());
  ASSERT_EQ(testing::WaitProcess(pid, 10), 0);
  EXPECT_NE(ReadFile(seen).find("Cpus_allowed_list:\t" + std::to_string(cpus.back()) + "\n"),
            std::string::npos)
      << ReadFile(seen);

  const std::string job = dir.Write("small.textproto", SmallJob("GREEDY", 1));
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job, "--pin_workers",
                       "--max_steps=3", "--out=" + dir.path() + "/out"},
                      60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 4; ++k) {
    const std::string want =
        absl::StrCat("worker ", k, " on CPU ", cpus[static_cast<size_t>(k) % cpus.size()]);
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  }
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

// The `localpar status` address the launcher announces in its log, or "" after 5 s.
std::string StatusAddress(const TempDir& dir) {
  std::string log;
  std::smatch m;
  std::regex announce("localpar status (127\\.0\\.0\\.1:[0-9]+)");
  for (int i = 0; i < 100 && !std::regex_search(log, m, announce); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log = ReadFile(dir.path() + "/log");
  }
  return std::regex_search(log, m, announce) ? m[1].str() : "";
}

// Starts a long run, waits until all four workers are up, then does something to it.
struct LongRun {
  TempDir dir;
  pid_t launcher = -1;
  std::vector<pid_t> children;
  // 10 steps an epoch; the last stage `slow_ms` slower per step.
  explicit LongRun(const std::vector<std::string>& extra = {}, int epochs = 50, int slow_ms = 20) {
    std::string job = dir.Write("job.textproto", PipelineJob(epochs, 64 * 10));
    std::vector<std::string> argv = {
        testing::BinDir() + "/localpar",       "run", job, "--quiet", "--slow_stage=3",
        "--slow_ms=" + std::to_string(slow_ms)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    launcher = testing::StartProcess(argv, dir.path() + "/log");
    for (int i = 0; i < 500 && children.size() < 5; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      children = testing::LaunchedProcesses(launcher);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // training under way
  }
  // True once `localpar status` shows the last stage past its first steps: every stage is
  // configured and training. A worker lost before it was configured is only restarted.
  bool Training() const {
    const std::string address = StatusAddress(dir);
    if (address.empty()) return false;
    std::regex step("training, step ([0-9]+)/");
    for (int i = 0; i < 300; ++i) {
      auto r = RunProcess({testing::BinDir() + "/localpar", "status", address}, 30);
      std::smatch m;
      if (r.exit_code == 0 && std::regex_search(r.output, m, step) && std::stoi(m[1]) >= 2) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
};

TEST(Launcher, StatusShowsEveryStageOfTheRunningJob) {
  LongRun run;
  ASSERT_EQ(run.children.size(), 5u) << ReadFile(run.dir.path() + "/log");
  const std::string address = StatusAddress(run.dir);
  ASSERT_FALSE(address.empty()) << ReadFile(run.dir.path() + "/log");
  // One row per stage, each with a positive examples/s (the column after the address).
  // The status port opens before the workers are configured, so allow start-up time.
  std::regex row("\\n +([0-3]) +127\\.0\\.0\\.1:[0-9]+ +([0-9]+) ");
  testing::ProcessResult r;
  int rows = 0, moving = 0;
  for (int attempt = 0; attempt < 15 && moving < 4; ++attempt) {
    r = RunProcess({testing::BinDir() + "/localpar", "status", address}, 30);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    rows = moving = 0;
    for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), row);
         it != std::sregex_iterator(); ++it) {
      ++rows;
      moving += std::stoi((*it)[2]) > 0;
    }
  }
  EXPECT_NE(r.output.find("pipe (GREEDY): epoch"), std::string::npos) << r.output;
  // Under load the coordinator may have fed every step already ("finishing") while the
  // slowed last stage still works through them.
  EXPECT_TRUE(
      std::regex_search(r.output, std::regex(", (training|evaluating|finishing), step [0-9]+/500 "
                                             "\\(the last stage; [0-9]+ fed\\)")))
      << r.output;
  EXPECT_NE(r.output.find("checkpoints: off"), std::string::npos) << r.output;
  EXPECT_EQ(rows, 4) << r.output;
  EXPECT_EQ(moving, 4) << r.output;
  // --json: the JobStatus message, every stage in it.
  auto json = RunProcess({testing::BinDir() + "/localpar", "status", address, "--json"}, 30);
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
  pid_t watch =
      testing::StartProcess({testing::BinDir() + "/localpar", "status", address, "--watch_s=0.2"},
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

TEST(Launcher, ACheckpointOnDemandCommitsAndStatusShowsIt) {
  TempDir ckpt;
  // 2000 steps: on a loaded machine the first 500 can all be fed (the sockets between stages
  // buffer a few hundred) before the request comes, and then no checkpoint would follow.
  LongRun run({"--checkpoint_dir=" + ckpt.path()}, 200);
  ASSERT_EQ(run.children.size(), 5u) << ReadFile(run.dir.path() + "/log");
  const std::string address = StatusAddress(run.dir);
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

// Asked for once every step is fed, it says that none will follow instead of promising one.
TEST(Launcher, ACheckpointAskedForAfterTheLastStepIsFedIsRefused) {
  TempDir ckpt;
  // 50 steps, all fed in well under a second; the last stage takes 100 ms each.
  LongRun run({"--checkpoint_dir=" + ckpt.path()}, 5, 100);
  ASSERT_EQ(run.children.size(), 5u) << ReadFile(run.dir.path() + "/log");
  const std::string address = StatusAddress(run.dir);
  ASSERT_FALSE(address.empty()) << ReadFile(run.dir.path() + "/log");
  testing::ProcessResult status;
  for (int i = 0; i < 20; ++i) {
    status = RunProcess({testing::BinDir() + "/localpar", "status", address}, 30);
    if (status.output.find(", finishing, step ") != std::string::npos) break;
  }
  ASSERT_NE(status.output.find(", finishing, step "), std::string::npos) << status.output;
  auto asked = RunProcess({testing::BinDir() + "/localpar", "checkpoint", address}, 30);
  EXPECT_EQ(asked.exit_code, 1) << asked.output;
  EXPECT_NE(asked.output.find("every step (50) is fed already and no checkpoint follows the last"),
            std::string::npos)
      << asked.output;
  EXPECT_EQ(testing::WaitProcess(run.launcher, 60), 0) << ReadFile(run.dir.path() + "/log");
}

// Ctrl-C stops the run at a step: every process goes, the weights and the report so far
// are written, and the message says what was kept and how to go on.
TEST(Launcher, CtrlCStopsEveryProcessAndSaysWhatWasLost) {
  TempDir out;
  LongRun run({"--out=" + out.path()});
  ASSERT_EQ(run.children.size(), 5u) << ReadFile(run.dir.path() + "/log");
  kill(run.launcher, SIGINT);
  EXPECT_EQ(testing::WaitProcess(run.launcher, 60), 130) << ReadFile(run.dir.path() + "/log");
  for (pid_t c : run.children) EXPECT_FALSE(testing::ProcessAlive(c)) << c;
  const std::string log = ReadFile(run.dir.path() + "/log");
  EXPECT_NE(log.find("localpar: interrupted after step "), std::string::npos) << log;
  EXPECT_NE(
      log.find(" of 500; the weights after that step and the report so far are in " + out.path()),
      std::string::npos)
      << log;
  EXPECT_NE(log.find("with no --checkpoint_dir this run cannot be resumed"), std::string::npos)
      << log;
  EXPECT_NE(ReadFile(out.path() + "/report.json").find("\"interrupted\": true"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(out.path() + "/weights.pb"));
}

// With checkpoints, Ctrl-C leaves one at the step it stopped at, names it and the flag that
// continues it; continuing ends bitwise equal to the uninterrupted reference.
TEST(Launcher, CtrlCCheckpointsAndTheRunContinuesBitwiseEqual) {
  TempDir ckpt;
  LongRun run({"--checkpoint_dir=" + ckpt.path(), "--checkpoint_every_steps=100000"});
  ASSERT_EQ(run.children.size(), 5u) << ReadFile(run.dir.path() + "/log");
  kill(run.launcher, SIGINT);
  EXPECT_EQ(testing::WaitProcess(run.launcher, 60), 130) << ReadFile(run.dir.path() + "/log");
  for (pid_t c : run.children) EXPECT_FALSE(testing::ProcessAlive(c)) << c;
  const std::string log = ReadFile(run.dir.path() + "/log");
  EXPECT_NE(log.find("no --out, so no weights or report were written"), std::string::npos) << log;
  EXPECT_NE(log.find("; checkpoint " + ckpt.path() +
                     "/ckpt-000001 holds the run: to continue, "
                     "run the same command with --resume=" +
                     ckpt.path()),
            std::string::npos)
      << log;
  const std::string job = run.dir.path() + "/job.textproto";
  auto resumed = RunProcess({testing::BinDir() + "/localpar", "run", job, "--quiet",
                             "--resume=" + ckpt.path(), "--out=" + run.dir.path() + "/resumed"},
                            300);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + ckpt.path() + "/ckpt-000001"), std::string::npos)
      << resumed.output;
  ExpectWeightsFileEquals(run.dir.path() + "/resumed/weights.pb",
                          testing::ReferenceWeights(job, run.dir.path() + "/ref"));
}

// `localpar train` stops at a step too, and says it cannot resume.
TEST(Launcher, CtrlCStopsTrainAtAStepWritingWhatItHas) {
  TempDir dir;
  const std::string job = dir.Write("job.textproto", PipelineJob(50, 64 * 10));
  pid_t train = testing::StartProcess(
      {testing::BinDir() + "/localpar", "train", job, "--out=" + dir.path() + "/out"},
      dir.path() + "/log");
  for (int i = 0; i < 500 && ReadFile(dir.path() + "/log").find("step") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(train, SIGINT);
  EXPECT_EQ(testing::WaitProcess(train, 60), 130);
  const std::string log = ReadFile(dir.path() + "/log");
  EXPECT_NE(log.find("localpar: interrupted after step "), std::string::npos) << log;
  EXPECT_NE(log.find("`localpar train` keeps no checkpoints, so it cannot resume"),
            std::string::npos)
      << log;
  EXPECT_NE(ReadFile(dir.path() + "/out/report.json").find("\"interrupted\": true"),
            std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/out/weights.pb"));
}

// A signal may arrive while oneDNN's JIT GEMM has the stack pointer in a heap buffer; its
// frame must go to the handler's own stack, or it overwrites the heap (this failed about
// one run in three before the alternate signal stack). Ten interrupts at different moments
// of a step: each run stops cleanly, saying so.
TEST(Launcher, CtrlCAtAnyMomentOfAStepStopsCleanly) {
  TempDir dir;
  const std::string job = dir.Write("job.textproto", PipelineJob(50, 64 * 10));
  for (int i = 0; i < 10; ++i) {
    const std::string log_path = absl::StrCat(dir.path(), "/log", i);
    pid_t train = testing::StartProcess(
        {testing::BinDir() + "/localpar", "train", job, "--out=" + dir.path() + "/out"}, log_path);
    for (int t = 0; t < 500 && ReadFile(log_path).find("step") == std::string::npos; ++t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * i));
    kill(train, SIGINT);
    EXPECT_EQ(testing::WaitProcess(train, 60), 130) << "interrupt " << i << ":\n"
                                                    << ReadFile(log_path);
    EXPECT_NE(ReadFile(log_path).find("localpar: interrupted after step "), std::string::npos)
        << ReadFile(log_path);
  }
}

TEST(Launcher, AKilledWorkerStopsTheJobWithWorkerLost) {
  LongRun run;
  ASSERT_EQ(run.children.size(), 5u) << ReadFile(run.dir.path() + "/log");
  ASSERT_TRUE(run.Training()) << ReadFile(run.dir.path() + "/log");
  // Children are started in stage order, the coordinator last.
  kill(run.children[2], SIGKILL);
  EXPECT_EQ(testing::WaitProcess(run.launcher, 60), 5) << ReadFile(run.dir.path() + "/log");
  std::string log = ReadFile(run.dir.path() + "/log");
  EXPECT_NE(log.find("worker for stage"), std::string::npos) << log;
  for (pid_t c : run.children) EXPECT_FALSE(testing::ProcessAlive(c)) << c;
}

}  // namespace
}  // namespace localpar
