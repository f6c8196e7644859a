// Auxiliary heads expand to ordinary layers.
#include "common/nn/head.h"

#include "common/nn/layers/conv.h"
#include "common/nn/layers/elementwise.h"
#include "common/nn/layers/linear.h"
#include "common/nn/layers/norm.h"

namespace localpar {
namespace {

// The layers of the head's kind, appended for input shape `in` (what the head's own layers
// leave).
bool KindLayers(const HeadConfig& head, const Shape& in, int64_t classes,
                std::vector<LayerConfig>* layers, std::string* error) {
  const bool image = in.size() == 3;
  switch (head.kind) {
    case HeadConfig::Kind::kLinear:
      break;
    case HeadConfig::Kind::kPoolLinear:
      if (image) layers->push_back(GlobalAvgPoolConfig());
      break;
    case HeadConfig::Kind::kMlp:
      if (head.hidden <= 0) {
        *error = "head.hidden must be > 0";
        return false;
      }
      layers->push_back(LinearConfig(head.hidden));
      layers->push_back(ReluConfig());
      break;
    case HeadConfig::Kind::kConvPoolLinear: {
      if (!image) {
        *error = "head conv_pool_linear needs an image-shaped stage output, got " + ShapeString(in);
        return false;
      }
      if (head.channels <= 0) {
        *error = "head.channels must be > 0";
        return false;
      }
      layers->push_back(Conv2dConfig(head.channels, /*kernel=*/3, /*stride=*/1, /*padding=*/1));
      layers->push_back(ReluConfig());
      layers->push_back(GlobalAvgPoolConfig());
      break;
    }
    case HeadConfig::Kind::kLanguageModel:
      if (in.size() != 2) {
        *error = "head language_model needs a sequence-shaped stage output [positions, dim], got " +
                 ShapeString(in);
        return false;
      }
      layers->push_back(LayerNormConfig());
      layers->push_back(DenseConfig(classes));  // one prediction per position
      return true;
  }
  layers->push_back(LinearConfig(classes));
  return true;
}

}  // namespace

bool HeadLayers(const HeadConfig& head, const Shape& in, int64_t classes,
                std::vector<LayerConfig>* layers, std::string* error) {
  *layers = head.layers;
  Shape cur = in;
  for (size_t i = 0; i < head.layers.size(); ++i) {
    Shape next;
    std::string e;
    if (!InferLayerShape(head.layers[i], cur, &next, &e)) {
      *error = "layers[" + std::to_string(i) + "] " + e + " (input " + ShapeString(cur) + ")";
      return false;
    }
    cur = next;
  }
  return KindLayers(head, cur, classes, layers, error);
}

}  // namespace localpar
