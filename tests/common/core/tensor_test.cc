// Tensor views, ownership and copies; bf16 conversion.
#include "common/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <set>

#include "tests/common/test_util.h"

namespace localpar {
namespace {

TEST(Tensor, SliceAndReshapeShareStorage) {
  auto cpu = MakeCpuBackend();
  Tensor t = Tensor::FromHost(*cpu, {3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor s = t.Slice(1, 2);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.ToHost(), (std::vector<float>{3, 4, 5, 6}));
  s.f32()[0] = 30;
  EXPECT_EQ(t.ToHost()[2], 30);
  Tensor r = t.Reshaped({6});
  EXPECT_EQ(r.ToHost()[2], 30);
}

TEST(Tensor, OwnerReusesStorageButBorrowedHandleDoesNot) {
  auto cpu = MakeCpuBackend();
  Tensor owner;
  owner.Ensure(*cpu, {4});
  void* first = owner.raw();
  owner.Ensure(*cpu, {2});  // smaller: reused in place
  EXPECT_EQ(owner.raw(), first);
  Tensor borrowed = owner;
  borrowed.Ensure(*cpu, {2});  // a borrowed handle never writes into the owner's storage
  EXPECT_NE(borrowed.raw(), first);
  owner.Ensure(*cpu, {1024});  // larger: fresh storage
  EXPECT_NE(owner.raw(), first);
}

TEST(Tensor, PinnedStorageIsNotOverwrittenAndTwoBuffersAlternate) {
  auto cpu = MakeCpuBackend();
  Tensor owner;
  owner.Ensure(*cpu, {4});
  owner.f32()[0] = 1;
  void* a = owner.raw();
  std::shared_ptr<const void> pin = owner.Pin();
  EXPECT_EQ(pin.get(), a);
  owner.Ensure(*cpu, {4});  // pinned: the owner moves to a second buffer
  void* b = owner.raw();
  ASSERT_NE(b, a);
  owner.f32()[0] = 2;
  EXPECT_EQ(static_cast<const float*>(pin.get())[0], 1);  // the reader still sees its data
  std::shared_ptr<const void> pin_b = owner.Pin();
  pin.reset();
  owner.Ensure(*cpu, {4});  // b pinned, a released: back to a, nothing allocated
  EXPECT_EQ(owner.raw(), a);
  pin_b.reset();
  owner.Ensure(*cpu, {4});  // nothing pinned: reused in place
  EXPECT_EQ(owner.raw(), a);
  // A pin taken through a view holds the owner's storage too, and outlives the owner.
  std::shared_ptr<const void> view_pin = owner.Slice(1, 2).Pin();
  EXPECT_EQ(view_pin.get(), static_cast<const char*>(a) + 4);
  owner.Ensure(*cpu, {4});
  EXPECT_NE(owner.raw(), a);
  owner = Tensor();
  EXPECT_EQ(static_cast<const float*>(view_pin.get())[-1], 1);  // a[0], written first
}

// The send path's device-to-host copy: into the backend's staging host memory (page-locked
// on CUDA), asynchronous, complete once the returned waiter returns, on every backend.
TEST(Tensor, AsyncCopyToStagingHostMemoryArrivesWhenWaitedFor) {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(MakeCpuBackend());
  if (auto gpu = testing::MaybeCuda()) backends.push_back(std::move(gpu));
  for (auto& be : backends) {
    std::unique_ptr<Backend> host = be->MakeStagingHost();
    ASSERT_EQ(host->device(), DeviceType::kCPU);
    std::vector<float> values(100000);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
    Tensor src = Tensor::FromHost(*be, {100000}, values);
    Tensor other = Tensor::Zeros(*be, {100000});
    Tensor staging = Tensor::Empty(*host, {100000});
    std::shared_ptr<const void> pin = src.Pin();
    std::function<void()> ready = be->CopyToHostAsync(staging.raw(), src.raw(), src.nbytes());
    be->Fill(other.f32(), 3.0f, other.numel());  // compute queued behind the copy
    ready();
    EXPECT_EQ(std::memcmp(staging.raw(), values.data(), src.nbytes()), 0) << be->Describe();
    EXPECT_EQ(other.ToHost()[7], 3.0f);
    // Dropping a waiter without calling it is allowed.
    be->CopyToHostAsync(staging.raw(), other.raw(), 16);
    be->Synchronize();
  }
}

TEST(Tensor, ABurstOfHeldBuffersIsReturnedOnceReleased) {
  int live = 0, allocations = 0;
  CpuOptions counting;
  counting.allocate = [&](size_t n) {
    ++live;
    ++allocations;
    return std::malloc(n);
  };
  counting.free = [&](void* p) {
    --live;
    std::free(p);
  };
  auto cpu = MakeCpuBackend(counting);
  {
    Tensor owner;
    std::vector<std::shared_ptr<const void>> held;
    for (int i = 0; i < 6; ++i) {  // six sends in flight at once: six buffers
      owner.Ensure(*cpu, {256});
      held.push_back(owner.Pin());
    }
    EXPECT_EQ(live, 6);
    held.clear();
    owner.Ensure(*cpu, {256});
    EXPECT_EQ(live, 2);  // the burst is over: the owner's buffer and one free spare remain
    // Steady state: one send in flight at a time cycles through those two, allocating nothing.
    const int before = allocations;
    std::set<const void*> cycle;
    for (int i = 0; i < 6; ++i) {
      std::shared_ptr<const void> pin = owner.Pin();
      owner.Ensure(*cpu, {256});
      cycle.insert(owner.raw());
    }
    EXPECT_EQ(cycle.size(), 2u);
    EXPECT_EQ(allocations, before);
  }
  EXPECT_EQ(live, 0);
}

TEST(Tensor, WrappedMemoryIsSharedKeptAliveAndNeverReused) {
  auto cpu = MakeCpuBackend();
  auto bytes = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<float>> watch = bytes;
  Tensor t = Tensor::Wrap(*cpu, bytes->data(), {2, 3}, DType::kF32, bytes);
  const void* memory = bytes->data();
  bytes.reset();
  EXPECT_FALSE(watch.expired());  // the tensor keeps the bytes alive
  EXPECT_EQ(t.raw(), memory);     // no copy
  EXPECT_EQ(t.Slice(1, 1).ToHost(), (std::vector<float>{4, 5, 6}));
  Tensor view = t.Reshaped({6});
  t.Ensure(*cpu, {2, 3});  // not the owner: fresh storage, the wrapped bytes untouched
  EXPECT_NE(t.raw(), memory);
  t.f32()[0] = -1;
  EXPECT_EQ(view.ToHost()[0], 1);
  t = Tensor();
  EXPECT_FALSE(watch.expired());  // the view still holds them
  view = Tensor();
  EXPECT_TRUE(watch.expired());
}

TEST(Tensor, CopyToAndCopyFromRoundTrip) {
  auto cpu = MakeCpuBackend();
  auto other = MakeCpuBackend();
  std::vector<float> v = testing::RandomVector(10, 1);
  Tensor a = Tensor::FromHost(*cpu, {10}, v);
  Tensor b = a.CopyTo(*other);
  EXPECT_EQ(b.ToHost(), v);
  b.f32()[0] = 99;
  EXPECT_EQ(a.ToHost()[0], v[0]);  // deep copy
  a.CopyFrom(b);
  EXPECT_EQ(a.ToHost()[0], 99);
}

TEST(Tensor, CrossDeviceCopyIsExact) {
  LP_REQUIRE_CUDA(gpu);
  auto cpu = MakeCpuBackend();
  std::vector<float> v = testing::RandomVector(1000, 2);
  Tensor a = Tensor::FromHost(*cpu, {1000}, v);
  Tensor g = a.CopyTo(*gpu);
  EXPECT_EQ(g.ToHost(), v);
  EXPECT_EQ(g.CopyTo(*cpu).ToHost(), v);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(nan))));
}

TEST(F16, EveryHalfRoundTripsAndMidpointsRoundToEven) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    uint16_t v = static_cast<uint16_t>(h);
    if ((v & 0x7c00) == 0x7c00 && (v & 0x3ff) != 0) continue;  // NaN payloads
    ASSERT_EQ(FloatToF16(F16ToFloat(v)), v) << std::hex << h;
  }
  // Between two adjacent positive halves the midpoint goes to the even one, and anything
  // off the midpoint goes to the nearer one (normals and subnormals alike).
  for (uint16_t a :
       {uint16_t{0x0001}, uint16_t{0x03ff}, uint16_t{0x3c00}, uint16_t{0x3c01}, uint16_t{0x7bfe}}) {
    float lo = F16ToFloat(a), hi = F16ToFloat(static_cast<uint16_t>(a + 1));
    float mid = lo + (hi - lo) / 2;
    uint16_t even = (a & 1) ? static_cast<uint16_t>(a + 1) : a;
    EXPECT_EQ(FloatToF16(mid), even) << std::hex << a;
    EXPECT_EQ(FloatToF16(std::nextafter(mid, 0.0f)), a) << std::hex << a;
    EXPECT_EQ(FloatToF16(std::nextafter(mid, 1e9f)), a + 1) << std::hex << a;
  }
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);  // the tie above the largest half: infinity
  EXPECT_EQ(FloatToF16(1e-9f), 0x0000);
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(NAN))));
  std::vector<float> x = {1.0f / 3, 1e6f, -1e-6f};
  RoundThroughWire(WireFormat::kF16, x.data(), x.size());
  EXPECT_EQ(x[0], F16ToFloat(0x3555));
  EXPECT_TRUE(std::isinf(x[1]));
  RoundThroughWire(WireFormat::kBF16, x.data(), 1);
  EXPECT_EQ(x[0], Bf16ToFloat(FloatToBf16(F16ToFloat(0x3555))));
}

}  // namespace
}  // namespace localpar
