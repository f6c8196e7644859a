// The coordinator program: owns a job. Loads the job and its data, serves its status and
// metrics, decides whether to resume, and runs the job on its workers (job_runner.h).
#pragma once

#include "absl/status/status.h"
#include "proto/config.pb.h"
#include "services/common/grpc_util.h"

namespace localpar {

// Returns the exit code (ExitCode).
int RunCoordinator(const v1::CoordinatorConfig& config, const SecurityOptions& security);

// What can be refused before any work: settings that contradict each other, and output or
// checkpoint directories that cannot be written. The launcher checks the same before it
// starts anything.
absl::Status CheckRunSettings(const v1::CoordinatorConfig& config);

}  // namespace localpar
