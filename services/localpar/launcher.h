// `localpar run`: the embedded default. Starts one worker process per stage and the
// coordinator on loopback with free ports, supervises them, and stops them all cleanly.
#pragma once

#include <string>
#include <vector>

#include "services/coordinator/coordinator.h"

namespace localpar {

struct LaunchOptions {
  CoordinatorOptions coordinator;  // job, out dir, progress, overrides
  std::string device = "cpu";
  int threads = 1;
  int queue_capacity = 4;
  std::string bin_dir;  // where localpar_worker and localpar_coordinator are
  // Testing: slow one stage down by this many milliseconds per training batch.
  int slow_stage = -1;
  int slow_ms = 0;
  // When set, the metrics endpoints of every process are written here as a Prometheus
  // file_sd target list once they are up.
  std::string metrics_targets;
  // Security flags forwarded verbatim to every worker and the coordinator.
  std::vector<std::string> security_flags;
};

// Returns the coordinator's exit code (see ExitCode), or kExitInterrupted after Ctrl-C.
int Launch(const LaunchOptions& options);

}  // namespace localpar
