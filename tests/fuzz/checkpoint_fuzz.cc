// Fuzz target: checkpoint files from untrusted bytes: the checksummed container, then the
// stage snapshot restored into a small stage. Garbage must never be loaded: anything that
// is not a consistent snapshot of this stage's shapes is refused.
#include <cstddef>
#include <cstdint>

#include "common/model_io/stage_snapshot.h"
#include "tests/fuzz/fuzz_file.h"

namespace {

localpar::Stage& FuzzStage() {
  static auto* cpu = localpar::MakeCpuBackend().release();
  static localpar::Stage* stage = [] {
    localpar::StageConfig c;
    localpar::LayerConfig lin;
    lin.kind = "linear";
    lin.Set("out_features", 3);
    c.layers = {lin};
    std::string error;
    return localpar::Stage::Create(*cpu, c, {4}, 2, localpar::OptimizerConfig(), 1, &error)
        .release();
  }();
  return *stage;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  localpar::fuzz::MemFile file(data, size);
  // Both the container check and, on the raw bytes, the snapshot parser and restore.
  (void)localpar::LoadStageFile(FuzzStage(), file.path());
  localpar::v1::StageCheckpoint c;
  if (c.ParseFromArray(data, static_cast<int>(size))) {
    (void)localpar::RestoreStageState(FuzzStage(), c, "fuzz");
  }
  return 0;
}
