// Subcommand flags.
#include "services/localpar/command_flags.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/job.pb.h"
#include "services/common/exit_codes.h"

namespace localpar {

absl::StatusOr<bool> ParseCommandArgs(const std::string& command, const std::string& usage,
                                      const Args& args, google::protobuf::Message* message,
                                      const FlagOptions& options,
                                      const std::vector<std::string>& names,
                                      std::vector<std::string>* values, std::ostream& out) {
  const std::string program = "localpar " + command;
  absl::StatusOr<bool> go = ParseProgramFlags(program, usage, args, message, options, values, out);
  if (!go.ok() || !*go) return go;
  if (values->size() != names.size()) {
    return UsageError(absl::StrCat("expected ", absl::StrJoin(names, " and "), ", got ",
                                   values->size(), " argument", values->size() == 1 ? "" : "s",
                                   "; see ", program, " --help"));
  }
  return true;
}

absl::StatusOr<bool> ParseCommand(const std::string& command, const std::string& usage,
                                  const Args& args, google::protobuf::Message* message,
                                  const FlagOptions& options, std::string* argument,
                                  std::ostream& out) {
  const std::string program = "localpar " + command;
  std::vector<std::string> positional;
  absl::StatusOr<bool> go =
      ParseProgramFlags(program, usage, args, message, options, &positional, out);
  if (!go.ok() || !*go) return go;
  if (positional.size() != 1) {
    return UsageError(absl::StrCat(
        "expected one", usage.find("HOST:PORT") != std::string::npos ? " address" : " job file",
        positional.empty() ? "" : absl::StrCat(", got ", positional.size()), "; see ", program,
        " --help"));
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

}  // namespace localpar
