// Subcommand flags.
#include "services/localpar/command_flags.h"

#include <iostream>

#include "absl/strings/str_join.h"
#include "proto/job.pb.h"
#include "services/common/exit_codes.h"

namespace localpar {

bool ParseCommandArgs(const std::string& command, const std::string& usage, const Args& args,
                      google::protobuf::Message* message, const FlagOptions& options,
                      const std::vector<std::string>& names, std::vector<std::string>* values,
                      int* exit_code) {
  const std::string program = "localpar " + command;
  if (!ParseProgramFlags(program, usage, args, message, options, values, exit_code)) {
    return false;
  }
  if (values->size() != names.size()) {
    std::cerr << program << ": expected " << absl::StrJoin(names, " and ") << ", got "
              << values->size() << " argument" << (values->size() == 1 ? "" : "s") << "; see "
              << program << " --help\n";
    *exit_code = kExitUsage;
    return false;
  }
  return true;
}

bool ParseCommand(const std::string& command, const std::string& usage, const Args& args,
                  google::protobuf::Message* message, const FlagOptions& options,
                  std::string* argument, int* exit_code) {
  const std::string program = "localpar " + command;
  std::vector<std::string> positional;
  if (!ParseProgramFlags(program, usage, args, message, options, &positional, exit_code)) {
    return false;
  }
  if (positional.size() != 1) {
    std::cerr << program << ": expected one "
              << (usage.find("HOST:PORT") != std::string::npos ? "address" : "job file")
              << (positional.empty() ? "" : ", got " + std::to_string(positional.size()))
              << "; see " << program << " --help\n";
    *exit_code = kExitUsage;
    return false;
  }
  *argument = positional[0];
  return true;
}

FlagOptions KeepOverrides(const std::set<std::string>& keep, const std::set<std::string>& exclude) {
  FlagOptions options;
  options.exclude = exclude;
  const google::protobuf::Descriptor* d = v1::JobOverrides::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    if (!keep.count(d->field(i)->name())) {
      options.exclude.insert("overrides." + d->field(i)->name());
    }
  }
  return options;
}

int Fail(int code, const std::string& message) {
  std::cerr << "localpar: " << message << "\n";
  return code;
}

}  // namespace localpar
