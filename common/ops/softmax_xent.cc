// Softmax cross-entropy with accuracy, on the CPU.
#include <cmath>

#include "common/core/check.h"
#include "common/core/cpu_backend.h"

namespace localpar {

void CpuBackend::SoftmaxXent(const float* logits, const int32_t* labels, int64_t rows, int64_t cols,
                             float grad_scale, float* dlogits, float* row_loss,
                             float* row_correct) {
  // The gradient's row holds the exponentials while the logits are still read.
  LP_CHECK_MSG(dlogits != logits, "SoftmaxXent: dlogits must not be the logits' buffer");
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * cols;
    int64_t argmax = 0;
    float mx = z[0];
    for (int64_t c = 1; c < cols; ++c) {
      if (z[c] > mx) {
        mx = z[c];
        argmax = c;
      }
    }
    // Training keeps each e^(z - max) in its row of dlogits, so the gradient's pass scales
    // them instead of computing every exponential twice (the same values, the same sum).
    float* d = dlogits ? dlogits + r * cols : nullptr;
    float sum = 0.0f;
    if (d) {
      for (int64_t c = 0; c < cols; ++c) {
        d[c] = std::exp(z[c] - mx);
        sum += d[c];
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(z[c] - mx);
    }
    float lse = mx + std::log(sum);
    int32_t label = labels[r];
    // Labels are validated where data enters; an out-of-range one scores as wrong and
    // contributes no target term rather than reading out of bounds.
    bool valid = label >= 0 && label < cols;
    row_loss[r] = valid ? lse - z[label] : 0.0f;
    row_correct[r] = (valid && argmax == label) ? 1.0f : 0.0f;
    if (d) {
      float inv = 1.0f / sum;
      for (int64_t c = 0; c < cols; ++c) {
        float p = d[c] * inv;
        d[c] = (p - (c == label ? 1.0f : 0.0f)) * grad_scale;
      }
    }
  }
}

}  // namespace localpar
