// Fuzz target: job files (text protobuf) from untrusted bytes: parse, default, validate and,
// when valid, infer every stage's shapes. Must never crash or hang.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/job/job.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<localpar::v1::Job> job = localpar::ParseJob(text, "fuzz.textproto");
  if (!job.ok()) return 0;
  localpar::ModelConfig m = localpar::ToModelConfig(*job);
  for (int k = 0; k < static_cast<int>(m.stages.size()); ++k) localpar::StageInputShape(m, k);
  return 0;
}
