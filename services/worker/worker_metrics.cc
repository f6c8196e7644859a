// A layer worker's Prometheus metrics.
#include "services/worker/worker_metrics.h"

namespace localpar {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Step phases span ~10 us (a small stage on a GPU) to seconds (a wide stage on a CPU).
const prometheus::Histogram::BucketBoundaries& StepBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1, 3};
  return *b;
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& r)
    : examples_(BuildCounter()
                    .Name("localpar_examples_total")
                    .Help("Examples processed by a stage, by phase (train, eval)")
                    .Register(r)),
      steps_(BuildCounter()
                 .Name("localpar_steps_total")
                 .Help("Parameter updates applied by a stage")
                 .Register(r)),
      step_seconds_(BuildHistogram()
                        .Name("localpar_step_seconds")
                        .Help("Time per training batch in each phase: receive_wait, forward, "
                              "backward, update, send_wait, allreduce (replicas exchanging "
                              "gradients)")
                        .Register(r)),
      loss_(BuildGauge()
                .Name("localpar_loss")
                .Help("Local (head) loss of the stage's latest training batch")
                .Register(r)),
      accuracy_(BuildGauge()
                    .Name("localpar_head_accuracy_ratio")
                    .Help("Head accuracy: latest training batch (train), last evaluation (eval)")
                    .Register(r)),
      queue_depth_(BuildGauge()
                       .Name("localpar_queue_depth")
                       .Help("Items waiting in a worker queue, by direction (inbound, outbound)")
                       .Register(r)),
      queue_capacity_(BuildGauge()
                          .Name("localpar_queue_capacity")
                          .Help("Capacity of a worker queue, by direction")
                          .Register(r)),
      bytes_(BuildCounter()
                 .Name("localpar_stream_bytes_total")
                 .Help("Bytes of stream items, by direction (received from upstream, sent "
                       "downstream)")
                 .Register(r)),
      rejected_(BuildCounter()
                    .Name("localpar_rejected_total")
                    .Help("Items refused by a worker, by reason")
                    .Register(r)),
      resident_(BuildGauge()
                    .Name("localpar_resident_memory_bytes")
                    .Help("Resident memory of the worker process")
                    .Register(r)),
      device_(BuildGauge()
                  .Name("localpar_device_memory_bytes")
                  .Help("Device (GPU) memory in use by the stage; 0 on the CPU backend")
                  .Register(r)) {}

void WorkerMetrics::Configure(const std::string& job, int stage, int replica) {
  std::lock_guard<std::mutex> lock(mu_);
  base_ = {{labels::kJob, job}, {labels::kStage, std::to_string(stage)}};
  if (replica >= 0) base_[labels::kReplica] = std::to_string(replica);
  auto with = [&](const char* key, const std::string& value) {
    auto l = base_;
    l[key] = value;
    return l;
  };
  train_examples_ = &examples_.Add(with(labels::kPhase, "train"));
  eval_examples_ = &examples_.Add(with(labels::kPhase, "eval"));
  step_ = &steps_.Add(base_);
  phase_.clear();
  for (const char* p :
       {"receive_wait", "forward", "backward", "gradient_wait", "update", "send_wait"}) {
    phase_[p] = &step_seconds_.Add(with(labels::kPhase, p), StepBuckets());
  }
  // Replicas exchanging gradients: a series only where there are replicas.
  if (replica >= 0) {
    phase_["allreduce"] = &step_seconds_.Add(with(labels::kPhase, "allreduce"), StepBuckets());
  }
  train_loss_ = &loss_.Add(base_);
  train_accuracy_ = &accuracy_.Add(with(labels::kPhase, "train"));
  eval_accuracy_ = &accuracy_.Add(with(labels::kPhase, "eval"));
  depth_in_ = &queue_depth_.Add(with(labels::kDirection, "inbound"));
  depth_out_ = &queue_depth_.Add(with(labels::kDirection, "outbound"));
  cap_in_ = &queue_capacity_.Add(with(labels::kDirection, "inbound"));
  cap_out_ = &queue_capacity_.Add(with(labels::kDirection, "outbound"));
  sent_ = &bytes_.Add(with(labels::kDirection, "sent"));
  received_ = &bytes_.Add(with(labels::kDirection, "received"));
  resident_bytes_ = &resident_.Add(base_);
  device_bytes_ = &device_.Add(base_);
  rejected_by_reason_.clear();
  for (const char* reason : kRejectReasons) {
    rejected_by_reason_[reason] = &rejected_.Add(with(labels::kReason, reason));
  }
}

void WorkerMetrics::ObservePhase(const char* phase, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = phase_.find(phase);
  if (it != phase_.end()) it->second->Observe(seconds);
}

void WorkerMetrics::AddExamples(bool train, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  prometheus::Counter* c = train ? train_examples_ : eval_examples_;
  if (c) c->Increment(static_cast<double>(n));
}

void WorkerMetrics::AddStep() {
  std::lock_guard<std::mutex> lock(mu_);
  if (step_) step_->Increment();
}

void WorkerMetrics::SetTrainHead(double loss, double accuracy) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!train_loss_) return;
  train_loss_->Set(loss);
  train_accuracy_->Set(accuracy);
}

void WorkerMetrics::SetEvalAccuracy(double accuracy) {
  std::lock_guard<std::mutex> lock(mu_);
  if (eval_accuracy_) eval_accuracy_->Set(accuracy);
}

void WorkerMetrics::SetQueue(bool inbound, int64_t depth, int64_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!depth_in_) return;
  (inbound ? depth_in_ : depth_out_)->Set(static_cast<double>(depth));
  (inbound ? cap_in_ : cap_out_)->Set(static_cast<double>(capacity));
}

void WorkerMetrics::AddBytes(bool sent, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  prometheus::Counter* c = sent ? sent_ : received_;
  if (c) c->Increment(static_cast<double>(n));
}

void WorkerMetrics::AddRejected(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  prometheus::Counter*& c = rejected_by_reason_[reason];
  if (!c) {
    auto l = base_;
    if (l.empty()) l[labels::kStage] = "unconfigured";
    l[labels::kReason] = reason;
    c = &rejected_.Add(l);
  }
  c->Increment();
}

void WorkerMetrics::SetMemory(int64_t resident_bytes, int64_t device_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!resident_bytes_) return;
  resident_bytes_->Set(static_cast<double>(resident_bytes));
  device_bytes_->Set(static_cast<double>(device_bytes));
}

}  // namespace localpar
