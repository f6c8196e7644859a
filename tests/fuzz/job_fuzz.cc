// Fuzz target: job files (text protobuf) from untrusted bytes: parse (with the nesting
// limit), default, validate and, when valid, infer every stage's shapes, count its
// parameters and FLOPs, and estimate and check its memory. Must never crash, hang, overflow
// (UBSan) or allocate what the job asks for.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/job/parse.h"
#include "common/job/resources.h"
#include "common/job/spec.h"
#include "common/nn/stage.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<localpar::v1::Job> job = localpar::ParseJob(text, "fuzz.textproto");
  if (!job.ok()) return 0;
  localpar::ModelConfig m = localpar::ToModelConfig(*job);
  for (int k = 0; k < static_cast<int>(m.stages.size()); ++k) {
    const localpar::Shape in = localpar::StageInputShape(m, k);
    localpar::StageParameterCount(m.stages[k], in, m.classes);
    localpar::StageForwardFlops(m.stages[k], in, m.classes);
  }
  for (bool per_replica : {false, true}) localpar::EstimateJobNeeds(*job, per_replica);
  localpar::CheckJobFits(*job, 1 << 30, true).IgnoreError();
  return 0;
}
