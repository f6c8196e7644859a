// A blocking queue with a fixed capacity: a full queue blocks the producer, which is how a
// slow stage slows its upstream instead of growing memory.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

namespace localpar {

template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity ? capacity : 1) {}

  // Blocks while full; returns false (dropping the item) once the queue is closed.
  bool Push(T item) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [&] { return closed_ || items_.size() < capacity_; });
    if (closed_) return false;
    items_.push_back(std::move(item));
    if (items_.size() > max_depth_) max_depth_ = items_.size();
    not_empty_.notify_one();
    return true;
  }

  // Never blocks: false (leaving `item` as it was) when the queue is full or closed.
  bool TryPush(T& item) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || items_.size() >= capacity_) return false;
    items_.push_back(std::move(item));
    if (items_.size() > max_depth_) max_depth_ = items_.size();
    not_empty_.notify_one();
    return true;
  }

  // Blocks while empty; returns nullopt once the queue is closed and drained.
  std::optional<T> Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return closed_ || !items_.empty(); });
    return TakeLocked();
  }

  // Never blocks.
  std::optional<T> TryPop() {
    std::lock_guard<std::mutex> lock(mu_);
    return TakeLocked();
  }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_full_.notify_all();
    not_empty_.notify_all();
  }

  size_t capacity() const { return capacity_; }
  bool closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return items_.size();
  }
  size_t max_depth() const {
    std::lock_guard<std::mutex> lock(mu_);
    return max_depth_;
  }

 private:
  std::optional<T> TakeLocked() {
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    not_full_.notify_one();
    return item;
  }

  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable not_full_, not_empty_;
  std::deque<T> items_;
  size_t max_depth_ = 0;
  bool closed_ = false;
};

}  // namespace localpar
