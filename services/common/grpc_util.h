// gRPC plumbing shared by the services: the one absl::Status <-> grpc::Status mapping,
// channel and server settings, and process helpers.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace localpar {

// Large enough for any activation batch we send in one message (both ends must agree).
inline constexpr int kMaxMessageBytes = 1 << 30;

// Transport security and control-RPC authentication, shared by every process.
struct SecurityOptions {
  std::string cert_pem;     // certificate (server side; client side too for mutual TLS)
  std::string key_pem;      // its private key
  std::string ca_pem;       // CA bundle that verifies peers
  bool mutual_tls = false;  // servers demand (and verify) client certificates
  std::string token;        // when set, control RPCs need "authorization: Bearer <token>"
  bool tls() const { return !cert_pem.empty() || !ca_pem.empty(); }
};

// Reads PEM files and the token file; errors name the file. `token_file` may be empty.
absl::Status LoadSecurity(const std::string& cert, const std::string& key, const std::string& ca,
                          bool mutual_tls, const std::string& token_file, SecurityOptions* out);
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const SecurityOptions& s);
// Adds the bearer token (if any) to an outgoing call.
void AddToken(grpc::ClientContext& ctx, const SecurityOptions& s);
// OK when no token is configured or the call carries the right one; else UNAUTHENTICATED.
grpc::Status CheckToken(const grpc::ServerContextBase& ctx, const SecurityOptions& s);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A channel with keep-alives and raised message limits; TLS (and a client certificate for
// mutual TLS) when `security` says so.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const SecurityOptions& security = {});
// Applies the same limits and keep-alive policy to a server under construction; it takes
// messages of at most `max_receive_bytes` (0: kMaxMessageBytes). gRPC reads a whole message
// before it checks its size (and before any handler checks a token), so the server also
// gets a memory quota of ServerBufferBytes(max_receive_bytes) for everything its transport
// buffers: a message that would pass it has its stream reset (RESOURCE_EXHAUSTED at the
// client) instead of being read to its end.
void ConfigureServer(grpc::ServerBuilder& builder, int max_receive_bytes = 0);
// Twice the largest message (an upstream and a downstream message at once) plus 64 MiB.
int64_t ServerBufferBytes(int64_t max_receive_bytes);

// Resident set size of this process, from /proc/self/statm.
int64_t ResidentBytes();
// This process's peak resident memory so far (VmHWM), 0 where /proc does not say.
int64_t PeakResidentBytes();
// Bytes the allocator holds in free chunks (mallinfo2's fordblks): freed by the program,
// kept for reuse, resident until trimmed.
int64_t AllocatorFreeBytes();
// Hands memory that was freed but kept by the allocator back to the system (malloc_trim),
// as after a burst the process no longer needs.
void TrimFreedMemory();

// glibc allocator settings for processes that move activation messages (megabytes, made on
// gRPC threads and freed on ours): such blocks stay in the heap and are reused instead of
// being mapped and unmapped (and page-faulted in) for every message, and the number of
// arenas is fixed so that reuse happens. Call once at start-up, before any threads.
void ConfigureAllocatorForMessages();
// CLOCK_MONOTONIC in nanoseconds: comparable between processes on one machine.
int64_t MonotonicNanos();

}  // namespace localpar
