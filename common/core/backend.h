// The Backend interface: memory, copies and every op kernel, implemented once per device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace localpar {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };

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

  // Op kernels: see backend_ops.inc for each kernel's contract.
#define LP_OP(ret, name, args) virtual ret name args = 0;
#include "common/core/backend_ops.inc"
#undef LP_OP
};

struct CpuOptions {
  // Threads for OpenBLAS GEMMs; elementwise kernels are single-threaded and deterministic.
  int threads = 1;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuOptions& options = {});

// Number of usable CUDA devices; 0 when the build has no CUDA or no driver/GPU is present.
int CudaDeviceCount();
// Returns nullptr when CUDA is unavailable.
std::unique_ptr<Backend> MakeCudaBackend(int device = 0);

}  // namespace localpar
