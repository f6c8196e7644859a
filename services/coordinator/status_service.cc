// The Coordinator service.
#include "services/coordinator/status_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

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
  // The marker follows the next step fed, which the last stage reaches only once the steps
  // already on their way have passed every stage. With every step fed there is no next one.
  const v1::JobStatus now = board_.Get();
  const int64_t last = now.stages_size() > 0 ? now.stages(now.stages_size() - 1).steps() : 0;
  const int64_t fed = now.fed_steps();
  if (now.total_steps() > 0 && fed >= now.total_steps()) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("every step (", fed, ") is fed already and no checkpoint follows the last; ",
                     "the run is finishing (the last stage is at step ", last,
                     "), and its weights are written at the end"));
  }
  checkpointer_.Request();
  out->set_message(absl::StrCat("a checkpoint follows the next step fed (step ", fed + 1,
                                "; the last stage is at step ", last, ", so it commits once the ",
                                std::max<int64_t>(0, fed - last),
                                " steps on their way have "
                                "passed), under ",
                                checkpointer_.dir()));
  return grpc::Status::OK;
}

}  // namespace localpar
