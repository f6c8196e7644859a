// The Worker gRPC service: thin handlers over the stage host, the stream sessions and the
// statistics.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "proto/localpar.grpc.pb.h"
#include "services/worker/stage_host.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_stats.h"

namespace localpar {

class WorkerService final : public v1::Worker::WithRawCallbackMethod_Stream<v1::Worker::Service> {
 public:
  // `metrics` may be null (no metrics endpoint).
  WorkerService(const WorkerOptions& options, WorkerMetrics* metrics);

  grpc::Status Configure(grpc::ServerContext*, const v1::ConfigureRequest*,
                         v1::ConfigureResponse*) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(
      grpc::CallbackServerContext* ctx) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*, v1::StatsResponse*) override;
  grpc::Status GetWeights(grpc::ServerContext*, const v1::WeightsRequest*,
                          v1::StageWeights*) override;
  grpc::Status StreamWeights(grpc::ServerContext*, const v1::WeightsRequest*,
                             grpc::ServerWriter<v1::ParamChunk>*) override;
  grpc::Status SetInitial(grpc::ServerContext*, grpc::ServerReader<v1::ParamChunk>*,
                          v1::SetInitialResponse*) override;
  grpc::Status Shutdown(grpc::ServerContext*, const v1::ShutdownRequest*,
                        v1::ShutdownResponse*) override;

  // How long the compute thread has worked on its own without finishing (WorkerStats).
  double StuckSeconds() const { return stats_.StuckSeconds(); }
  // Steps taken in this configuration: unchanged between two looks means idle.
  int64_t Steps() const { return stats_.steps(); }

  // Blocks until a Shutdown RPC, a SHUTDOWN item or RequestShutdown.
  void WaitForShutdown();
  void RequestShutdown();
  // After the server's Shutdown: waits until every stream session is gone (its threads
  // joined, its downstream call released), at most `bound`. False if one is still there;
  // the service (and gRPC) must then not be torn down under it.
  bool WaitForSessions(std::chrono::milliseconds bound);

 private:
  const WorkerOptions& options_;
  WorkerStats stats_;
  StageHost host_;
  std::mutex mu_;
  bool streaming_ = false;  // one upstream stream at a time
  std::mutex shutdown_mu_;
  std::condition_variable shutdown_cv_;
  bool shutdown_ = false;
  int live_sessions_ = 0;  // under shutdown_mu_, signalled on shutdown_cv_
};

}  // namespace localpar
