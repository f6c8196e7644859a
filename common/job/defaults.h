// A job's documented defaults (defaults.cc).
#pragma once

#include "proto/job.pb.h"

namespace localpar {

// Fills documented defaults for zero-valued fields, in place.
void ApplyJobDefaults(v1::Job& job);
// Job.replica_sync's part of it (again after --sync_every and friends): the outer step's
// defaults when every > 1; an every-step setting with nothing else is cleared, so that it
// fingerprints as a job without it.
void ApplyReplicaSyncDefaults(v1::Job& job);

}  // namespace localpar
