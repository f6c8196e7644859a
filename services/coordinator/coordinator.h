// The coordinator program: owns a job. Loads the job and its data, serves its status and
// metrics, decides whether to resume, and runs the job on its workers (job_runner.h).
#pragma once

#include "proto/config.pb.h"
#include "services/common/grpc_util.h"

namespace localpar {

// Returns the exit code (ExitCode).
int RunCoordinator(const v1::CoordinatorConfig& config, const SecurityOptions& security);

}  // namespace localpar
