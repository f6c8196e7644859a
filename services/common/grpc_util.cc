// gRPC plumbing shared by the services.
#include "services/common/grpc_util.h"

#include <malloc.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace localpar {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

namespace {

absl::StatusOr<std::string> ReadAll(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": empty"));
  return ss.str();
}

}  // namespace

absl::Status LoadSecurity(const std::string& cert, const std::string& key, const std::string& ca,
                          bool mutual_tls, const std::string& token_file, SecurityOptions* out) {
  out->mutual_tls = mutual_tls;
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (mutual_tls && (cert.empty() || ca.empty())) {
    return absl::InvalidArgumentError("--mtls needs --tls_cert, --tls_key and --tls_ca");
  }
  for (auto [path, what, dst] :
       {std::tuple{cert, "--tls_cert", &out->cert_pem}, std::tuple{key, "--tls_key", &out->key_pem},
        std::tuple{ca, "--tls_ca", &out->ca_pem}}) {
    if (path.empty()) continue;
    absl::StatusOr<std::string> text = ReadAll(path, what);
    if (!text.ok()) return text.status();
    if (text->find("-----BEGIN") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not a PEM file"));
    }
    *dst = *text;
  }
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadAll(token_file, "--auth_token_file");
    if (!token.ok()) return token.status();
    std::string t = *token;
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
    if (t.empty()) return absl::InvalidArgumentError("--auth_token_file " + token_file + ": empty");
    out->token = t;
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const SecurityOptions& s) {
  if (s.cert_pem.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts(
      s.mutual_tls ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  opts.pem_root_certs = s.ca_pem;
  opts.pem_key_cert_pairs.push_back({s.key_pem, s.cert_pem});
  return grpc::SslServerCredentials(opts);
}

void AddToken(grpc::ClientContext& ctx, const SecurityOptions& s) {
  if (!s.token.empty()) ctx.AddMetadata("authorization", "Bearer " + s.token);
}

grpc::Status CheckToken(const grpc::ServerContextBase& ctx, const SecurityOptions& s) {
  if (s.token.empty()) return grpc::Status::OK;
  auto it = ctx.client_metadata().find("authorization");
  const std::string want = "Bearer " + s.token;
  bool same = it != ctx.client_metadata().end() && it->second.size() == want.size();
  if (same) {
    // In constant time: how much of a guess was right must not show in the timing.
    unsigned char diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff |= static_cast<unsigned char>(it->second.data()[i] ^ want[i]);
    }
    same = diff == 0;
  }
  if (!same) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "this RPC needs a valid bearer token");
  }
  return grpc::Status::OK;
}

// Keep-alive pings every 10 s (idle links included), a peer silent for 5 s more is dead;
// servers accept pings that often.
constexpr int kKeepaliveTimeMs = 10000;
constexpr int kKeepaliveTimeoutMs = 5000;

// Activation messages are megabytes: read the socket in chunks of 4 MiB or more (gRPC's
// default starts at 8 KiB). On loopback this raised a stream from about 1.3 to 1.7 GB/s
// (tests/bench/transport_bench).
constexpr int kMinReadChunkBytes = 4 << 20;
constexpr int kMaxReadChunkBytes = 16 << 20;

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const SecurityOptions& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, kMinReadChunkBytes);
  args.SetInt(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, kMaxReadChunkBytes);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (security.tls()) {
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = security.ca_pem;
    if (!security.cert_pem.empty()) {
      opts.pem_cert_chain = security.cert_pem;
      opts.pem_private_key = security.key_pem;
    }
    creds = grpc::SslCredentials(opts);
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

// A bound on the threads synchronous handlers may take: calls beyond it are refused
// (RESOURCE_EXHAUSTED) instead of piling up.
constexpr int kMaxServerThreads = 64;

int64_t ServerBufferBytes(int64_t max_receive_bytes) {
  return 2 * max_receive_bytes + (int64_t{64} << 20);
}

void ConfigureServer(grpc::ServerBuilder& builder, int max_receive_bytes) {
  // One quota per server (the builder keeps its own reference). Measured with a 1 GiB
  // message to a worker taking 256 MiB: without the memory bound the worker peaked at 1.2 GB
  // and kept 1.0 GB resident; with it the stream was reset at 0.5 GB
  // (hostile_peer's case_oversized_messages_are_bounded).
  grpc::ResourceQuota quota("localpar-server");
  quota.SetMaxThreads(kMaxServerThreads);
  quota.Resize(static_cast<size_t>(
      ServerBufferBytes(max_receive_bytes > 0 ? max_receive_bytes : kMaxMessageBytes)));
  builder.SetResourceQuota(quota);
  // Without this, gRPC binds with SO_REUSEPORT and a second server on a used port
  // "succeeds", splitting traffic; we want "address in use" to be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(max_receive_bytes > 0 ? max_receive_bytes : kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, kMinReadChunkBytes);
  builder.AddChannelArgument(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, kMaxReadChunkBytes);
}

void ConfigureAllocatorForMessages() {
  // Measured with tests/bench/transport_bench on loopback: a 256 KiB mmap threshold spent
  // about half of a stream's time in page faults and unmapping (1.1 GB/s); keeping blocks
  // up to 64 MiB in the heap gave 2.1-2.5 GB/s. Worker memory stays flat because the send
  // path reuses its buffers (Tensor::Pin) rather than allocating per message.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_ARENA_MAX, 2);
}

int64_t ResidentBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

int64_t PeakResidentBytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long kib = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return static_cast<int64_t>(kib) * 1024;
}

int64_t AllocatorFreeBytes() { return static_cast<int64_t>(mallinfo2().fordblks); }

void TrimFreedMemory() { malloc_trim(0); }

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace localpar
