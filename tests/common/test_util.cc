// Shared test helpers.
#include "tests/common/test_util.h"

#include <cmath>
#include <sstream>

#include "common/core/rng.h"

namespace localpar::testing {

std::vector<float> RandomVector(size_t n, uint64_t seed, float lo, float hi) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = lo + (hi - lo) * rng.NextUniform();
  return v;
}

::testing::AssertionResult AllClose(const std::vector<float>& actual,
                                    const std::vector<float>& expected, float atol, float rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  std::ostringstream bad;
  int failures = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    float tol = atol + rtol * std::fabs(expected[i]);
    if (!(std::fabs(actual[i] - expected[i]) <= tol)) {
      if (failures < 5) {
        bad << "\n  [" << i << "] actual " << actual[i] << " expected " << expected[i] << " (tol "
            << tol << ")";
      }
      ++failures;
    }
  }
  if (failures) {
    return ::testing::AssertionFailure()
           << failures << " of " << actual.size() << " elements differ:" << bad.str();
  }
  return ::testing::AssertionSuccess();
}

std::unique_ptr<Backend> MaybeCuda() {
  if (CudaDeviceCount() == 0) return nullptr;
  return MakeCudaBackend(0);
}

}  // namespace localpar::testing
