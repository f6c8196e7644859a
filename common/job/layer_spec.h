// job.proto's Layer and the core's LayerConfig, converted by reflection: the Layer field that
// is set names the kind, and its message's fields are the settings, by name. So no code
// outside a kind's family file names the kind (common/nn/layers/).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/nn/layer.h"
#include "proto/job.pb.h"

namespace localpar {

LayerConfig LayerFromSpec(const v1::Layer& layer);
// Writes the settings back into the kind's message (fields the message does not have are
// ignored), bodies too.
void LayerToSpec(const LayerConfig& config, v1::Layer* layer);

// The kind's documented defaults, filled in the job file's own message.
void ApplyLayerSpecDefaults(v1::Layer* layer);
// How deep `layer` nests: 1 for a plain layer, 1 + the deepest layer of its body otherwise.
int LayerSpecNesting(const v1::Layer& layer);
// The kind's settings checks; errors name `at`.KIND.FIELD.
absl::Status ValidateLayerSpec(const v1::Layer& layer, const std::string& at);

}  // namespace localpar
