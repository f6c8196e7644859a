// `localpar run`'s supervisor: starts one worker process per stage replica and the
// coordinator on loopback with free ports, restarts a crashed or hung one (the coordinator
// rolls back to its last checkpoint), forwards Ctrl-C, and stops them all at the end.
#pragma once

#include <ostream>
#include <string>

#include "services/common/grpc_util.h"
#include "services/localpar/launcher.h"

namespace localpar {

// The handler for SIGINT and SIGTERM while a supervisor runs: once, the coordinator is asked
// to stop after its current step and write what the run has; twice, everything stops at once.
void OnLaunchSignal(int signal);

// Runs the cluster of `stages` x `replicas` workers (stage 0's replicas first) and the
// coordinator, with their port files and logs in `run_dir`; what it does goes to `log`.
// Returns the coordinator's exit code (ExitCode), or kExitInterrupted after Ctrl-C.
int Supervise(const LaunchOptions& options, const SecurityOptions& security, int stages,
              int replicas, const std::string& run_dir, std::ostream& log);

}  // namespace localpar
