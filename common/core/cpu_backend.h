// The CPU backend: oneDNN or OpenBLAS (or a portable fallback) for GEMM, oneDNN (or im2col)
// for convolutions, plain loops for the rest.
#pragma once

#include <memory>
#include <mutex>

#include "common/core/backend.h"

namespace localpar {

// Op kernels are defined beside their CUDA twins in common/ops/<family>.cc.
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& options);

  DeviceType device() const override { return DeviceType::kCPU; }
  std::string Describe() const override;

  void* Allocate(size_t bytes) override;
  void Free(void* ptr) override;
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  void CopyWithin(void* dst, const void* src, size_t bytes) override;
  void Synchronize() override {}

#define LP_OP(ret, name, args) ret name args override;
#include "common/core/backend_ops.inc"
#undef LP_OP

 private:
  CpuOptions options_;
#ifdef LOCALPAR_HAVE_DNNL
  // Sets the calling thread's OpenMP thread count (oneDNN's) to options_.threads.
  void UseOwnThreads() const;
  // oneDNN's engine and convolution primitives (ops/conv.cc), made on the first convolution.
  struct DnnlConvs;
  struct DnnlPlan;
  // oneDNN's state and, through *plan, the geometry's primitives; nullptr where the im2col
  // path serves instead.
  DnnlConvs* DnnlPlanFor(const ConvGeometry& g, DnnlPlan** plan);
  std::once_flag dnnl_once_;
  std::shared_ptr<DnnlConvs> dnnl_;
#endif
};

}  // namespace localpar
