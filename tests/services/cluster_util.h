// Helpers for tests that run the real programs: subprocesses, temporary directories, and
// small readers for the files a run writes.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "proto/tensor.pb.h"

namespace localpar::testing {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr together
};

// Runs argv to completion (killed after timeout_s), capturing its output.
ProcessResult RunProcess(const std::vector<std::string>& argv, int timeout_s = 300);

// Starts argv in the background with output to `log_path`; returns its pid.
pid_t StartProcess(const std::vector<std::string>& argv, const std::string& log_path);
// Waits for pid; returns its exit code (128 + signal when killed), or -1 on timeout.
int WaitProcess(pid_t pid, int timeout_s);
// Direct children of `pid`, from /proc.
std::vector<pid_t> ChildrenOf(pid_t pid);
// The processes a `localpar run` started, from their command lines (pids alone can wrap
// around): the workers in stage order, then the coordinator.
std::vector<pid_t> LaunchedProcesses(pid_t launcher);
bool ProcessAlive(pid_t pid);

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const;

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path);
std::string BinDir();  // where the build put localpar, localpar_worker, ...

// The numbers after each occurrence of "key": in a JSON text, in order.
std::vector<double> JsonNumbers(const std::string& json, const std::string& key);

// A 4-stage job touching every kind of layer the rules must agree on (see cluster_util.cc).
std::string SmallJob(const std::string& rule, int micro_batches);
// Bit for bit, tensor by tensor, naming the first that differs.
void ExpectBitwiseEqual(const v1::ModelWeights& a, const v1::ModelWeights& b);
// Reads a run's weights.pb and compares it with `want`.
void ExpectWeightsFileEquals(const std::string& path, const v1::ModelWeights& want);

// The reference trainer's weights for the job file (its output in `out`).
v1::ModelWeights ReferenceWeights(const std::string& job_path, const std::string& out);
// Runs `job` on a local cluster (output in DIR/cluster) and checks that its weights equal
// the reference trainer's (DIR/ref) bit for bit; returns the reference weights.
v1::ModelWeights ExpectClusterEqualsReference(const TempDir& dir, const std::string& job);
// A job with enough compute per stage that overlap in time is visible. Activation messages
// are batch x width x 4 bytes.
std::string PipelineJob(int epochs, int train_examples, int width = 256, int batch = 64);

// Runs `job` uninterrupted (into DIR/full), then again checkpointing every 2 steps into
// `ckpt` and stopping after step 5; returns the second run.
ProcessResult RunFullThenStopAfterFive(const TempDir& dir, const std::string& job,
                                       const std::string& ckpt);

// `count` workers started with port files under `dir`, and their loopback addresses; each
// gets `extra` flags.
struct StartedWorkers {
  std::vector<pid_t> pids;
  std::vector<std::string> addresses;
  std::string list() const;  // "HOST:PORT,HOST:PORT,..."
};
StartedWorkers StartWorkers(const std::string& dir, int count,
                            const std::vector<std::string>& extra = {});

}  // namespace localpar::testing
