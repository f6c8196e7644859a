// The compute backend a program asks for by name.
#include "common/run/device.h"

#include "absl/strings/str_cat.h"

namespace localpar {

absl::StatusOr<std::unique_ptr<Backend>> PickBackend(const DeviceChoice& o) {
  if (o.device == "cuda" || o.device == "auto") {
    if (auto gpu = MakeCudaBackend(0)) return gpu;
    if (o.device == "cuda") {
      return absl::FailedPreconditionError("--device=cuda: no CUDA device is available");
    }
  } else if (o.device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", o.device, ": expected cpu, cuda or auto"));
  }
  CpuOptions cpu;
  cpu.threads = o.threads;
  return MakeCpuBackend(cpu);
}

}  // namespace localpar
