// The replicas' own TCP mesh: joining with secrets from the rendezvous, and the gather.
#include "services/worker/replica_mesh.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/peer_text.h"
#include "services/worker/mesh_join.h"
#include "services/worker/mesh_wire.h"

namespace localpar {

using mesh::Clock;
using mesh::CloseFd;
using mesh::Errno;
using mesh::GetU64;
using mesh::kFrameHeaderBytes;
using mesh::kFrameMagic;
using mesh::kSecretBytes;
using mesh::Lost;
using mesh::MillisUntil;
using mesh::ParsePublished;
using mesh::Published;
using mesh::PutU32;
using mesh::PutU64;
using mesh::Resolve;

ReplicaMesh::ReplicaMesh(int replica, int replicas, std::string what)
    : replica_(replica),
      replicas_(replicas),
      what_(std::move(what)),
      fds_(static_cast<size_t>(replicas), -1) {}

ReplicaMesh::~ReplicaMesh() { Close(); }

absl::StatusOr<std::unique_ptr<ReplicaMesh>> ReplicaMesh::Listen(const std::string& host,
                                                                 int replica, int replicas,
                                                                 std::string what) {
  if (replicas < 1 || replica < 0 || replica >= replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica ", replica, " of ", replicas, " is out of range"));
  }
  std::unique_ptr<ReplicaMesh> mesh(new ReplicaMesh(replica, replicas, std::move(what)));
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (absl::Status s = Resolve(host, 0, &addr, &len); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("collective host ", s.message()));
  }
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen on the collective host '",
                                               SanitizePeerText(host, 128), "': ", Errno(e)));
  }
  mesh->listen_fd_ = fd;
  mesh->host_ = host;
  mesh->port_ =
      ntohs(addr.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                      : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  std::random_device random;
  mesh->secret_.resize(kSecretBytes);
  for (size_t i = 0; i < kSecretBytes; i += 4) PutU32(mesh->secret_.data() + i, random());
  return mesh;
}

std::string ReplicaMesh::published() const {
  return absl::StrCat(host_, " ", port_, " ", absl::BytesToHexString(secret_));
}

absl::Status ReplicaMesh::Connect(const std::vector<std::string>& published,
                                  std::chrono::milliseconds timeout) {
  if (!failed_.ok()) return failed_;
  if (published.size() != static_cast<size_t>(replicas_)) {
    return failed_ = absl::InternalError("the rendezvous gave the wrong number of addresses");
  }
  std::vector<Published> peers(published.size());
  for (int s = 0; s < replicas_; ++s) {
    if (s == replica_) continue;
    absl::StatusOr<Published> p = ParsePublished(published[static_cast<size_t>(s)]);
    if (!p.ok()) {
      Close();
      return failed_ = absl::UnavailableError(absl::StrCat("replica ", s, " of ", what_,
                                                           " published a collective address ",
                                                           p.status().message()));
    }
    peers[static_cast<size_t>(s)] = *std::move(p);
  }
  absl::Status joined =
      mesh::Join(replica_, replicas_, what_, secret_, peers, &fds_, &listen_fd_, &refused_)
          .Run(timeout);
  if (!joined.ok()) {
    Close();
    return failed_ = joined;
  }
  const int one = 1;
  for (int fd : fds_) {
    if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return absl::OkStatus();
}

absl::Status ReplicaMesh::AllGather(const float* in, int64_t n, float* out,
                                    std::chrono::milliseconds timeout) {
  if (!failed_.ok()) return failed_;
  const size_t payload = static_cast<size_t>(n) * sizeof(float);
  if (payload > 0) std::memcpy(out + static_cast<size_t>(replica_) * n, in, payload);
  char header[kFrameHeaderBytes];
  std::memcpy(header, kFrameMagic, 8);
  PutU64(header + 8, sequence_);
  PutU64(header + 16, static_cast<uint64_t>(n));
  struct Progress {
    size_t sent = 0, received = 0;
    char header[kFrameHeaderBytes];
  };
  const size_t frame = kFrameHeaderBytes + payload;
  std::vector<Progress> progress(static_cast<size_t>(replicas_));
  const auto deadline = Clock::now() + timeout;
  auto fail = [&](std::string why) {
    Close();
    return failed_ = absl::UnavailableError(
               absl::StrCat("replica ", replica_, " of ", what_, ": ", std::move(why)));
  };
  while (true) {
    std::vector<pollfd> polls;
    std::vector<int> who;
    for (int s = 0; s < replicas_; ++s) {
      if (s == replica_) continue;
      const Progress& p = progress[static_cast<size_t>(s)];
      short events = 0;
      if (p.sent < frame) events |= POLLOUT;
      if (p.received < frame) events |= POLLIN;
      if (events == 0) continue;
      polls.push_back({fds_[static_cast<size_t>(s)], events, 0});
      who.push_back(s);
    }
    if (polls.empty()) break;
    if (Clock::now() >= deadline) {
      std::vector<std::string> late;
      for (int s : who) late.push_back(std::to_string(s));
      return fail(absl::StrCat("replica(s) ", absl::StrJoin(late, ", "),
                               " did not complete the gather within ", timeout.count() / 1000.0,
                               " s"));
    }
    if (poll(polls.data(), polls.size(), MillisUntil(deadline)) < 0 && errno != EINTR) {
      return fail(absl::StrCat("poll: ", Errno(errno)));
    }
    for (size_t k = 0; k < polls.size(); ++k) {
      const int s = who[k];
      const int fd = polls[k].fd;
      Progress& p = progress[static_cast<size_t>(s)];
      if ((polls[k].revents & POLLOUT) && p.sent < frame) {
        const char* from = p.sent < kFrameHeaderBytes
                               ? header + p.sent
                               : reinterpret_cast<const char*>(in) + (p.sent - kFrameHeaderBytes);
        const size_t left =
            p.sent < kFrameHeaderBytes ? kFrameHeaderBytes - p.sent : frame - p.sent;
        ssize_t k2 = send(fd, from, left, MSG_NOSIGNAL);
        if (k2 < 0 && errno != EAGAIN && errno != EINTR) return fail(Lost(s, errno));
        if (k2 > 0) p.sent += static_cast<size_t>(k2);
      }
      if ((polls[k].revents & (POLLIN | POLLHUP | POLLERR)) && p.received < frame) {
        char* to = p.received < kFrameHeaderBytes
                       ? p.header + p.received
                       : reinterpret_cast<char*>(out + static_cast<size_t>(s) * n) +
                             (p.received - kFrameHeaderBytes);
        const size_t left =
            p.received < kFrameHeaderBytes ? kFrameHeaderBytes - p.received : frame - p.received;
        ssize_t k2 = recv(fd, to, left, 0);
        if (k2 == 0) return fail(absl::StrCat("replica ", s, " closed its connection"));
        if (k2 < 0 && errno != EAGAIN && errno != EINTR) return fail(Lost(s, errno));
        if (k2 < 0) continue;
        const bool had_header = p.received >= kFrameHeaderBytes;
        p.received += static_cast<size_t>(k2);
        if (!had_header && p.received >= kFrameHeaderBytes) {
          const uint64_t sequence = GetU64(p.header + 8), floats = GetU64(p.header + 16);
          if (std::memcmp(p.header, kFrameMagic, 8) != 0 || sequence != sequence_ ||
              floats != static_cast<uint64_t>(n)) {
            return fail(absl::StrCat(
                "replica ", s, " sent a frame that is not this gather's bucket (gather ", sequence,
                " of ", floats, " floats where gather ", sequence_, " of ", n, " was due)"));
          }
        }
      }
    }
  }
  ++sequence_;
  return absl::OkStatus();
}

void ReplicaMesh::Close() {
  for (int& fd : fds_) CloseFd(fd);
  CloseFd(listen_fd_);
  if (failed_.ok())
    failed_ = absl::CancelledError(absl::StrCat("the mesh of ", what_, " is closed"));
}

}  // namespace localpar
