// `localpar probe` (a gRPC health check, for container health checks) and `localpar status`
// (a running job's per-stage view, read from the coordinator).
#pragma once

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "services/common/grpc_util.h"

namespace localpar {

// Writes the server's serving status to `out`; OK when the server at `address` reports
// SERVING within `timeout_ms`, else an error (exit 1) saying why.
absl::Status Probe(const std::string& address, int timeout_ms, const SecurityOptions& security,
                   std::ostream& out);

struct StatusOptions {
  int timeout_ms = 2000;  // each call's deadline
  int sample_ms = 1000;   // throughput is sampled over this long
  bool json = false;      // the JobStatus as JSON (no sampling) instead of the table
  double watch_s = 0;     // > 0: again every this many seconds until the coordinator goes away
};
// Writes to `out` the job whose coordinator serves `address`: its phase and step, the last
// checkpoint, and each stage's throughput, loss, queue depth and refusals. An error (exit 1)
// when it cannot be read, saying why and naming the wrong kind of process when it is one.
// Watching, the end of the job is said on `err` and is no error.
absl::Status Status(const std::string& address, const StatusOptions& options,
                    const SecurityOptions& security, std::ostream& out, std::ostream& err);

// Asks the coordinator at `address` for a checkpoint after the next training step; its
// answer goes to `out`.
absl::Status RequestCheckpoint(const std::string& address, const SecurityOptions& security,
                               std::ostream& out);

}  // namespace localpar
