// A worker process's life: signals, the gRPC server and metrics endpoint, the port file,
// and a clean shutdown.
#pragma once

#include "services/worker/stage_host.h"

namespace localpar {

// Serves until Shutdown or SIGTERM/SIGINT (which drains in-flight batches first). Returns
// the exit code: 0 after a clean shutdown, 2 when it cannot listen.
int RunWorker(const WorkerOptions& options);

}  // namespace localpar
