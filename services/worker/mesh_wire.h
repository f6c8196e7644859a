// The replicas' mesh on the wire (replica_mesh.h): the hello that proves a connection, the
// bucket frame's header, the published "HOST PORT SECRET", and the socket chores around them.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace localpar::mesh {

using Clock = std::chrono::steady_clock;

inline constexpr size_t kSecretBytes = 32;
// A hello and its answer: magic (8), from (4), to (4), replicas (4), zero (4), the secret
// (32), zero (8).
inline constexpr size_t kHelloBytes = 64;
inline constexpr char kHelloMagic[] = "LPMESH01";
inline constexpr char kAnswerMagic[] = "LPMESHOK";
// A bucket frame's header: magic (8), the gather's sequence number (8), floats (8).
inline constexpr size_t kFrameHeaderBytes = 24;
inline constexpr char kFrameMagic[] = "LPBUCKET";
// Connections not yet proven while joining: at most this many, each for at most this long.
inline constexpr size_t kMaxUnproven = 32;
inline constexpr auto kHelloWithin = std::chrono::seconds(5);
inline constexpr auto kRetryAfter = std::chrono::milliseconds(100);

// Little-endian fields, whatever the machine.
void PutU32(char* p, uint32_t v);
void PutU64(char* p, uint64_t v);
uint32_t GetU32(const char* p);
uint64_t GetU64(const char* p);

// The words of a bfloat16-pairs reduction (ReduceFormat::kBf16Pairs): element 2i in the low
// half of word i, 2i + 1 in the high half. Packing n floats rounds each to bfloat16 into
// (n + 1) / 2 words (an odd n leaves the last high half 0); unpacking gives n floats back.
void PackBf16Pairs(const float* in, int64_t n, float* words);
void UnpackBf16Pairs(const float* words, int64_t n, float* out);

// Compares every byte, whatever differs (no early exit to time).
bool SameSecret(const std::string& a, const std::string& b);

std::string Hello(const char* magic, int from, int to, int replicas, const std::string& secret);
struct ParsedHello {
  uint32_t from, to, replicas;
  std::string secret;
};
bool ParseHello(const std::string& h, const char* magic, ParsedHello* out);

std::string Errno(int e);
// The first address `host` resolves to, with `port`.
absl::Status Resolve(const std::string& host, int port, sockaddr_storage* addr, socklen_t* len);
// Shuts and closes `fd` if it is open, and marks it closed (-1).
void CloseFd(int& fd);
// Why the connection to replica s ended, from a send or recv error.
std::string Lost(int s, int e);
// Milliseconds until `t`, clamped to [0, 1000] (one poll's wait).
int MillisUntil(Clock::time_point t);

// A published value: "HOST PORT SECRET".
struct Published {
  std::string host;
  int port = 0;
  std::string secret;
};
absl::StatusOr<Published> ParsePublished(const std::string& v);

}  // namespace localpar::mesh
