// The coordinator program.
#include "services/coordinator/coordinator.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/core/cpu_backend.h"
#include "common/io/atomic_file.h"
#include "common/job/data_spec.h"
#include "common/job/parse.h"
#include "common/job/spec.h"
#include "common/model_io/model_file.h"
#include "common/model_io/regroup.h"
#include "common/model_io/tensor_proto.h"
#include "common/nn/rule.h"
#include "common/run/job_data.h"
#include "common/run/ledger.h"
#include "common/run/run_io.h"
#include "services/common/exit_codes.h"
#include "services/common/metrics.h"
#include "services/common/port_file.h"
#include "services/common/program_config.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/job_runner.h"
#include "services/coordinator/rendezvous_service.h"
#include "services/coordinator/worker_pool.h"

namespace localpar {
namespace {

// The Coordinator service (and, with replicas, the Rendezvous service) on `listen`; its
// port goes to `port_file` and *bound.
absl::StatusOr<std::unique_ptr<grpc::Server>> ServeStatus(const v1::CoordinatorConfig& c,
                                                          const SecurityOptions& security,
                                                          StatusService* service,
                                                          RendezvousService* rendezvous,
                                                          int* bound) {
  grpc::EnableDefaultHealthCheckService(true);  // the launcher's liveness check
  grpc::ServerBuilder builder;
  ConfigureServer(builder);
  int port = 0;
  builder.AddListeningPort(c.status_listen(), ServerCredentials(security), &port);
  builder.RegisterService(service);
  if (rendezvous) builder.RegisterService(rendezvous);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return UsageError(absl::StrCat("--status_listen=", c.status_listen(), ": cannot serve there"));
  }
  if (!c.status_port_file().empty()) {
    if (absl::Status s = WritePortFile(c.status_port_file(), {port}); !s.ok()) {
      return FailureError(s.message());
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

// Resumes when asked to (or, with resume_if_present, when there is something to resume).
// A fresh run refuses a directory with checkpoints in it (a usage error: another
// --checkpoint_dir, or --resume).
absl::Status DecideResume(const v1::CoordinatorConfig& c, JobRunner& runner,
                          const RunLedger& ledger, std::ostream& log) {
  Checkpointer& checkpointer = runner.checkpointer();
  bool resume = !c.resume().empty();
  if (c.resume_if_present() && !c.checkpoint_dir().empty()) {
    // This run's checkpoints, or the same network's in another layout: a coordinator
    // restarted while it regrouped one must not start afresh.
    resume =
        FindLatestCheckpoint(c.checkpoint_dir(), checkpointer.fingerprint(), checkpointer.network())
            .ok();
    if (!resume) {
      log << "localpar: no checkpoint of this run in " << c.checkpoint_dir()
          << "; starting fresh\n";
    }
  }
  if (!resume) {
    if (c.resume_if_present()) return absl::OkStatus();
    absl::Status fresh = checkpointer.CheckFresh();
    return fresh.ok() ? fresh : UsageError(fresh.message());
  }
  absl::StatusOr<FoundCheckpoint> found = checkpointer.FindResume(log);
  if (!found.ok() && absl::IsInvalidArgument(found.status())) {
    return UsageError(found.status().message());  // a change a resume cannot make
  }
  if (!found.ok()) {
    return WithExitCode(absl::Status(found.status().code(),
                                     absl::StrCat("cannot resume: ", found.status().message())),
                        kExitFailure);
  }
  log << "localpar: resuming from " << found->dir << " at step " << found->manifest.step() << "\n";
  // A longer (or shorter) run than the checkpoint's: what that does to the schedule.
  if (absl::StatusOr<v1::Job> before = CheckpointJob(found->manifest, found->dir); before.ok()) {
    if (std::string note = ledger.ResumeNote(*before, found->manifest.step()); !note.empty()) {
      log << "localpar: " << note << "\n";
    }
  }
  runner.ResumeFrom(*std::move(found));
  return absl::OkStatus();
}

// What besides the job changes a run's arithmetic.
std::string RunSettings(const v1::CoordinatorConfig& c, const v1::ModelWeights* initial) {
  std::string s =
      absl::StrCat("non_finite=", c.non_finite(), ";overlap_max_delay=", c.overlap_max_delay());
  if (initial == nullptr) return s;
  // Another starting point is another run. Weights that fit one protobuf are hashed as one
  // (as checkpoints have always recorded them); past protobuf's 2 GiB, tensor by tensor.
  if (initial->ByteSizeLong() < (size_t{1} << 31)) {
    const std::string bytes = initial->SerializeAsString();
    absl::StrAppend(
        &s, ";init=", bytes.size(), ":",
        crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
    return s;
  }
  uLong crc = crc32(0, nullptr, 0);
  size_t total = 0;
  for (const v1::StageWeights& st : initial->stages()) {
    for (const v1::NamedTensor& nt : st.params()) {
      const std::string head = absl::StrCat(st.stage(), "/", nt.name(), ";");
      crc = crc32(crc, reinterpret_cast<const Bytef*>(head.data()), static_cast<uInt>(head.size()));
      const std::string& data = nt.tensor().data();
      for (size_t at = 0; at < data.size(); at += size_t{1} << 30) {
        const size_t n = std::min(data.size() - at, size_t{1} << 30);
        crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data() + at), static_cast<uInt>(n));
      }
      total += data.size();
    }
  }
  absl::StrAppend(&s, ";init_tensors=", total, ":", crc);
  return s;
}

// The parameters --init_from names, checked against the job's network (on the CPU: only
// the values travel to the workers), and what was said of them on `log`.
absl::StatusOr<v1::ModelWeights> ReadInitialWeights(const std::string& path, const v1::Job& job,
                                                    InitNotes* notes, std::ostream& log) {
  CpuBackend cpu{CpuOptions{}};
  const ModelConfig config = ToModelConfig(job);
  std::string error;
  std::unique_ptr<Model> model = Model::Create(cpu, config, &error);
  if (!model) return absl::InvalidArgumentError(error);
  DropGradients(*model);  // it only checks the file: the parameters are all it needs
  absl::StatusOr<InitNotes> read = LoadInitialWeights(path, config, *model, log);
  if (!read.ok()) return read.status();
  *notes = *std::move(read);
  return SnapshotModel(*model);  // the names workers expect, whatever the file's format
}

}  // namespace

namespace {

// What the job and the flags must agree on before anything starts.
absl::Status CheckJobAgainstFlags(const v1::CoordinatorConfig& c, const v1::Job& job) {
  const int replicas = job.replicas();
  if (c.workers_size() != job.stages_size() * replicas) {
    return UsageError(absl::StrCat("--workers lists ", c.workers_size(), " addresses but job ",
                                   job.name(), " has ", job.stages_size(), " stages",
                                   replicas > 1 ? absl::StrCat(" x ", replicas, " replicas") : ""));
  }
  if (replicas > 1) {
    std::set<std::string> seen;
    for (const std::string& w : c.workers()) {
      if (!seen.insert(w).second) {
        return UsageError(absl::StrCat(
            "--workers lists ", w, " twice; every replica of every stage needs its own worker"));
      }
    }
    if (c.status_listen().empty()) {
      return UsageError(
          "replicas meet at the coordinator's service: --status_listen must not be empty");
    }
    if (c.replica_timeout_s() < 1) return UsageError("--replica_timeout_s: must be >= 1");
  }
  if (c.has_weights_pb_limit_mib() && c.weights_pb_limit_mib() < 1) {
    return UsageError("--weights_pb_limit_mib: must be >= 1");
  }
  if (c.has_collect_stall_s() && c.collect_stall_s() < 1)
    return UsageError("--collect_stall_s: must be >= 1");
  if (c.has_transfer_chunk_kib() &&
      (c.transfer_chunk_kib() < 1 || c.transfer_chunk_kib() > (64 << 10))) {
    return UsageError("--transfer_chunk_kib: must be from 1 to 65536 (64 MiB)");
  }
  if (c.overlap_max_delay() > 0 && !Rule(ToUpdateRule(job.rule())).allows_delay) {
    return UsageError(
        absl::StrCat("--overlap_max_delay does not apply to ", v1::UpdateRule_Name(job.rule())));
  }
  return absl::OkStatus();
}

// The Prometheus endpoint, when asked for.
absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(const v1::CoordinatorConfig& c) {
  if (c.metrics_listen().empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<MetricsServer>> ms = MetricsServer::Start(c.metrics_listen());
  if (!ms.ok()) return UsageError(ms.status().message());
  if (!c.metrics_port_file().empty()) {
    if (absl::Status s = WritePortFile(c.metrics_port_file(), {(*ms)->port()}); !s.ok()) {
      return FailureError(s.message());
    }
  }
  return ms;
}

}  // namespace

absl::Status RunCoordinator(const v1::CoordinatorConfig& given, const SecurityOptions& security,
                            std::ostream& log, std::ostream& out) {
  ConfigureAllocatorForMessages();
  // --resume=DIR continues the checkpoints there: DIR is the checkpoint directory.
  v1::CoordinatorConfig c = given;
  if (!c.resume().empty() && c.checkpoint_dir().empty()) {
    c.set_checkpoint_dir(SplitResumePath(c.resume()).first);  // DIR, or DIR of DIR/ckpt-N
  }
  if (absl::Status s = CheckRunSettings(c); !s.ok()) return UsageError(s.message());
  absl::StatusOr<v1::Job> job = LoadJobWithOverrides(c.job(), c.overrides());
  if (!job.ok()) {
    return WithExitCode(job.status(), IsDataError(job.status()) ? kExitBadData : kExitBadJob);
  }
  if (absl::Status s = CheckJobAgainstFlags(c, *job); !s.ok()) return s;
  absl::StatusOr<DataSplit> data = LoadJobData(*job);
  if (!data.ok()) return WithExitCode(data.status(), kExitBadData);
  for (const std::string& w : data->warnings) log << "localpar: warning: " << w << "\n";
  if (absl::Status s = CheckReplicasFitData(*job, data->train.size()); !s.ok()) {
    return JobError(absl::StrCat("invalid job file ", c.job(), ": ", s.message()));
  }
  absl::StatusOr<std::unique_ptr<MetricsServer>> metrics_server = ServeMetrics(c);
  if (!metrics_server.ok()) return metrics_server.status();
  std::unique_ptr<CoordinatorMetrics> metrics;
  if (*metrics_server) {
    metrics = std::make_unique<CoordinatorMetrics>((*metrics_server)->registry(), job->name(),
                                                   !c.checkpoint_dir().empty(),
                                                   JobLabelsPerExample(*job));
  }
  std::optional<v1::ModelWeights> initial;
  InitNotes notes;
  if (!c.init_from().empty()) {
    absl::StatusOr<v1::ModelWeights> w = ReadInitialWeights(c.init_from(), *job, &notes, log);
    if (!w.ok()) {
      return WithExitCode(
          absl::Status(w.status().code(), absl::StrCat("--init_from: ", w.status().message())),
          w.status().code() == absl::StatusCode::kNotFound ? kExitUsage : kExitBadJob);
    }
    initial = *std::move(w);
  }
  LedgerOptions lo = RunLedgerOptions(c.out(), !c.quiet(), log, notes);
  lo.train_line_every_steps = 0;  // the monitor sees the last stage's step four times a second
  lo.train_line_every_seconds = 1.0;
  lo.checkpoint_every_steps = c.checkpoint_every_steps();
  lo.checkpoint_every_seconds = c.checkpoint_every_seconds();
  absl::StatusOr<std::unique_ptr<RunLedger>> ledger =
      RunLedger::Open(*job, data->train.size(), data->test.size(), lo);
  if (!ledger.ok()) return UsageError(absl::StrCat("--out: ", ledger.status().message()));
  if (!c.quiet()) log << "length: " << StepsNote(*job, data->train.size()) << "\n";
  const int replicas = job->replicas();
  const std::string settings = RunSettings(c, initial ? &*initial : nullptr);
  std::string fingerprint = JobFingerprint(*job, settings);
  std::string network = NetworkFingerprint(*job, settings);
  JobRunner runner(c, security, *std::move(job), *std::move(data), std::move(fingerprint), **ledger,
                   metrics.get(), log, out);
  StatusService status(runner.status_board(), runner.checkpointer(), security);
  std::unique_ptr<RendezvousService> rendezvous;
  if (replicas > 1) rendezvous = std::make_unique<RendezvousService>(security);
  std::unique_ptr<grpc::Server> status_server;
  int status_port = 0;
  if (!c.status_listen().empty()) {
    absl::StatusOr<std::unique_ptr<grpc::Server>> served =
        ServeStatus(c, security, &status, rendezvous.get(), &status_port);
    if (!served.ok()) return served.status();
    status_server = *std::move(served);
  }
  if (rendezvous) runner.UseRendezvous(rendezvous.get(), RendezvousAddress(c, status_port));
  if (initial) runner.InitFrom(*std::move(initial));
  runner.checkpointer().SetNetwork(std::move(network));
  if (absl::Status s = DecideResume(c, runner, **ledger, log); !s.ok()) return s;
  return runner.Run();
}

}  // namespace localpar
