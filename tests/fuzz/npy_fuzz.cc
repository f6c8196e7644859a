// Fuzz target: NumPy .npy images and .npz archives from untrusted bytes. A header or a zip
// directory that claims more than the bytes hold must be refused before allocation; every
// array returned must hold exactly what its shape and dtype say.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "common/data/npy.h"
#include "tests/fuzz/fuzz_file.h"

namespace {

void CheckArray(const localpar::NpyArray& a) {
  size_t item = 0;
  for (const char* d : {"f4", "i4", "u4"}) item = a.dtype == d ? 4 : item;
  for (const char* d : {"f8", "i8", "u8"}) item = a.dtype == d ? 8 : item;
  for (const char* d : {"u2", "i2"}) item = a.dtype == d ? 2 : item;
  for (const char* d : {"u1", "i1"}) item = a.dtype == d ? 1 : item;
  if (item == 0 || static_cast<size_t>(a.count()) * item != a.data.size()) __builtin_trap();
  if (a.count() > 0) (void)a.at(a.count() - 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
    localpar::fuzz::MemFile file(data, size);
    absl::StatusOr<std::map<std::string, localpar::NpyArray>> z =
        localpar::ReadNpzFile(file.path());
    if (z.ok()) {
      for (const auto& [name, a] : *z) CheckArray(a);
    }
    return 0;
  }
  absl::StatusOr<localpar::NpyArray> a = localpar::ParseNpy(bytes, "fuzz.npy");
  if (a.ok()) CheckArray(*a);
  return 0;
}
