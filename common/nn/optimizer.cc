// Optimizer steps and learning-rate schedules.
#include "common/nn/optimizer.h"

#include <cmath>

namespace localpar {

void Optimizer::Step(const std::vector<Param*>& params, float lr) {
  ++steps_;
  const bool adam = config_.kind == OptimizerConfig::Kind::kAdamW;
  // Bias corrections in double, then rounded once, so every backend sees the same floats.
  float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(config_.beta1), steps_));
  float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(config_.beta2), steps_));
  if (config_.clip_norm > 0) {
    // Summed in double in parameter order, then rounded once: the same scale everywhere.
    double squares = 0;
    for (Param* p : params) {
      if (p->trainable) squares += backend_.SquaredNorm(p->grad.f32(), p->grad.numel());
    }
    last_grad_norm_ = std::sqrt(squares);
    const double coefficient = config_.clip_norm / (last_grad_norm_ + 1e-6);
    if (coefficient < 1.0) {
      for (Param* p : params) {
        if (p->trainable)
          backend_.Scale(p->grad.f32(), static_cast<float>(coefficient), p->grad.numel());
      }
    }
  }
  for (Param* p : params) {
    if (!p->trainable) continue;
    const bool decays = !config_.decay_matrices_only || p->value.shape().size() >= 2;
    const float weight_decay = decays ? config_.weight_decay : 0.0f;
    int64_t n = p->value.numel();
    if (!p->state1.defined()) p->state1 = Tensor::Zeros(backend_, p->value.shape());
    if (adam) {
      if (!p->state2.defined()) p->state2 = Tensor::Zeros(backend_, p->value.shape());
      backend_.AdamWStep(p->value.f32(), p->grad.f32(), p->state1.f32(), p->state2.f32(), n, lr,
                         config_.beta1, config_.beta2, config_.eps, weight_decay, c1, c2);
    } else {
      backend_.SgdStep(p->value.f32(), p->grad.f32(), p->state1.f32(), n, lr, config_.momentum,
                       weight_decay, config_.nesterov);
    }
  }
}

float LearningRate(const ScheduleConfig& s, int64_t step, int64_t total_steps) {
  if (s.warmup_steps > 0 && step < s.warmup_steps) {
    return s.lr * static_cast<float>(step + 1) / static_cast<float>(s.warmup_steps);
  }
  if (s.kind == ScheduleConfig::Kind::kConstant) return s.lr;
  int64_t span = total_steps - s.warmup_steps;
  if (span <= 0) return s.lr;
  double t = static_cast<double>(step - s.warmup_steps) / static_cast<double>(span);
  if (t > 1.0) t = 1.0;
  double cosine = 0.5 * (1.0 + std::cos(M_PI * t));
  return static_cast<float>(s.min_lr + (s.lr - s.min_lr) * cosine);
}

}  // namespace localpar
