// Exit codes of localpar, localpar_coordinator and localpar_worker, and errors that carry
// theirs: functions return absl::Status with the exit code as a payload, and each program's
// main prints the error and maps it to its exit code in one place.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace localpar {

enum ExitCode {
  kExitOk = 0,
  kExitFailure = 1,
  kExitUsage = 2,
  kExitBadJob = 3,
  kExitBadData = 4,
  kExitWorkerLost = 5,
  kExitTrainingFailed = 6,  // the loss went non-finite, or the run trained on nothing
  kExitInterrupted = 130,
};

// `s` with `code` attached (OK stays OK).
absl::Status WithExitCode(absl::Status s, ExitCode code);
// The code attached to `s`; kExitOk for OK; a data error (IsDataError) is kExitBadData;
// otherwise kExitFailure.
ExitCode ExitCodeOf(const absl::Status& s);

// Shorthands: a bad flag or setting (2), a job that does not hold together (3), a data set
// that cannot be read (4), a worker that was lost (5), a run that trained nothing (6).
absl::Status UsageError(absl::string_view message);
absl::Status JobError(absl::string_view message);
absl::Status WorkerLostError(absl::string_view message);
absl::Status TrainingFailedError(absl::string_view message);
// Failures the program does not attribute to any of those (1).
absl::Status FailureError(absl::string_view message);
// An error with the exit code `code` (any of the above).
absl::Status CodedError(ExitCode code, absl::string_view message);
// A job file that did not load: 4 when its data could not be read, 3 otherwise.
absl::Status JobLoadError(const absl::Status& s);
// The exit code of a failure already said on the console by the process that failed (a
// child's own message): its message is empty, and a main prints nothing more for it.
absl::Status ReportedError(ExitCode code);

}  // namespace localpar
