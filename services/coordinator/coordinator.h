// The coordinator: owns a job. It configures one worker per stage, streams the data into
// the first, runs evaluation after every epoch, and writes the report and final weights.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/localpar.pb.h"
#include "services/common/grpc_util.h"

namespace localpar {

struct CoordinatorOptions {
  std::string job_path;
  std::vector<std::string> workers;  // host:port per stage, in stage order
  std::string out_dir;               // report.json, weights.pb (and trace.json)
  bool progress = true;
  bool trace = false;  // write every stage's per-batch compute intervals to trace.json
  v1::ConfigureRequest::NonFinite non_finite = v1::ConfigureRequest::REJECT;
  int overlap_max_delay = 0;  // asynchronous OVERLAP when > 0
  int configure_timeout_s = 30;
  std::string metrics_listen = "127.0.0.1:0";  // Prometheus /metrics; empty: none
  std::string metrics_port_file;               // written with the metrics port
  std::string status_listen = "127.0.0.1:0";   // Coordinator gRPC service (localpar status)
  std::string status_port_file;                // written with its port
  // Overrides applied to the job file (0 / empty: keep the job's).
  std::string rule;
  int epochs = 0;
  int64_t max_steps = 0;
  int64_t seed = -1;  // -1: keep
  int stages = 0;     // regroup the job's stages into this many (RegroupStages); 0: keep
  // Checkpoints: a directory of ckpt-NNNNNN/ subdirectories, each committed by its MANIFEST.
  std::string checkpoint_dir;
  int64_t checkpoint_every_steps = 0;
  double checkpoint_every_seconds = 0;
  int keep_checkpoints = 3;
  bool resume = false;             // continue from the newest complete checkpoint
  bool resume_if_present = false;  // resume when one exists, else start fresh (restarts)
  int64_t stop_after_steps = 0;    // checkpoint and stop after this many steps (0: run on)
  SecurityOptions security;        // TLS to the workers, the status service, tokens
  int max_recoveries = 10;         // pipeline breaks survived (with checkpoints) before giving up
  int recovery_timeout_s = 60;     // how long to wait for a lost stage to come back
};

// Exit codes, shared by the coordinator and the launcher.
enum ExitCode {
  kExitOk = 0,
  kExitFailure = 1,
  kExitUsage = 2,
  kExitBadJob = 3,
  kExitBadData = 4,
  kExitWorkerLost = 5,
  kExitInterrupted = 130,
};

int RunCoordinator(const CoordinatorOptions& options);

// Loads a job file and applies the overrides in `options`; used before anything starts.
absl::StatusOr<v1::Job> LoadJobWithOverrides(const CoordinatorOptions& options);

}  // namespace localpar
