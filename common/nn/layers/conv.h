// The convolution family's configs, for code that builds layers itself.
#pragma once

#include "common/nn/layer.h"

namespace localpar {

LayerConfig Conv2dConfig(int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding);
LayerConfig GlobalAvgPoolConfig();

}  // namespace localpar
