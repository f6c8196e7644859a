// The silence bound's thread.
#include "services/common/stall_timer.h"

namespace localpar {

StallTimer::StallTimer(std::chrono::milliseconds bound, std::function<void()> on_stall)
    : bound_(bound), on_stall_(std::move(on_stall)), last_(std::chrono::steady_clock::now()) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      const auto due = last_ + bound_;
      if (std::chrono::steady_clock::now() >= due) {
        fired_ = true;
        on_stall_();  // under the lock: the destructor waits for it
        return;
      }
      cv_.wait_until(lock, due);
    }
  });
}

StallTimer::~StallTimer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StallTimer::Touch() {
  std::lock_guard<std::mutex> lock(mu_);
  last_ = std::chrono::steady_clock::now();
}

bool StallTimer::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

}  // namespace localpar
