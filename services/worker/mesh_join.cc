// Joining the replicas' mesh (mesh_join.h).
#include "services/worker/mesh_join.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/peer_text.h"

namespace localpar::mesh {

Join::Join(int replica, int replicas, const std::string& what, const std::string& secret,
           const std::vector<Published>& peers, std::vector<int>* fds, int* listen_fd, int* refused)
    : replica_(replica),
      replicas_(replicas),
      what_(what),
      secret_(secret),
      peers_(peers),
      fds_(*fds),
      listen_fd_(*listen_fd),
      refused_(*refused) {
  for (int s = 0; s < replica_; ++s) out_.push_back(Outgoing{s, -1, false, {}, Clock::now(), {}});
}

absl::Status Join::Run(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  absl::Status status;
  while (Connected() < replicas_ - 1 && Clock::now() < deadline && status.ok()) {
    StartDue();
    status = Round(deadline);
  }
  for (Incoming& c : in_) Refuse(c);
  for (Outgoing& o : out_) CloseFd(o.fd);
  CloseFd(listen_fd_);  // nothing else can connect from now on
  if (!status.ok()) return status;
  if (Connected() < replicas_ - 1) return Missing(timeout);
  return absl::OkStatus();
}

int Join::Connected() const {
  return static_cast<int>(std::count_if(fds_.begin(), fds_.end(), [](int fd) { return fd >= 0; }));
}

void Join::GiveUp(Outgoing& o, std::string why) {
  CloseFd(o.fd);
  o.answering = false;
  o.got.clear();
  o.last = std::move(why);
  o.next_try = Clock::now() + kRetryAfter;
}

void Join::Refuse(Incoming& c) {
  CloseFd(c.fd);
  ++refused_;
}

std::string Join::Where(const Outgoing& o) const {
  const Published& p = peers_[static_cast<size_t>(o.replica)];
  return absl::StrCat(SanitizePeerText(p.host, 128), ":", p.port);
}

// Starts the connections that are due.
void Join::StartDue() {
  for (Outgoing& o : out_) {
    if (o.fd >= 0 || fds_[static_cast<size_t>(o.replica)] >= 0 || Clock::now() < o.next_try) {
      continue;
    }
    const Published& p = peers_[static_cast<size_t>(o.replica)];
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (absl::Status s = Resolve(p.host, p.port, &addr, &len); !s.ok()) {
      GiveUp(o, std::string(s.message()));
      continue;
    }
    o.fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (o.fd < 0 ||
        (connect(o.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS)) {
      GiveUp(o, absl::StrCat("connecting to ", Where(o), ": ", Errno(errno)));
    }
  }
}

absl::Status Join::Round(Clock::time_point deadline) {
  std::vector<pollfd> polls;
  std::vector<std::pair<int, size_t>> owner;  // 0: listener, 1: outgoing, 2: incoming
  if (listen_fd_ >= 0) {
    polls.push_back({listen_fd_, POLLIN, 0});
    owner.emplace_back(0, 0);
  }
  for (size_t i = 0; i < out_.size(); ++i) {
    if (out_[i].fd < 0) continue;
    polls.push_back({out_[i].fd, static_cast<short>(out_[i].answering ? POLLIN : POLLOUT), 0});
    owner.emplace_back(1, i);
  }
  for (size_t i = 0; i < in_.size(); ++i) {
    polls.push_back({in_[i].fd, POLLIN, 0});
    owner.emplace_back(2, i);
  }
  const int wait = std::min(MillisUntil(deadline), static_cast<int>(kRetryAfter.count()));
  if (poll(polls.data(), polls.size(), wait) < 0 && errno != EINTR) {
    return absl::InternalError(absl::StrCat("poll: ", Errno(errno)));
  }
  for (size_t k = 0; k < polls.size(); ++k) {
    if (polls[k].revents == 0) continue;
    auto [kind, i] = owner[k];
    if (kind == 0) {
      Accept();
    } else if (kind == 1) {
      if (out_[i].fd >= 0) OnOutgoing(out_[i]);
    } else if (in_[i].fd >= 0) {  // else it made room for a newer one
      OnIncoming(in_[i]);
    }
  }
  // Drop what was closed, and unproven connections past their time.
  for (Incoming& c : in_) {
    if (c.fd >= 0 && Clock::now() > c.deadline) Refuse(c);
  }
  in_.erase(std::remove_if(in_.begin(), in_.end(), [](const Incoming& c) { return c.fd < 0; }),
            in_.end());
  return absl::OkStatus();
}

void Join::Accept() {
  while (true) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    // The oldest unproven one makes room (closed here, dropped after this round).
    auto live = [](const Incoming& c) { return c.fd >= 0; };
    if (static_cast<size_t>(std::count_if(in_.begin(), in_.end(), live)) >= kMaxUnproven) {
      Refuse(*std::find_if(in_.begin(), in_.end(), live));
    }
    in_.push_back(Incoming{fd, {}, Clock::now() + kHelloWithin});
  }
}

void Join::OnOutgoing(Outgoing& o) {
  const Published& p = peers_[static_cast<size_t>(o.replica)];
  if (!o.answering) {
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(o.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    const std::string hello = Hello(kHelloMagic, replica_, o.replica, replicas_, p.secret);
    if (err != 0) {
      GiveUp(o, absl::StrCat("connecting to ", Where(o), ": ", Errno(err)));
    } else if (send(o.fd, hello.data(), hello.size(), MSG_NOSIGNAL) !=
               static_cast<ssize_t>(hello.size())) {
      GiveUp(o, absl::StrCat("sending the hello to ", Where(o), " failed"));
    } else {
      o.answering = true;
    }
    return;
  }
  char buf[kHelloBytes];
  ssize_t k = recv(o.fd, buf, kHelloBytes - o.got.size(), 0);
  if (k <= 0) {
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
    GiveUp(o, "it closed the connection without answering the hello");
    return;
  }
  o.got.append(buf, static_cast<size_t>(k));
  if (o.got.size() < kHelloBytes) return;
  ParsedHello h;
  if (!ParseHello(o.got, kAnswerMagic, &h) || h.from != static_cast<uint32_t>(o.replica) ||
      h.to != static_cast<uint32_t>(replica_) || h.replicas != static_cast<uint32_t>(replicas_) ||
      !SameSecret(h.secret, secret_)) {
    GiveUp(o, absl::StrCat(Where(o), " answered the hello, but not as replica ", o.replica,
                           " of this configuration"));
    return;
  }
  fds_[static_cast<size_t>(o.replica)] = o.fd;
  o.fd = -1;
}

void Join::OnIncoming(Incoming& c) {
  char buf[kHelloBytes];
  ssize_t k = recv(c.fd, buf, kHelloBytes - c.got.size(), 0);
  if (k <= 0) {
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
    Refuse(c);
    return;
  }
  c.got.append(buf, static_cast<size_t>(k));
  if (c.got.size() < kHelloBytes) return;
  ParsedHello h;
  const bool ok = ParseHello(c.got, kHelloMagic, &h) && h.to == static_cast<uint32_t>(replica_) &&
                  h.replicas == static_cast<uint32_t>(replicas_) &&
                  h.from > static_cast<uint32_t>(replica_) &&
                  h.from < static_cast<uint32_t>(replicas_) && fds_[h.from] < 0 &&
                  SameSecret(h.secret, secret_);
  const std::string answer =
      ok ? Hello(kAnswerMagic, replica_, static_cast<int>(h.from), replicas_, peers_[h.from].secret)
         : std::string();
  if (!ok || send(c.fd, answer.data(), answer.size(), MSG_NOSIGNAL) !=
                 static_cast<ssize_t>(answer.size())) {
    Refuse(c);
    return;
  }
  fds_[h.from] = c.fd;
  c.fd = -1;
}

absl::Status Join::Missing(std::chrono::milliseconds timeout) const {
  std::vector<std::string> missing;
  std::string last;
  for (int s = 0; s < replicas_; ++s) {
    if (s == replica_ || fds_[static_cast<size_t>(s)] >= 0) continue;
    missing.push_back(std::to_string(s));
    for (const Outgoing& o : out_) {
      if (o.replica == s && !o.last.empty())
        last = absl::StrCat(" (replica ", s, ": ", o.last, ")");
    }
  }
  return absl::UnavailableError(absl::StrCat("replica(s) ", absl::StrJoin(missing, ", "), " of ",
                                             what_, " did not connect to replica ", replica_,
                                             " within ", timeout.count() / 1000.0, " s", last));
}

}  // namespace localpar::mesh
