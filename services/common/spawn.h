// Starting child processes (the launcher's workers and coordinator, and the tests' programs).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace localpar {

// fork + execv(argv[0], argv). The child gets its own process group (so a terminal's
// Ctrl-C reaches only the parent, which then stops everyone in order) and is killed if the
// parent dies. stdout and stderr go to `log_path` when it is not empty. Returns the pid.
pid_t SpawnProcess(const std::vector<std::string>& argv, const std::string& log_path);

}  // namespace localpar
