// CPU backend: memory, copies and construction (op kernels live in common/ops/*.cc).
#include "common/core/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <new>

#ifdef LOCALPAR_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef LOCALPAR_HAVE_DNNL
#include <dlfcn.h>

#include "common/core/check.h"
#endif

namespace localpar {

CpuBackend::CpuBackend(const CpuOptions& options) : options_(options) {
#ifdef LOCALPAR_HAVE_OPENBLAS
  // Process-wide in OpenBLAS; the last backend constructed wins.
  openblas_set_num_threads(options_.threads > 0 ? options_.threads : 1);
#endif
}

#ifdef LOCALPAR_HAVE_DNNL
// oneDNN runs on the OpenMP runtime it was built with (libgomp, for Debian's), which it
// loads itself. Its thread count is set through that runtime's own entry point, found at
// run time: this code is not compiled with OpenMP, and no second runtime (clang's libomp,
// in the sanitizer build) is linked beside it.
void CpuBackend::UseOwnThreads() const {
  using SetNumThreads = void (*)(int);
  static const auto set_num_threads =
      reinterpret_cast<SetNumThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  LP_CHECK_MSG(set_num_threads != nullptr, "oneDNN's OpenMP runtime has no omp_set_num_threads");
  set_num_threads(options_.threads > 0 ? options_.threads : 1);
}
#endif

std::string CpuBackend::Describe() const {
  const std::string precision = GemmPrecisionSuffix();
#if defined(LOCALPAR_HAVE_DNNL)
  return "cpu (oneDNN, " + std::to_string(options_.threads) + " thread(s)" + precision + ")";
#elif defined(LOCALPAR_HAVE_OPENBLAS)
  return "cpu (OpenBLAS, " + std::to_string(options_.threads) + " thread(s)" + precision + ")";
#else
  return "cpu (portable GEMM" + precision + ")";
#endif
}

std::function<void()> Backend::CopyToHostAsync(void* host_dst, const void* src, size_t bytes) {
  CopyToHost(host_dst, src, bytes);
  return [] {};
}

std::unique_ptr<Backend> Backend::MakeStagingHost() { return MakeCpuBackend(); }

void* CpuBackend::Allocate(size_t bytes) {
  if (options_.allocate) {
    void* p = options_.allocate(bytes == 0 ? 64 : bytes);
    if (!p) throw std::bad_alloc();
    return p;
  }
  // 64-byte alignment suits AVX-512 loads and keeps rows cache-line aligned.
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) throw std::bad_alloc();
  return p;
}

void CpuBackend::Free(void* ptr) {
  if (options_.free) {
    options_.free(ptr);
  } else {
    std::free(ptr);
  }
}

void CpuBackend::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  std::memcpy(dst, host_src, bytes);
}

void CpuBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  std::memcpy(host_dst, src, bytes);
}

void CpuBackend::CopyWithin(void* dst, const void* src, size_t bytes) {
  std::memmove(dst, src, bytes);
}

std::unique_ptr<Backend> MakeCpuBackend(const CpuOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace localpar
