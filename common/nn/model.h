// A Model: the ordered stages of a network, built from a plain config.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/nn/stage.h"

namespace localpar {

struct ModelConfig {
  Shape input_shape;  // per example, e.g. [28, 28, 1]
  int64_t classes = 10;
  std::vector<StageConfig> stages;
  OptimizerConfig optimizer;
  uint64_t seed = 0;
};

// The most classes (or vocabulary entries) a job may have.
constexpr int64_t kMaxClasses = (int64_t{1} << 31) - 1;

// Checks every stage's layers and head against the shapes flowing in, without allocating.
// On failure *error names the stage and layer and both shapes.
bool ValidateModel(const ModelConfig& config, std::string* error);

// Per-example input shape of stage k (the data's shape for k = 0); the config must be valid.
Shape StageInputShape(const ModelConfig& config, int k);

class Model {
 public:
  // `built`, when set, sees each stage as soon as it exists, before the next is built: a
  // model built only to name or lay out weights can free what it does not need stage by stage.
  static std::unique_ptr<Model> Create(Backend& backend, const ModelConfig& config,
                                       std::string* error,
                                       const std::function<void(int, Stage&)>& built = nullptr);
  int num_stages() const { return static_cast<int>(stages_.size()); }
  Stage& stage(int k) { return *stages_[k]; }
  int64_t num_parameters();
  // Makes this model's parameters, optimizer state, outer state (replica_sync) and optimizer
  // step count those of `from` (a model of the same config, on the same backend): a replica
  // starting where another is.
  void CopyStateFrom(Model& from);

 private:
  std::vector<std::unique_ptr<Stage>> stages_;
};

}  // namespace localpar
