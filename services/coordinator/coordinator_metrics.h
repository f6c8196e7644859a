// The coordinator's Prometheus metrics (the server and the shared label names are
// services/common/metrics.h).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <string>

#include "services/common/metrics.h"

namespace localpar {

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
