// Security flags shared by localpar, localpar_worker and localpar_coordinator.
#include "services/common/security_flags.h"

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate: serve TLS (and present it as a client for mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle that peers' certificates must chain to");
ABSL_FLAG(bool, mtls, false, "Mutual TLS: servers require and verify client certificates");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token that control RPCs require");

namespace localpar {

void ListSharedFlagsInHelp() {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "main.cc") || absl::EndsWith(file, "security_flags.cc") ||
           absl::EndsWith(file, "job_flags.cc");
  };
  absl::SetFlagsUsageConfig(config);
}

absl::Status SecurityFromFlags(SecurityOptions* out) {
  return LoadSecurity(absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                      absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_mtls),
                      absl::GetFlag(FLAGS_auth_token_file), out);
}

std::vector<std::string> SecurityFlagArgs() {
  std::vector<std::string> args;
  auto forward = [&](const char* name, const std::string& value) {
    if (!value.empty()) args.push_back(absl::StrCat("--", name, "=", value));
  };
  forward("tls_cert", absl::GetFlag(FLAGS_tls_cert));
  forward("tls_key", absl::GetFlag(FLAGS_tls_key));
  forward("tls_ca", absl::GetFlag(FLAGS_tls_ca));
  forward("auth_token_file", absl::GetFlag(FLAGS_auth_token_file));
  if (absl::GetFlag(FLAGS_mtls)) args.push_back("--mtls");
  return args;
}

}  // namespace localpar
