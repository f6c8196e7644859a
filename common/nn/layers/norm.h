// The normalisation family's configs, for code that builds layers itself.
#pragma once

#include "common/nn/layer.h"

namespace localpar {

LayerConfig LayerNormConfig();

}  // namespace localpar
