// What every `localpar` subcommand does first: parse its flags, and take exactly one
// argument (the job file, or an address).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "services/common/program_config.h"
#include "services/localpar/commands.h"

namespace localpar {

// False when the command should exit with *exit_code (--help, a usage error).
bool ParseCommand(const std::string& command, const std::string& usage, const Args& args,
                  google::protobuf::Message* message, const FlagOptions& options,
                  std::string* argument, int* exit_code);

// The same for a command that takes several arguments, named in `names` ("JOB_FILE").
bool ParseCommandArgs(const std::string& command, const std::string& usage, const Args& args,
                      google::protobuf::Message* message, const FlagOptions& options,
                      const std::vector<std::string>& names, std::vector<std::string>* values,
                      int* exit_code);

// Flag options for a command that takes only some of the job overrides (`keep`, by field
// name of localpar.v1.JobOverrides): the others are neither accepted nor listed in --help.
// `exclude` names further fields to leave out.
FlagOptions KeepOverrides(const std::set<std::string>& keep,
                          const std::set<std::string>& exclude = {});

// Prints "localpar: MESSAGE" and returns `code`.
int Fail(int code, const std::string& message);

}  // namespace localpar
