// Starting child processes (the launcher's workers and coordinator, and the tests' programs).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace localpar {

// fork + execv(argv[0], argv). The child gets its own process group (so a terminal's
// Ctrl-C reaches only the parent, which then stops everyone in order) and is killed if the
// parent dies. stdout and stderr go to `log_path` when it is not empty. With `cpu` >= 0 the
// child runs on that CPU alone. Returns the pid.
pid_t SpawnProcess(const std::vector<std::string>& argv, const std::string& log_path, int cpu = -1);

// The CPUs this process may run on, in order (sched_getaffinity); {0} if it cannot tell.
std::vector<int> AllowedCpus();

}  // namespace localpar
