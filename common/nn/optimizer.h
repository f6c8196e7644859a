// Optimizers (SGD with momentum and weight decay, AdamW) and learning-rate schedules.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/nn/layer.h"

namespace localpar {

struct OptimizerConfig {
  enum class Kind { kSgd, kAdamW };
  Kind kind = Kind::kAdamW;
  float momentum = 0.0f;  // SGD
  bool nesterov = false;  // SGD
  float weight_decay = 0.0f;
  float beta1 = 0.9f;  // AdamW
  float beta2 = 0.999f;
  float eps = 1e-8f;
  // AdamW: weight decay only for parameters of two or more dimensions (not biases or
  // normalisation scales).
  bool decay_matrices_only = false;
  // Global-norm clipping of the gradients Step applies (0: none), PyTorch's clip_grad_norm_:
  // scaled by clip_norm / (norm + 1e-6) when that is below 1.
  float clip_norm = 0.0f;
};

// Owns the per-parameter state of one stage. Step applies one update to every parameter
// and zeroes the gradients for the next accumulation.
class Optimizer {
 public:
  Optimizer(Backend& backend, const OptimizerConfig& config) : backend_(backend), config_(config) {}
  void Step(const std::vector<Param*>& params, float lr);
  // The trainable parameters' gradients' joint L2 norm before the last Step clipped them.
  double last_grad_norm() const { return last_grad_norm_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }  // when restoring a checkpoint

 private:
  Backend& backend_;
  OptimizerConfig config_;
  int64_t steps_ = 0;
  double last_grad_norm_ = 0;
};

struct ScheduleConfig {
  enum class Kind { kConstant, kCosine };
  Kind kind = Kind::kConstant;
  float lr = 1e-3f;
  int64_t warmup_steps = 0;  // linear warm-up from 0, for either kind
  float min_lr = 0.0f;       // cosine floor
};

// Learning rate for 0-based `step` of `total_steps`.
float LearningRate(const ScheduleConfig& schedule, int64_t step, int64_t total_steps);

}  // namespace localpar
