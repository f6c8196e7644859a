// `localpar run`'s supervision of its processes (supervisor.h).
#include "services/localpar/supervisor.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/atomic_file.h"
#include "common/model_io/regroup.h"
#include "common/run/report.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "services/common/exit_codes.h"
#include "services/common/port_file.h"
#include "services/common/program_config.h"
#include "services/common/spawn.h"
#include "services/localpar/children.h"
#include "services/localpar/health_watch.h"

namespace localpar {
namespace {

// Ctrl-C (or SIGTERM) once: the coordinator is asked to stop after its current step and
// write what the run has; twice: everything stops at once.
volatile std::sig_atomic_t g_interrupted = 0;
void OnSignal(int) { g_interrupted = g_interrupted + 1; }

constexpr int kMaxRestarts = 5;
// How long a worker may take to report its ports before the run gives up on it.
constexpr int kWorkerStartSeconds = 150;
// A process that answers no health check (or only NOT_SERVING) this long is hung or stopped.
constexpr double kUnhealthySeconds = 5;
using Clock = std::chrono::steady_clock;

// Restarts back off: 0.25 s, 0.5 s, 1 s, ... up to 8 s.
std::chrono::milliseconds RestartDelay(int restarts) {
  return std::chrono::milliseconds(std::min(8000, 250 << std::min(restarts, 5)));
}

// Prometheus file_sd: a list of target groups with labels.
absl::Status WriteTargets(const std::string& path, const std::vector<int>& workers,
                          int coordinator) {
  google::protobuf::ListValue groups;
  auto add = [&](const std::vector<int>& ports, const char* component) {
    google::protobuf::Struct* g = groups.add_values()->mutable_struct_value();
    google::protobuf::ListValue* targets = (*g->mutable_fields())["targets"].mutable_list_value();
    for (int p : ports) {
      if (p > 0) targets->add_values()->set_string_value(absl::StrCat("127.0.0.1:", p));
    }
    (*(*g->mutable_fields())["labels"].mutable_struct_value()->mutable_fields())["component"]
        .set_string_value(component);
  };
  add(workers, "worker");
  add({coordinator}, "coordinator");
  return WriteFileAtomically(path, ToJson(groups, false));
}

class Supervisor {
 public:
  // `stages` workers, or with replicas stages x replicas, stage 0's replicas first.
  Supervisor(const LaunchOptions& options, const SecurityOptions& security, int stages,
             int replicas, std::string run_dir, std::ostream& log)
      : options_(options),
        log_(log),
        stages_(stages * replicas),
        replicas_(replicas),
        run_dir_(std::move(run_dir)),
        addresses_(stages * replicas),
        metrics_ports_(stages * replicas, 0),
        health_(security) {}

  int Run() {
    if (!StartWorkers()) {
      StopAll(children_, std::chrono::seconds(2));
      return g_interrupted ? kExitInterrupted : kExitFailure;
    }
    if (absl::Status s = StartCoordinator(); !s.ok()) {
      log_ << "localpar: " << s.message() << "\n";
      StopAll(children_, std::chrono::seconds(2));
      return kExitFailure;
    }
    const int rc = Loop();
    // After a clean run (or one stopped cleanly) the workers were told to shut down; give
    // them a moment, then stop.
    StopAll(children_, std::chrono::seconds(rc == kExitOk || rc == kExitInterrupted ? 10 : 2));
    return rc;
  }

 private:
  std::string PortFile(int k) const { return absl::StrCat(run_dir_, "/worker", k, ".port"); }
  // Worker i holds replica i % replicas of stage i / replicas.
  std::string WorkerName(int i) const {
    return replicas_ > 1
               ? absl::StrCat("worker for stage ", i / replicas_, " replica ", i % replicas_)
               : absl::StrCat("worker for stage ", i);
  }

  v1::WorkerConfig WorkerConfigFor(int k, const std::string& listen) const {
    const v1::RunCommand& r = options_.run;
    v1::WorkerConfig w = WorkerDefaults();
    w.set_listen(listen);
    w.set_port_file(PortFile(k));
    *w.mutable_compute() = r.compute();
    w.set_queue_capacity(r.queue_capacity());
    if (k / replicas_ == r.slow_stage()) w.set_debug_delay_ms(r.slow_ms());
    *w.mutable_security() = r.coordinator().security();
    // The launcher stops its workers itself, after the coordinator: one that exits before
    // then, whatever its exit code, is lost and restarted (a restarted coordinator needs it).
    w.set_stay_after_shutdown(true);
    // Each worker owns its storage, as on separate hosts: one directory per stage.
    std::string dir = r.coordinator().checkpoint_dir().empty()
                          ? SplitResumePath(r.coordinator().resume()).first
                          : r.coordinator().checkpoint_dir();
    if (!dir.empty())
      w.set_checkpoint_dir(LocalSnapshotDir(dir, k / replicas_, k % replicas_, replicas_));
    return w;
  }

  // Waits for worker k's port file; a loaded machine (a sanitizer build beside other tests)
  // may take more than 30 s to start one, so it says so every 30 s and gives up after
  // kWorkerStartSeconds. A worker that exits is noticed at once.
  absl::StatusOr<std::vector<int>> WaitForWorkerPorts(int k) {
    constexpr int kNoticeSeconds = 30;
    absl::StatusOr<std::vector<int>> ports;
    for (int waited = 0; waited < kWorkerStartSeconds; waited += kNoticeSeconds) {
      if (waited > 0) {
        log_ << "localpar: still waiting for " << children_[k].name << " to start (" << waited
             << " s)\n";
      }
      ports = WaitForPortFile(PortFile(k), 2, std::chrono::seconds(kNoticeSeconds), [&] {
        Reap(children_);
        return children_[k].exited || g_interrupted;
      });
      if (!absl::IsDeadlineExceeded(ports.status())) break;
    }
    return ports;
  }

  // Each worker binds port 0 and reports the port it got: no races for free ports.
  bool StartWorkers() {
    const std::string bin = options_.bin_dir + "/localpar_worker";
    const std::vector<int> cpus = AllowedCpus();
    for (int k = 0; k < stages_; ++k) {
      Child c;
      c.name = WorkerName(k);
      if (options_.run.pin_workers()) c.cpu = cpus[k % cpus.size()];
      c.argv = {bin};
      for (std::string& a : ToFlagArgs(WorkerConfigFor(k, "127.0.0.1:0"), WorkerDefaults())) {
        c.argv.push_back(std::move(a));
      }
      c.log_path = absl::StrCat(run_dir_, "/worker", k, ".log");
      c.Start();
      children_.push_back(std::move(c));
    }
    for (int k = 0; k < stages_; ++k) {
      absl::StatusOr<std::vector<int>> ports;
      while (true) {
        ports = WaitForWorkerPorts(k);
        // Killed before it was up (not a startup error of its own): started again.
        Child& c = children_[k];
        if (ports.ok() || !c.exited || !WIFSIGNALED(c.status) || c.restarts >= kMaxRestarts ||
            g_interrupted) {
          break;
        }
        log_ << "localpar: " << c.Describe() << " while starting; starting it again\n";
        ++c.restarts;
        c.Start();
      }
      if (!ports.ok()) {
        log_ << "localpar: "
             << (children_[k].exited ? children_[k].Describe()
                                     : absl::StrCat(children_[k].name, " did not start within ",
                                                    kWorkerStartSeconds, " s"))
             << "; its log:\n";
        PrintLogTail(children_[k].log_path, log_);
        return false;
      }
      addresses_[k] = absl::StrCat("127.0.0.1:", (*ports)[0]);
      metrics_ports_[k] = (*ports)[1];
      health_.Watch(k, addresses_[k]);
    }
    if (options_.run.pin_workers()) {
      log_ << "localpar: each worker pinned to one CPU:";
      for (int k = 0; k < stages_; ++k) {
        log_ << (k ? ", " : " ") << "worker " << k << " on CPU " << children_[k].cpu;
      }
      log_ << (static_cast<size_t>(stages_) > cpus.size()
                   ? " (more workers than CPUs: some share)\n"
                   : "\n");
    }
    return true;
  }

  absl::Status StartCoordinator() {
    v1::CoordinatorConfig c = options_.run.coordinator();
    c.set_job(options_.job_path);
    for (const std::string& a : addresses_) c.add_workers(a);
    c.set_metrics_port_file(run_dir_ + "/coordinator.metrics_port");
    c.set_status_port_file(run_dir_ + "/coordinator.status_port");
    if (c.checkpoint_dir().empty()) c.set_checkpoint_dir(SplitResumePath(c.resume()).first);
    // Every worker's storage is under the checkpoint directory (WorkerConfigFor), so a resume
    // with another --stages or --replicas can regroup the snapshots.
    c.set_local_snapshots(!c.checkpoint_dir().empty());
    std::string text;
    google::protobuf::TextFormat::PrintToString(c, &text);
    const std::string path = run_dir_ + "/coordinator.config";
    if (absl::Status s = WriteFileAtomically(path, text); !s.ok()) return s;
    checkpoint_dir_ = c.checkpoint_dir();
    Child coordinator;
    coordinator.name = "coordinator";
    coordinator.argv = {options_.bin_dir + "/localpar_coordinator", "--config=" + path};
    coordinator.Start();
    children_.push_back(std::move(coordinator));
    return absl::OkStatus();
  }

  int Loop() {
    while (true) {
      Reap(children_);
      KillUnhealthy();
      Child& coordinator = children_.back();
      // A coordinator killed by a signal is restarted to resume from its last checkpoint.
      if (coordinator.exited && WIFSIGNALED(coordinator.status) && !checkpoint_dir_.empty() &&
          coordinator.restarts < kMaxRestarts && !g_interrupted) {
        if (Due(coordinator, "to resume from " + checkpoint_dir_)) RestartCoordinator();
      } else if (coordinator.exited) {
        // The coordinator may have stopped over a lost worker before this loop saw it go.
        for (int k = 0; k < stages_; ++k) {
          if (children_[k].Lost()) ReportLost(k);
        }
        return WIFEXITED(coordinator.status) ? WEXITSTATUS(coordinator.status) : kExitFailure;
      }
      Announce();
      if (g_interrupted > 1 || (g_interrupted && coordinator.exited)) {
        log_ << "\nlocalpar: interrupted again; stopping the coordinator and " << stages_
             << " workers now, without writing anything more\n";
        StopAll(children_, std::chrono::seconds(5));
        return kExitInterrupted;
      }
      if (g_interrupted && !interrupt_forwarded_) {
        interrupt_forwarded_ = true;
        log_ << "\nlocalpar: interrupted; stopping after the current step and writing what "
                "the run has (Ctrl-C again to stop at once)\n";
        kill(coordinator.pid, SIGINT);
      }
      for (int k = 0; k < stages_; ++k) {
        if (!children_[k].Lost()) continue;
        if (children_[k].restarts >= kMaxRestarts) {
          ReportLost(k);
        } else if (Due(children_[k], "")) {
          RestartWorker(k);
        }
      }
      // The coordinator notices a lost worker by itself; give it time to say so, then stop.
      if (Clock::now() - worker_lost_at_ > std::chrono::seconds(15)) {
        StopAll(children_, std::chrono::seconds(2));
        return kExitWorkerLost;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // A hung or stopped process answers no health check: killed, so that it is restarted
  // like a crashed one.
  void KillUnhealthy() {
    for (size_t i = 0; i < children_.size(); ++i) {
      Child& c = children_[i];
      if (c.exited || health_.SecondsUnhealthy(static_cast<int>(i)) < kUnhealthySeconds) continue;
      c.cause = absl::StrCat("answered no health check for ", kUnhealthySeconds,
                             " s (hung or stopped); the launcher killed it");
      health_.Forget(static_cast<int>(i));
      kill(c.pid, SIGKILL);
    }
  }

  // The first call after `c` went away schedules its restart (printing why, and when);
  // true once the backoff has passed.
  bool Due(Child& c, const std::string& why) {
    if (c.restart_at == Clock::time_point{}) {
      const auto delay = RestartDelay(c.restarts);
      c.restart_at = Clock::now() + delay;
      log_ << "\nlocalpar: " << c.Describe() << "; restarting it" << (why.empty() ? "" : " ") << why
           << " in " << delay.count() / 1000.0 << " s\n";
    }
    return Clock::now() >= c.restart_at;
  }

  void RestartCoordinator() {
    Child& c = children_.back();
    if (c.restarts++ == 0) c.argv.push_back("--resume_if_present");
    std::filesystem::remove(run_dir_ + "/coordinator.status_port");
    status_announced_ = false;
    health_.Forget(stages_);
    c.Start();
  }

  // A crashed worker comes back on the same address; the coordinator rolls the pipeline
  // back to its last checkpoint (or gives up if it has none).
  void RestartWorker(int k) {
    Child& c = children_[k];
    ++c.restarts;
    std::filesystem::remove(PortFile(k));
    metrics_ports_[k] = -1;  // re-read from the new port file, then republish targets
    c.argv = {c.argv[0]};
    for (std::string& a : ToFlagArgs(WorkerConfigFor(k, addresses_[k]), WorkerDefaults())) {
      c.argv.push_back(std::move(a));
    }
    c.log_path = absl::StrCat(run_dir_, "/worker", k, ".log.", c.restarts);
    c.Start();
    health_.Watch(k, addresses_[k]);
  }

  // Names the first lost worker, once.
  void ReportLost(int k) {
    if (worker_lost_at_ != Clock::time_point::max()) return;
    log_ << "\nlocalpar: " << children_[k].Describe() << "\n";
    worker_lost_at_ = Clock::now();
  }

  // The status address once the coordinator serves it; the metrics targets once every
  // endpoint is known (again after a worker restarts).
  void Announce() {
    if (!status_announced_) {
      if (auto port = ReadPortFile(run_dir_ + "/coordinator.status_port", 1)) {
        const std::string address = absl::StrCat("127.0.0.1:", (*port)[0]);
        if (children_.back().restarts == 0) {
          log_ << "localpar: " << stages_ << " workers up; watch with: localpar status " << address
               << "\n";
        }
        health_.Watch(stages_, address);
        status_announced_ = true;
      }
    }
    // The metrics ports, once, when the coordinator's and every worker's are known.
    if (!metrics_announced_) {
      auto coordinator = ReadPortFile(run_dir_ + "/coordinator.metrics_port", 1);
      const bool known =
          coordinator && (*coordinator)[0] > 0 &&
          std::all_of(metrics_ports_.begin(), metrics_ports_.end(), [](int p) { return p > 0; });
      if (known) {
        log_ << "localpar: metrics (Prometheus, GET /metrics): coordinator 127.0.0.1:"
             << (*coordinator)[0] << ", workers";
        for (int k = 0; k < stages_; ++k) {
          log_ << (k ? ", " : " ") << "127.0.0.1:" << metrics_ports_[k];
        }
        log_ << "\n";
        metrics_announced_ = true;
      }
    }
    const std::string& targets = options_.run.metrics_targets();
    if (targets.empty()) return;
    for (int k = 0; k < stages_; ++k) {
      if (metrics_ports_[k] != -1) continue;
      if (auto ports = ReadPortFile(PortFile(k), 2)) {
        metrics_ports_[k] = (*ports)[1];
        targets_written_ = false;
      }
    }
    if (targets_written_) return;
    if (auto port = ReadPortFile(run_dir_ + "/coordinator.metrics_port", 1)) {
      if (absl::Status s = WriteTargets(targets, metrics_ports_, (*port)[0]); !s.ok()) {
        log_ << "localpar: " << s.message() << "\n";
      }
      targets_written_ = true;
    }
  }

  const LaunchOptions& options_;
  std::ostream& log_;
  const int stages_;  // workers: stages x replicas
  const int replicas_;
  const std::string run_dir_;
  std::vector<std::string> addresses_;
  std::vector<int> metrics_ports_;
  bool metrics_announced_ = false;
  std::vector<Child> children_;  // the workers in stage order, then the coordinator
  std::string checkpoint_dir_;
  bool status_announced_ = false;
  bool interrupt_forwarded_ = false;
  bool targets_written_ = false;
  Clock::time_point worker_lost_at_ = Clock::time_point::max();
  HealthWatch health_;  // ids: the stage for workers, `stages_` for the coordinator
};

}  // namespace

void OnLaunchSignal(int signal) { OnSignal(signal); }

int Supervise(const LaunchOptions& options, const SecurityOptions& security, int stages,
              int replicas, const std::string& run_dir, std::ostream& log) {
  return Supervisor(options, security, stages, replicas, run_dir, log).Run();
}

}  // namespace localpar
