// The CUDA backend: cuBLAS for GEMM, our kernels for the rest, one stream per backend.
#pragma once

#include <memory>

#include "common/core/backend.h"
#include "common/core/block_cache.h"

namespace localpar {

// Declared without CUDA headers so host-only code can include it; op kernels are
// defined in common/ops/<family>.cu.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  DeviceType device() const override { return DeviceType::kCUDA; }
  std::string Describe() const override;

  void* Allocate(size_t bytes) override;
  void Free(void* ptr) override;
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  void CopyWithin(void* dst, const void* src, size_t bytes) override;
  void Synchronize() override;
  // Blocks held by tensors plus idle blocks kept for reuse (see BlockCache).
  // On a second stream (copy_stream), after the work queued so far; see Backend.
  std::function<void()> CopyToHostAsync(void* host_dst, const void* src, size_t bytes) override;
  // Page-locked host memory (cudaHostAlloc).
  std::unique_ptr<Backend> MakeStagingHost() override;
  int64_t DeviceBytesInUse() const override {
    return cache_->bytes_in_use() + cache_->bytes_idle();
  }
  const BlockCache& cache() const { return *cache_; }

#define LP_OP(ret, name, args) ret name args override;
#include "common/core/backend_ops.inc"
#undef LP_OP

  // Opaque handles (cudaStream_t, cublasHandle_t) for the .cu files.
  void* stream() const { return stream_; }
  void* cublas() const { return cublas_; }
  // A device buffer of at least `bytes` for one kernel sequence's temporaries; reused (and
  // grown when needed) by later calls, so no per-step allocation.
  void* Scratch(size_t bytes);

  // cuBLASLt state for the fused GemmBias (ops/gemm.cu): the handle, a workspace, and one
  // plan per (shape, epilogue, precision), made on first use.
  struct LtPlans;
  LtPlans* lt_plans();

 private:
  int device_;
  void* stream_ = nullptr;
  void* copy_stream_ = nullptr;
  void* cublas_ = nullptr;
  std::unique_ptr<BlockCache> cache_;  // every device allocation goes through it
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  LtPlans* lt_plans_ = nullptr;
  friend void DestroyLtPlans(CudaBackend* b);
};

}  // namespace localpar
