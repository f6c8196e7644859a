// Deterministic parameter initialisation, computed on the host so every backend agrees.
#pragma once

#include <cstdint>

#include "common/core/tensor.h"

namespace localpar {

// Uniform in [-bound, bound), PyTorch's default for linear and conv layers when
// bound = 1/sqrt(fan_in).
Tensor UniformInit(Backend& backend, const Shape& shape, float bound, uint64_t seed);
Tensor ConstantInit(Backend& backend, const Shape& shape, float value);

}  // namespace localpar
