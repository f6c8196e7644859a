// ReLU and GELU, forward and backward, on the CPU.
#include <cstdint>

#include "common/core/cpu_backend.h"
#include "common/core/widest_vectors.h"
#include "common/ops/activation_math.h"
#include "common/ops/vector_gelu.h"

namespace localpar {
namespace {

// The loops are built for the widest vectors the CPU has (widest_vectors.h; this file is
// compiled with -ffp-contract=off), with the scalar code's bits.
LP_WIDEST_VECTORS void ReluLoop(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

// dy is loaded whatever the sign, so the select vectorises; a load only where y > 0 kept
// the loop scalar and branchy (10% of a fashion_resnet step, random signs mispredicting).
LP_WIDEST_VECTORS void ReluBackwardLoop(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

LP_WIDEST_VECTORS void GeluLoop(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = CpuGeluValue(x[i]);
}

LP_WIDEST_VECTORS void GeluBackwardLoop(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * CpuGeluDerivative(x[i]);
}

}  // namespace

void CpuBackend::ReluForward(const float* x, float* y, int64_t n) { ReluLoop(x, y, n); }

void CpuBackend::ReluBackward(const float* y, const float* dy, float* dx, int64_t n) {
  ReluBackwardLoop(y, dy, dx, n);
}

void CpuBackend::GeluForward(const float* x, float* y, int64_t n) { GeluLoop(x, y, n); }

void CpuBackend::GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  GeluBackwardLoop(x, dy, dx, n);
}

}  // namespace localpar
