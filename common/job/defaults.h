// A job's documented defaults (defaults.cc).
#pragma once

#include "proto/job.pb.h"

namespace localpar {

// Fills documented defaults for zero-valued fields, in place.
void ApplyJobDefaults(v1::Job& job);

}  // namespace localpar
