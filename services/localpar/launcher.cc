// `localpar run`'s start-up (launcher.h): the checks before anything starts, and the run
// directory the supervisor works in.
#include "services/localpar/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/dataset.h"
#include "common/job/parse.h"
#include "services/common/exit_codes.h"
#include "services/common/interrupt.h"
#include "services/common/port_file.h"
#include "services/common/program_config.h"
#include "services/localpar/supervisor.h"

namespace localpar {
namespace {

// A run directory holds launcher.pid while its launcher lives. One whose launcher is gone
// without cleaning up (SIGKILL) is removed by the next launch; a failed run's directory,
// kept for its logs, no longer has the file.
constexpr char kRunDirPrefix[] = "localpar.";

void RemoveStaleRunDirs() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/tmp", ec)) {
    if (e.path().filename().string().rfind(kRunDirPrefix, 0) != 0) continue;
    std::optional<std::vector<int>> pid = ReadPortFile((e.path() / "launcher.pid").string(), 1);
    if (pid && kill((*pid)[0], 0) != 0 && errno == ESRCH) std::filesystem::remove_all(e.path(), ec);
  }
}

// What one idle worker process holds (gRPC, oneDNN and OpenBLAS pools, its queues).
constexpr int64_t kWorkerMiB = 200;

// MemAvailable from /proc/meminfo, in MiB (a large number when it cannot be read).
int64_t AvailableMemoryMiB() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib / 1024;
  }
  return int64_t{1} << 40;
}

// True when some process wrote to its log in `run_dir`: worth keeping after a failure.
bool HoldsLogs(const std::string& run_dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run_dir, ec)) {
    if (e.path().filename().string().find(".log") != std::string::npos && e.is_regular_file(ec) &&
        e.file_size(ec) > 0) {
      return true;
    }
  }
  return false;
}

// Refuses bad settings, a bad job, a missing data set or more workers than the machine
// holds before anything starts; on OK, *job is the job and *security its credentials.
absl::Status CheckLaunch(const LaunchOptions& o, v1::Job* job_out, SecurityOptions* security) {
  if (absl::Status s = CheckRunSettings(o.run.coordinator()); !s.ok()) {
    return UsageError(s.message());
  }
  absl::StatusOr<v1::Job> job = LoadJobWithOverrides(o.job_path, o.run.coordinator().overrides());
  if (!job.ok()) return JobLoadError(job.status());
  // One worker process per stage replica, each about kWorkerMiB before its stage's state:
  // a job of a thousand stages is refused here, not by the kernel's OOM killer.
  const int64_t wanted = static_cast<int64_t>(job->stages_size()) * std::max(1, job->replicas());
  const int64_t available_mib = AvailableMemoryMiB();
  const int64_t fit = o.run.has_max_local_workers()
                          ? o.run.max_local_workers()
                          : std::max<int64_t>(1, available_mib / kWorkerMiB);
  if (wanted > fit) {
    return UsageError(
        absl::StrCat("the job needs ", wanted, " worker processes (", job->stages_size(),
                     " stages x ", std::max(1, job->replicas()), " replicas), about ",
                     wanted * kWorkerMiB, " MiB at ~", kWorkerMiB, " MiB each; ",
                     o.run.has_max_local_workers()
                         ? absl::StrCat("--max_local_workers is ", o.run.max_local_workers())
                         : absl::StrCat("this machine has ", available_mib, " MiB available"),
                     ". Run its stages across machines (localpar_worker on each, then "
                     "localpar_coordinator), or raise --max_local_workers."));
  }
  for (const char* program : {"/localpar_worker", "/localpar_coordinator"}) {
    const std::string bin = o.bin_dir + program;
    if (access(bin.c_str(), X_OK) != 0) {
      return FailureError(absl::StrCat(bin, " not found (build all targets)"));
    }
  }
  if (absl::Status s = LoadSecurity(o.run.coordinator().security(), security); !s.ok()) {
    return UsageError(s.message());
  }
  *job_out = *std::move(job);
  return absl::OkStatus();
}

}  // namespace

absl::Status Launch(const LaunchOptions& o, std::ostream& log) {
  v1::Job job;
  SecurityOptions security;
  if (absl::Status s = CheckLaunch(o, &job, &security); !s.ok()) return s;
  RemoveStaleRunDirs();
  char tmpl[] = "/tmp/localpar.XXXXXX";
  if (!mkdtemp(tmpl)) {
    return FailureError(absl::StrCat("cannot create a run directory in /tmp: ", strerror(errno)));
  }
  if (absl::Status s = WritePortFile(std::string(tmpl) + "/launcher.pid", {getpid()}); !s.ok()) {
    return FailureError(s.message());
  }
  InstallSignalHandler(OnLaunchSignal);
  const std::string run_dir = tmpl;
  const int rc = Supervise(o, security, job.stages_size(), job.replicas(), run_dir, log);
  std::error_code ec;
  if (rc == kExitOk || rc == kExitInterrupted || !HoldsLogs(run_dir)) {
    std::filesystem::remove_all(run_dir, ec);
  } else {
    std::filesystem::remove(run_dir + "/launcher.pid", ec);  // kept for its logs
    log << "localpar: worker logs are in " << run_dir << "\n";
  }
  // The coordinator (or the supervisor, for a lost worker) has said why.
  return rc == kExitOk ? absl::OkStatus() : ReportedError(static_cast<ExitCode>(rc));
}

}  // namespace localpar
