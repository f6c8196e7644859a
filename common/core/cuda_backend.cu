// CUDA backend: device selection, stream, cuBLAS handle, memory and copies.
#include <cstdio>
#include <string>

#include "common/core/cuda_common.cuh"

namespace localpar {

int CudaDeviceCount() {
  // With no driver cudaGetDeviceCount fails (error 35); any failure means "no GPU".
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> MakeCudaBackend(int device) {
  if (device < 0 || device >= CudaDeviceCount()) return nullptr;
  return std::make_unique<CudaBackend>(device);
}

CudaBackend::CudaBackend(int device) : device_(device) {
  LP_CUDA_CHECK(cudaSetDevice(device_));
  cudaStream_t stream;
  LP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  cudaStream_t copy_stream;
  LP_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  copy_stream_ = copy_stream;
  cublasHandle_t handle;
  LP_CUBLAS_CHECK(cublasCreate(&handle));
  LP_CUBLAS_CHECK(cublasSetStream(handle, stream));
  cublas_ = handle;
  cache_ = std::make_unique<BlockCache>(
      [this](size_t bytes) -> void* {
        void* p = nullptr;
        LP_CUDA_CHECK(cudaSetDevice(device_));
        cudaError_t err = cudaMalloc(&p, bytes);
        if (err == cudaErrorMemoryAllocation) {
          cudaGetLastError();  // clear it: the cache frees its idle blocks and retries
          return nullptr;
        }
        LP_CUDA_CHECK(err);
        return p;
      },
      [this](void* p) {
        cudaSetDevice(device_);
        cudaFree(p);
      });
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(StreamOf(this));
  cudaStreamSynchronize(static_cast<cudaStream_t>(copy_stream_));
  if (scratch_) Free(scratch_);
  DestroyLtPlans(this);
  cache_.reset();
  cublasDestroy(CublasOf(this));
  cudaStreamDestroy(StreamOf(this));
  cudaStreamDestroy(static_cast<cudaStream_t>(copy_stream_));
}

std::string CudaBackend::Describe() const {
  cudaDeviceProp prop;
  LP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  return std::string("cuda:") + std::to_string(device_) + " (" + prop.name + GemmPrecisionSuffix() +
         ")";
}

void* CudaBackend::Allocate(size_t bytes) {
  void* p = cache_->Allocate(bytes);
  if (p == nullptr) {
    std::fprintf(stderr, "cuda:%d: out of device memory allocating %zu bytes (%lld in use)\n",
                 device_, bytes, static_cast<long long>(cache_->bytes_in_use()));
    std::abort();
  }
  return p;
}

void CudaBackend::Free(void* ptr) {
  // No synchronisation: every kernel runs on this backend's one stream, so whatever reuses
  // the block is queued after the work that used it.
  cache_->Free(ptr);
}

void CudaBackend::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  LP_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, StreamOf(this)));
  // Pageable source: the caller may reuse it right after we return.
  LP_CUDA_CHECK(cudaStreamSynchronize(StreamOf(this)));
}

void CudaBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  LP_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, StreamOf(this)));
  LP_CUDA_CHECK(cudaStreamSynchronize(StreamOf(this)));
}

std::function<void()> CudaBackend::CopyToHostAsync(void* host_dst, const void* src, size_t bytes) {
  auto copy = static_cast<cudaStream_t>(copy_stream_);
  cudaEvent_t queued;  // everything on the compute stream so far, the source's writer included
  LP_CUDA_CHECK(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
  LP_CUDA_CHECK(cudaEventRecord(queued, StreamOf(this)));
  LP_CUDA_CHECK(cudaStreamWaitEvent(copy, queued, 0));
  LP_CUDA_CHECK(cudaEventDestroy(queued));  // released once it has fired
  LP_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, copy));
  cudaEvent_t done;
  LP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  LP_CUDA_CHECK(cudaEventRecord(done, copy));
  // The event goes with the last copy of the waiter, waited on or not.
  auto event = std::shared_ptr<CUevent_st>(done, [](cudaEvent_t e) { cudaEventDestroy(e); });
  const int device = device_;
  return [event, device] {
    LP_CUDA_CHECK(cudaSetDevice(device));
    LP_CUDA_CHECK(cudaEventSynchronize(event.get()));
  };
}

std::unique_ptr<Backend> CudaBackend::MakeStagingHost() {
  CpuOptions o;
  const int device = device_;
  o.allocate = [device](size_t bytes) -> void* {
    void* p = nullptr;
    LP_CUDA_CHECK(cudaSetDevice(device));
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  };
  o.free = [](void* p) { cudaFreeHost(p); };
  return MakeCpuBackend(o);
}

void CudaBackend::CopyWithin(void* dst, const void* src, size_t bytes) {
  LP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, StreamOf(this)));
}

void* CudaBackend::Scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_) Free(scratch_);
    scratch_ = Allocate(bytes);
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

void CudaBackend::Synchronize() {
  LP_CUDA_CHECK(cudaStreamSynchronize(StreamOf(this)));
  LP_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(copy_stream_)));
}

}  // namespace localpar
