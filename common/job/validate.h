// A job's checks, field by field, then shapes through every stage (validate.cc).
#pragma once

#include "absl/status/status.h"
#include "common/job/limits.h"
#include "proto/job.pb.h"

namespace localpar {

// Field-level checks (naming the field path and the reason), then shape inference through
// every stage and head (naming the stage, the layer and both shapes).
absl::Status ValidateJob(const v1::Job& job);
// The field-level checks alone (before the data's shape is known).
absl::Status ValidateJobFields(const v1::Job& job);

}  // namespace localpar
