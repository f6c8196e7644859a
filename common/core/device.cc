// The compute backend a program asks for by name.
#include "common/core/device.h"

namespace localpar {

PickedBackend PickBackend(const DeviceChoice& o) {
  PickedBackend out;
  if (o.device == "cuda" || o.device == "auto") {
    if ((out.backend = MakeCudaBackend(0))) return out;
    if (o.device == "cuda") {
      out.error = "--device=cuda: no CUDA device is available";
      return out;
    }
  } else if (o.device != "cpu") {
    out.error = "--device=" + o.device + ": expected cpu, cuda or auto";
    out.bad_name = true;
    return out;
  }
  CpuOptions cpu;
  cpu.threads = o.threads;
  out.backend = MakeCpuBackend(cpu);
  return out;
}

}  // namespace localpar
