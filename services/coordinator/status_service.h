// The Coordinator gRPC service (`localpar status`, `localpar checkpoint`). Status answers
// from a snapshot the job runner refreshes; it makes no calls of its own.
#pragma once

#include <mutex>

#include "proto/localpar.grpc.pb.h"
#include "services/common/grpc_util.h"
#include "services/coordinator/checkpointer.h"

namespace localpar {

class StatusBoard {
 public:
  void Publish(v1::JobStatus status);
  v1::JobStatus Get() const;

 private:
  mutable std::mutex mu_;
  v1::JobStatus status_;
};

class StatusService final : public v1::Coordinator::Service {
 public:
  StatusService(const StatusBoard& board, Checkpointer& checkpointer,
                const SecurityOptions& security)
      : board_(board), checkpointer_(checkpointer), security_(security) {}
  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*, v1::JobStatus*) override;
  grpc::Status Checkpoint(grpc::ServerContext*, const v1::CheckpointRequest*,
                          v1::CheckpointResponse*) override;

 private:
  const StatusBoard& board_;
  Checkpointer& checkpointer_;
  const SecurityOptions& security_;
};

}  // namespace localpar
