// Auxiliary heads expand to ordinary layers.
#include "common/nn/head.h"

namespace localpar {

const char* HeadKindName(HeadConfig::Kind kind) {
  switch (kind) {
    case HeadConfig::Kind::kLinear:
      return "linear";
    case HeadConfig::Kind::kPoolLinear:
      return "pool_linear";
    case HeadConfig::Kind::kMlp:
      return "mlp";
    case HeadConfig::Kind::kConvPoolLinear:
      return "conv_pool_linear";
    case HeadConfig::Kind::kLanguageModel:
      return "language_model";
  }
  return "?";
}

bool HeadLayers(const HeadConfig& head, const Shape& in, int64_t classes,
                std::vector<LayerConfig>* layers, std::string* error) {
  using K = LayerConfig::Kind;
  auto layer = [](K kind, int64_t out = 0) {
    LayerConfig c;
    c.kind = kind;
    c.out_features = out;
    return c;
  };
  layers->clear();
  bool image = in.size() == 3;
  switch (head.kind) {
    case HeadConfig::Kind::kLinear:
      break;
    case HeadConfig::Kind::kPoolLinear:
      if (image) layers->push_back(layer(K::kGlobalAvgPool));
      break;
    case HeadConfig::Kind::kMlp:
      if (head.hidden <= 0) {
        *error = "head.hidden must be > 0";
        return false;
      }
      layers->push_back(layer(K::kLinear, head.hidden));
      layers->push_back(layer(K::kRelu));
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
      LayerConfig conv = layer(K::kConv2d, head.channels);
      conv.kernel = 3;
      conv.padding = 1;
      layers->push_back(conv);
      layers->push_back(layer(K::kRelu));
      layers->push_back(layer(K::kGlobalAvgPool));
      break;
    }
    case HeadConfig::Kind::kLanguageModel:
      if (in.size() != 2) {
        *error = "head language_model needs a sequence-shaped stage output [positions, dim], got " +
                 ShapeString(in);
        return false;
      }
      layers->push_back(layer(K::kLayerNorm));
      layers->push_back(layer(K::kDense, classes));  // one prediction per position
      return true;
  }
  layers->push_back(layer(K::kLinear, classes));
  return true;
}

}  // namespace localpar
