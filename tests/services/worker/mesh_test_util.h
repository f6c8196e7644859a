// What the replicas' mesh tests share: a peer's view of the wire (a plain socket to a
// replica, the fields of a published address, a hello as a replica would send it).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"

namespace localpar::mesh_testing {

inline int PortOf(const std::string& published) {
  std::vector<std::string> parts = absl::StrSplit(published, ' ');
  return std::stoi(parts.at(1));
}

inline std::string SecretOf(const std::string& published) {
  std::vector<std::string> parts = absl::StrSplit(published, ' ');
  return absl::HexStringToBytes(parts.at(2));
}

// A plain socket connected to 127.0.0.1:port, or -1.
inline int Dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
inline std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

// A hello as replica `from` would send it to `to` (little-endian host, as the tests run on).
inline std::string Hello(int from, int to, int replicas, const std::string& secret,
                         const char* magic = "LPMESH01") {
  return std::string(magic, 8) + U32(from) + U32(to) + U32(replicas) + U32(0) + secret +
         std::string(8, '\0');
}

}  // namespace localpar::mesh_testing
