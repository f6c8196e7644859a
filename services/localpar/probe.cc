// gRPC health check client.
#include "services/localpar/probe.h"

#include <chrono>
#include <functional>
#include <ostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/run/report.h"
#include "proto/health.grpc.pb.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/exit_codes.h"
#include "services/common/grpc_util.h"
#include "services/common/peer_text.h"
#include "services/localpar/command_flags.h"

namespace localpar {

absl::Status Probe(const std::string& address, int timeout_ms, const SecurityOptions& security,
                   std::ostream& out) {
  auto stub = grpc::health::v1::Health::NewStub(MakeChannel(address, security));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
  if (!st.ok()) {
    return FailureError(absl::StrCat(address, ": ", SanitizePeerText(st.error_message())));
  }
  const std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  out << address << ": " << name << "\n";
  if (resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) return absl::OkStatus();
  return FailureError(absl::StrCat(address, " is not serving (", name, ")"));
}

namespace {

// What a failed Status call means, for a person: the wrong kind of process is the usual one.
std::string StatusError(const std::string& address, const grpc::Status& st) {
  if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return absl::StrCat(address,
                        " is not a coordinator: it does not serve localpar.v1.Coordinator (a "
                        "worker? `localpar probe` checks workers; `localpar run` prints the "
                        "coordinator's status address)");
  }
  const std::string m = SanitizePeerText(st.error_message());
  if (m.find("http1") != std::string::npos || m.find("HTTP/1") != std::string::npos ||
      m.find("Socket closed") != std::string::npos) {
    return absl::StrCat(address, ": ", m,
                        " (is this a gRPC port? a /metrics endpoint speaks HTTP/1, not gRPC)");
  }
  return absl::StrCat(address, ": ", m);
}

void PrintStatus(const v1::JobStatus& a, const v1::JobStatus& b, std::ostream& out) {
  const double dt = b.uptime_seconds() - a.uptime_seconds();
  const int64_t step = b.stages_size() > 0 ? b.stages(b.stages_size() - 1).steps() : 0;
  out << absl::StrFormat(
      "%s (%s): epoch %d/%d, %s, step %d/%d (the last stage; %d fed), up %.0f s\n",
      SanitizePeerText(b.job()), SanitizePeerText(b.rule()), b.epoch(), b.epochs(),
      b.phase().empty() ? "running" : SanitizePeerText(b.phase()), step, b.total_steps(),
      b.fed_steps(), b.uptime_seconds());
  if (!b.checkpoints()) {
    out << "checkpoints: off (no --checkpoint_dir)\n";
  } else if (b.last_checkpoint().empty()) {
    out << "checkpoints: none committed yet\n";
  } else {
    out << absl::StrFormat("last checkpoint: %s (%.0f s ago)\n",
                           SanitizePeerText(b.last_checkpoint()), b.checkpoint_age_seconds());
  }
  const bool bytes = b.byte_tokens();  // losses in nats, and in bits per byte beside them
  out << "stage  address                 examples/s   loss   " << (bytes ? " bits/byte" : "")
      << "  queue   refused\n";
  for (int k = 0; k < b.stages_size(); ++k) {
    const v1::StageStatus& s = b.stages(k);
    int64_t before = k < a.stages_size() ? a.stages(k).examples() : s.examples();
    double rate = dt > 0 ? (s.examples() - before) / dt : 0;
    const std::string bits = bytes ? absl::StrFormat("  %8.3f", BitsPerByte(s.loss())) : "";
    out << absl::StrFormat(
        "%5d  %-22s  %10.0f  %7.4f%s  %3d/%-3d  %7d%s\n", s.stage(),
        s.replicas() > 1 ? absl::StrCat(s.replicas(), " replicas") : SanitizePeerText(s.address()),
        rate, s.loss(), bits, s.queue_depth(), s.queue_capacity(), s.rejected(),
        s.reachable() ? "" : "  UNREACHABLE");
    // With replicas, each one's address, throughput and time spent exchanging gradients.
    for (int r = 0; r < s.replica_addresses_size(); ++r) {
      const bool same = k < a.stages_size() && r < a.stages(k).replica_examples_size();
      const double was = same ? a.stages(k).replica_examples(r) : s.replica_examples(r);
      const double ar_was = same ? a.stages(k).replica_allreduce_seconds(r) : 0;
      const bool up = r < s.replica_reachable_size() && s.replica_reachable(r);
      out << absl::StrFormat(
          "    r%-2d %-22s  %10.0f  all-reduce %.0f%% of the time%s\n", r,
          SanitizePeerText(s.replica_addresses(r)), dt > 0 ? (s.replica_examples(r) - was) / dt : 0,
          dt > 0 && same ? 100 * (s.replica_allreduce_seconds(r) - ar_was) / dt : 0,
          up ? "" : "  UNREACHABLE");
    }
  }
}

}  // namespace

absl::Status Status(const std::string& address, const StatusOptions& o,
                    const SecurityOptions& security, std::ostream& out, std::ostream& err) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(address, security));
  auto fetch = [&](v1::JobStatus* out) -> grpc::Status {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(o.timeout_ms));
    AddToken(ctx, security);
    return stub->Status(&ctx, v1::StatusRequest(), out);
  };
  for (int round = 0;; ++round) {
    v1::JobStatus a, b;
    grpc::Status st = fetch(&a);
    if (st.ok() && !o.json) {
      std::this_thread::sleep_for(std::chrono::milliseconds(o.sample_ms));
      st = fetch(&b);
    } else {
      b = a;
    }
    if (!st.ok()) {
      // Watching, a coordinator that goes away after answering has finished (or died: its
      // own exit code says which). A server shutting down mid-call cancels it.
      if (round > 0 && (st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                        st.error_code() == grpc::StatusCode::CANCELLED)) {
        err << "localpar status: " << address
            << " stopped answering (the job ended, or its coordinator stopped)\n";
        return absl::OkStatus();
      }
      return FailureError(StatusError(address, st));
    }
    if (o.json) {
      out << ToJson(b, true);
    } else {
      if (round > 0) out << "\n";
      PrintStatus(a, b, out);
    }
    out.flush();
    if (o.watch_s <= 0) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::duration<double>(o.watch_s));
  }
}

absl::Status RequestCheckpoint(const std::string& address, const SecurityOptions& security,
                               std::ostream& out) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(address, security));
  grpc::ClientContext ctx;
  AddToken(ctx, security);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::CheckpointResponse resp;
  grpc::Status st = stub->Checkpoint(&ctx, v1::CheckpointRequest(), &resp);
  if (!st.ok()) {
    return FailureError(absl::StrCat(address, ": ", SanitizePeerText(st.error_message())));
  }
  out << SanitizePeerText(resp.message()) << "\n";
  return absl::OkStatus();
}

namespace {

// A client command: its flags, the security files they name, then `call` on the address.
absl::Status ClientCommand(
    const char* command, const char* usage, const Args& args, const Io& io,
    const std::function<absl::Status(const std::string&, const v1::ClientCommand&,
                                     const SecurityOptions&)>& call) {
  v1::ClientCommand c = ClientDefaults();
  std::string address;
  absl::StatusOr<bool> go = ParseCommand(command, usage, args, &c, {}, &address, io.out);
  if (!go.ok() || !*go) return go.status();
  SecurityOptions security;
  if (absl::Status s = LoadSecurity(c.security(), &security); !s.ok()) {
    return UsageError(s.message());
  }
  return call(address, c, security);
}

}  // namespace

absl::Status ProbeCommand(const Args& args, const Io& io) {
  return ClientCommand(
      "probe",
      "localpar probe HOST:PORT [flags]\n"
      "The standard gRPC health check of a worker or coordinator: exit 0 when it "
      "reports SERVING.",
      args, io, [&](const std::string& a, const v1::ClientCommand& c, const SecurityOptions& s) {
        return Probe(a, c.timeout_ms(), s, io.out);
      });
}

absl::Status StatusCommand(const Args& args, const Io& io) {
  v1::StatusCommand c;
  *c.mutable_client() = ClientDefaults();
  std::string address;
  absl::StatusOr<bool> go =
      ParseCommand("status",
                   "localpar status HOST:PORT [flags]\n"
                   "A running job, from its coordinator: the phase, the step, the last "
                   "checkpoint, and each stage's\nthroughput (sampled over a second), loss, "
                   "queue and refusals.",
                   args, &c, {}, &address, io.out);
  if (!go.ok() || !*go) return go.status();
  if (c.watch_s() < 0) return UsageError("--watch_s must be >= 0");
  SecurityOptions security;
  if (absl::Status s = LoadSecurity(c.client().security(), &security); !s.ok()) {
    return UsageError(s.message());
  }
  StatusOptions o;
  o.timeout_ms = c.client().timeout_ms();
  o.json = c.json();
  o.watch_s = c.watch_s();
  return Status(address, o, security, io.out, io.err);
}

absl::Status CheckpointCommand(const Args& args, const Io& io) {
  return ClientCommand("checkpoint",
                       "localpar checkpoint HOST:PORT [flags]\n"
                       "Asks the job's coordinator for a checkpoint after the next training step.",
                       args, io,
                       [&](const std::string& a, const v1::ClientCommand&,
                           const SecurityOptions& s) { return RequestCheckpoint(a, s, io.out); });
}

}  // namespace localpar
