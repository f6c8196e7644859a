// A bound on silence for a blocking stream: a thread that calls `on_stall` once if no
// Touch() came for `bound`. A blocking Read of gRPC's synchronous API has no timeout of its
// own; cancelling the call from here (ServerContext or ClientContext TryCancel) makes it
// return false, so a peer that sends one piece and then nothing cannot hold the caller.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace localpar {

class StallTimer {
 public:
  StallTimer(std::chrono::milliseconds bound, std::function<void()> on_stall);
  ~StallTimer();  // stops the thread (on_stall never runs after it returns)
  StallTimer(const StallTimer&) = delete;
  StallTimer& operator=(const StallTimer&) = delete;

  void Touch();        // data arrived: the silence starts again
  bool fired() const;  // on_stall ran

 private:
  const std::chrono::milliseconds bound_;
  const std::function<void()> on_stall_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::chrono::steady_clock::time_point last_;
  bool stop_ = false, fired_ = false;
  std::thread thread_;
};

}  // namespace localpar
