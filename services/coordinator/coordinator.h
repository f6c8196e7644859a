// The coordinator program: owns a job. Loads the job and its data, serves its status and
// metrics, decides whether to resume, and runs the job on its workers (job_runner.h).
#pragma once

#include <ostream>

#include "absl/status/status.h"
#include "proto/config.pb.h"
#include "services/common/grpc_util.h"

namespace localpar {

// The whole program after its flags; messages go to `log`, the report's table and the files
// written to `out`. An error carries its exit code
// (exit_codes.h), and main prints it.
absl::Status RunCoordinator(const v1::CoordinatorConfig& config, const SecurityOptions& security,
                            std::ostream& log, std::ostream& out);

}  // namespace localpar
