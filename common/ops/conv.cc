// NHWC convolution on the CPU: oneDNN's kernels where the build has it, im2col + GEMM
// otherwise; the im2col path itself (shared with CUDA) and its building blocks.
#include <algorithm>
#include <cstring>

#include "common/core/cpu_backend.h"

#ifdef LOCALPAR_HAVE_DNNL
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "dnnl.hpp"
#endif

namespace localpar {

// ---- the im2col path (every backend) ------------------------------------------------------

namespace {
constexpr int64_t kColumnBudget = 8 << 20;  // floats in the column buffer

// Images per im2col group: as many as fit the column budget, at least one.
int64_t Im2ColGroup(const ConvGeometry& g) {
  int64_t per_image = std::max<int64_t>(1, g.oh * g.ow * g.fan_in());
  return std::clamp<int64_t>(kColumnBudget / per_image, 1, std::max<int64_t>(1, g.n));
}
}  // namespace

int64_t Backend::ConvIm2ColWorkspaceFloats(const ConvGeometry& g) {
  return Im2ColGroup(g) * g.oh * g.ow * g.fan_in();
}

void Backend::ConvForwardIm2Col(const ConvGeometry& g, const float* x, const float* w,
                                const float* bias, float* y, float* workspace) {
  const int64_t group = Im2ColGroup(g);
  for (int64_t i0 = 0; i0 < g.n; i0 += group) {
    int64_t images = std::min(group, g.n - i0);
    Im2Col(x + i0 * g.h * g.w * g.c, workspace, images, g.h, g.w, g.c, g.kernel, g.kernel, g.stride,
           g.pad, g.oh, g.ow);
    Gemm(false, false, images * g.oh * g.ow, g.out_channels, g.fan_in(), 1.0f, workspace, w, 0.0f,
         y + i0 * g.oh * g.ow * g.out_channels);
  }
  AddRowVector(y, bias, g.n * g.oh * g.ow, g.out_channels);
}

void Backend::ConvBackwardDataIm2Col(const ConvGeometry& g, const float* dy, const float* w,
                                     float* dx, float* workspace) {
  const int64_t group = Im2ColGroup(g);
  Fill(dx, 0.0f, g.n * g.h * g.w * g.c);
  for (int64_t i0 = 0; i0 < g.n; i0 += group) {
    int64_t images = std::min(group, g.n - i0);
    Gemm(false, true, images * g.oh * g.ow, g.fan_in(), g.out_channels, 1.0f,
         dy + i0 * g.oh * g.ow * g.out_channels, w, 0.0f, workspace);
    Col2Im(workspace, dx + i0 * g.h * g.w * g.c, images, g.h, g.w, g.c, g.kernel, g.kernel,
           g.stride, g.pad, g.oh, g.ow);
  }
}

void Backend::ConvBackwardWeightsIm2Col(const ConvGeometry& g, const float* x, const float* dy,
                                        float* dw, float* db, float* workspace) {
  const int64_t group = Im2ColGroup(g);
  SumRows(dy, db, g.n * g.oh * g.ow, g.out_channels);
  for (int64_t i0 = 0; i0 < g.n; i0 += group) {
    int64_t images = std::min(group, g.n - i0);
    Im2Col(x + i0 * g.h * g.w * g.c, workspace, images, g.h, g.w, g.c, g.kernel, g.kernel, g.stride,
           g.pad, g.oh, g.ow);
    Gemm(true, false, g.fan_in(), g.out_channels, images * g.oh * g.ow, 1.0f, workspace,
         dy + i0 * g.oh * g.ow * g.out_channels, 1.0f, dw);
  }
}

void CpuBackend::Im2Col(const float* x, float* col, int64_t n, int64_t h, int64_t w, int64_t c,
                        int64_t kh, int64_t kw, int64_t stride, int64_t pad, int64_t oh,
                        int64_t ow) {
  const int64_t row_len = kh * kw * c;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        float* dst = col + ((b * oh + oy) * ow + ox) * row_len;
        for (int64_t ky = 0; ky < kh; ++ky) {
          int64_t iy = oy * stride - pad + ky;
          for (int64_t kx = 0; kx < kw; ++kx) {
            int64_t ix = ox * stride - pad + kx;
            float* d = dst + (ky * kw + kx) * c;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
              std::memset(d, 0, sizeof(float) * c);
            } else {
              std::memcpy(d, x + ((b * h + iy) * w + ix) * c, sizeof(float) * c);
            }
          }
        }
      }
    }
  }
}

void CpuBackend::Col2Im(const float* col, float* dx, int64_t n, int64_t h, int64_t w, int64_t c,
                        int64_t kh, int64_t kw, int64_t stride, int64_t pad, int64_t oh,
                        int64_t ow) {
  const int64_t row_len = kh * kw * c;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        const float* src = col + ((b * oh + oy) * ow + ox) * row_len;
        for (int64_t ky = 0; ky < kh; ++ky) {
          int64_t iy = oy * stride - pad + ky;
          if (iy < 0 || iy >= h) continue;
          for (int64_t kx = 0; kx < kw; ++kx) {
            int64_t ix = ox * stride - pad + kx;
            if (ix < 0 || ix >= w) continue;
            const float* s = src + (ky * kw + kx) * c;
            float* d = dx + ((b * h + iy) * w + ix) * c;
            for (int64_t ch = 0; ch < c; ++ch) d[ch] += s[ch];
          }
        }
      }
    }
  }
}

// ---- the CPU's Conv ops ---------------------------------------------------------------------

#ifdef LOCALPAR_HAVE_DNNL
// oneDNN's direct convolution on NHWC activations, the same library (and on Debian the same
// build) that PyTorch's CPU convolutions use. Its CPU kernels have no atomics: for a fixed
// thread count a primitive gives the same bits on every call, which the determinism tests
// check (OpsConv.*, and every cluster-versus-reference test with a conv job). Weights stay
// HWIO in our tensors; each primitive is handed them in the blocked layout it asked for,
// reordered on every call (a few thousand floats, cheap beside the convolution) by a
// reorder primitive made with the plan.
struct CpuBackend::DnnlPlan {
  // A primitive's own layout of the weights (or of their gradient) and the reorder between
  // it and HWIO; both empty when the primitive takes HWIO as it is.
  struct Staging {
    dnnl::memory buffer;
    dnnl::reorder reorder;
    explicit operator bool() const { return static_cast<bool>(buffer); }
  };
  dnnl::memory::desc src, dst, user_weights, bias;
  dnnl::convolution_forward fwd;
  Staging fwd_weights;  // HWIO into the forward's layout
  dnnl::convolution_backward_data bwd_data;
  Staging bwd_data_weights;  // HWIO into the backward data pass's layout
  dnnl::convolution_backward_weights bwd_weights;
  Staging diff_weights;  // the weight gradient's layout back into HWIO
};

struct CpuBackend::DnnlConvs {
  using Plan = DnnlPlan;
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

  // The three primitives for a geometry, made on its first use; nullptr (remembered) when
  // oneDNN has no implementation for it, and the im2col path serves instead.
  Plan* PlanFor(const ConvGeometry& g) {
    Key key{g.n, g.h, g.w, g.c, g.out_channels, g.kernel, g.stride, g.pad};
    auto it = plans.find(key);
    if (it != plans.end()) return it->second.get();
    std::unique_ptr<Plan> plan;
    try {
      plan = MakePlan(g);
    } catch (const dnnl::error&) {
      plan = nullptr;
    }
    return plans.emplace(key, std::move(plan)).first->second.get();
  }

  std::unique_ptr<Plan> MakePlan(const ConvGeometry& g) {
    auto plan = std::make_unique<Plan>();
    const dnnl::memory::dims dims{g.out_channels, g.c, g.kernel, g.kernel};
    const dnnl::memory::dims strides{g.stride, g.stride}, padding{g.pad, g.pad};
    const dnnl::memory::desc any_weights(dims, dt::f32, tag::any);
    plan->src = dnnl::memory::desc({g.n, g.c, g.h, g.w}, dt::f32, tag::nhwc);
    plan->dst = dnnl::memory::desc({g.n, g.out_channels, g.oh, g.ow}, dt::f32, tag::nhwc);
    plan->user_weights = dnnl::memory::desc(dims, dt::f32, tag::hwio);
    plan->bias = dnnl::memory::desc({g.out_channels}, dt::f32, tag::x);

    dnnl::convolution_forward::primitive_desc fwd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                        dnnl::algorithm::convolution_direct, plan->src, any_weights,
                                        plan->bias, plan->dst, strides, padding, padding),
        engine);
    plan->fwd = dnnl::convolution_forward(fwd);
    plan->fwd_weights = StagingFor(plan->user_weights, fwd.weights_desc(), *plan);

    dnnl::convolution_backward_data::primitive_desc bwd_data(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, plan->src,
                                              any_weights, plan->dst, strides, padding, padding),
        engine, fwd);
    plan->bwd_data = dnnl::convolution_backward_data(bwd_data);
    plan->bwd_data_weights = StagingFor(plan->user_weights, bwd_data.weights_desc(), *plan);

    dnnl::convolution_backward_weights::primitive_desc bwd_weights(
        dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, plan->src,
                                                 any_weights, plan->bias, plan->dst, strides,
                                                 padding, padding),
        engine, fwd);
    plan->bwd_weights = dnnl::convolution_backward_weights(bwd_weights);
    plan->diff_weights = StagingFor(bwd_weights.diff_weights_desc(), plan->user_weights, *plan);
    return plan;
  }

  // A buffer in the primitive's side of `from` -> `to` (whichever is not HWIO) and the
  // reorder between them; neither when both are HWIO.
  Plan::Staging StagingFor(const dnnl::memory::desc& from, const dnnl::memory::desc& to,
                           const Plan& plan) {
    if (from == to) return {};
    const dnnl::memory::desc& own = from == plan.user_weights ? to : from;
    return {dnnl::memory(own, engine),
            dnnl::reorder(dnnl::reorder::primitive_desc(engine, from, engine, to))};
  }

  // A memory object over caller-owned data (oneDNN takes non-const handles; none of the
  // inputs is written).
  dnnl::memory Wrap(const dnnl::memory::desc& d, const float* p) {
    return dnnl::memory(d, engine, const_cast<float*>(p));
  }

  // The HWIO `weights` as a primitive wants them: themselves, or reordered into `staging`
  // (empty when the primitive takes HWIO).
  dnnl::memory WeightsAs(const Plan& plan, const float* weights, Plan::Staging& staging) {
    dnnl::memory user = Wrap(plan.user_weights, weights);
    if (!staging) return user;
    staging.reorder.execute(stream, user, staging.buffer);
    return staging.buffer;
  }

  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::unique_ptr<Plan>> plans;
  std::mutex mu;  // one convolution at a time: primitives share their scratchpads
};

CpuBackend::DnnlConvs* CpuBackend::DnnlPlanFor(const ConvGeometry& g, DnnlPlan** plan) {
  // oneDNN unless the GEMMs must round their operands (TF32/BF16 modes), which only the
  // im2col path's GEMM does.
  if (gemm_precision_ != GemmPrecision::kF32) return nullptr;
  std::call_once(dnnl_once_, [this] { dnnl_ = std::make_shared<DnnlConvs>(); });
  std::lock_guard<std::mutex> lock(dnnl_->mu);
  // Before the plan is made, too: a primitive fixes how it splits its work (and so the
  // order of its sums) among the calling thread's OpenMP threads when it is created.
  UseOwnThreads();
  *plan = dnnl_->PlanFor(g);
  return *plan ? dnnl_.get() : nullptr;
}

int64_t CpuBackend::ConvWorkspaceFloats(const ConvGeometry& g) {
  DnnlPlan* plan;
  if (DnnlPlanFor(g, &plan)) return g.fan_in() * g.out_channels + g.out_channels;
  return ConvIm2ColWorkspaceFloats(g);
}

void CpuBackend::ConvForward(const ConvGeometry& g, const float* x, const float* w,
                             const float* bias, float* y, float* workspace) {
  DnnlPlan* p;
  DnnlConvs* d = DnnlPlanFor(g, &p);
  if (!d) return ConvForwardIm2Col(g, x, w, bias, y, workspace);
  DnnlPlan& plan = *p;
  std::lock_guard<std::mutex> lock(d->mu);
  plan.fwd.execute(d->stream, {{DNNL_ARG_SRC, d->Wrap(plan.src, x)},
                               {DNNL_ARG_WEIGHTS, d->WeightsAs(plan, w, plan.fwd_weights)},
                               {DNNL_ARG_BIAS, d->Wrap(plan.bias, bias)},
                               {DNNL_ARG_DST, d->Wrap(plan.dst, y)}});
  d->stream.wait();
}

void CpuBackend::ConvBackwardData(const ConvGeometry& g, const float* dy, const float* w, float* dx,
                                  float* workspace) {
  DnnlPlan* p;
  DnnlConvs* d = DnnlPlanFor(g, &p);
  if (!d) return ConvBackwardDataIm2Col(g, dy, w, dx, workspace);
  DnnlPlan& plan = *p;
  std::lock_guard<std::mutex> lock(d->mu);
  plan.bwd_data.execute(d->stream,
                        {{DNNL_ARG_DIFF_DST, d->Wrap(plan.dst, dy)},
                         {DNNL_ARG_WEIGHTS, d->WeightsAs(plan, w, plan.bwd_data_weights)},
                         {DNNL_ARG_DIFF_SRC, d->Wrap(plan.src, dx)}});
  d->stream.wait();
}

void CpuBackend::ConvBackwardWeights(const ConvGeometry& g, const float* x, const float* dy,
                                     float* dw, float* db, float* workspace) {
  DnnlPlan* p;
  DnnlConvs* d = DnnlPlanFor(g, &p);
  if (!d) return ConvBackwardWeightsIm2Col(g, x, dy, dw, db, workspace);
  DnnlPlan& plan = *p;
  const int64_t weight_floats = g.fan_in() * g.out_channels;
  {
    std::lock_guard<std::mutex> lock(d->mu);
    // oneDNN overwrites its outputs: they land in the workspace and are added below.
    dnnl::memory hwio = d->Wrap(plan.user_weights, workspace);
    dnnl::memory diff = plan.diff_weights ? plan.diff_weights.buffer : hwio;
    plan.bwd_weights.execute(d->stream,
                             {{DNNL_ARG_SRC, d->Wrap(plan.src, x)},
                              {DNNL_ARG_DIFF_DST, d->Wrap(plan.dst, dy)},
                              {DNNL_ARG_DIFF_WEIGHTS, diff},
                              {DNNL_ARG_DIFF_BIAS, d->Wrap(plan.bias, workspace + weight_floats)}});
    if (plan.diff_weights) plan.diff_weights.reorder.execute(d->stream, diff, hwio);
    d->stream.wait();
  }
  Axpy(1.0f, workspace, dw, weight_floats);
  Axpy(1.0f, workspace + weight_floats, db, g.out_channels);
}
#else
int64_t CpuBackend::ConvWorkspaceFloats(const ConvGeometry& g) {
  return ConvIm2ColWorkspaceFloats(g);
}

void CpuBackend::ConvForward(const ConvGeometry& g, const float* x, const float* w,
                             const float* bias, float* y, float* workspace) {
  ConvForwardIm2Col(g, x, w, bias, y, workspace);
}

void CpuBackend::ConvBackwardData(const ConvGeometry& g, const float* dy, const float* w, float* dx,
                                  float* workspace) {
  ConvBackwardDataIm2Col(g, dy, w, dx, workspace);
}

void CpuBackend::ConvBackwardWeights(const ConvGeometry& g, const float* x, const float* dy,
                                     float* dw, float* db, float* workspace) {
  ConvBackwardWeightsIm2Col(g, x, dy, dw, db, workspace);
}
#endif

}  // namespace localpar
