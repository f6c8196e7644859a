// localpar_worker: one stage of a job as a gRPC service. The coordinator configures it.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "services/common/security_flags.h"
#include "services/worker/worker.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "Address to serve on (port 0: pick a free port)");
ABSL_FLAG(std::string, port_file, "", "Write the bound port to this file once serving");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda, or auto (cuda when a GPU is present)");
ABSL_FLAG(int, threads, 1,
          "CPU GEMM threads (the reference trainer must use the same count for bitwise equality)");
ABSL_FLAG(int, queue_capacity, 4, "Items buffered in each direction; a full queue slows upstream");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "Address for the Prometheus /metrics endpoint (port 0: pick a free port; empty: off)");
ABSL_FLAG(int, debug_delay_ms, 0, "Testing only: sleep this long after each training batch");

int main(int argc, char** argv) {
  localpar::ListSharedFlagsInHelp();
  absl::SetProgramUsageMessage(
      "localpar_worker: serves one stage of a localpar job (configured by the coordinator).\n"
      "Stops on the Shutdown RPC, SIGTERM or SIGINT, draining in-flight batches first.");
  absl::ParseCommandLine(argc, argv);
  localpar::WorkerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.device = absl::GetFlag(FLAGS_device);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.queue_capacity = absl::GetFlag(FLAGS_queue_capacity);
  options.debug_delay_ms = absl::GetFlag(FLAGS_debug_delay_ms);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (options.threads < 1 || options.queue_capacity < 1) {
    std::cerr << "localpar_worker: --threads and --queue_capacity must be >= 1\n";
    return 2;
  }
  if (absl::Status s = localpar::SecurityFromFlags(&options.security); !s.ok()) {
    std::cerr << "localpar_worker: " << s.message() << "\n";
    return 2;
  }
  return localpar::RunWorker(options);
}
