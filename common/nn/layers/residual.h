// The residual family's config, for code that builds layers itself.
#pragma once

#include <vector>

#include "common/nn/layer.h"

namespace localpar {

LayerConfig ResidualConfig(std::vector<LayerConfig> body);

}  // namespace localpar
