// Worker RPC handlers.
#include "services/worker/worker_service.h"

#include "services/common/grpc_util.h"
#include "services/common/stall_timer.h"
#include "services/worker/session.h"
#include "services/worker/worker_metrics.h"

namespace localpar {
namespace {

// A stream refused before it starts.
class RefusedStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

WorkerService::WorkerService(const WorkerOptions& options, WorkerMetrics* metrics)
    : options_(options), stats_(metrics), host_(options) {}

grpc::Status WorkerService::Configure(grpc::ServerContext* ctx, const v1::ConfigureRequest* req,
                                      v1::ConfigureResponse* resp) {
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) return auth;
  std::lock_guard<std::mutex> lock(mu_);
  if (streaming_) {
    // ABORTED: retry once the previous stream has wound down (the coordinator does).
    return grpc::Status(grpc::StatusCode::ABORTED,
                        "cannot reconfigure while an upstream stream is open");
  }
  absl::StatusOr<v1::ConfigureResponse> r = host_.Configure(*req);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  std::shared_ptr<const ConfiguredStage> s = host_.setup();
  stats_.Reset(s->request.job().name(), s->stage, s->stage_model->optimizer().steps(),
               options_.config.queue_capacity(), s->stage_model->StateBytes(),
               s->stage_model->ActivationBytesPerExample(), s->restored);
  if (s->replicas > 1) stats_.SetReplica(s->request.job().name(), s->stage, s->replica);
  return grpc::Status::OK;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* WorkerService::Stream(
    grpc::CallbackServerContext* ctx) {
  // Feeding a stage is as privileged as configuring it.
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) {
    return new RefusedStream(auth);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (streaming_) {
      return new RefusedStream(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                            "this worker already has an upstream stream"));
    }
    if (std::shared_ptr<const ConfiguredStage> s = host_.setup(); s && s->initial_pending) {
      return new RefusedStream(
          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       "the stage's starting parameters have not all arrived (SetInitial)"));
    }
    streaming_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    ++live_sessions_;
  }
  auto* session = new StreamSession(
      ctx, host_.setup(), host_, stats_, options_,
      [this] {
        std::lock_guard<std::mutex> lock(mu_);
        streaming_ = false;
      },
      // Runs once the session is deleted: nothing of it is left to touch the service.
      [this](bool shutdown) {
        if (shutdown && !options_.config.stay_after_shutdown()) RequestShutdown();
        std::lock_guard<std::mutex> lock(shutdown_mu_);
        --live_sessions_;
        shutdown_cv_.notify_all();
      });
  session->Start();
  return session;
}

grpc::Status WorkerService::Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                                  v1::StatsResponse* resp) {
  // Statistics describe the training (steps, losses, timing): as private as the weights.
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) return auth;
  *resp = stats_.Snapshot(req->include_intervals());
  return grpc::Status::OK;
}

grpc::Status WorkerService::GetWeights(grpc::ServerContext* ctx, const v1::WeightsRequest*,
                                       v1::StageWeights* resp) {
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) return auth;
  absl::StatusOr<v1::StageWeights> w = host_.Weights(std::chrono::seconds(10));
  if (!w.ok()) return ToGrpcStatus(w.status());
  *resp = *std::move(w);
  return grpc::Status::OK;
}

grpc::Status WorkerService::StreamWeights(grpc::ServerContext* ctx, const v1::WeightsRequest* req,
                                          grpc::ServerWriter<v1::ParamChunk>* writer) {
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) return auth;
  return ToGrpcStatus(
      host_.WeightChunks(std::chrono::seconds(10), req->chunk_bytes(),
                         [&](const v1::ParamChunk& c) { return writer->Write(c); }));
}

grpc::Status WorkerService::SetInitial(grpc::ServerContext* ctx,
                                       grpc::ServerReader<v1::ParamChunk>* reader,
                                       v1::SetInitialResponse* resp) {
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) return auth;
  std::lock_guard<std::mutex> lock(mu_);  // no Configure or Stream meanwhile
  if (streaming_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "SetInitial: an upstream stream is open");
  }
  // A client that stalls mid-stream must not hold the stage (and with it Configure, Stream
  // and GetWeights): the same bound on silence as an upstream stream.
  const int stall_s = UpstreamStallSeconds(options_.config);
  StallTimer stall(std::chrono::seconds(stall_s), [ctx] { ctx->TryCancel(); });
  absl::StatusOr<v1::SetInitialResponse> r = host_.SetInitial([&](v1::ParamChunk* c) {
    if (!reader->Read(c)) return false;
    stall.Touch();
    return true;
  });
  if (stall.fired()) {
    // The client sees the cancel (it is what ended the read); the log says why.
    const std::string why = absl::StrCat("SetInitial: no piece came for ", stall_s,
                                         " s; the stage stays unstarted (send them all again)");
    if (options_.log != nullptr) *options_.log << "localpar_worker: " << why << "\n";
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, why);
  }
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Shutdown(grpc::ServerContext* ctx, const v1::ShutdownRequest*,
                                     v1::ShutdownResponse*) {
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) return auth;
  RequestShutdown();
  return grpc::Status::OK;
}

void WorkerService::RequestShutdown() {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  shutdown_ = true;
  shutdown_cv_.notify_all();
}

bool WorkerService::WaitForSessions(std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lock(shutdown_mu_);
  return shutdown_cv_.wait_for(lock, bound, [&] { return live_sessions_ == 0; });
}

void WorkerService::WaitForShutdown() {
  std::unique_lock<std::mutex> lock(shutdown_mu_);
  shutdown_cv_.wait(lock, [&] { return shutdown_; });
}

}  // namespace localpar
