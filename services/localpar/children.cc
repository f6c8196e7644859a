// Child processes of the launcher.
#include "services/localpar/children.h"

#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <ostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/common/spawn.h"

namespace localpar {

void Child::Start() {
  pid = SpawnProcess(argv, log_path, cpu);
  exited = false;
  status = 0;
  cause.clear();
  restart_at = {};
}

std::string Child::Describe() const {
  if (!cause.empty()) return absl::StrCat(name, " ", cause);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) {
    return name + " was stopped by SIGTERM (it drained and exited)";
  }
  if (WIFEXITED(status)) return absl::StrCat(name, " exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat(name, " was killed by signal ", WTERMSIG(status));
  return name + " stopped";
}

void Reap(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.exited) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.exited = true;
      c.status = status;
    }
  }
}

void StopAll(std::vector<Child>& children, std::chrono::milliseconds grace) {
  for (Child& c : children) {
    if (!c.exited) kill(c.pid, SIGTERM);
  }
  const auto until = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < until) {
    Reap(children);
    bool all = true;
    for (const Child& c : children) all = all && c.exited;
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (Child& c : children) {
    if (!c.exited) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &c.status, 0);
      c.exited = true;
    }
  }
}

void PrintLogTail(const std::string& path, std::ostream& out) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
    if (lines.size() > 5) lines.erase(lines.begin());
  }
  for (const std::string& l : lines) out << "    " << l << "\n";
}

}  // namespace localpar
