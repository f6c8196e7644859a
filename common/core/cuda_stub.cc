// Stand-ins for builds without the CUDA backend: no device is ever available.
#include "common/core/backend.h"

namespace localpar {

int CudaDeviceCount() { return 0; }
std::unique_ptr<Backend> MakeCudaBackend(int) { return nullptr; }

}  // namespace localpar
