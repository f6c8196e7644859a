// `localpar run`: the embedded default. Starts one worker process per stage and the
// coordinator on loopback with free ports, supervises them (a crashed worker or coordinator
// is restarted; the coordinator rolls back to its last checkpoint), and stops them all
// cleanly on Ctrl-C or at the end.
#pragma once

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "proto/config.pb.h"

namespace localpar {

struct LaunchOptions {
  std::string job_path;
  v1::RunCommand run;   // every flag of `localpar run`
  std::string bin_dir;  // where localpar_worker and localpar_coordinator are
};

// Runs the job; the launcher's own messages (processes up, restarts, the metrics ports) go to
// `log`, each process's to the terminal or its log file. A job, a setting or a machine that
// cannot run it is refused before anything starts. A run that ends otherwise than OK is an
// error with the coordinator's exit code (ExitCode), or kExitInterrupted after Ctrl-C.
absl::Status Launch(const LaunchOptions& options, std::ostream& log);

}  // namespace localpar
