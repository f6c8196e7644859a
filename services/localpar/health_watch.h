// Liveness for the launcher: a thread that asks every child's gRPC health service once a
// second. A process that stops answering (SIGSTOP, a hang) or answers NOT_SERVING (a worker
// whose compute made no progress, see worker_process.cc) is unhealthy; the launcher kills
// and restarts it as it does a crashed one.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "services/common/grpc_util.h"

namespace localpar {

class HealthWatch {
 public:
  explicit HealthWatch(const SecurityOptions& security);
  ~HealthWatch();

  // Starts (or restarts, after the process was replaced) watching `address` as `id`, which
  // serves there now.
  void Watch(int id, const std::string& address);
  void Forget(int id);
  // Seconds since `id` last answered SERVING (or was watched); 0 for an unknown id.
  double SecondsUnhealthy(int id) const;

 private:
  struct Target {
    std::string address;
    std::chrono::steady_clock::time_point last_serving;
    bool seen = false;
  };
  void Loop();

  const SecurityOptions& security_;
  mutable std::mutex mu_;
  std::map<int, Target> targets_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace localpar
