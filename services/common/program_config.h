// Every program's configuration message with its defaults (the values --help shows), and
// the common steps of turning flags into one: parse, --help, --version, usage errors.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "services/common/grpc_util.h"
#include "services/common/proto_flags.h"

namespace localpar {

v1::CoordinatorConfig CoordinatorDefaults();
// What a coordinator's settings refuse before any work: settings that contradict each other,
// and output or checkpoint directories that cannot be written. The coordinator and the
// launcher (before it starts anything) both check it.
absl::Status CheckRunSettings(const v1::CoordinatorConfig& config);
// Where programs compute, by default: the CPU, one GEMM thread.
v1::DeviceConfig DeviceDefaults();
v1::WorkerConfig WorkerDefaults();
v1::RunCommand RunDefaults();
v1::TrainCommand TrainDefaults();
v1::ProfileCommand ProfileDefaults();
v1::PredictCommand PredictDefaults();
v1::SampleCommand SampleDefaults();
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

// Parses `args` into `message` (holding its defaults). On --help writes `usage` and the
// flags to `out`, on --version the version, and returns false: the program is done (exit
// 0). A usage error is returned as a UsageError naming the flag and `program`'s --help.
// --check_flags sets *check_flags (a program that takes it checks its flags as it would to
// run, without reading files or opening ports, says so and exits 0); with check_flags null
// it is a usage error. True: go on, with the arguments that are not flags in *positional.
absl::StatusOr<bool> ParseProgramFlags(const std::string& program, const std::string& usage,
                                       const std::vector<std::string>& args,
                                       google::protobuf::Message* message,
                                       const FlagOptions& options,
                                       std::vector<std::string>* positional, std::ostream& out,
                                       bool* check_flags = nullptr);

}  // namespace localpar
