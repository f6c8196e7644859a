// Exit codes as status payloads.
#include "services/common/exit_codes.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "common/job/data_spec.h"

namespace localpar {
namespace {

constexpr char kExitCodePayload[] = "type.localpar/exit-code";

}  // namespace

absl::Status WithExitCode(absl::Status s, ExitCode code) {
  if (!s.ok()) s.SetPayload(kExitCodePayload, absl::Cord(std::to_string(static_cast<int>(code))));
  return s;
}

ExitCode ExitCodeOf(const absl::Status& s) {
  if (s.ok()) return kExitOk;
  if (absl::optional<absl::Cord> p = s.GetPayload(kExitCodePayload)) {
    return static_cast<ExitCode>(std::stoi(std::string(*p)));
  }
  return IsDataError(s) ? kExitBadData : kExitFailure;
}

absl::Status UsageError(absl::string_view m) {
  return WithExitCode(absl::InvalidArgumentError(m), kExitUsage);
}
absl::Status JobError(absl::string_view m) {
  return WithExitCode(absl::InvalidArgumentError(m), kExitBadJob);
}
absl::Status WorkerLostError(absl::string_view m) {
  return WithExitCode(absl::UnavailableError(m), kExitWorkerLost);
}
absl::Status TrainingFailedError(absl::string_view m) {
  return WithExitCode(absl::FailedPreconditionError(m), kExitTrainingFailed);
}
absl::Status FailureError(absl::string_view m) {
  return WithExitCode(absl::UnknownError(m), kExitFailure);
}

absl::Status CodedError(ExitCode code, absl::string_view m) {
  return WithExitCode(absl::UnknownError(m), code);
}
absl::Status JobLoadError(const absl::Status& s) {
  return WithExitCode(s, IsDataError(s) ? kExitBadData : kExitBadJob);
}

absl::Status ReportedError(ExitCode code) { return WithExitCode(absl::UnknownError(""), code); }

}  // namespace localpar
