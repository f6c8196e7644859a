// Fuzz target: IDX files (gzipped or plain) from untrusted bytes. A header that claims a
// huge array must be refused before allocation; truncation and trailing bytes are errors.
#include <cstddef>
#include <cstdint>

#include "common/data/idx.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  localpar::fuzz::MemFile file(data, size);
  absl::StatusOr<localpar::IdxArray> a = localpar::ReadIdxFile(file.path());
  if (!a.ok()) return 0;
  size_t n = 1;
  for (int64_t d : a->dims) n *= static_cast<size_t>(d);
  if (n != a->data.size()) __builtin_trap();
  return 0;
}
