// GEMM on CUDA: every GEMM goes through cuBLAS here, in the backend's GemmPrecision.
#include "common/core/cuda_common.cuh"

namespace localpar {

namespace {

// F32: exact float32 (cuBLAS's default math). TF32 / BF16: tensor cores, operands rounded
// on the fly, float32 accumulation (see GemmPrecision).
cublasComputeType_t ComputeType(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kTF32:
      return CUBLAS_COMPUTE_32F_FAST_TF32;
    case GemmPrecision::kBF16:
      return CUBLAS_COMPUTE_32F_FAST_16BF;
    case GemmPrecision::kF32:
      break;
  }
  return CUBLAS_COMPUTE_32F;
}

}  // namespace

void CudaBackend::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  // cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major
  // C^T = op(B)^T op(A)^T, so the operands swap places.
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = static_cast<int>(trans_b ? k : n), lda = static_cast<int>(trans_a ? m : k);
  if (gemm_precision_ == GemmPrecision::kF32) {
    LP_CUBLAS_CHECK(cublasSgemm(CublasOf(this), op_b, op_a, static_cast<int>(n),
                                static_cast<int>(m), static_cast<int>(k), &alpha, b, ldb, a, lda,
                                &beta, c, static_cast<int>(n)));
    return;
  }
  LP_CUBLAS_CHECK(cublasGemmEx(CublasOf(this), op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                               static_cast<int>(k), &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda,
                               &beta, c, CUDA_R_32F, static_cast<int>(n),
                               ComputeType(gemm_precision_), CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::GemmBatched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, const float* a, int64_t stride_a, const float* b,
                              int64_t stride_b, float beta, float* c, int64_t stride_c,
                              int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = static_cast<int>(trans_b ? k : n), lda = static_cast<int>(trans_a ? m : k);
  if (gemm_precision_ == GemmPrecision::kF32) {
    LP_CUBLAS_CHECK(cublasSgemmStridedBatched(
        CublasOf(this), op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
        &alpha, b, ldb, stride_b, a, lda, stride_a, &beta, c, static_cast<int>(n), stride_c,
        static_cast<int>(batch)));
    return;
  }
  LP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      CublasOf(this), op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
      &alpha, b, CUDA_R_32F, ldb, stride_b, a, CUDA_R_32F, lda, stride_a, &beta, c, CUDA_R_32F,
      static_cast<int>(n), stride_c, static_cast<int>(batch), ComputeType(gemm_precision_),
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace localpar
