// The elementwise family's configs, for code that builds layers itself.
#pragma once

#include "common/nn/layer.h"

namespace localpar {

LayerConfig ReluConfig();
LayerConfig GeluConfig();

}  // namespace localpar
