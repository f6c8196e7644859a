// Tensor views, ownership and copies; bf16 conversion.
#include "common/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

}  // namespace
}  // namespace localpar
