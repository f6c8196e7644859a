// The replicas' own TCP mesh: joining with secrets from the rendezvous, and the gather.
#include "services/worker/replica_mesh.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/common/peer_text.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSecretBytes = 32;
// A hello and its answer: magic (8), from (4), to (4), replicas (4), zero (4), the secret
// (32), zero (8).
constexpr size_t kHelloBytes = 64;
constexpr char kHelloMagic[] = "LPMESH01";
constexpr char kAnswerMagic[] = "LPMESHOK";
// A bucket frame's header: magic (8), the gather's sequence number (8), floats (8).
constexpr size_t kFrameHeaderBytes = 24;
constexpr char kFrameMagic[] = "LPBUCKET";
// Connections not yet proven while joining: at most this many, each for at most this long.
constexpr size_t kMaxUnproven = 32;
constexpr auto kHelloWithin = std::chrono::seconds(5);
constexpr auto kRetryAfter = std::chrono::milliseconds(100);

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

struct ParsedHello {
  uint32_t from, to, replicas;
  std::string secret;
};

bool ParseHello(const std::string& h, const char* magic, ParsedHello* out) {
  if (h.size() != kHelloBytes || std::memcmp(h.data(), magic, 8) != 0) return false;
  out->from = GetU32(h.data() + 8);
  out->to = GetU32(h.data() + 12);
  out->replicas = GetU32(h.data() + 16);
  out->secret = h.substr(24, kSecretBytes);
  return true;
}

std::string Errno(int e) { return std::strerror(e); }

// The first address `host` resolves to, with `port`.
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

// Why the connection to replica s ended, from a send or recv error.
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

// A published value: "HOST PORT SECRET".
struct Published {
  std::string host;
  int port = 0;
  std::string secret;
};

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

}  // namespace

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
  const auto deadline = Clock::now() + timeout;

  // Replicas below this one: connect, send the hello, read the answer.
  struct Outgoing {
    int replica;
    int fd = -1;
    bool answering = false;  // connected, hello sent, reading the answer
    std::string got;
    Clock::time_point next_try;
    std::string last;  // why the last try failed
  };
  // Connections accepted and not yet proven.
  struct Incoming {
    int fd;
    std::string got;
    Clock::time_point deadline;
  };
  std::vector<Outgoing> out;
  for (int s = 0; s < replica_; ++s) out.push_back(Outgoing{s, -1, false, {}, Clock::now(), {}});
  std::vector<Incoming> in;
  auto connected = [&] {
    return std::count_if(fds_.begin(), fds_.end(), [](int fd) { return fd >= 0; });
  };
  auto give_up = [&](Outgoing& o, std::string why) {
    CloseFd(o.fd);
    o.answering = false;
    o.got.clear();
    o.last = std::move(why);
    o.next_try = Clock::now() + kRetryAfter;
  };
  auto refuse = [&](Incoming& c) {
    CloseFd(c.fd);
    ++refused_;
  };

  while (connected() < replicas_ - 1 && Clock::now() < deadline) {
    // Start the connections that are due.
    for (Outgoing& o : out) {
      if (o.fd >= 0 || fds_[static_cast<size_t>(o.replica)] >= 0 || Clock::now() < o.next_try) {
        continue;
      }
      const Published& p = peers[static_cast<size_t>(o.replica)];
      sockaddr_storage addr{};
      socklen_t len = 0;
      if (absl::Status s = Resolve(p.host, p.port, &addr, &len); !s.ok()) {
        give_up(o, std::string(s.message()));
        continue;
      }
      o.fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (o.fd < 0 ||
          (connect(o.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS)) {
        give_up(o, absl::StrCat("connecting to ", SanitizePeerText(p.host, 128), ":", p.port, ": ",
                                Errno(errno)));
      }
    }
    std::vector<pollfd> polls;
    std::vector<std::pair<int, size_t>> owner;  // 0: listener, 1: outgoing, 2: incoming
    if (listen_fd_ >= 0) {
      polls.push_back({listen_fd_, POLLIN, 0});
      owner.emplace_back(0, 0);
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].fd < 0) continue;
      polls.push_back({out[i].fd, static_cast<short>(out[i].answering ? POLLIN : POLLOUT), 0});
      owner.emplace_back(1, i);
    }
    for (size_t i = 0; i < in.size(); ++i) {
      polls.push_back({in[i].fd, POLLIN, 0});
      owner.emplace_back(2, i);
    }
    const int wait = std::min(MillisUntil(deadline), static_cast<int>(kRetryAfter.count()));
    if (poll(polls.data(), polls.size(), wait) < 0 && errno != EINTR) {
      Close();
      return failed_ = absl::InternalError(absl::StrCat("poll: ", Errno(errno)));
    }
    for (size_t k = 0; k < polls.size(); ++k) {
      if (polls[k].revents == 0) continue;
      auto [kind, i] = owner[k];
      if (kind == 0) {
        while (true) {
          int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          // The oldest unproven one makes room (closed here, dropped after this round).
          auto live = [](const Incoming& c) { return c.fd >= 0; };
          if (static_cast<size_t>(std::count_if(in.begin(), in.end(), live)) >= kMaxUnproven) {
            refuse(*std::find_if(in.begin(), in.end(), live));
          }
          in.push_back(Incoming{fd, {}, Clock::now() + kHelloWithin});
        }
      } else if (kind == 1) {
        Outgoing& o = out[i];
        if (o.fd < 0) continue;
        const Published& p = peers[static_cast<size_t>(o.replica)];
        if (!o.answering) {
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(o.fd, SOL_SOCKET, SO_ERROR, &err, &len);
          const std::string hello = Hello(kHelloMagic, replica_, o.replica, replicas_, p.secret);
          if (err != 0) {
            give_up(o, absl::StrCat("connecting to ", SanitizePeerText(p.host, 128), ":", p.port,
                                    ": ", Errno(err)));
          } else if (send(o.fd, hello.data(), hello.size(), MSG_NOSIGNAL) !=
                     static_cast<ssize_t>(hello.size())) {
            give_up(o, absl::StrCat("sending the hello to ", SanitizePeerText(p.host, 128), ":",
                                    p.port, " failed"));
          } else {
            o.answering = true;
          }
          continue;
        }
        char buf[kHelloBytes];
        ssize_t k2 = recv(o.fd, buf, kHelloBytes - o.got.size(), 0);
        if (k2 <= 0) {
          if (k2 < 0 && (errno == EAGAIN || errno == EINTR)) continue;
          give_up(o, "it closed the connection without answering the hello");
          continue;
        }
        o.got.append(buf, static_cast<size_t>(k2));
        if (o.got.size() < kHelloBytes) continue;
        ParsedHello h;
        if (!ParseHello(o.got, kAnswerMagic, &h) || h.from != static_cast<uint32_t>(o.replica) ||
            h.to != static_cast<uint32_t>(replica_) ||
            h.replicas != static_cast<uint32_t>(replicas_) || !SameSecret(h.secret, secret_)) {
          give_up(o, absl::StrCat(SanitizePeerText(p.host, 128), ":", p.port,
                                  " answered the hello, but not as replica ", o.replica,
                                  " of this configuration"));
          continue;
        }
        fds_[static_cast<size_t>(o.replica)] = o.fd;
        o.fd = -1;
      } else {
        Incoming& c = in[i];
        if (c.fd < 0) continue;  // made room for a newer one
        char buf[kHelloBytes];
        ssize_t k2 = recv(c.fd, buf, kHelloBytes - c.got.size(), 0);
        if (k2 <= 0) {
          if (k2 < 0 && (errno == EAGAIN || errno == EINTR)) continue;
          refuse(c);
          continue;
        }
        c.got.append(buf, static_cast<size_t>(k2));
        if (c.got.size() < kHelloBytes) continue;
        ParsedHello h;
        const bool ok =
            ParseHello(c.got, kHelloMagic, &h) && h.to == static_cast<uint32_t>(replica_) &&
            h.replicas == static_cast<uint32_t>(replicas_) &&
            h.from > static_cast<uint32_t>(replica_) && h.from < static_cast<uint32_t>(replicas_) &&
            fds_[h.from] < 0 && SameSecret(h.secret, secret_);
        const std::string answer = ok ? Hello(kAnswerMagic, replica_, static_cast<int>(h.from),
                                              replicas_, peers[h.from].secret)
                                      : std::string();
        if (!ok || send(c.fd, answer.data(), answer.size(), MSG_NOSIGNAL) !=
                       static_cast<ssize_t>(answer.size())) {
          refuse(c);
          continue;
        }
        fds_[h.from] = c.fd;
        c.fd = -1;
      }
    }
    // Drop what was closed, and unproven connections past their time.
    for (Incoming& c : in) {
      if (c.fd >= 0 && Clock::now() > c.deadline) refuse(c);
    }
    in.erase(std::remove_if(in.begin(), in.end(), [](const Incoming& c) { return c.fd < 0; }),
             in.end());
  }
  for (Incoming& c : in) refuse(c);
  for (Outgoing& o : out) CloseFd(o.fd);
  CloseFd(listen_fd_);  // nothing else can connect from now on
  if (connected() < replicas_ - 1) {
    std::vector<std::string> missing;
    std::string last;
    for (int s = 0; s < replicas_; ++s) {
      if (s == replica_ || fds_[static_cast<size_t>(s)] >= 0) continue;
      missing.push_back(std::to_string(s));
      for (const Outgoing& o : out) {
        if (o.replica == s && !o.last.empty())
          last = absl::StrCat(" (replica ", s, ": ", o.last, ")");
      }
    }
    Close();
    return failed_ = absl::UnavailableError(
               absl::StrCat("replica(s) ", absl::StrJoin(missing, ", "), " of ", what_,
                            " did not connect to replica ", replica_, " within ",
                            timeout.count() / 1000.0, " s", last));
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
