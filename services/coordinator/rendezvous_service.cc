// The replicas' key-value store.
#include "services/coordinator/rendezvous_service.h"

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/peer_text.h"

namespace localpar {
namespace {

grpc::Status Refuse(grpc::StatusCode code, const std::string& message) {
  return grpc::Status(code, message);
}

}  // namespace

void RendezvousService::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  values_.clear();
}

grpc::Status RendezvousService::Set(grpc::ServerContext* ctx, const v1::StoreSetRequest* req,
                                    v1::StoreSetResponse*) {
  if (grpc::Status auth = CheckToken(*ctx, security_); !auth.ok()) return auth;
  if (req->key().empty() || req->key().size() > kMaxKeyBytes) {
    return Refuse(grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("key: must have 1..", kMaxKeyBytes, " bytes"));
  }
  if (req->value().size() > kMaxValueBytes) {
    return Refuse(grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("value: ", req->value().size(), " bytes; at most ", kMaxValueBytes));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(req->key());
  if (it != values_.end()) {
    if (it->second == req->value()) return grpc::Status::OK;  // a retry
    return Refuse(grpc::StatusCode::ALREADY_EXISTS,
                  absl::StrCat("key ", SanitizePeerText(req->key()),
                               " is already set: two workers were configured as the same replica "
                               "of a stage (GROUP/stage-K/REPLICA)"));
  }
  if (values_.size() >= kMaxKeys) {
    return Refuse(grpc::StatusCode::RESOURCE_EXHAUSTED,
                  absl::StrCat("the rendezvous holds ", kMaxKeys, " keys already"));
  }
  values_.emplace(req->key(), req->value());
  set_cv_.notify_all();
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Get(grpc::ServerContext* ctx, const v1::StoreGetRequest* req,
                                    v1::StoreGetResponse* resp) {
  if (grpc::Status auth = CheckToken(*ctx, security_); !auth.ok()) return auth;
  if (req->keys_size() < 1 || req->keys_size() > 256) {
    return Refuse(grpc::StatusCode::INVALID_ARGUMENT, "keys: ask for 1..256");
  }
  if (req->timeout_ms() < 0 || req->timeout_ms() > kMaxWaitMs) {
    return Refuse(grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("timeout_ms: must be in 0..", kMaxWaitMs));
  }
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(req->timeout_ms());
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    std::vector<std::string> missing;
    for (const std::string& k : req->keys()) {
      if (!values_.count(k)) missing.push_back(SanitizePeerText(k, 64));
    }
    if (missing.empty()) break;
    if (ctx->IsCancelled()) return Refuse(grpc::StatusCode::CANCELLED, "the caller went away");
    if (std::chrono::steady_clock::now() >= until) {
      return Refuse(grpc::StatusCode::DEADLINE_EXCEEDED,
                    absl::StrCat("not set: ", absl::StrJoin(missing, ", ")));
    }
    // Wakes for every new key, and now and then to notice a caller that went away.
    set_cv_.wait_until(lock,
                       std::min(until, std::chrono::steady_clock::now() + std::chrono::seconds(1)));
  }
  for (const std::string& k : req->keys()) resp->add_values(values_[k]);
  return grpc::Status::OK;
}

}  // namespace localpar
