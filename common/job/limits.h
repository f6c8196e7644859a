// How big and deep a job may be: the limits every parser and check of a job shares.
#pragma once

#include <cstdint>

namespace localpar {

// How deep blocks may nest (a residual is 1 deep, a residual in a residual's body 2). One
// limit serves both
// parsers: the text parser stops at kMaxJobMessageDepth messages, which a job within the
// nesting limit never reaches, and a Job within it stays far inside the limit of 100 that
// protobuf's binary parser (and so gRPC) applies to a Configure. `validate` names the layer.
constexpr int kMaxLayerNesting = 16;
constexpr int kMaxJobMessageDepth = 2 * kMaxLayerNesting + 8;
// The most stages a job may have: each is a worker process.
constexpr int kMaxStages = 1024;

// The most replicas of a stage a job may ask for (Job.replicas).
constexpr int kMaxReplicas = 64;

}  // namespace localpar
