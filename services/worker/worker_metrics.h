// A layer worker's Prometheus metrics (the server and the shared label names are
// services/common/metrics.h).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "services/common/metrics.h"

namespace localpar {

// Why a worker refuses an item: the `reason` label of localpar_rejected_total. Every reason
// is exported from the start (at zero), so dashboards and alerts see the series.
inline constexpr const char* kRejectReasons[] = {
    "before_configure",   "malformed_item",    "unknown_control", "empty_item",
    "malformed_tensor",   "wrong_dtype",       "wrong_shape",     "wrong_labels",
    "label_out_of_range", "unknown_phase",     "bad_position",    "bad_micro_batch",
    "non_finite",         "non_finite_skipped"};

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

}  // namespace localpar
