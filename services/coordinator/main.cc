// localpar_coordinator: runs a job on already-running workers, one per stage.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "services/common/job_flags.h"
#include "services/common/security_flags.h"
#include "services/coordinator/coordinator.h"

ABSL_FLAG(std::string, job, "", "Job file (text-format localpar.v1.Job)");
ABSL_FLAG(std::string, workers, "",
          "Comma-separated host:port of each stage's worker, in stage order");
ABSL_FLAG(std::string, out, "", "Directory for report.json and weights.pb (empty: none)");
ABSL_FLAG(bool, quiet, false, "No progress line");
ABSL_FLAG(bool, trace, false, "Also write every stage's per-batch compute intervals to trace.json");
ABSL_FLAG(std::string, non_finite, "reject",
          "NaN/Inf activations: reject (INVALID_ARGUMENT) or skip");
ABSL_FLAG(int, overlap_max_delay, 0,
          "OVERLAP only: apply returned gradients asynchronously, at most this many steps late (0: "
          "synchronous, exact)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "Address for the Prometheus /metrics endpoint (port 0: pick a free port; empty: off)");
ABSL_FLAG(std::string, metrics_port_file, "", "Write the metrics port to this file");
ABSL_FLAG(std::string, status_listen, "127.0.0.1:0",
          "Address of the Coordinator gRPC service that `localpar status` reads (empty: off)");
ABSL_FLAG(std::string, status_port_file, "", "Write the status port to this file");
ABSL_FLAG(std::string, checkpoint_dir, "", "Directory for checkpoints (ckpt-NNNNNN/); empty: none");
ABSL_FLAG(int64_t, checkpoint_every_steps, 0, "Checkpoint every N training steps (0: off)");
ABSL_FLAG(double, checkpoint_every_seconds, 0, "Checkpoint every T seconds (0: off)");
ABSL_FLAG(int, keep_checkpoints, 3, "Committed checkpoints to keep");
ABSL_FLAG(bool, resume, false, "Continue from the newest complete checkpoint in --checkpoint_dir");
ABSL_FLAG(
    bool, resume_if_present, false,
    "Resume when --checkpoint_dir holds a complete checkpoint, else start fresh (for restarts)");
ABSL_FLAG(int, recovery_timeout_s, 60,
          "How long to wait for a lost stage to come back before giving up");
ABSL_FLAG(int, max_recoveries, 10,
          "Pipeline breaks to recover from (with checkpoints) before giving up");
ABSL_FLAG(int64_t, stop_after_steps, 0,
          "Checkpoint and stop after this many steps (0: run to the end)");

int main(int argc, char** argv) {
  localpar::ListSharedFlagsInHelp();
  absl::SetProgramUsageMessage(
      "localpar_coordinator --job=FILE --workers=HOST:PORT,...: trains a job on running "
      "workers.\nExit codes: 0 ok, 1 failure, 2 usage, 3 invalid job, 4 data, 5 worker lost.");
  absl::ParseCommandLine(argc, argv);
  localpar::CoordinatorOptions o;
  o.job_path = absl::GetFlag(FLAGS_job);
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty())) {
    o.workers.emplace_back(w);
  }
  o.out_dir = absl::GetFlag(FLAGS_out);
  o.progress = !absl::GetFlag(FLAGS_quiet);
  o.trace = absl::GetFlag(FLAGS_trace);
  std::string nf = absl::GetFlag(FLAGS_non_finite);
  if (nf != "reject" && nf != "skip") {
    std::cerr << "localpar_coordinator: --non_finite must be reject or skip\n";
    return localpar::kExitUsage;
  }
  o.non_finite =
      nf == "skip" ? localpar::v1::ConfigureRequest::SKIP : localpar::v1::ConfigureRequest::REJECT;
  o.overlap_max_delay = absl::GetFlag(FLAGS_overlap_max_delay);
  localpar::JobOverridesFromFlags(&o);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  o.status_listen = absl::GetFlag(FLAGS_status_listen);
  o.status_port_file = absl::GetFlag(FLAGS_status_port_file);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
  o.checkpoint_every_seconds = absl::GetFlag(FLAGS_checkpoint_every_seconds);
  o.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  o.resume = absl::GetFlag(FLAGS_resume);
  o.resume_if_present = absl::GetFlag(FLAGS_resume_if_present);
  o.stop_after_steps = absl::GetFlag(FLAGS_stop_after_steps);
  o.recovery_timeout_s = absl::GetFlag(FLAGS_recovery_timeout_s);
  o.max_recoveries = absl::GetFlag(FLAGS_max_recoveries);
  if (o.job_path.empty() || o.workers.empty()) {
    std::cerr << "localpar_coordinator: --job and --workers are required; see --help\n";
    return localpar::kExitUsage;
  }
  if (absl::Status s = localpar::SecurityFromFlags(&o.security); !s.ok()) {
    std::cerr << "localpar_coordinator: " << s.message() << "\n";
    return localpar::kExitUsage;
  }
  return localpar::RunCoordinator(o);
}
