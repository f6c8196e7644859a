// A worker process's life: signals, the gRPC server and metrics endpoint, the port file,
// and a clean shutdown.
#pragma once

#include <ostream>

#include "absl/status/statusor.h"
#include "services/worker/stage_host.h"

namespace localpar {

// Serves until Shutdown or SIGTERM/SIGINT (which drains in-flight batches first); messages
// go to `log`. Returns the exit code of a clean stop: 0 after Shutdown or SHUTDOWN, 128 + the
// signal when stopped from outside. An error (it cannot listen, say) carries its exit code.
absl::StatusOr<int> RunWorker(const WorkerOptions& options, std::ostream& log);

}  // namespace localpar
