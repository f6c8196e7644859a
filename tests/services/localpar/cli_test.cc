// The localpar command line as a user meets it: per-command help, usage errors with exit 2,
// the stage programs a job runs, and run flags that reach the coordinator.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <sstream>

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
  EXPECT_NE(r.output.find("--device: expected one of cpu, cuda, auto, got 'gpu'"),
            std::string::npos)
      << r.output;
  r = RunProcess({Bin(), "validate", Smoke(), "--rule=sideways"}, 10);
  EXPECT_EQ(r.exit_code, 2) << "a bad flag value is a usage error, not a bad job";
  EXPECT_NE(r.output.find("--rule: expected one of BACKPROP, GREEDY, CHUNKED, OVERLAP"),
            std::string::npos)
      << r.output;
  r = RunProcess({Bin(), "run", Smoke(), "--non_finite=drop"}, 10);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("expected one of REJECT, SKIP"), std::string::npos) << r.output;
  r = RunProcess({Bin(), "fly"}, 10);
  EXPECT_EQ(r.exit_code, 2);
  r = RunProcess({Bin(), "validate"}, 10);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("expected one job file"), std::string::npos) << r.output;
}

// Everything that can be checked is checked before a process starts: the answer comes at
// once, with exit 2 for flags, and leaves no log folder behind.
TEST(Cli, RunChecksFlagsBeforeStartingAnyProcess) {
  auto r = RunProcess({Bin(), "run", Smoke(), "--metrics_listen=nonsense"}, 10);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--metrics_listen=nonsense: not IPV4:PORT"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("worker logs are in"), std::string::npos) << r.output;
  // A port someone else holds.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string held = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  r = RunProcess({Bin(), "run", Smoke(), "--metrics_listen=" + held}, 10);
  close(fd);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--metrics_listen=" + held + ": cannot listen there"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("worker logs are in"), std::string::npos) << r.output;
}

// `run` starts a process per stage replica: a job that needs more than the machine holds is
// refused before any starts, with the estimate and how to go on.
TEST(Cli, RunRefusesMoreLocalWorkersThanTheMachineHolds) {
  TempDir dir;
  std::string many = "rule: GREEDY data { synthetic {} }\n";
  for (int k = 0; k < 1000; ++k) many += "stages { layers { relu {} } }\n";
  const std::string job = dir.Write("many.textproto", many);
  auto r = RunProcess({Bin(), "run", job}, 30);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the job needs 1000 worker processes (1000 stages x 1 replicas)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("MiB available"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("workers up"), std::string::npos) << r.output;
  r = RunProcess({Bin(), "run", Smoke(), "--max_local_workers=1"}, 30);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--max_local_workers is 1"), std::string::npos) << r.output;
}

TEST(Cli, SmallerRoughEdges) {
  TempDir dir;
  // An empty job file says so.
  const std::string empty = dir.Write("empty.textproto", "# nothing yet\n\n");
  auto r = RunProcess({Bin(), "validate", empty}, 10);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("empty.textproto: empty file"), std::string::npos) << r.output;
  // validate names the defaults the text format leaves out.
  const std::string plain = dir.Write("plain.textproto",
                                      "rule: GREEDY seed: 0 data { synthetic {} }\n"
                                      "stages { layers { linear { out_features: 4 } } }\n");
  r = RunProcess({Bin(), "validate", plain}, 10);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* want : {"#   seed: 0", "#   stages[0].name: none (messages say stages[0])",
                           "#   stages[0].head.kind: LINEAR"}) {
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  }
  // An export whose file name and --format disagree.
  r = RunProcess({Bin(), "export", Smoke(), dir.path() + "/w.pb", "--out=" + dir.path() + "/x.onnx",
                  "--format=safetensors"},
                 10);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("x.onnx names a .onnx file, but --format=safetensors"), std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/x.onnx"));
}

// Names reach terminals: a job file's control characters are refused, naming the field.
// What a killed writer left in --out is cleaned when the next run starts there; a live
// writer's file is left alone.
TEST(Cli, ControlCharactersInNamesAndStaleTemporariesAreHandled) {
  TempDir dir;
  const std::string evil =
      dir.Write("evil.textproto",
                "name: \"evil\\033]0;pwned\\007\" rule: GREEDY data { synthetic {} }\n"
                "stages { layers { linear { out_features: 4 } } }\n");
  auto r = RunProcess({Bin(), "validate", evil}, 10);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("name: holds a control character (byte 0x1b at 4)"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find('\033'), std::string::npos) << "the escape itself is never echoed";
  const std::string out = dir.path() + "/out";
  std::filesystem::create_directories(out);
  const std::string dead = out + "/weights.pb.tmp.99999999";  // above any pid_max
  const std::string live = out + "/report.json.tmp." + std::to_string(getpid());
  dir.Write("out/weights.pb.tmp.99999999", "half a file");
  dir.Write("out/report.json.tmp." + std::to_string(getpid()), "being written");
  r = RunProcess({Bin(), "train", Smoke(), "--max_steps=1", "--quiet", "--out=" + out}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dead)) << "a killed writer's temporary file stays";
  EXPECT_TRUE(std::filesystem::exists(live)) << "a live writer's file was removed";
}

TEST(Cli, FlagValuesTakeAnyCase) {
  // Enum-like values in any case: rules, devices, the non-finite policy.
  auto r = RunProcess({Bin(), "validate", Smoke(), "--rule=backprop"}, 10);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rule: BACKPROP"), std::string::npos) << r.output;
  r = RunProcess(
      {Bin(), "train", Smoke(), "--device=CPU", "--rule=Greedy", "--max_steps=1", "--quiet"}, 30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = RunProcess({Bin(), "run", Smoke(), "--device=Cpu", "--non_finite=skip", "--max_steps=1",
                  "--quiet", "--status_listen="},
                 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// The flags each command's --help lists, and no others: a flag a command does not use is
// neither listed nor accepted.
TEST(Cli, EachCommandListsOnlyItsOwnFlags) {
  auto flags = [](const std::string& command) {
    auto r = RunProcess({Bin(), command, "--help"}, 10);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::set<std::string> out;
    std::istringstream in(r.output);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("  --", 0) != 0) continue;
      out.insert(line.substr(4, line.find_first_of("= ", 4) - 4));
    }
    return out;
  };
  using Set = std::set<std::string>;
  EXPECT_EQ(flags("data"), Set({"data_path"}));
  EXPECT_EQ(flags("export"),
            Set({"data_path", "external_data", "format", "out", "shard_mib", "stage", "stages"}));
  EXPECT_EQ(flags("predict"), Set({"batch_size", "data_path", "device", "input", "input_scaled",
                                   "labels", "logits", "out", "stage", "stages", "threads"}));
  EXPECT_EQ(flags("sample"), Set({"cache", "data_path", "device", "prompt", "seed", "stages",
                                  "temperature", "threads", "tokens", "top_k", "vocabulary"}));
  EXPECT_EQ(flags("plan"),
            Set({"batch_size", "data_path", "device", "naive", "rule", "stages", "threads"}));
  EXPECT_EQ(flags("project"),
            Set({"batch_size", "cores", "data_path", "device", "json", "latency_us", "link_gbps",
                 "project_stages", "replicas", "rule", "stages", "threads"}));
  EXPECT_EQ(
      flags("validate"),
      Set({"batch_size", "data_path", "epochs", "eval_every_steps", "explain", "lr", "max_steps",
           "memory_limit_mib", "micro_batches", "outer_lr", "outer_momentum", "replicas", "resume",
           "rule", "schedule", "seed", "stages", "sync_bf16", "sync_every"}));
  const Set run = flags("run");
  EXPECT_TRUE(run.count("resume_if_present")) << "run takes the coordinator's restart flag";
  EXPECT_TRUE(run.count("resume") && run.count("checkpoint_dir"));
  auto r = RunProcess({Bin(), "data", Smoke(), "--epochs=3"}, 10);
  EXPECT_EQ(r.exit_code, 2) << "data takes no --epochs: " << r.output;
  r = RunProcess({Bin(), "export", Smoke(), "w.pb", "--lr=0.1"}, 10);
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// Figures on examples held out of the training data are validation figures, everywhere a
// user reads them; a data set's own test split keeps the name test.
TEST(Cli, HeldOutFiguresAreCalledValidationAndATestSplitTest) {
  TempDir dir;
  const std::string held = dir.Write("held.textproto", R"(name: "held" rule: GREEDY batch_size: 32
epochs: 1 seed: 7
data { synthetic { train_examples: 256 test_examples: 64 shape: [8] classes: 3 seed: 3 }
       holdout_fraction: 0.25 }
optimizer { sgd {} } schedule { lr: 0.05 }
stages { layers { linear { out_features: 8 } } }
stages { layers { linear { out_features: 8 } } }
)");
  for (const char* how : {"train", "run"}) {
    SCOPED_TRACE(how);
    const std::string out = dir.path() + "/" + how;
    auto r = RunProcess({Bin(), how, held, "--out=" + out}, 60);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("epoch 1: validation accuracy s0 "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("valid loss valid acc"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("test "), std::string::npos) << r.output;
    const std::string report = testing::ReadFile(out + "/report.json");
    EXPECT_NE(report.find("\"eval_split\": \"validation\""), std::string::npos) << report;
    EXPECT_NE(report.find("\"validation\": [\n"), std::string::npos) << report;
    EXPECT_NE(report.find("\"test\": []"), std::string::npos) << report;
    const std::string metrics = testing::ReadFile(out + "/metrics.jsonl");
    EXPECT_NE(metrics.find("\"kind\":\"validation\""), std::string::npos) << metrics;
    EXPECT_EQ(metrics.find("\"kind\":\"test\""), std::string::npos) << metrics;
  }
  auto r = RunProcess({Bin(), "data", held}, 30);
  EXPECT_NE(r.output.find("\"validation_examples\": 64"), std::string::npos) << r.output;
  // The same job on the data set's test split.
  r = RunProcess({Bin(), "train", Smoke(), "--max_steps=2"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(": test accuracy s0 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("test loss  test acc"), std::string::npos) << r.output;
  r = RunProcess({Bin(), "data", Smoke()}, 30);
  EXPECT_NE(r.output.find("\"test_examples\": 128"), std::string::npos) << r.output;
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
