// Fuzz target: a wire tensor (localpar.v1.Tensor) from untrusted bytes. Checking must refuse
// every inconsistent tensor before anything is allocated; decoding a checked one must work
// and give exactly the bytes its dtype and shape call for.
#include <cstddef>
#include <cstdint>

#include "common/model_io/tensor_proto.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* cpu = localpar::MakeCpuBackend().release();
  localpar::v1::Tensor t;
  if (!t.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (!localpar::CheckWireTensor(t, "fuzz").ok()) return 0;
  localpar::Tensor out;
  localpar::DecodeTensorInto(t, *cpu, &out);
  // F16 has no compute type and is widened to float32 on decode, so it doubles in size.
  size_t want = t.dtype() == localpar::v1::F16 ? 2 * t.data().size() : t.data().size();
  if (out.nbytes() != want) __builtin_trap();
  return 0;
}
