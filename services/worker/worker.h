// The layer worker: a gRPC service that holds one stage, consumes activation batches from
// upstream, trains its stage by the job's update rule, and streams activations downstream.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/nn/stage.h"
#include "common/nn/trainer.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/bounded_queue.h"
#include "services/common/grpc_util.h"
#include "services/common/metrics.h"
#include "services/common/wire.h"

namespace localpar {

struct WorkerOptions {
  std::string listen = "127.0.0.1:0";
  std::string port_file;  // written with the bound port once serving
  std::string device = "cpu";
  int threads = 1;
  int queue_capacity = 4;                      // items buffered in each direction
  int debug_delay_ms = 0;                      // sleep per training batch (to test backpressure)
  std::string metrics_listen = "127.0.0.1:0";  // Prometheus /metrics; empty: none
  SecurityOptions security;                    // TLS, mutual TLS, control-RPC token
};

class WorkerService final : public v1::Worker::Service {
 public:
  // `metrics` may be null (no metrics endpoint).
  WorkerService(const WorkerOptions& options, WorkerMetrics* metrics);
  ~WorkerService() override;

  grpc::Status Configure(grpc::ServerContext*, const v1::ConfigureRequest*,
                         v1::ConfigureResponse*) override;
  // Worker.Stream, registered in the constructor with ByteBuffer responses (see wire.h).
  grpc::Status ServeStream(grpc::ServerContext*, UpStream* up);
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*, v1::StatsResponse*) override;
  grpc::Status GetWeights(grpc::ServerContext*, const v1::WeightsRequest*,
                          v1::StageWeights*) override;
  grpc::Status Shutdown(grpc::ServerContext*, const v1::ShutdownRequest*,
                        v1::ShutdownResponse*) override;

  // Blocks until a Shutdown RPC (or RequestShutdown) arrives.
  void WaitForShutdown();
  void RequestShutdown();

 private:
  class Session;  // one upstream stream: its queues, threads and downstream link

  absl::Status CheckItem(const v1::DownItem& item);
  void Reject(const std::string& reason);

  WorkerOptions options_;
  WorkerMetrics* metrics_;
  std::mutex compute_mu_;  // held while a batch is computed (weights are in use)
  std::mutex mu_;          // guards configuration and statistics below
  bool configured_ = false;
  bool streaming_ = false;
  v1::ConfigureRequest config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Stage> stage_;
  int stage_index_ = 0;
  int num_stages_ = 0;
  int32_t classes_ = 0;
  int64_t labels_per_example_ = 1;
  WireFormat wire_ = WireFormat::kF32;        // how activations go to the next stage
  int64_t baseline_bytes_ = ResidentBytes();  // resident memory before any stage exists
  TrainerOptions trainer_;
  std::shared_ptr<grpc::Channel> downstream_;  // to the next stage; null for the last
  // Host memory for activations that need converting or copying before they are sent (a
  // 16-bit wire, a device stage): the compute backend when it is the CPU, else its own.
  std::unique_ptr<Backend> host_backend_;
  Backend& host_backend() { return host_backend_ ? *host_backend_ : *backend_; }

  // Statistics (guarded by mu_).
  v1::StatsResponse stats_;
  HeadStats recent_;
  std::map<int, v1::EpochStatistics> epochs_;
  std::deque<v1::Interval> intervals_;
  double delay_sum_ = 0;
  int64_t delay_count_ = 0;

  std::mutex shutdown_mu_;
  std::condition_variable shutdown_cv_;
  bool shutdown_ = false;

  friend class Session;
};

// Serves until Shutdown or SIGTERM/SIGINT (which drains in-flight batches first).
int RunWorker(const WorkerOptions& options);

}  // namespace localpar
