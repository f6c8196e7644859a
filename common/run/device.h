// The compute backend a program asks for by name: "cpu", "cuda" or "auto".
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/core/backend.h"

namespace localpar {

struct DeviceChoice {
  std::string device = "cpu";  // "cpu", "cuda" or "auto"
  int threads = 1;             // CPU GEMM threads
};

// An unknown device name is INVALID_ARGUMENT, a CUDA device that is not there
// FAILED_PRECONDITION.
absl::StatusOr<std::unique_ptr<Backend>> PickBackend(const DeviceChoice& choice);

}  // namespace localpar
