// Block cache for device memory (see block_cache.h).
#include "common/core/block_cache.h"

#include "common/core/check.h"

namespace localpar {

BlockCache::BlockCache(std::function<void*(size_t)> allocate, std::function<void(void*)> release)
    : allocate_(std::move(allocate)), release_(std::move(release)) {}

BlockCache::~BlockCache() { ReleaseIdle(); }

void* BlockCache::Allocate(size_t bytes) {
  const size_t size = (bytes + kGranule - 1) / kGranule * kGranule + (bytes == 0 ? kGranule : 0);
  std::unique_lock<std::mutex> lock(mu_);
  auto it = idle_.lower_bound(size);
  if (it != idle_.end() && it->first <= 2 * size) {
    void* p = it->second;
    const size_t have = it->first;
    idle_.erase(it);
    bytes_idle_ -= static_cast<int64_t>(have);
    in_use_[p] = have;
    bytes_in_use_ += static_cast<int64_t>(have);
    return p;
  }
  void* p = allocate_(size);
  ++device_allocations_;
  if (p == nullptr && !idle_.empty()) {
    lock.unlock();
    ReleaseIdle();
    lock.lock();
    p = allocate_(size);
    ++device_allocations_;
  }
  if (p == nullptr) return nullptr;
  in_use_[p] = size;
  bytes_in_use_ += static_cast<int64_t>(size);
  return p;
}

void BlockCache::Free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(ptr);
  LP_CHECK_MSG(it != in_use_.end(), "freeing a block this cache did not hand out");
  idle_.emplace(it->second, ptr);
  bytes_in_use_ -= static_cast<int64_t>(it->second);
  bytes_idle_ += static_cast<int64_t>(it->second);
  in_use_.erase(it);
}

void BlockCache::ReleaseIdle() {
  std::multimap<size_t, void*> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle.swap(idle_);
    bytes_idle_ = 0;
  }
  for (auto& [size, p] : idle) release_(p);
}

int64_t BlockCache::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_in_use_;
}

int64_t BlockCache::bytes_idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_idle_;
}

int64_t BlockCache::device_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_allocations_;
}

}  // namespace localpar
