// Helpers shared by the tests: random data, tolerance checks, optional CUDA backend.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/core/backend.h"

namespace localpar::testing {

std::vector<float> RandomVector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// Element-wise |a - e| <= atol + rtol * |e|; reports the first few offenders.
::testing::AssertionResult AllClose(const std::vector<float>& actual,
                                    const std::vector<float>& expected, float atol, float rtol);

// A CUDA backend, or nullptr when this machine has no usable GPU.
std::unique_ptr<Backend> MaybeCuda();

}  // namespace localpar::testing

// Skips (never fails) the current test when no GPU is present.
#define LP_REQUIRE_CUDA(var)                   \
  auto var = ::localpar::testing::MaybeCuda(); \
  if (!var) GTEST_SKIP() << "no CUDA device on this machine"
