// The coordinator program.
#include "services/coordinator/coordinator.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/core/cpu_backend.h"
#include "common/io/atomic_file.h"
#include "common/job/model_file.h"
#include "common/job/run.h"
#include "common/job/tensor_codec.h"
#include "services/common/exit_codes.h"
#include "services/common/metrics.h"
#include "services/common/port_file.h"
#include "services/coordinator/job_runner.h"
#include "services/coordinator/rendezvous_service.h"
#include "services/coordinator/worker_pool.h"

namespace localpar {
namespace {

// The Coordinator service (and, with replicas, the Rendezvous service) on `listen`; its
// port goes to `port_file` and *bound.
std::unique_ptr<grpc::Server> ServeStatus(const v1::CoordinatorConfig& c,
                                          const SecurityOptions& security, StatusService* service,
                                          RendezvousService* rendezvous, int* bound) {
  grpc::EnableDefaultHealthCheckService(true);  // the launcher's liveness check
  grpc::ServerBuilder builder;
  ConfigureServer(builder);
  int port = 0;
  builder.AddListeningPort(c.status_listen(), ServerCredentials(security), &port);
  builder.RegisterService(service);
  if (rendezvous) builder.RegisterService(rendezvous);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "localpar: cannot serve status on " << c.status_listen() << "\n";
    return nullptr;
  }
  if (!c.status_port_file().empty()) {
    if (absl::Status s = WritePortFile(c.status_port_file(), {port}); !s.ok()) {
      std::cerr << "localpar: " << s.message() << "\n";
    }
  }
  *bound = port;
  return server;
}

// Where workers reach the Rendezvous service: --advertise, else the --status_listen host
// (this machine's name when that is a wildcard), with the bound port.
std::string RendezvousAddress(const v1::CoordinatorConfig& c, int port) {
  std::string host = c.advertise();
  if (host.empty()) {
    host = HostOf(c.status_listen());
    if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") {
      char name[256] = {};
      host = gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
    }
  }
  const bool has_port = host[0] == '[' ? host.find("]:") != std::string::npos
                                       : std::count(host.begin(), host.end(), ':') == 1;
  if (has_port) return host;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";  // IPv6
  return absl::StrCat(host, ":", port);
}

// Resumes when asked to (or, with resume_if_present, when there is something to resume);
// false when asked to and it cannot. A fresh run refuses a directory with checkpoints in it.
bool DecideResume(const v1::CoordinatorConfig& c, JobRunner& runner) {
  Checkpointer& checkpointer = runner.checkpointer();
  bool resume = c.resume();
  if (c.resume_if_present() && !c.checkpoint_dir().empty()) {
    resume = FindLatestCheckpoint(c.checkpoint_dir(), checkpointer.fingerprint()).ok();
    if (!resume)
      std::cerr << "localpar: no checkpoint of this run in " << c.checkpoint_dir()
                << "; starting fresh\n";
  }
  if (!resume) {
    if (c.resume_if_present()) return true;
    absl::Status fresh = checkpointer.CheckFresh();
    if (!fresh.ok()) std::cerr << "localpar: " << fresh.message() << "\n";
    return fresh.ok();
  }
  absl::StatusOr<FoundCheckpoint> found = checkpointer.FindResume(std::cerr);
  if (!found.ok()) {
    std::cerr << "localpar: cannot resume: " << found.status().message() << "\n";
    return false;
  }
  std::cerr << "localpar: resuming from " << found->dir << " at step " << found->manifest.step()
            << "\n";
  runner.ResumeFrom(*std::move(found));
  return true;
}

// What besides the job changes a run's arithmetic.
std::string RunSettings(const v1::CoordinatorConfig& c, const v1::ModelWeights* initial) {
  std::string s =
      absl::StrCat("non_finite=", c.non_finite(), ";overlap_max_delay=", c.overlap_max_delay());
  if (initial) {  // another starting point is another run
    const std::string bytes = initial->SerializeAsString();
    absl::StrAppend(
        &s, ";init=", bytes.size(), ":",
        crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
  }
  return s;
}

// The parameters --init_from names, checked against the job's network (on the CPU: only
// the values travel to the workers).
absl::StatusOr<v1::ModelWeights> ReadInitialWeights(const std::string& path, const v1::Job& job) {
  CpuBackend cpu{CpuOptions{}};
  const ModelConfig config = ToModelConfig(job);
  std::string error;
  std::unique_ptr<Model> model = Model::Create(cpu, config, &error);
  if (!model) return absl::InvalidArgumentError(error);
  absl::StatusOr<v1::ModelWeights> w = ReadAnyWeightsFile(path, config, *model);
  if (!w.ok()) return w.status();
  if (absl::Status s = LoadWeights(*w, path, config, *model); !s.ok()) return s;
  return SnapshotModel(*model);  // the names workers expect, whatever the file's format
}

}  // namespace

absl::Status CheckRunSettings(const v1::CoordinatorConfig& c) {
  if (c.resume() && c.checkpoint_dir().empty()) {
    return absl::InvalidArgumentError("--resume needs --checkpoint_dir");
  }
  if (c.stop_after_steps() > 0 && c.checkpoint_dir().empty()) {
    return absl::InvalidArgumentError(
        "--stop_after_steps needs --checkpoint_dir (the run stops at a checkpoint to resume from)");
  }
  if (!c.out().empty()) {
    if (absl::Status s = CheckWritableDirectory(c.out(), "--out"); !s.ok()) return s;
  }
  if (!c.checkpoint_dir().empty()) {
    if (absl::Status s = CheckWritableDirectory(c.checkpoint_dir(), "--checkpoint_dir"); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

int RunCoordinator(const v1::CoordinatorConfig& c, const SecurityOptions& security) {
  ConfigureAllocatorForMessages();
  if (absl::Status s = CheckRunSettings(c); !s.ok()) {
    std::cerr << "localpar: " << s.message() << "\n";
    return kExitUsage;
  }
  absl::StatusOr<v1::Job> job = LoadJobWithOverrides(c.job(), c.overrides());
  if (!job.ok()) {
    std::cerr << "localpar: " << job.status().message() << "\n";
    return IsDataError(job.status()) ? kExitBadData : kExitBadJob;
  }
  const int replicas = job->replicas();
  if (c.workers_size() != job->stages_size() * replicas) {
    std::cerr << "localpar: --workers lists " << c.workers_size() << " addresses but job "
              << job->name() << " has " << job->stages_size() << " stages"
              << (replicas > 1 ? absl::StrCat(" x ", replicas, " replicas") : "") << "\n";
    return kExitUsage;
  }
  if (replicas > 1) {
    std::set<std::string> seen;
    for (const std::string& w : c.workers()) {
      if (!seen.insert(w).second) {
        std::cerr << "localpar: --workers lists " << w
                  << " twice; every replica of every stage needs its own worker\n";
        return kExitUsage;
      }
    }
    if (c.status_listen().empty()) {
      std::cerr << "localpar: replicas meet at the coordinator's service: --status_listen must "
                   "not be empty\n";
      return kExitUsage;
    }
    if (c.replica_timeout_s() < 1) {
      std::cerr << "localpar: --replica_timeout_s: must be >= 1\n";
      return kExitUsage;
    }
  }
  if (c.overlap_max_delay() > 0 && !Rule(ToUpdateRule(job->rule())).allows_delay) {
    std::cerr << "localpar: --overlap_max_delay does not apply to "
              << v1::UpdateRule_Name(job->rule()) << "\n";
    return kExitUsage;
  }
  absl::StatusOr<DataSplit> data = LoadJobData(*job);
  if (!data.ok()) {
    std::cerr << "localpar: " << data.status().message() << "\n";
    return kExitBadData;
  }
  if (absl::Status s = CheckReplicasFitData(*job, data->train.size()); !s.ok()) {
    std::cerr << "localpar: invalid job file " << c.job() << ": " << s.message() << "\n";
    return kExitBadJob;
  }
  std::unique_ptr<MetricsServer> metrics_server;
  std::unique_ptr<CoordinatorMetrics> metrics;
  if (!c.metrics_listen().empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> ms = MetricsServer::Start(c.metrics_listen());
    if (!ms.ok()) {
      std::cerr << "localpar: " << ms.status().message() << "\n";
      return kExitUsage;
    }
    metrics_server = *std::move(ms);
    metrics = std::make_unique<CoordinatorMetrics>(metrics_server->registry(), job->name());
    if (!c.metrics_port_file().empty()) {
      if (absl::Status s = WritePortFile(c.metrics_port_file(), {metrics_server->port()});
          !s.ok()) {
        std::cerr << "localpar: " << s.message() << "\n";
      }
    }
  }
  std::optional<v1::ModelWeights> initial;
  if (!c.init_from().empty()) {
    absl::StatusOr<v1::ModelWeights> w = ReadInitialWeights(c.init_from(), *job);
    if (!w.ok()) {
      std::cerr << "localpar: --init_from: " << w.status().message() << "\n";
      return w.status().code() == absl::StatusCode::kNotFound ? kExitUsage : kExitBadJob;
    }
    initial = *std::move(w);
  }
  std::string fingerprint = JobFingerprint(*job, RunSettings(c, initial ? &*initial : nullptr));
  JobRunner runner(c, security, *std::move(job), *std::move(data), std::move(fingerprint),
                   metrics.get());
  StatusService status(runner.status_board(), runner.checkpointer(), security);
  std::unique_ptr<RendezvousService> rendezvous;
  if (replicas > 1) rendezvous = std::make_unique<RendezvousService>(security);
  std::unique_ptr<grpc::Server> status_server;
  int status_port = 0;
  if (!c.status_listen().empty() &&
      !(status_server = ServeStatus(c, security, &status, rendezvous.get(), &status_port))) {
    return kExitUsage;
  }
  if (rendezvous) runner.UseRendezvous(rendezvous.get(), RendezvousAddress(c, status_port));
  if (initial) runner.InitFrom(*std::move(initial));
  if (!DecideResume(c, runner)) return kExitFailure;
  return runner.Run();
}

}  // namespace localpar
