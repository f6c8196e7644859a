// The security flags every program takes (--tls_cert, --tls_key, --tls_ca, --mtls,
// --auth_token_file), defined once.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/common/grpc_util.h"

namespace localpar {

// Makes --help list the shared flags (these, and job_flags.h's where linked) next to the
// program's own (main.cc) flags. Call before parsing the command line.
void ListSharedFlagsInHelp();

// Loads the files the flags name into *out (LoadSecurity).
absl::Status SecurityFromFlags(SecurityOptions* out);

// The same flags as command-line arguments, for the processes a launcher starts.
std::vector<std::string> SecurityFlagArgs();

}  // namespace localpar
