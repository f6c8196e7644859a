// The device block cache, run over malloc with a memory budget standing in for the GPU.
#include "common/core/block_cache.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <vector>

namespace localpar {
namespace {

// malloc with a budget: returns nullptr past `limit` bytes, like cudaMalloc when full.
struct Device {
  size_t limit = SIZE_MAX, used = 0;
  int64_t released = 0;
  std::unordered_map<void*, size_t> sizes;
  BlockCache MakeCache() {
    return BlockCache(
        [this](size_t n) -> void* {
          if (used + n > limit) return nullptr;
          void* p = std::malloc(n);
          sizes[p] = n;
          used += n;
          return p;
        },
        [this](void* p) {
          used -= sizes[p];
          sizes.erase(p);
          ++released;
          std::free(p);
        });
  }
};

TEST(BlockCache, ATrainingLoopStopsAllocatingOnceItsWorkingSetIsCached) {
  Device dev;
  BlockCache cache = dev.MakeCache();
  const std::vector<size_t> step = {4096, 100, 1 << 20, 4096, 777, 0};
  for (int iter = 0; iter < 5; ++iter) {
    std::vector<void*> held;
    for (size_t n : step) held.push_back(cache.Allocate(n));
    std::set<void*> distinct(held.begin(), held.end());
    EXPECT_EQ(distinct.size(), held.size());  // blocks in use are never handed out twice
    for (void* p : held) cache.Free(p);
    EXPECT_EQ(cache.device_allocations(), static_cast<int64_t>(step.size()))
        << "iteration " << iter;
  }
  EXPECT_EQ(cache.bytes_in_use(), 0);
  EXPECT_GT(cache.bytes_idle(), 1 << 20);
  EXPECT_EQ(dev.released, 0);  // nothing went back to the device while the loop ran
}

TEST(BlockCache, ReusesOnlyBlocksAtMostTwiceTheRequestAndRoundsToTheGranule) {
  Device dev;
  BlockCache cache = dev.MakeCache();
  void* big = cache.Allocate(8192);
  cache.Free(big);
  void* small = cache.Allocate(100);  // 512 after rounding; an 8 KiB block would waste 15/16
  EXPECT_NE(small, big);
  EXPECT_EQ(cache.bytes_in_use(), 512);
  void* mid = cache.Allocate(5000);  // 5120 after rounding: the 8 KiB block is within 2x
  EXPECT_EQ(mid, big);
  EXPECT_EQ(cache.bytes_in_use(), 512 + 8192);
  cache.Free(small);
  cache.Free(mid);
  EXPECT_EQ(cache.bytes_idle(), 512 + 8192);
}

TEST(BlockCache, WhenTheDeviceIsFullIdleBlocksAreReleasedAndTheAllocationRetried) {
  Device dev;
  dev.limit = 3 << 20;
  BlockCache cache = dev.MakeCache();
  void* a = cache.Allocate(1 << 20);
  void* b = cache.Allocate(1 << 20);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  cache.Free(a);
  cache.Free(b);
  // 2.5 MiB fits only once the two idle 1 MiB blocks go back to the device.
  void* c = cache.Allocate(5 << 19);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(dev.released, 2);
  EXPECT_EQ(cache.bytes_idle(), 0);
  // Past the budget even with nothing idle: nullptr, not a crash.
  EXPECT_EQ(cache.Allocate(1 << 20), nullptr);
  cache.Free(c);
}

TEST(BlockCache, DestroyingTheCacheReturnsIdleBlocks) {
  Device dev;
  {
    BlockCache cache = dev.MakeCache();
    cache.Free(cache.Allocate(1000));
    cache.Free(cache.Allocate(100000));
  }
  EXPECT_EQ(dev.used, 0u);
  EXPECT_EQ(dev.released, 2);
}

}  // namespace
}  // namespace localpar
