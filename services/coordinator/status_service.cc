// The Coordinator service.
#include "services/coordinator/status_service.h"

namespace localpar {

void StatusBoard::Publish(v1::JobStatus status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = std::move(status);
}

v1::JobStatus StatusBoard::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

grpc::Status StatusService::Status(grpc::ServerContext* ctx, const v1::StatusRequest*,
                                   v1::JobStatus* out) {
  if (grpc::Status auth = CheckToken(*ctx, security_); !auth.ok()) return auth;
  *out = board_.Get();
  return grpc::Status::OK;
}

grpc::Status StatusService::Checkpoint(grpc::ServerContext* ctx, const v1::CheckpointRequest*,
                                       v1::CheckpointResponse* out) {
  if (grpc::Status auth = CheckToken(*ctx, security_); !auth.ok()) return auth;
  if (!checkpointer_.enabled()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this run has no --checkpoint_dir");
  }
  checkpointer_.Request();
  out->set_message("a checkpoint follows the next training step, under " + checkpointer_.dir());
  return grpc::Status::OK;
}

}  // namespace localpar
