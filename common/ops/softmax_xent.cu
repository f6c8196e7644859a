// Softmax cross-entropy with accuracy, on CUDA: one block per row.
#include <cfloat>

#include "common/core/cuda_common.cuh"

namespace localpar {
namespace {

__global__ void SoftmaxXentKernel(const float* logits, const int32_t* labels, long long cols,
                                  float grad_scale, float* dlogits, float* row_loss,
                                  float* row_correct) {
  __shared__ float shm[kBlock];
  __shared__ int shm_idx[kBlock];
  long long r = blockIdx.x;
  const float* z = logits + r * cols;
  float mx = -FLT_MAX;
  int idx = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    if (z[c] > mx) {
      mx = z[c];
      idx = static_cast<int>(c);
    }
  }
  // Arg-max with ties broken towards the lowest index, as on the CPU.
  shm[threadIdx.x] = mx;
  shm_idx[threadIdx.x] = idx;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      float a = shm[threadIdx.x], b = shm[threadIdx.x + s];
      int ia = shm_idx[threadIdx.x], ib = shm_idx[threadIdx.x + s];
      if (b > a || (b == a && ib < ia)) {
        shm[threadIdx.x] = b;
        shm_idx[threadIdx.x] = ib;
      }
    }
    __syncthreads();
  }
  float gmax = shm[0];
  int argmax = shm_idx[0];
  __syncthreads();
  float local = 0.0f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) local += expf(z[c] - gmax);
  float sum = BlockSum(local, shm);
  int label = labels[r];
  bool valid = label >= 0 && label < cols;
  if (threadIdx.x == 0) {
    row_loss[r] = valid ? gmax + logf(sum) - z[label] : 0.0f;
    row_correct[r] = (valid && argmax == label) ? 1.0f : 0.0f;
  }
  if (dlogits) {
    float inv = 1.0f / sum;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
      float p = expf(z[c] - gmax) * inv;
      dlogits[r * cols + c] = (p - (c == label ? 1.0f : 0.0f)) * grad_scale;
    }
  }
}

}  // namespace

void CudaBackend::SoftmaxXent(const float* logits, const int32_t* labels, int64_t rows,
                              int64_t cols, float grad_scale, float* dlogits, float* row_loss,
                              float* row_correct) {
  if (rows == 0) return;
  SoftmaxXentKernel<<<static_cast<unsigned>(rows), kBlock, 0, StreamOf(this)>>>(
      logits, labels, cols, grad_scale, dlogits, row_loss, row_correct);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
