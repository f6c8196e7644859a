// `localpar probe`: a gRPC health check, for container health checks.
#pragma once

#include <string>

namespace localpar {

// Returns 0 when the server at `address` reports SERVING within `timeout_ms`, else 1.
int Probe(const std::string& address, int timeout_ms);

}  // namespace localpar
