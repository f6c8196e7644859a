// `localpar run`: the embedded default. Starts one worker process per stage and the
// coordinator on loopback with free ports, supervises them (a crashed worker or coordinator
// is restarted; the coordinator rolls back to its last checkpoint), and stops them all
// cleanly on Ctrl-C or at the end.
#pragma once

#include <string>

#include "proto/config.pb.h"

namespace localpar {

struct LaunchOptions {
  std::string job_path;
  v1::RunCommand run;   // every flag of `localpar run`
  std::string bin_dir;  // where localpar_worker and localpar_coordinator are
};

// Returns the coordinator's exit code (ExitCode), or kExitInterrupted after Ctrl-C.
int Launch(const LaunchOptions& options);

}  // namespace localpar
