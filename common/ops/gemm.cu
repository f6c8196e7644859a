// GEMM on CUDA: every GEMM goes through cuBLAS here, in the backend's GemmPrecision.
#include <cublasLt.h>

#include <map>
#include <tuple>

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

// ---- cuBLASLt: the linear layer's GEMM with its bias (and ReLU) in the epilogue ---------

struct CudaBackend::LtPlans {
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
    cublasLtMatmulAlgo_t algo;
    bool ok = false;  // false: no cuBLASLt algorithm for it; use GEMM + kernels
  };
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  static constexpr size_t kWorkspaceBytes = 32 << 20;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, int>, Plan> plans;
};

CudaBackend::LtPlans* CudaBackend::lt_plans() {
  if (!lt_plans_) {
    lt_plans_ = new LtPlans;
    LP_CUBLAS_CHECK(cublasLtCreate(&lt_plans_->handle));
    lt_plans_->workspace = Allocate(LtPlans::kWorkspaceBytes);
  }
  return lt_plans_;
}

void DestroyLtPlans(CudaBackend* b) {
  CudaBackend::LtPlans* p = b->lt_plans_;
  if (!p) return;
  for (auto& [key, plan] : p->plans) {
    if (plan.op) cublasLtMatmulDescDestroy(plan.op);
    if (plan.w) cublasLtMatrixLayoutDestroy(plan.w);
    if (plan.x) cublasLtMatrixLayoutDestroy(plan.x);
    if (plan.y) cublasLtMatrixLayoutDestroy(plan.y);
  }
  b->Free(p->workspace);
  cublasLtDestroy(p->handle);
  delete p;
  b->lt_plans_ = nullptr;
}

void CudaBackend::GemmBias(int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                           const float* bias, float* y, bool relu) {
  if (m == 0 || n == 0) return;
  LtPlans* lt = lt_plans();
  auto key = std::make_tuple(m, n, k, relu, static_cast<int>(gemm_precision_));
  auto it = lt->plans.find(key);
  if (it == lt->plans.end()) {
    // Column-major view: y^T [n x m] = w^T [n x k] * x^T [k x m]; the bias runs along y^T's
    // rows (n), which is what the BIAS epilogue adds.
    LtPlans::Plan plan;
    LP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, ComputeType(gemm_precision_), CUDA_R_32F));
    cublasLtEpilogue_t epilogue = relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    LP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                   &epilogue, sizeof(epilogue)));
    LP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.w, CUDA_R_32F, n, k, n));
    LP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.x, CUDA_R_32F, k, m, k));
    LP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.y, CUDA_R_32F, n, m, n));
    cublasLtMatmulPreference_t pref;
    LP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = LtPlans::kWorkspaceBytes;
    LP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt->handle, plan.op, plan.w, plan.x, plan.y,
                                                       plan.y, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    plan.ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (plan.ok) plan.algo = result.algo;
    it = lt->plans.emplace(key, plan).first;
  }
  const LtPlans::Plan& plan = it->second;
  if (!plan.ok) {
    GemmBiasInSteps(m, n, k, x, w, bias, y, relu);
    return;
  }
  LP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                 sizeof(bias)));
  const float alpha = 1.0f, beta = 0.0f;
  LP_CUBLAS_CHECK(cublasLtMatmul(lt->handle, plan.op, &alpha, w, plan.w, x, plan.x, &beta, y,
                                 plan.y, y, plan.y, &plan.algo, lt->workspace,
                                 LtPlans::kWorkspaceBytes, StreamOf(this)));
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
