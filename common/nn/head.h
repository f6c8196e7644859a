// Auxiliary heads: the small classifiers that give each stage its local loss.
#pragma once

#include <string>
#include <vector>

#include "common/nn/layer.h"

namespace localpar {

struct HeadConfig {
  enum class Kind {
    kLinear,          // linear on the flattened features
    kPoolLinear,      // global average pooling (for images), then linear
    kMlp,             // linear(hidden), relu, linear
    kConvPoolLinear,  // conv 3x3 (channels), relu, global average pooling, linear
    kLanguageModel,   // sequences [positions, dim]: layer norm, then per-position logits
  };
  Kind kind = Kind::kLinear;
  int64_t hidden = 256;
  int64_t channels = 32;
  // kLanguageModel: the output projection is the stage's embedding table, transposed.
  bool tie_embedding = false;
  // Applied to the stage's output first (more capacity: a transformer block, say).
  std::vector<LayerConfig> layers;
};

// The head's layers for a stage whose output has per-example shape `in` (its own `layers`
// first, then its kind's); the last layer
// produces `classes` logits. Returns false with *error when the head cannot fit.
bool HeadLayers(const HeadConfig& head, const Shape& in, int64_t classes,
                std::vector<LayerConfig>* layers, std::string* error);

}  // namespace localpar
