// `localpar run`.
#include <filesystem>

#include "services/common/exit_codes.h"
#include "services/localpar/command_flags.h"
#include "services/localpar/launcher.h"

namespace localpar {
namespace {

std::string BinDir() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

}  // namespace

absl::Status RunCommand(const Args& args, const Io& io) {
  LaunchOptions o;
  o.run = RunDefaults();
  FlagOptions flags;
  // The launcher sets these itself.
  flags.exclude = {"coordinator.job", "coordinator.workers", "coordinator.local_snapshots",
                   "metrics_port_file", "status_port_file"};
  absl::StatusOr<bool> go =
      ParseCommand("run",
                   "localpar run JOB_FILE [flags]\n"
                   "Trains JOB_FILE on a local cluster: one localpar_worker process per stage and "
                   "a\nlocalpar_coordinator, over gRPC on loopback. Ctrl-C stops them all.",
                   args, &o.run, flags, &o.job_path, io.out);
  if (!go.ok() || !*go) return go.status();
  const v1::RunCommand& r = o.run;
  if (r.compute().threads() < 1) return UsageError("--threads must be >= 1");
  if (r.queue_capacity() < 1) return UsageError("--queue_capacity must be >= 1");
  o.bin_dir = BinDir();
  return Launch(o, io.err);
}

}  // namespace localpar
