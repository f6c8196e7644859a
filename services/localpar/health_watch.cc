// The launcher's health checks.
#include "services/localpar/health_watch.h"

#include <vector>

#include "proto/health.grpc.pb.h"

namespace localpar {

HealthWatch::HealthWatch(const SecurityOptions& security)
    : security_(security), thread_([this] { Loop(); }) {}

HealthWatch::~HealthWatch() {
  stop_ = true;
  thread_.join();
}

void HealthWatch::Watch(int id, const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  // Watched once it has said where it serves (its port file): serving from now on.
  targets_[id] = Target{address, std::chrono::steady_clock::now(), true};
}

void HealthWatch::Forget(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  targets_.erase(id);
}

double HealthWatch::SecondsUnhealthy(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = targets_.find(id);
  if (it == targets_.end() || !it->second.seen) return 0;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second.last_serving)
      .count();
}

void HealthWatch::Loop() {
  std::map<std::string, std::unique_ptr<grpc::health::v1::Health::Stub>> stubs;
  while (!stop_) {
    std::vector<std::pair<int, std::string>> now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, t] : targets_) now.emplace_back(id, t.address);
    }
    for (const auto& [id, address] : now) {
      auto& stub = stubs[address];
      if (!stub) stub = grpc::health::v1::Health::NewStub(MakeChannel(address, security_));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(800));
      grpc::health::v1::HealthCheckResponse resp;
      const bool serving = stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok() &&
                           resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
      if (!serving) continue;
      std::lock_guard<std::mutex> lock(mu_);
      auto it = targets_.find(id);
      if (it != targets_.end() && it->second.address == address) {
        it->second.last_serving = std::chrono::steady_clock::now();
        it->second.seen = true;
      }
    }
    for (int i = 0; i < 10 && !stop_; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace localpar
