// The linear family's configs, for code that builds layers itself (heads, shorthand kinds).
#pragma once

#include "common/nn/layer.h"

namespace localpar {

LayerConfig LinearConfig(int64_t out_features);  // on the flattened example
LayerConfig DenseConfig(int64_t out_features);   // per position, on the last dimension

}  // namespace localpar
