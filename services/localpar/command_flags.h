// What every `localpar` subcommand does first: parse its flags, and take exactly one
// argument (the job file, or an address).
#pragma once

#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/common/program_config.h"
#include "services/localpar/commands.h"

namespace localpar {

// True: go on with *argument. False: --help or --version was written to `out` (exit 0). A
// usage error (an unknown flag, no argument or several) is returned naming the command.
absl::StatusOr<bool> ParseCommand(const std::string& command, const std::string& usage,
                                  const Args& args, google::protobuf::Message* message,
                                  const FlagOptions& options, std::string* argument,
                                  std::ostream& out);

// The same for a command that takes several arguments, named in `names` ("JOB_FILE").
absl::StatusOr<bool> ParseCommandArgs(const std::string& command, const std::string& usage,
                                      const Args& args, google::protobuf::Message* message,
                                      const FlagOptions& options,
                                      const std::vector<std::string>& names,
                                      std::vector<std::string>* values, std::ostream& out);

// Flag options for a command that takes only some of the job overrides (`keep`, by field
// name of localpar.v1.JobOverrides): the others are neither accepted nor listed in --help.
// `exclude` names further fields to leave out.
FlagOptions KeepOverrides(const std::set<std::string>& keep,
                          const std::set<std::string>& exclude = {});

}  // namespace localpar
