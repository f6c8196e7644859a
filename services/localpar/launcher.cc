// Process supervision for `localpar run`.
#include "services/localpar/launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data/dataset.h"
#include "services/common/spawn.h"

namespace localpar {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void OnSignal(int) { g_interrupted = 1; }

struct Child {
  std::string name;
  pid_t pid = -1;
  bool exited = false;
  int status = 0;
};

void Reap(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.exited) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.exited = true;
      c.status = status;
    }
  }
}

// SIGTERM (workers drain), then SIGKILL whatever is still running after `grace`.
void StopAll(std::vector<Child>& children, std::chrono::milliseconds grace) {
  for (Child& c : children) {
    if (!c.exited) kill(c.pid, SIGTERM);
  }
  auto until = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < until) {
    Reap(children);
    bool all = true;
    for (const Child& c : children) all = all && c.exited;
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (Child& c : children) {
    if (!c.exited) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &c.status, 0);
      c.exited = true;
    }
  }
}

std::string Describe(const Child& c) {
  if (WIFEXITED(c.status)) return absl::StrCat(c.name, " exited with code ", WEXITSTATUS(c.status));
  if (WIFSIGNALED(c.status))
    return absl::StrCat(c.name, " was killed by signal ", WTERMSIG(c.status));
  return c.name + " stopped";
}

void PrintLogTail(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
    if (lines.size() > 5) lines.erase(lines.begin());
  }
  for (const std::string& l : lines) std::cerr << "    " << l << "\n";
}

// Prometheus file_sd format: a list of target groups with labels.
void WriteTargets(const std::string& path, const std::vector<int>& workers, int coordinator) {
  std::vector<std::string> w;
  for (int p : workers) {
    if (p > 0) w.push_back(absl::StrCat("\"127.0.0.1:", p, "\""));
  }
  std::string tmp = path + ".tmp";
  std::ofstream(tmp) << "[{\"targets\": [" << absl::StrJoin(w, ", ")
                     << "], \"labels\": {\"component\": \"worker\"}},\n {\"targets\": [\"127.0.0.1:"
                     << coordinator << "\"], \"labels\": {\"component\": \"coordinator\"}}]\n";
  std::filesystem::rename(tmp, path);
}

}  // namespace

int Launch(const LaunchOptions& o) {
  // Refuse a bad job or a missing data set before starting anything.
  absl::StatusOr<v1::Job> job = LoadJobWithOverrides(o.coordinator);
  if (!job.ok()) {
    std::cerr << "localpar: " << job.status().message() << "\n";
    return kExitBadJob;
  }
  if (job->data().has_fashion_mnist()) {
    std::string probe = job->data().fashion_mnist().dir() + "/train-images-idx3-ubyte.gz";
    if (!std::filesystem::exists(probe)) {
      std::cerr << "localpar: " << probe << " not found; Fashion-MNIST comes in the Debian "
                << "package dataset-fashion-mnist (apt-get install dataset-fashion-mnist)\n";
      return kExitBadData;
    }
  }
  const int stages = job->stages_size();
  std::string worker_bin = o.bin_dir + "/localpar_worker";
  std::string coord_bin = o.bin_dir + "/localpar_coordinator";
  for (const std::string& bin : {worker_bin, coord_bin}) {
    if (access(bin.c_str(), X_OK) != 0) {
      std::cerr << "localpar: " << bin << " not found (build all targets)\n";
      return kExitFailure;
    }
  }
  char tmpl[] = "/tmp/localpar.XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("localpar: mkdtemp");
    return kExitFailure;
  }
  const std::string run_dir = tmpl;

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<Child> children;
  std::vector<std::vector<std::string>> worker_argv(stages);
  for (int k = 0; k < stages; ++k) {
    std::vector<std::string> argv = {worker_bin,
                                     "--listen=127.0.0.1:0",
                                     absl::StrCat("--port_file=", run_dir, "/worker", k, ".port"),
                                     "--device=" + o.device,
                                     absl::StrCat("--threads=", o.threads),
                                     absl::StrCat("--queue_capacity=", o.queue_capacity)};
    if (k == o.slow_stage) argv.push_back(absl::StrCat("--debug_delay_ms=", o.slow_ms));
    argv.insert(argv.end(), o.security_flags.begin(), o.security_flags.end());
    worker_argv[k] = argv;
    Child c;
    c.name = absl::StrCat("worker for stage ", k);
    c.pid = SpawnProcess(argv, absl::StrCat(run_dir, "/worker", k, ".log"));
    children.push_back(c);
  }

  // Each worker binds port 0 and reports the port it got: no races for free ports.
  std::vector<std::string> addresses(stages);
  std::vector<int> metrics_ports(stages, 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int k = 0; k < stages; ++k) {
    std::string path = absl::StrCat(run_dir, "/worker", k, ".port");
    while (addresses[k].empty()) {
      std::ifstream in(path);
      int port = 0, metrics_port = 0;
      if (in >> port >> metrics_port && port > 0) {
        addresses[k] = absl::StrCat("127.0.0.1:", port);
        metrics_ports[k] = metrics_port;
        break;
      }
      Reap(children);
      if (children[k].exited || g_interrupted || std::chrono::steady_clock::now() > deadline) {
        std::cerr << "localpar: "
                  << (children[k].exited ? Describe(children[k])
                                         : children[k].name + " did not start")
                  << "; its log:\n";
        PrintLogTail(absl::StrCat(run_dir, "/worker", k, ".log"));
        StopAll(children, std::chrono::seconds(2));
        return g_interrupted ? kExitInterrupted : kExitFailure;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  const CoordinatorOptions& co = o.coordinator;
  std::vector<std::string> argv = {coord_bin, "--job=" + co.job_path,
                                   "--workers=" + absl::StrJoin(addresses, ",")};
  if (!co.out_dir.empty()) argv.push_back("--out=" + co.out_dir);
  if (!co.progress) argv.push_back("--quiet");
  if (co.trace) argv.push_back("--trace");
  if (co.non_finite == v1::ConfigureRequest::SKIP) argv.push_back("--non_finite=skip");
  if (co.overlap_max_delay > 0)
    argv.push_back(absl::StrCat("--overlap_max_delay=", co.overlap_max_delay));
  if (!co.rule.empty()) argv.push_back("--rule=" + co.rule);
  if (co.epochs > 0) argv.push_back(absl::StrCat("--epochs=", co.epochs));
  if (co.max_steps > 0) argv.push_back(absl::StrCat("--max_steps=", co.max_steps));
  if (co.seed >= 0) argv.push_back(absl::StrCat("--seed=", co.seed));
  if (co.stages > 0) argv.push_back(absl::StrCat("--stages=", co.stages));
  if (!co.checkpoint_dir.empty()) {
    argv.push_back("--checkpoint_dir=" + co.checkpoint_dir);
    argv.push_back(absl::StrCat("--checkpoint_every_steps=", co.checkpoint_every_steps));
    argv.push_back(absl::StrCat("--checkpoint_every_seconds=", co.checkpoint_every_seconds));
    argv.push_back(absl::StrCat("--keep_checkpoints=", co.keep_checkpoints));
  }
  if (co.resume) argv.push_back("--resume");
  if (co.stop_after_steps > 0)
    argv.push_back(absl::StrCat("--stop_after_steps=", co.stop_after_steps));
  argv.insert(argv.end(), o.security_flags.begin(), o.security_flags.end());
  const std::string coord_port_file = run_dir + "/coordinator.metrics_port";
  argv.push_back("--metrics_port_file=" + coord_port_file);
  const std::string status_port_file = run_dir + "/coordinator.status_port";
  argv.push_back("--status_port_file=" + status_port_file);
  Child coordinator;
  coordinator.name = "coordinator";
  coordinator.pid = SpawnProcess(argv, "");
  children.push_back(coordinator);

  bool targets_written = o.metrics_targets.empty();
  bool status_announced = false;
  int rc = kExitOk;
  auto worker_died_at = std::chrono::steady_clock::time_point::max();
  std::vector<int> restarts(stages + 1, 0);
  constexpr int kMaxRestarts = 5;
  // A worker that exits 0 left on the coordinator's in-band SHUTDOWN: not a failure.
  auto lost = [&](int k) {
    return children[k].exited &&
           !(WIFEXITED(children[k].status) && WEXITSTATUS(children[k].status) == 0);
  };
  // Names the first lost worker, once.
  auto report_lost = [&](int k) {
    if (worker_died_at != std::chrono::steady_clock::time_point::max()) return;
    std::cerr << "\nlocalpar: " << Describe(children[k]) << "\n";
    worker_died_at = std::chrono::steady_clock::now();
  };
  while (true) {
    Reap(children);
    Child& coord = children.back();
    // A coordinator killed by a signal is restarted to resume from its last checkpoint.
    if (coord.exited && WIFSIGNALED(coord.status) && !co.checkpoint_dir.empty() &&
        restarts[stages] < kMaxRestarts && !g_interrupted) {
      std::cerr << "\nlocalpar: " << Describe(coord) << "; restarting it to resume from "
                << co.checkpoint_dir << "\n";
      if (std::find(argv.begin(), argv.end(), "--resume_if_present") == argv.end()) {
        argv.push_back("--resume_if_present");
      }
      ++restarts[stages];
      coord.pid = SpawnProcess(argv, "");
      coord.exited = false;
      continue;
    }
    if (coord.exited) {
      rc = WIFEXITED(coord.status) ? WEXITSTATUS(coord.status) : kExitFailure;
      // The coordinator may have stopped over a lost worker before this loop saw it go.
      for (int k = 0; k < stages; ++k) {
        if (lost(k)) report_lost(k);
      }
      break;
    }
    if (!status_announced) {
      std::ifstream in(status_port_file);
      int status_port = 0;
      if (in >> status_port && status_port > 0) {
        std::cerr << "localpar: " << stages
                  << " workers up; watch with: localpar status 127.0.0.1:" << status_port << "\n";
        status_announced = true;
      }
    }
    for (int k = 0; k < stages; ++k) {
      if (metrics_ports[k] != -1) continue;
      std::ifstream in(absl::StrCat(run_dir, "/worker", k, ".port"));
      int port = 0, metrics_port = 0;
      if (in >> port >> metrics_port && port > 0) {
        metrics_ports[k] = metrics_port;
        targets_written = o.metrics_targets.empty();
      }
    }
    if (!targets_written) {
      std::ifstream in(coord_port_file);
      int coord_port = 0;
      if (in >> coord_port && coord_port > 0) {
        WriteTargets(o.metrics_targets, metrics_ports, coord_port);
        targets_written = true;
      }
    }
    if (g_interrupted) {
      std::cerr << "\nlocalpar: interrupted; stopping the coordinator and " << stages
                << " workers\n";
      StopAll(children, std::chrono::seconds(5));
      std::filesystem::remove_all(run_dir);
      return kExitInterrupted;
    }
    for (int k = 0; k < stages; ++k) {
      // A crashed worker comes back on the same address; the coordinator rolls the
      // pipeline back to its last checkpoint (or gives up if it has none).
      if (lost(k) && restarts[k] < kMaxRestarts) {
        std::cerr << "\nlocalpar: " << Describe(children[k]) << "; restarting it\n";
        std::vector<std::string> again = worker_argv[k];
        for (std::string& a : again) {
          if (a.rfind("--listen=", 0) == 0) a = "--listen=" + addresses[k];
        }
        ++restarts[k];
        std::filesystem::remove(absl::StrCat(run_dir, "/worker", k, ".port"));
        metrics_ports[k] = -1;  // re-read from the new port file, then republish targets
        children[k].pid =
            SpawnProcess(again, absl::StrCat(run_dir, "/worker", k, ".log.", restarts[k]));
        children[k].exited = false;
        children[k].status = 0;
        continue;
      }
      if (lost(k)) report_lost(k);
    }
    // The coordinator notices a lost worker by itself; give it time to say so, then stop.
    if (std::chrono::steady_clock::now() - worker_died_at > std::chrono::seconds(15)) {
      StopAll(children, std::chrono::seconds(2));
      rc = kExitWorkerLost;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // After a clean run the workers were told to shut down; give them a moment, then stop.
  StopAll(children, std::chrono::seconds(rc == kExitOk ? 10 : 2));
  if (rc == kExitOk) {
    std::filesystem::remove_all(run_dir);
  } else {
    std::cerr << "localpar: worker logs are in " << run_dir << "\n";
  }
  return rc;
}

}  // namespace localpar
