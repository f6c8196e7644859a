// Subprocess and file helpers for the cluster tests.
#include "tests/services/cluster_util.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "services/common/spawn.h"

namespace localpar::testing {
namespace {

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

pid_t StartProcess(const std::vector<std::string>& argv, const std::string& log_path) {
  return SpawnProcess(argv, log_path);
}

int WaitProcess(pid_t pid, int timeout_s) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return DecodeStatus(status);
    if (r < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

ProcessResult RunProcess(const std::vector<std::string>& argv, int timeout_s) {
  TempDir dir;
  std::string log = dir.path() + "/out.log";
  pid_t pid = StartProcess(argv, log);
  ProcessResult r;
  r.exit_code = WaitProcess(pid, timeout_s);
  if (r.exit_code == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  r.output = ReadFile(log);
  return r;
}

std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid;
    if (rest >> state >> ppid && ppid == pid) out.push_back(std::stoi(name));
  }
  return out;
}

std::vector<pid_t> LaunchedProcesses(pid_t launcher) {
  std::map<int, pid_t> workers;
  pid_t coordinator = -1;
  for (pid_t child : ChildrenOf(launcher)) {
    std::ifstream in("/proc/" + std::to_string(child) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find("localpar_coordinator") != std::string::npos) coordinator = child;
    std::smatch m;
    static const std::regex kPortFile("/worker([0-9]+)\\.port");
    if (std::regex_search(cmdline, m, kPortFile)) workers[std::stoi(m[1])] = child;
  }
  std::vector<pid_t> out;
  for (const auto& [stage, pid] : workers) out.push_back(pid);
  if (coordinator > 0) out.push_back(coordinator);
  return out;
}

bool ProcessAlive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t close = line.rfind(')');
  return close != std::string::npos && line[close + 2] != 'Z';
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/localpar_test.XXXXXX";
  path_ = mkdtemp(tmpl);
}

TempDir::~TempDir() { std::filesystem::remove_all(path_); }

std::string TempDir::Write(const std::string& name, const std::string& text) const {
  std::string p = path_ + "/" + name;
  std::ofstream(p) << text;
  return p;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string BinDir() { return LOCALPAR_BIN_DIR; }

std::vector<double> JsonNumbers(const std::string& json, const std::string& key) {
  std::vector<double> out;
  std::string needle = "\"" + key + "\": ";
  for (size_t pos = json.find(needle); pos != std::string::npos; pos = json.find(needle, pos + 1)) {
    out.push_back(std::strtod(json.c_str() + pos + needle.size(), nullptr));
  }
  return out;
}

}  // namespace localpar::testing
