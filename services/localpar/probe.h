// `localpar probe` (a gRPC health check, for container health checks) and `localpar status`
// (a running job's per-stage view, read from the coordinator).
#pragma once

#include <string>

#include "services/common/grpc_util.h"

namespace localpar {

// Returns 0 when the server at `address` reports SERVING within `timeout_ms`, else 1.
int Probe(const std::string& address, int timeout_ms, const SecurityOptions& security);

// Prints each stage's throughput (sampled over `sample_ms`), loss, queue depth and
// refusals for the job whose coordinator serves `address`. Returns 0, or 1 if unreachable.
int Status(const std::string& address, int sample_ms, const SecurityOptions& security);

// Asks the coordinator at `address` for a checkpoint after the next training step.
int RequestCheckpoint(const std::string& address, const SecurityOptions& security);

}  // namespace localpar
