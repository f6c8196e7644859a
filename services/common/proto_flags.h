// Command-line flags that fill a configuration message (proto/config.proto): each field
// with a (help) option is a flag of the same name, nested messages are flattened, and the
// help text comes from the same options. So an option is declared once, for every program
// that takes it.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace localpar {

struct FlagOptions {
  bool config_flag = false;  // accept --config=FILE (a text-format message, read first)
  // Fields that are not flags here (the launcher sets them): a name, or a dotted path from
  // the top message ("coordinator.resume").
  std::set<std::string> exclude;
};

struct ParsedFlags {
  std::vector<std::string> positional;  // arguments that are not flags, in order
  bool help = false;                    // -h or --help
  bool version = false;                 // --version
  bool check_flags = false;             // --check_flags: check the flags, then exit
};

// Fills `message` (which holds the defaults) from `args`:
//   --name=value, or --name value; for booleans --name, --noname, --name=true|false;
//   repeated fields take a comma-separated list; enums their value name in any case;
//   numbers marked (count) must be >= 0; "--" ends the flags.
// Errors are INVALID_ARGUMENT and name the flag (an unknown one with the closest flag).
absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args,
                                       google::protobuf::Message* message,
                                       const FlagOptions& options = {});

// One line per flag: "  --name=VALUE  help (default: ...)", defaults read from `defaults`.
std::string FlagHelp(const google::protobuf::Message& defaults, const FlagOptions& options = {});

// The flags that reproduce `message` where it differs from `defaults` (for a child process).
std::vector<std::string> ToFlagArgs(const google::protobuf::Message& message,
                                    const google::protobuf::Message& defaults);

}  // namespace localpar
