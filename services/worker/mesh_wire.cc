// The replicas' mesh on the wire (mesh_wire.h).
#include "services/worker/mesh_wire.h"

#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/core/dtype.h"
#include "services/common/peer_text.h"

namespace localpar::mesh {

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void PackBf16Pairs(const float* in, int64_t n, float* words) {
  for (int64_t i = 0; i < n; i += 2) {
    const uint32_t hi = i + 1 < n ? FloatToBf16(in[i + 1]) : 0;
    const uint32_t w = static_cast<uint32_t>(FloatToBf16(in[i])) | (hi << 16);
    std::memcpy(&words[i / 2], &w, 4);
  }
}

void UnpackBf16Pairs(const float* words, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, &words[i / 2], 4);
    out[i] = Bf16ToFloat(static_cast<uint16_t>(i % 2 == 0 ? w & 0xffffu : w >> 16));
  }
}

bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;  // every byte compared, whatever differs
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string Hello(const char* magic, int from, int to, int replicas, const std::string& secret) {
  std::string h(kHelloBytes, '\0');
  std::memcpy(h.data(), magic, 8);
  PutU32(h.data() + 8, static_cast<uint32_t>(from));
  PutU32(h.data() + 12, static_cast<uint32_t>(to));
  PutU32(h.data() + 16, static_cast<uint32_t>(replicas));
  std::memcpy(h.data() + 24, secret.data(), kSecretBytes);
  return h;
}

bool ParseHello(const std::string& h, const char* magic, ParsedHello* out) {
  if (h.size() != kHelloBytes || std::memcmp(h.data(), magic, 8) != 0) return false;
  out->from = GetU32(h.data() + 8);
  out->to = GetU32(h.data() + 12);
  out->replicas = GetU32(h.data() + 16);
  out->secret = h.substr(24, kSecretBytes);
  return true;
}

std::string Errno(int e) { return std::strerror(e); }

absl::Status Resolve(const std::string& host, int port, sockaddr_storage* addr, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found) {
    return absl::UnavailableError(
        absl::StrCat("'", SanitizePeerText(host, 128), "' does not resolve: ", gai_strerror(rc)));
  }
  std::memcpy(addr, found->ai_addr, found->ai_addrlen);
  *len = found->ai_addrlen;
  freeaddrinfo(found);
  if (addr->ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(addr)->sin_port = htons(static_cast<uint16_t>(port));
  } else if (addr->ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(addr)->sin6_port = htons(static_cast<uint16_t>(port));
  } else {
    return absl::UnavailableError(
        absl::StrCat("'", SanitizePeerText(host, 128), "' is not an IP host"));
  }
  return absl::OkStatus();
}

void CloseFd(int& fd) {
  if (fd >= 0) {
    shutdown(fd, SHUT_RDWR);
    close(fd);
  }
  fd = -1;
}

std::string Lost(int s, int e) {
  if (e == EPIPE || e == ECONNRESET) {
    return absl::StrCat("replica ", s, " closed its connection (", Errno(e), ")");
  }
  return absl::StrCat("the connection to replica ", s, " was lost: ", Errno(e));
}

int MillisUntil(Clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
}

absl::StatusOr<Published> ParsePublished(const std::string& v) {
  std::vector<std::string> parts = absl::StrSplit(v, ' ');
  Published p;
  if (parts.size() != 3 || parts[0].empty() || parts[0].size() > 253 ||
      !absl::SimpleAtoi(parts[1], &p.port) || p.port < 1 || p.port > 65535 ||
      parts[2].size() != 2 * kSecretBytes ||
      !std::all_of(parts[2].begin(), parts[2].end(),
                   [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", SanitizePeerText(v, 128), "' is not HOST PORT SECRET (64 hexadecimal digits)"));
  }
  p.host = parts[0];
  p.secret = absl::HexStringToBytes(parts[2]);
  return p;
}

}  // namespace localpar::mesh
