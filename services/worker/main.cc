// localpar_worker: one stage of a job as a gRPC service. The coordinator configures it.
#include <iostream>

#include "services/common/exit_codes.h"
#include "services/common/program_config.h"
#include "services/worker/worker_process.h"

int main(int argc, char** argv) {
  const std::string usage =
      "localpar_worker [flags]\n"
      "Serves one stage of a localpar job; the coordinator configures it. Stops on the\n"
      "Shutdown RPC, a SHUTDOWN item, SIGTERM or SIGINT, draining in-flight batches first.\n"
      "--check_flags checks the flags as a run would (without reading files or listening)\n"
      "and exits 0, or 2 naming the flag.";
  localpar::v1::WorkerConfig config = localpar::WorkerDefaults();
  std::vector<std::string> positional;
  bool check_only = false;
  absl::StatusOr<bool> go =
      localpar::ParseProgramFlags("localpar_worker", usage, {argv + 1, argv + argc}, &config, {},
                                  &positional, std::cout, &check_only);
  if (!go.ok()) {
    std::cerr << "localpar_worker: " << go.status().message() << "\n";
    return localpar::ExitCodeOf(go.status());
  }
  if (!*go) return localpar::kExitOk;
  if (!positional.empty()) {
    std::cerr << "localpar_worker: unexpected argument '" << positional[0] << "'\n";
    return localpar::kExitUsage;
  }
  if (config.compute().threads() < 1 || config.queue_capacity() < 1) {
    std::cerr << "localpar_worker: --threads and --queue_capacity must be >= 1\n";
    return localpar::kExitUsage;
  }
  const std::string& device = config.compute().device();
  if (device != "cpu" && device != "cuda" && device != "auto") {
    std::cerr << "localpar_worker: --device=" << device << ": expected cpu, cuda or auto\n";
    return localpar::kExitUsage;
  }
  if (absl::Status s = localpar::CheckHostPort(config.listen(), "--listen", true); !s.ok()) {
    std::cerr << "localpar_worker: " << s.message() << "\n";
    return localpar::kExitUsage;
  }
  if (check_only) {
    std::cout << "localpar_worker: flags ok\n";
    return localpar::kExitOk;
  }
  localpar::WorkerOptions options;
  options.config = config;
  if (absl::Status s = localpar::LoadSecurity(config.security(), &options.security); !s.ok()) {
    std::cerr << "localpar_worker: " << s.message() << "\n";
    return localpar::kExitUsage;
  }
  // The one place the worker's errors are printed and mapped to exit codes.
  absl::StatusOr<int> code = localpar::RunWorker(options, std::cerr);
  if (code.ok()) return *code;
  std::cerr << "localpar_worker: " << code.status().message() << "\n";
  return localpar::ExitCodeOf(code.status());
}
