// The Rendezvous service: where the replicas of a stage meet (Gloo's rendezvous::Store,
// kept in the coordinator's memory). Every key is set once per configuration; the job
// runner clears the store before it configures the workers again. Nothing from the wire is
// trusted: keys, values and waits are bounded, and a key set twice with another value is
// refused, which is how two workers claiming the same replica are caught.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "proto/localpar.grpc.pb.h"
#include "services/common/grpc_util.h"

namespace localpar {

class RendezvousService final : public v1::Rendezvous::Service {
 public:
  static constexpr size_t kMaxKeyBytes = 256;
  static constexpr size_t kMaxValueBytes = 64 << 10;
  static constexpr size_t kMaxKeys = 4096;
  static constexpr int kMaxWaitMs = 10 * 60 * 1000;

  explicit RendezvousService(const SecurityOptions& security) : security_(security) {}

  // Forgets every key: the workers are about to be configured again.
  void Clear();

  grpc::Status Set(grpc::ServerContext* ctx, const v1::StoreSetRequest* req,
                   v1::StoreSetResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const v1::StoreGetRequest* req,
                   v1::StoreGetResponse* resp) override;

 private:
  const SecurityOptions& security_;
  std::mutex mu_;
  std::condition_variable set_cv_;
  std::map<std::string, std::string> values_;
};

}  // namespace localpar
