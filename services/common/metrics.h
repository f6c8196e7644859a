// Prometheus for the services: one exposer per process on its own port, and the label names
// every program's metrics share. Each program's own metrics are in its folder
// (worker/worker_metrics.h, coordinator/coordinator_metrics.h).
#pragma once

#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct MHD_Daemon;  // libmicrohttpd

namespace localpar {

// Label names, defined once (low cardinality: never a batch id).
namespace labels {
// The localpar job's name. Not `job`, which is Prometheus's own label for the scrape job:
// the two clashed unless every scrape set honor_labels.
inline constexpr char kJob[] = "localpar_job";
inline constexpr char kStage[] = "stage";
inline constexpr char kPhase[] = "phase";
inline constexpr char kDirection[] = "direction";
inline constexpr char kReason[] = "reason";
inline constexpr char kReplica[] = "replica";
}  // namespace labels

// Owns the registry and serves it as Prometheus text on exactly GET /metrics, through
// libmicrohttpd: a pool of threads, a connection limit and a per-connection timeout, so a
// slow or idle client cannot hold up a scrape. Anything else is 404 (405 for other methods).
//
// prometheus-cpp's own Exposer (civetweb) cannot start in our processes: civetweb creates
// its threads with a ~100 KB stack, and cuBLASLt's 94 KB of static TLS (the worker links
// CUDA) leaves too little, so pthread_create fails. libmicrohttpd's stack size is set here.
// Refuses a --metrics_listen that is not IPv4:PORT, or whose port cannot be bound now (in
// use, or an address not this host's), before anything starts.
absl::Status CheckMetricsListen(const std::string& listen);

class MetricsServer {
 public:
  // `listen` is host:port (IPv4); port 0 picks a free one.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen);
  ~MetricsServer();
  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }
  // The exposition text (what GET /metrics answers): the registry, then the process_*
  // metrics (process_metrics.h). The registry holds localpar_build_info{version, revision}.
  std::string Render() const;

 private:
  MetricsServer() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  ::MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace localpar
