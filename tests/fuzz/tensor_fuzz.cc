// Fuzz target: a wire tensor (localpar.v1.Tensor) from untrusted bytes. Checking must refuse
// every inconsistent tensor before anything is allocated; decoding a checked one must work.
#include <cstddef>
#include <cstdint>

#include "common/job/tensor_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* cpu = localpar::MakeCpuBackend().release();
  localpar::v1::Tensor t;
  if (!t.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (!localpar::CheckWireTensor(t, "fuzz").ok()) return 0;
  localpar::Tensor out;
  localpar::DecodeTensorInto(t, *cpu, &out);
  if (out.nbytes() != t.data().size()) __builtin_trap();
  return 0;
}
