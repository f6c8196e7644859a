// The Backend interface: memory, copies and every op kernel, implemented once per device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace localpar {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };

// How GEMMs treat their float32 operands. kF32 is exact float32, the default, which the CPU
// reference and the bitwise-determinism guarantees assume. kTF32 and kBF16 round each
// operand to TensorFloat-32 (10 mantissa bits) or bfloat16 (7) and accumulate in float32:
// on CUDA the tensor cores do it (cuBLAS compute types 32F_FAST_TF32 and 32F_FAST_16BF);
// the CPU backend rounds copies of the operands to nearest even, so both give the same
// numbers up to summation order. Tensors, the master weights and optimizer state stay
// float32 in every mode; only the GEMMs' inputs lose precision.
enum class GemmPrecision : uint8_t { kF32 = 0, kTF32 = 1, kBF16 = 2 };
const char* GemmPrecisionName(GemmPrecision p);

// One NHWC convolution: n images of h x w x c, out_channels filters of kernel x kernel x c
// (weights HWIO: [kernel * kernel * c, out_channels]) with one stride and one zero padding
// on every side, giving n x oh x ow x out_channels.
struct ConvGeometry {
  int64_t n, h, w, c, out_channels, kernel, stride, pad, oh, ow;
  int64_t fan_in() const { return kernel * kernel * c; }
};

// All pointers below point into this backend's memory. Matrices are row-major and
// contiguous. Image tensors are NHWC. Kernels that "accumulate" add into their output;
// all others overwrite it. Each op's CPU and CUDA kernels live side by side in
// common/ops/<family>.cc and common/ops/<family>.cu.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceType device() const = 0;
  virtual std::string Describe() const = 0;

  // ---- memory --------------------------------------------------------------
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  virtual void CopyFromHost(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void CopyWithin(void* dst, const void* src, size_t bytes) = 0;
  // Waits until all work queued on this backend has finished.
  virtual void Synchronize() = 0;
  // Device memory this backend currently holds (0 for host memory).
  virtual int64_t DeviceBytesInUse() const { return 0; }
  // Starts copying `bytes` to host memory and returns a function that waits until the copy
  // is done (callable once, on any thread; dropping it is fine). On CUDA the copy runs on a
  // separate stream, overlapping work queued after it, so the source must not be written
  // until then (hold a Tensor::Pin); into page-locked memory (MakeStagingHost) it is truly
  // asynchronous. The CPU backend copies at once.
  virtual std::function<void()> CopyToHostAsync(void* host_dst, const void* src, size_t bytes);
  // A CPU backend whose memory suits staging this backend's copies: page-locked for CUDA.
  virtual std::unique_ptr<Backend> MakeStagingHost();

  void set_gemm_precision(GemmPrecision p) { gemm_precision_ = p; }
  GemmPrecision gemm_precision() const { return gemm_precision_; }

  // Op kernels: see backend_ops.inc for each kernel's contract.
#define LP_OP(ret, name, args) virtual ret name args = 0;
#include "common/core/backend_ops.inc"
#undef LP_OP

  // The convolution as im2col plus GEMM, a group of images at a time so the column buffer
  // (the workspace) stays bounded; the backward passes recompute the columns. CUDA's way,
  // and the CPU's where oneDNN is absent or the GEMMs round their operands.
  static int64_t ConvIm2ColWorkspaceFloats(const ConvGeometry& g);
  void ConvForwardIm2Col(const ConvGeometry& g, const float* x, const float* w, const float* bias,
                         float* y, float* workspace);
  void ConvBackwardDataIm2Col(const ConvGeometry& g, const float* dy, const float* w, float* dx,
                              float* workspace);
  void ConvBackwardWeightsIm2Col(const ConvGeometry& g, const float* x, const float* dy, float* dw,
                                 float* db, float* workspace);

 protected:
  // ", bf16 GEMMs" (for Describe) unless the GEMMs are exact float32.
  std::string GemmPrecisionSuffix() const;
  // GemmBias as three kernels in turn: GEMM, bias, ReLU (the CPU's way, and CUDA's fallback).
  void GemmBiasInSteps(int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                       const float* bias, float* y, bool relu);

  GemmPrecision gemm_precision_ = GemmPrecision::kF32;
};

struct CpuOptions {
  // Threads for OpenBLAS GEMMs and oneDNN convolutions; elementwise kernels are
  // single-threaded and deterministic.
  int threads = 1;
  // Where memory comes from, when not aligned_alloc / free (both or neither): the CUDA
  // backend's page-locked host memory for staging.
  std::function<void*(size_t)> allocate;
  std::function<void(void*)> free;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuOptions& options = {});

// Number of usable CUDA devices; 0 when the build has no CUDA or no driver/GPU is present.
int CudaDeviceCount();
// Returns nullptr when CUDA is unavailable.
std::unique_ptr<Backend> MakeCudaBackend(int device = 0);

}  // namespace localpar
