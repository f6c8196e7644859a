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

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A channel with keep-alives and raised message limits.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);
// Applies the same limits and keep-alive policy to a server under construction.
void ConfigureServer(grpc::ServerBuilder& builder);

// Resident set size of this process, from /proc/self/statm.
int64_t ResidentBytes();
// CLOCK_MONOTONIC in nanoseconds: comparable between processes on one machine.
int64_t MonotonicNanos();

}  // namespace localpar
