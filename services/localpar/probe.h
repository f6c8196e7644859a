// `localpar probe` (a gRPC health check, for container health checks) and `localpar status`
// (a running job's per-stage view, read from the coordinator).
#pragma once

#include <string>

#include "services/common/grpc_util.h"

namespace localpar {

// Returns 0 when the server at `address` reports SERVING within `timeout_ms`, else 1.
int Probe(const std::string& address, int timeout_ms, const SecurityOptions& security);

struct StatusOptions {
  int timeout_ms = 2000;  // each call's deadline
  int sample_ms = 1000;   // throughput is sampled over this long
  bool json = false;      // the JobStatus as JSON (no sampling) instead of the table
  double watch_s = 0;     // > 0: again every this many seconds until the coordinator goes away
};
// Prints the job whose coordinator serves `address`: its phase and step, the last checkpoint,
// and each stage's throughput, loss, queue depth and refusals. Returns 0, or 1 when it cannot
// be read (saying why, and naming the wrong kind of process when it is one).
int Status(const std::string& address, const StatusOptions& options,
           const SecurityOptions& security);

// Asks the coordinator at `address` for a checkpoint after the next training step.
int RequestCheckpoint(const std::string& address, const SecurityOptions& security);

}  // namespace localpar
