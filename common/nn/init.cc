// Deterministic parameter initialisation.
#include "common/nn/init.h"

#include <vector>

#include "common/core/rng.h"

namespace localpar {

Tensor UniformInit(Backend& backend, const Shape& shape, float bound, uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(NumElements(shape)));
  Rng rng(seed);
  for (float& v : host) v = (2.0f * rng.NextUniform() - 1.0f) * bound;
  return Tensor::FromHost(backend, shape, host);
}

Tensor ConstantInit(Backend& backend, const Shape& shape, float value) {
  std::vector<float> host(static_cast<size_t>(NumElements(shape)), value);
  return Tensor::FromHost(backend, shape, host);
}

}  // namespace localpar
