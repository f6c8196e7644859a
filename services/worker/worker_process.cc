// The worker process.
#include "services/worker/worker_process.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/common/exit_codes.h"
#include "services/common/interrupt.h"
#include "services/common/metrics.h"
#include "services/common/port_file.h"
#include "services/common/spawn.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_service.h"

namespace localpar {
namespace {

// Self-pipe: a handler (not sigwait) because libraries such as OpenBLAS start threads before
// main, with signals unblocked, so any thread may be the one that receives SIGTERM.
int g_signal_pipe[2] = {-1, -1};
void OnTerminate(int sig) {
  char c = static_cast<char>(sig);
  (void)!write(g_signal_pipe[1], &c, 1);
}

}  // namespace

absl::StatusOr<int> RunWorker(const WorkerOptions& given, std::ostream& log) {
  WorkerOptions options = given;
  options.log = &log;
  ConfigureAllocatorForMessages();
  if (pipe(g_signal_pipe) != 0) return FailureError("cannot make the signal pipe");
  InstallSignalHandler(OnTerminate);

  std::unique_ptr<MetricsServer> metrics_server;
  std::unique_ptr<WorkerMetrics> metrics;
  if (!options.config.metrics_listen().empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> ms =
        MetricsServer::Start(options.config.metrics_listen());
    if (!ms.ok()) return UsageError(ms.status().message());
    metrics_server = *std::move(ms);
    metrics = std::make_unique<WorkerMetrics>(metrics_server->registry());
  }
  WorkerService service(options, metrics.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const int64_t max_message = options.config.max_message_mib() << 20;
  ConfigureServer(builder, static_cast<int>(std::min<int64_t>(max_message, kMaxMessageBytes)));
  int port = 0;
  builder.AddListeningPort(options.config.listen(), ServerCredentials(options.security), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return UsageError(absl::StrCat("cannot listen on ", options.config.listen(),
                                   " (in use, or not a valid address)"));
  }
  const int metrics_port = metrics_server ? metrics_server->port() : 0;
  if (!options.config.port_file().empty()) {
    // "GRPC_PORT METRICS_PORT" (0 when metrics are off).
    if (absl::Status s = WritePortFile(options.config.port_file(), {port, metrics_port}); !s.ok()) {
      return FailureError(s.message());
    }
  }
  log << "localpar_worker: serving on port " << port;
  if (metrics_server) log << ", metrics on port " << metrics_port;
  const std::vector<int> cpus = AllowedCpus();
  log << (cpus.size() == 1 ? ", on CPU " : ", on CPUs ");
  for (size_t i = 0; i < cpus.size(); ++i) log << (i ? "," : "") << cpus[i];
  log << "\n";
  int stopped_by = 0;
  std::thread signals([&] {
    char c = 0;
    if (read(g_signal_pipe[0], &c, 1) == 1 && c != 0) {
      log << "localpar_worker: signal " << int{c} << ": draining and shutting down\n";
      stopped_by = c;
      service.RequestShutdown();
    }
  });
  // Progress-based liveness: a compute thread that has worked on its own too long without
  // finishing (a hang, not a wait on a peer) makes the health check say NOT_SERVING, so
  // that a supervisor restarts the worker; it says SERVING again if the work finishes.
  //
  // Memory a burst left behind (a message the transport refused, a large configuration
  // replaced) goes back to the system once the worker is idle: glibc otherwise keeps freed
  // heap for reuse (ConfigureAllocatorForMessages), and a refused 1 GiB message left 1.0 GB
  // resident for minutes. Trimmed when no step was taken for a second and, since the last
  // trim (or their smallest since), the allocator's free chunks grew by 32 MiB or more
  // (trimmed pages still count as free, so the growth is what was freed since) or the
  // resident size did (trimmed pages reused and freed again between two looks).
  constexpr int64_t kTrimAbove = int64_t{32} << 20;
  std::atomic<bool> stopping{false};
  std::thread watchdog([&] {
    const int timeout_s = options.config.progress_timeout_s();
    bool serving = true;
    int64_t steps = service.Steps(), free_floor = AllocatorFreeBytes();
    int64_t resident_after = ResidentBytes();
    while (!stopping) {
      const int64_t now_steps = service.Steps(), free = AllocatorFreeBytes();
      const int64_t resident = ResidentBytes();
      free_floor = std::min(free_floor, free);
      resident_after = std::min(resident_after, resident);
      if (now_steps == steps &&
          (free > free_floor + kTrimAbove || resident > resident_after + kTrimAbove)) {
        TrimFreedMemory();
        free_floor = AllocatorFreeBytes();
        resident_after = ResidentBytes();
      }
      steps = now_steps;
      const bool stuck = timeout_s > 0 && service.StuckSeconds() > timeout_s;
      if (stuck == serving) {
        serving = !stuck;
        server->GetHealthCheckService()->SetServingStatus(serving);
        log << "localpar_worker: "
            << (stuck ? "the compute thread made no progress for " + std::to_string(timeout_s) +
                            " s: NOT_SERVING"
                      : "the compute thread is making progress again: SERVING")
            << "\n";
      }
      for (int i = 0; i < 10 && !stopping; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  service.WaitForShutdown();
  stopping = true;
  watchdog.join();
  // Streams in flight get a grace period to finish their batches.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  // A stream's session may still be ending on one of gRPC's threads (its compute thread
  // finishing a step, its downstream call being released): tearing down the service or
  // gRPC under it crashed the worker when its coordinator died. Its threads end within a
  // step once the call is cancelled; if one does not, leave without running destructors.
  if (!service.WaitForSessions(std::chrono::seconds(30))) {
    log << "localpar_worker: a stream did not end within 30 s of shutdown; exiting now\n";
    log.flush();
    std::_Exit(stopped_by ? 128 + stopped_by : kExitFailure);
  }
  char zero = 0;
  (void)!write(g_signal_pipe[1], &zero, 1);  // wake the signal thread if no signal came
  signals.join();
  // Stopped from outside (not by the job's SHUTDOWN or the Shutdown RPC): 128 + the signal,
  // so that a supervisor (the launcher, Compose, Kubernetes) knows to restart it.
  return stopped_by ? 128 + stopped_by : 0;
}

}  // namespace localpar
