// Job files read: protobuf text format, defaults, overrides, the data's figures, validation
// (parse.cc).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/job/limits.h"
#include "proto/job.pb.h"

namespace localpar {

// Parses text-format `text`; syntax errors name source:line:column. Applies defaults and
// validates (see ValidateJob).
absl::StatusOr<v1::Job> ParseJob(const std::string& text, const std::string& source);
// LoadJobWithOverrides without overrides.
absl::StatusOr<v1::Job> LoadJobFile(const std::string& path);
// Parses the file, applies defaults, then `overrides` (so a --rule that changes what is
// valid counts), reads the data's shape and class count (ResolveDataShape), then validates
// once. Errors name the file, or the flag that was wrong; data errors are marked
// (IsDataError).
absl::StatusOr<v1::Job> LoadJobWithOverrides(const std::string& path,
                                             const v1::JobOverrides& overrides);

}  // namespace localpar
