// Program configuration defaults and flag handling.
#include "services/common/program_config.h"

#include <ostream>

#include "absl/strings/str_cat.h"
#include "common/io/atomic_file.h"
#include "common/model_io/checkpoint.h"
#include "services/common/exit_codes.h"
#include "services/common/metrics.h"

#ifndef LOCALPAR_VERSION
#define LOCALPAR_VERSION "0.0"
#endif
#include "git_revision.h"  // generated at build time: LOCALPAR_GIT_REVISION

namespace localpar {

v1::CoordinatorConfig CoordinatorDefaults() {
  v1::CoordinatorConfig c;
  c.set_configure_timeout_s(30);
  c.set_metrics_listen("127.0.0.1:0");
  c.set_status_listen("127.0.0.1:0");
  c.set_keep_checkpoints(3);
  c.set_max_recoveries(10);
  c.set_recovery_timeout_s(60);
  c.set_replica_timeout_s(60);
  c.set_collect_stall_s(60);
  return c;
}

v1::DeviceConfig DeviceDefaults() {
  v1::DeviceConfig d;
  d.set_device("cpu");
  d.set_threads(1);
  return d;
}

v1::WorkerConfig WorkerDefaults() {
  v1::WorkerConfig w;
  w.set_listen("127.0.0.1:0");
  *w.mutable_compute() = DeviceDefaults();
  w.set_queue_capacity(4);
  w.set_metrics_listen("127.0.0.1:0");
  w.set_upstream_stall_s(60);
  w.set_progress_timeout_s(300);
  w.set_max_message_mib(256);
  return w;
}

v1::RunCommand RunDefaults() {
  v1::RunCommand r;
  *r.mutable_coordinator() = CoordinatorDefaults();
  *r.mutable_compute() = DeviceDefaults();
  r.set_queue_capacity(4);
  r.set_slow_stage(-1);
  return r;
}

v1::TrainCommand TrainDefaults() {
  v1::TrainCommand t;
  *t.mutable_compute() = DeviceDefaults();
  return t;
}

v1::ProfileCommand ProfileDefaults() {
  v1::ProfileCommand p;
  *p.mutable_compute() = DeviceDefaults();
  p.set_project_stages("1,2,4");
  return p;
}

v1::PredictCommand PredictDefaults() {
  v1::PredictCommand p;
  *p.mutable_compute() = DeviceDefaults();
  p.set_batch_size(256);
  return p;
}

v1::SampleCommand SampleDefaults() {
  v1::SampleCommand s;
  *s.mutable_compute() = DeviceDefaults();
  s.set_tokens(200);
  s.set_temperature(1.0);
  s.set_seed(1);
  s.set_cache(true);
  return s;
}

v1::ClientCommand ClientDefaults() {
  v1::ClientCommand c;
  c.set_timeout_ms(2000);
  return c;
}

absl::Status LoadSecurity(const v1::SecurityConfig& c, SecurityOptions* out) {
  return LoadSecurity(c.tls_cert(), c.tls_key(), c.tls_ca(), c.mtls(), c.auth_token_file(), out);
}

std::string BuildVersion() { return LOCALPAR_VERSION; }
std::string BuildRevision() { return LOCALPAR_GIT_REVISION; }

std::string VersionString() {
  return std::string("localpar ") + LOCALPAR_VERSION + " (git " + LOCALPAR_GIT_REVISION + ")";
}

absl::Status CheckHostPort(const std::string& address, const std::string& flag, bool port_zero_ok) {
  const size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  int number = -1;
  const bool host_ok =
      !host.empty() && (host.front() == '[' ? host.back() == ']' && host.size() > 2
                                            : host.find_first_of(":[] \t/") == std::string::npos);
  if (!host_ok || port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      (number = std::stoi(port)) > 65535 || (number == 0 && !port_zero_ok)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", address,
                                                   ": expected HOST:PORT with a port from ",
                                                   port_zero_ok ? 0 : 1, " to 65535"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ParseProgramFlags(const std::string& program, const std::string& usage,
                                       const std::vector<std::string>& args,
                                       google::protobuf::Message* message,
                                       const FlagOptions& options,
                                       std::vector<std::string>* positional, std::ostream& out,
                                       bool* check_flags) {
  const std::unique_ptr<google::protobuf::Message> defaults(message->New());
  defaults->CopyFrom(*message);
  absl::StatusOr<ParsedFlags> parsed = ParseFlags(args, message, options);
  if (!parsed.ok()) {
    return UsageError(absl::StrCat(parsed.status().message(), " (see ", program, " --help)"));
  }
  if (parsed->help) {
    out << usage << "\n\nFlags:\n" << FlagHelp(*defaults, options);
    return false;
  }
  if (parsed->version) {
    out << VersionString() << "\n";
    return false;
  }
  if (parsed->check_flags) {
    if (!check_flags) {
      return UsageError(
          absl::StrCat("--check_flags is not a flag of this command (see ", program, " --help)"));
    }
    *check_flags = true;
  }
  *positional = std::move(parsed->positional);
  return true;
}

absl::Status CheckRunSettings(const v1::CoordinatorConfig& c) {
  // --resume=DIR checkpoints into DIR unless --checkpoint_dir names it too.
  // --resume=DIR/ckpt-N rolls back to that checkpoint of DIR.
  const std::string resume_dir = SplitResumePath(c.resume()).first;
  const std::string& dir = c.checkpoint_dir().empty() ? resume_dir : c.checkpoint_dir();
  if (!c.resume().empty() && !c.checkpoint_dir().empty() && resume_dir != c.checkpoint_dir()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--resume=", c.resume(),
                     " continues the checkpoints in that directory, but "
                     "--checkpoint_dir=",
                     c.checkpoint_dir(), " names another; leave --checkpoint_dir out"));
  }
  if (c.stop_after_steps() > 0 && dir.empty()) {
    return absl::InvalidArgumentError(
        "--stop_after_steps needs --checkpoint_dir (the run stops at a checkpoint to resume from)");
  }
  if (!c.out().empty()) {
    if (absl::Status s = CheckWritableDirectory(c.out(), "--out"); !s.ok()) return s;
  }
  if (!dir.empty()) {
    if (absl::Status s = CheckWritableDirectory(
            dir, c.checkpoint_dir().empty() ? "--resume" : "--checkpoint_dir");
        !s.ok()) {
      return s;
    }
    // A fresh run into a folder of another run's checkpoints: refused before anything starts.
    if (c.resume().empty() && !c.resume_if_present()) {
      if (absl::Status s = CheckNoCheckpoints(dir); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--checkpoint_dir=", s.message()));
      }
    }
  }
  if (!c.metrics_listen().empty()) {
    if (absl::Status s = CheckMetricsListen(c.metrics_listen()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace localpar
