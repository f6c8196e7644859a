// The launcher's child processes: starting, reaping, describing and stopping them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

namespace localpar {

struct Child {
  std::string name;  // "worker for stage 2", "coordinator"
  std::vector<std::string> argv;
  std::string log_path;  // empty: the launcher's own stdout and stderr
  int cpu = -1;          // the one CPU it runs on (--pin_workers), or -1 for any
  pid_t pid = -1;
  bool exited = false;
  int status = 0;  // from waitpid
  int restarts = 0;
  std::string cause;  // why the launcher killed it (a failed health check), if it did
  std::chrono::steady_clock::time_point restart_at{};  // when a restart is due (backoff)

  void Start();
  // "worker for stage 2 exited with code 1" / "... was killed by signal 9" / the cause.
  std::string Describe() const;
  // Exited while it was still needed (the launcher's workers stay after the job's SHUTDOWN,
  // so any exit before the launcher stops them is a loss).
  bool Lost() const { return exited; }
};

// Notes every child that has exited, without waiting.
void Reap(std::vector<Child>& children);
// SIGTERM (workers drain), then SIGKILL whatever is still running after `grace`.
void StopAll(std::vector<Child>& children, std::chrono::milliseconds grace);
// The last lines of a log, indented, to stderr.
void PrintLogTail(const std::string& path, std::ostream& out);

}  // namespace localpar
