// Every program's configuration message with its defaults (the values --help shows), and
// the common steps of turning flags into one: parse, --help, --version, usage errors.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/config.pb.h"
#include "services/common/grpc_util.h"
#include "services/common/proto_flags.h"

namespace localpar {

v1::CoordinatorConfig CoordinatorDefaults();
// What a coordinator's settings refuse before any work: settings that contradict each other,
// and output or checkpoint directories that cannot be written. The coordinator and the
// launcher (before it starts anything) both check it.
absl::Status CheckRunSettings(const v1::CoordinatorConfig& config);
v1::WorkerConfig WorkerDefaults();
v1::RunCommand RunDefaults();
v1::TrainCommand TrainDefaults();
v1::ProfileCommand ProfileDefaults();
v1::ClientCommand ClientDefaults();

// Reads the files a SecurityConfig names (certificates, key, CA, token).
absl::Status LoadSecurity(const v1::SecurityConfig& config, SecurityOptions* out);

// "localpar 0.x (git REVISION)".
std::string VersionString();
// Its parts: the version ("0.1.0") and the git revision the build came from.
std::string BuildVersion();
std::string BuildRevision();

// HOST:PORT (HOST a name, an IPv4 address or a bracketed IPv6 one; PORT 1-65535, or 0 where
// `port_zero_ok`: any free port), or INVALID_ARGUMENT naming `flag` and the address.
absl::Status CheckHostPort(const std::string& address, const std::string& flag, bool port_zero_ok);

// Parses `args` into `message` (holding its defaults). On --help prints `usage` and the
// flags to stdout and returns 0 in *exit_code; on --version prints the version; on a usage
// error prints it (naming `program`) and sets 2. Returns false when the program should
// exit with *exit_code. --check_flags sets *check_flags (a program that takes it checks its
// flags as it would to run, without reading files or opening ports, says so and exits 0);
// with check_flags null it is a usage error.
bool ParseProgramFlags(const std::string& program, const std::string& usage,
                       const std::vector<std::string>& args, google::protobuf::Message* message,
                       const FlagOptions& options, std::vector<std::string>* positional,
                       int* exit_code, bool* check_flags = nullptr);

}  // namespace localpar
