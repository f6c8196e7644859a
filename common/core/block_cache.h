// A cache of freed memory blocks in front of a slow, synchronising allocator (cudaMalloc /
// cudaFree). Freed blocks are kept and handed out again, so a training loop whose tensors
// come and go allocates from the device only until it reaches its working set.
//
// Work on the owning backend runs on one stream, in order, so a block freed by the host can
// be handed out at once: anything that writes to it later is queued after everything that
// used it before. No device code here; a test runs it over malloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>

namespace localpar {

class BlockCache {
 public:
  // `allocate` returns nullptr when the device is out of memory; the cache then releases
  // its idle blocks and tries once more.
  BlockCache(std::function<void*(size_t)> allocate, std::function<void(void*)> release);
  ~BlockCache();  // releases the idle blocks (blocks still in use belong to their tensors)
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A block of at least `bytes` (rounded up to kGranule). An idle block is reused when it is
  // no more than twice the rounded request; nullptr only when the device has no memory left.
  void* Allocate(size_t bytes);
  void Free(void* ptr);
  // Returns every idle block to the device.
  void ReleaseIdle();

  int64_t bytes_in_use() const;        // in blocks handed out
  int64_t bytes_idle() const;          // cached, ready for reuse
  int64_t device_allocations() const;  // calls to `allocate` so far

  static constexpr size_t kGranule = 512;

 private:
  std::function<void*(size_t)> allocate_;
  std::function<void(void*)> release_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> in_use_;  // block -> its size
  std::multimap<size_t, void*> idle_;         // size -> block
  int64_t bytes_in_use_ = 0, bytes_idle_ = 0, device_allocations_ = 0;
};

}  // namespace localpar
