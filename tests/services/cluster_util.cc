// Subprocess and file helpers for the cluster tests.
#include "tests/services/cluster_util.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "common/job/parse.h"
#include "common/model_io/tensor_proto.h"
#include "common/run/reference_run.h"
#include "services/common/spawn.h"

namespace localpar::testing {
namespace {

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

pid_t StartProcess(const std::vector<std::string>& argv, const std::string& log_path) {
  return SpawnProcess(argv, log_path);
}

int WaitProcess(pid_t pid, int timeout_s) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return DecodeStatus(status);
    if (r < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

ProcessResult RunProcess(const std::vector<std::string>& argv, int timeout_s) {
  TempDir dir;
  std::string log = dir.path() + "/out.log";
  pid_t pid = StartProcess(argv, log);
  ProcessResult r;
  r.exit_code = WaitProcess(pid, timeout_s);
  if (r.exit_code == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  r.output = ReadFile(log);
  return r;
}

std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid;
    if (rest >> state >> ppid && ppid == pid) out.push_back(std::stoi(name));
  }
  return out;
}

std::vector<pid_t> LaunchedProcesses(pid_t launcher) {
  std::map<int, pid_t> workers;
  pid_t coordinator = -1;
  for (pid_t child : ChildrenOf(launcher)) {
    std::ifstream in("/proc/" + std::to_string(child) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find("localpar_coordinator") != std::string::npos) coordinator = child;
    std::smatch m;
    static const std::regex kPortFile("/worker([0-9]+)\\.port");
    if (std::regex_search(cmdline, m, kPortFile)) workers[std::stoi(m[1])] = child;
  }
  std::vector<pid_t> out;
  for (const auto& [stage, pid] : workers) out.push_back(pid);
  if (coordinator > 0) out.push_back(coordinator);
  return out;
}

bool ProcessAlive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t close = line.rfind(')');
  return close != std::string::npos && line[close + 2] != 'Z';
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/localpar_test.XXXXXX";
  path_ = mkdtemp(tmpl);
}

TempDir::~TempDir() { std::filesystem::remove_all(path_); }

std::string TempDir::Write(const std::string& name, const std::string& text) const {
  std::string p = path_ + "/" + name;
  std::ofstream(p) << text;
  return p;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string BinDir() { return LOCALPAR_BIN_DIR; }

std::vector<double> JsonNumbers(const std::string& json, const std::string& key) {
  std::vector<double> out;
  std::string needle = "\"" + key + "\": ";
  for (size_t pos = json.find(needle); pos != std::string::npos; pos = json.find(needle, pos + 1)) {
    out.push_back(std::strtod(json.c_str() + pos + needle.size(), nullptr));
  }
  return out;
}

// Four stages touching every kind of layer the rules must agree on: conv, batch norm (its
// running statistics are in the weights compared), pooling, dropout
// (seeded per step and micro-batch), layer norm, a residual block, several head kinds, a
// cosine schedule with warm-up, and a partial last batch (200 = 6 x 30 + 20).
std::string SmallJob(const std::string& rule, int micro_batches) {
  std::ostringstream j;
  j << "name: \"small4\"\nrule: " << rule << "\nmicro_batches: " << micro_batches << R"(
batch_size: 30
epochs: 2
seed: 5
data { synthetic { train_examples: 200 test_examples: 50 shape: [6, 6, 1] classes: 5 seed: 2 noise: 0.7 } }
optimizer { adamw { weight_decay: 0.01 } }
schedule { kind: COSINE lr: 0.01 warmup_steps: 3 }
stages { layers { conv2d { out_channels: 4 padding: 1 } } layers { batch_norm {} } layers { relu {} } head { kind: CONV_POOL_LINEAR channels: 3 } }
stages { layers { max_pool { kernel: 2 } } layers { linear { out_features: 16 } } layers { gelu {} } layers { dropout { rate: 0.2 } } }
stages { layers { linear { out_features: 16 } } layers { layer_norm {} } layers { relu {} } head { kind: MLP hidden: 8 } }
stages { layers { residual { body { linear { out_features: 16 } } body { relu {} } } } }
)";
  return j.str();
}

void ExpectBitwiseEqual(const v1::ModelWeights& a, const v1::ModelWeights& b) {
  ASSERT_EQ(a.stages_size(), b.stages_size());
  int tensors = 0;
  for (int k = 0; k < a.stages_size(); ++k) {
    ASSERT_EQ(a.stages(k).params_size(), b.stages(k).params_size()) << "stage " << k;
    for (int i = 0; i < a.stages(k).params_size(); ++i) {
      const v1::NamedTensor& x = a.stages(k).params(i);
      const v1::NamedTensor& y = b.stages(k).params(i);
      EXPECT_EQ(x.name(), y.name());
      EXPECT_TRUE(x.tensor().data() == y.tensor().data())
          << "stage " << k << " " << x.name() << " differs";
      ++tensors;
    }
  }
  EXPECT_GT(tensors, 10);
}

// Reads a run's weights.pb and compares it with `want`, bit for bit.
void ExpectWeightsFileEquals(const std::string& path, const v1::ModelWeights& want) {
  absl::StatusOr<v1::ModelWeights> got = ReadWeightsFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectBitwiseEqual(*got, want);
}

v1::ModelWeights ReferenceWeights(const std::string& job_path, const std::string& out) {
  absl::StatusOr<v1::Job> job = LoadJobFile(job_path);
  EXPECT_TRUE(job.ok()) << job.status();
  absl::StatusOr<DataSplit> data = LoadJobData(*job);
  EXPECT_TRUE(data.ok()) << data.status();
  RunOptions o;
  o.progress = false;
  o.out_dir = out;
  std::ostringstream log;
  absl::StatusOr<v1::RunReport> r = RunReference(*job, *data, o, log, log);
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

// A job with enough compute per stage that overlap in time is visible. Activation messages
// are batch x width x 4 bytes.
std::string PipelineJob(int epochs, int train_examples, int width, int batch) {
  std::ostringstream j;
  j << "name: \"pipe\" rule: GREEDY seed: 3 batch_size: " << batch << " epochs: " << epochs
    << "\ndata { synthetic { train_examples: " << train_examples << " test_examples: " << batch
    << " shape: [" << width << "] classes: 10 seed: 1 } }\n";
  for (int k = 0; k < 4; ++k) {
    j << "stages { layers { linear { out_features: " << width << " } } layers { relu {} } }\n";
  }
  return j.str();
}

// Runs `job` uninterrupted (into DIR/full), then again checkpointing every 2 steps into
// `ckpt` and stopping after step 5; returns the second run.
ProcessResult RunFullThenStopAfterFive(const TempDir& dir, const std::string& job,
                                       const std::string& ckpt) {
  const std::string bin = BinDir() + "/localpar";
  auto full = RunProcess({bin, "run", job, "--quiet", "--out=" + dir.path() + "/full"}, 120);
  EXPECT_EQ(full.exit_code, 0) << full.output;
  auto first = RunProcess({bin, "run", job, "--quiet", "--checkpoint_dir=" + ckpt,
                           "--checkpoint_every_steps=2", "--stop_after_steps=5"},
                          120);
  EXPECT_EQ(first.exit_code, 0) << first.output;
  return first;
}

std::string StartedWorkers::list() const {
  std::string out;
  for (const std::string& a : addresses) out += (out.empty() ? "" : ",") + a;
  return out;
}

StartedWorkers StartWorkers(const std::string& dir, int count,
                            const std::vector<std::string>& extra) {
  StartedWorkers w;
  for (int k = 0; k < count; ++k) {
    const std::string pf = dir + "/w" + std::to_string(k);
    std::vector<std::string> argv = {BinDir() + "/localpar_worker", "--port_file=" + pf};
    argv.insert(argv.end(), extra.begin(), extra.end());
    w.pids.push_back(StartProcess(argv, pf + ".log"));
    int port = 0;
    for (int i = 0; i < 500 && port == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::ifstream(pf) >> port;
    }
    w.addresses.push_back("127.0.0.1:" + std::to_string(port));
  }
  return w;
}

}  // namespace localpar::testing
