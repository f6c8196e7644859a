// Prometheus metrics for the services: one exposer per process on its own port, metric
// families registered once at start-up, label children kept for the hot path.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <mutex>
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

// Why a worker refuses an item: the `reason` label of localpar_rejected_total. Every reason
// is exported from the start (at zero), so dashboards and alerts see the series.
inline constexpr const char* kRejectReasons[] = {
    "before_configure",   "malformed_item",    "unknown_control", "empty_item",
    "malformed_tensor",   "wrong_dtype",       "wrong_shape",     "wrong_labels",
    "label_out_of_range", "unknown_phase",     "bad_position",    "bad_micro_batch",
    "non_finite",         "non_finite_skipped"};

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

// A layer worker's metrics. Families are registered when the worker starts; the labelled
// children are created when it is configured (job and stage known).
class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);
  // replica >= 0: one of the stage's replicas, labelled `replica`.
  void Configure(const std::string& job, int stage, int replica = -1);

  // Step-time phases: receive_wait, forward, backward, update, send_wait, allreduce.
  void ObservePhase(const char* phase, double seconds);
  void AddExamples(bool train, int64_t n);
  void AddStep();
  void SetTrainHead(double loss, double accuracy);
  void SetEvalAccuracy(double accuracy);
  void SetQueue(bool inbound, int64_t depth, int64_t capacity);
  void AddBytes(bool sent, int64_t n);
  void AddRejected(const std::string& reason);
  void SetMemory(int64_t resident_bytes, int64_t device_bytes);

 private:
  prometheus::Family<prometheus::Counter>& examples_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& accuracy_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Gauge>& queue_capacity_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Gauge>& resident_;
  prometheus::Family<prometheus::Gauge>& device_;

  std::mutex mu_;  // guards the children maps and pointers
  std::map<std::string, std::string> base_;
  std::map<std::string, prometheus::Histogram*> phase_;
  std::map<std::string, prometheus::Counter*> rejected_by_reason_;
  prometheus::Counter* train_examples_ = nullptr;
  prometheus::Counter* eval_examples_ = nullptr;
  prometheus::Counter* step_ = nullptr;
  prometheus::Gauge* train_loss_ = nullptr;
  prometheus::Gauge* train_accuracy_ = nullptr;
  prometheus::Gauge* eval_accuracy_ = nullptr;
  prometheus::Gauge* depth_in_ = nullptr;
  prometheus::Gauge* depth_out_ = nullptr;
  prometheus::Gauge* cap_in_ = nullptr;
  prometheus::Gauge* cap_out_ = nullptr;
  prometheus::Counter* sent_ = nullptr;
  prometheus::Counter* received_ = nullptr;
  prometheus::Gauge* resident_bytes_ = nullptr;
  prometheus::Gauge* device_bytes_ = nullptr;
};

// The coordinator's metrics: epoch, progress and examples ingested.
class CoordinatorMetrics {
 public:
  CoordinatorMetrics(prometheus::Registry& registry, const std::string& job);
  void SetEpoch(int epoch) { epoch_.Set(epoch); }
  void SetProgress(double ratio) { progress_.Set(ratio); }
  void AddIngested(int64_t n) { ingested_.Increment(static_cast<double>(n)); }
  void AddError() { errors_.Increment(); }
  void CheckpointCommitted(double seconds) {
    checkpoints_.Increment();
    checkpoint_seconds_.Observe(seconds);
    last_checkpoint_.SetToCurrentTime();
  }

 private:
  prometheus::Gauge& epoch_;
  prometheus::Gauge& progress_;
  prometheus::Counter& ingested_;
  prometheus::Counter& errors_;
  prometheus::Counter& checkpoints_;
  prometheus::Histogram& checkpoint_seconds_;
  prometheus::Gauge& last_checkpoint_;
};

}  // namespace localpar
