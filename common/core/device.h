// The compute backend a program asks for by name: "cpu", "cuda" or "auto".
#pragma once

#include <memory>
#include <string>

#include "common/core/backend.h"

namespace localpar {

struct DeviceChoice {
  std::string device = "cpu";  // "cpu", "cuda" or "auto"
  int threads = 1;             // CPU GEMM threads
};

struct PickedBackend {
  std::unique_ptr<Backend> backend;  // null when the choice cannot be met
  std::string error;                 // why, naming --device
  bool bad_name = false;             // the name is none of cpu, cuda, auto (else: no CUDA device)
};

PickedBackend PickBackend(const DeviceChoice& choice);

}  // namespace localpar
