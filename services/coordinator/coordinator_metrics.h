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
  // checkpoints: whether the run writes them (the last one's timestamp is exported only
  // then); positions: labels per example (> 1: a sequence model, whose tokens are counted).
  CoordinatorMetrics(prometheus::Registry& registry, const std::string& job, bool checkpoints,
                     int64_t positions);
  void SetEpoch(int epoch) { epoch_.Set(epoch); }
  void SetProgress(double ratio) { progress_.Set(ratio); }
  void AddIngested(int64_t n) {
    ingested_.Increment(static_cast<double>(n));
    if (tokens_) tokens_->Increment(static_cast<double>(n * positions_));
  }
  void SetLearningRate(double lr) { lr_.Set(lr); }
  void AddError() { errors_.Increment(); }
  void CheckpointCommitted(double seconds) {
    checkpoints_.Increment();
    checkpoint_seconds_.Observe(seconds);
    if (last_checkpoint_) last_checkpoint_->SetToCurrentTime();
  }

 private:
  const int64_t positions_;
  prometheus::Gauge& epoch_;
  prometheus::Gauge& progress_;
  prometheus::Counter& ingested_;
  prometheus::Counter& errors_;
  prometheus::Counter& checkpoints_;
  prometheus::Histogram& checkpoint_seconds_;
  prometheus::Gauge& lr_;
  prometheus::Gauge* last_checkpoint_ = nullptr;
  prometheus::Counter* tokens_ = nullptr;
};

}  // namespace localpar
