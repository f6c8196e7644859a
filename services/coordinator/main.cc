// localpar_coordinator: runs a job on already-running workers, one per stage.
#include <iostream>

#include "services/common/exit_codes.h"
#include "services/common/interrupt.h"
#include "services/common/program_config.h"
#include "services/coordinator/coordinator.h"

int main(int argc, char** argv) {
  const std::string usage =
      "localpar_coordinator --job=FILE --workers=HOST:PORT,... [flags] [--config=FILE]\n"
      "Trains a job on running workers, one per stage, in stage order. --config reads a\n"
      "text-format localpar.v1.CoordinatorConfig first; flags beside it override it.\n"
      "SIGINT or SIGTERM stops it after the current step: a checkpoint (with --checkpoint_dir),\n"
      "the weights and report so far (with --out), exit 130; a second one stops it at once.\n"
      "Exit codes: 0 ok, 1 failure, 2 usage, 3 invalid job, 4 data, 5 a worker was lost,\n"
      "6 training failed, 130 interrupted.\n"
      "--check_flags checks the flags as a run would (without reading files or dialling\n"
      "workers) and exits 0, or 2 naming the flag.";
  localpar::v1::CoordinatorConfig config = localpar::CoordinatorDefaults();
  localpar::FlagOptions options;
  options.config_flag = true;
  std::vector<std::string> positional;
  bool check_only = false;
  absl::StatusOr<bool> go =
      localpar::ParseProgramFlags("localpar_coordinator", usage, {argv + 1, argv + argc}, &config,
                                  options, &positional, std::cout, &check_only);
  if (!go.ok()) {
    std::cerr << "localpar_coordinator: " << go.status().message() << "\n";
    return localpar::ExitCodeOf(go.status());
  }
  if (!*go) return localpar::kExitOk;
  if (!positional.empty()) {
    std::cerr << "localpar_coordinator: unexpected argument '" << positional[0] << "'\n";
    return localpar::kExitUsage;
  }
  if (config.job().empty() || config.workers().empty()) {
    std::cerr << "localpar_coordinator: --job and --workers are required; see --help\n";
    return localpar::kExitUsage;
  }
  for (const std::string& w : config.workers()) {
    if (absl::Status s = localpar::CheckHostPort(w, "--workers", false); !s.ok()) {
      std::cerr << "localpar_coordinator: " << s.message() << "\n";
      return localpar::kExitUsage;
    }
  }
  if (check_only) {
    std::cout << "localpar_coordinator: flags ok\n";
    return localpar::kExitOk;
  }
  localpar::SecurityOptions security;
  if (absl::Status s = localpar::LoadSecurity(config.security(), &security); !s.ok()) {
    std::cerr << "localpar_coordinator: " << s.message() << "\n";
    return localpar::kExitUsage;
  }
  // SIGINT or SIGTERM: stop at the next step, checkpoint, write what there is, exit 130.
  localpar::InstallInterruptHandler();
  // The one place the coordinator's errors are printed and mapped to exit codes.
  absl::Status s = localpar::RunCoordinator(config, security, std::cerr, std::cout);
  if (!s.ok()) std::cerr << "localpar: " << s.message() << "\n";
  return localpar::ExitCodeOf(s);
}
