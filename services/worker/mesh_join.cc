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
           const std::vector<Published>& peers, const Tls* tls, std::vector<Conn>* conns,
           int* listen_fd, int* refused)
    : replica_(replica),
      replicas_(replicas),
      what_(what),
      secret_(secret),
      peers_(peers),
      tls_(tls),
      conns_(*conns),
      listen_fd_(*listen_fd),
      refused_(*refused) {
  for (int s = 0; s < replica_; ++s) {
    out_.push_back(Outgoing{s, Conn(), Outgoing::kConnecting, 0, {}, Clock::now(), {}});
  }
}

absl::Status Join::Run(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  absl::Status status;
  while (Connected() < replicas_ - 1 && Clock::now() < deadline && status.ok()) {
    StartDue();
    status = Round(deadline);
  }
  for (Incoming& c : in_) {
    if (c.conn.open()) Refuse(c);
  }
  for (Outgoing& o : out_) o.conn.Close();
  CloseFd(listen_fd_);  // nothing else can connect from now on
  if (!status.ok()) return status;
  if (Connected() < replicas_ - 1) return Missing(timeout);
  return absl::OkStatus();
}

int Join::Connected() const {
  return static_cast<int>(
      std::count_if(conns_.begin(), conns_.end(), [](const Conn& c) { return c.open(); }));
}

void Join::GiveUp(Outgoing& o, std::string why) {
  o.conn.Close();
  o.stage = Outgoing::kConnecting;
  o.got.clear();
  o.last = std::move(why);
  o.next_try = Clock::now() + kRetryAfter;
}

void Join::Refuse(Incoming& c) {
  c.conn.Close();
  ++refused_;
}

std::string Join::Where(const Outgoing& o) const {
  const Published& p = peers_[static_cast<size_t>(o.replica)];
  return absl::StrCat(SanitizePeerText(p.host, 128), ":", p.port);
}

// Starts the connections that are due.
void Join::StartDue() {
  for (Outgoing& o : out_) {
    if (o.conn.open() || conns_[static_cast<size_t>(o.replica)].open() ||
        Clock::now() < o.next_try) {
      continue;
    }
    const Published& p = peers_[static_cast<size_t>(o.replica)];
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (absl::Status s = Resolve(p.host, p.port, &addr, &len); !s.ok()) {
      GiveUp(o, std::string(s.message()));
      continue;
    }
    const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    o.conn = Conn(fd, tls_, /*accepting=*/false, p.host);
    o.stage = Outgoing::kConnecting;
    o.events = POLLOUT;
    if (fd < 0 ||
        (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS)) {
      GiveUp(o, absl::StrCat("connecting to ", Where(o), ": ", Errno(errno)));
    }
  }
}

absl::Status Join::Round(Clock::time_point deadline) {
  std::vector<pollfd> polls;
  std::vector<std::pair<int, size_t>> owner;  // 0: listener, 1: outgoing, 2: incoming
  bool pending = false;                       // bytes decrypted already, which poll does not see
  if (listen_fd_ >= 0) {
    polls.push_back({listen_fd_, POLLIN, 0});
    owner.emplace_back(0, 0);
  }
  for (size_t i = 0; i < out_.size(); ++i) {
    if (!out_[i].conn.open()) continue;
    polls.push_back({out_[i].conn.fd(), out_[i].events, 0});
    owner.emplace_back(1, i);
    pending = pending || out_[i].conn.Pending();
  }
  for (size_t i = 0; i < in_.size(); ++i) {
    polls.push_back({in_[i].conn.fd(), in_[i].events, 0});
    owner.emplace_back(2, i);
    pending = pending || in_[i].conn.Pending();
  }
  const int wait =
      pending ? 0 : std::min(MillisUntil(deadline), static_cast<int>(kRetryAfter.count()));
  if (poll(polls.data(), polls.size(), wait) < 0 && errno != EINTR) {
    return absl::InternalError(absl::StrCat("poll: ", Errno(errno)));
  }
  for (size_t k = 0; k < polls.size(); ++k) {
    auto [kind, i] = owner[k];
    if (kind == 0) {
      if (polls[k].revents != 0) Accept();
    } else if (kind == 1) {
      Outgoing& o = out_[i];
      if (o.conn.open() && (polls[k].revents != 0 || o.conn.Pending())) OnOutgoing(o);
    } else if (in_[i].conn.open() && (polls[k].revents != 0 || in_[i].conn.Pending())) {
      OnIncoming(in_[i]);  // (a closed one made room for a newer one)
    }
  }
  // Drop what was closed, and unproven connections past their time.
  for (Incoming& c : in_) {
    if (c.conn.open() && Clock::now() > c.deadline) Refuse(c);
  }
  in_.erase(
      std::remove_if(in_.begin(), in_.end(), [](const Incoming& c) { return !c.conn.open(); }),
      in_.end());
  return absl::OkStatus();
}

void Join::Accept() {
  while (true) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    // The oldest unproven one makes room (closed here, dropped after this round).
    auto live = [](const Incoming& c) { return c.conn.open(); };
    if (static_cast<size_t>(std::count_if(in_.begin(), in_.end(), live)) >= kMaxUnproven) {
      Refuse(*std::find_if(in_.begin(), in_.end(), live));
    }
    in_.push_back(Incoming{
        Conn(fd, tls_, /*accepting=*/true, ""), false, POLLIN, {}, Clock::now() + kHelloWithin});
  }
}

void Join::OnOutgoing(Outgoing& o) {
  if (o.stage == Outgoing::kConnecting) {
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(o.conn.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return GiveUp(o, absl::StrCat("connecting to ", Where(o), ": ", Errno(err)));
    o.stage = Outgoing::kHandshaking;
  }
  if (o.stage == Outgoing::kHandshaking) {
    const Io io = o.conn.Handshake();
    if (io == Io::kWantRead || io == Io::kWantWrite) {
      o.events = EventsFor(io);
      return;
    }
    if (io != Io::kDone) {
      return GiveUp(o,
                    absl::StrCat("TLS with ", Where(o), " failed: ",
                                 io == Io::kClosed ? "it closed the connection" : o.conn.error()));
    }
    const Published& p = peers_[static_cast<size_t>(o.replica)];
    const std::string hello = Hello(kHelloMagic, replica_, o.replica, replicas_, p.secret);
    Io sent;
    if (o.conn.Send(hello.data(), hello.size(), &sent) != hello.size()) {
      return GiveUp(o, absl::StrCat("sending the hello to ", Where(o), " failed"));
    }
    o.stage = Outgoing::kAnswering;
    o.events = POLLIN;
  }
  Answered(o);
}

// Reads what there is of the answer to the hello, and checks it once it is whole.
void Join::Answered(Outgoing& o) {
  char buf[kHelloBytes];
  Io io;
  const size_t k = o.conn.Recv(buf, kHelloBytes - o.got.size(), &io);
  if (k == 0) {
    if (io == Io::kWantRead || io == Io::kWantWrite) {
      o.events = EventsFor(io);
      return;
    }
    return GiveUp(o, io == Io::kFailed && o.conn.tls()
                         ? absl::StrCat("TLS with ", Where(o), " failed: ", o.conn.error())
                         : "it closed the connection without answering the hello");
  }
  o.got.append(buf, k);
  if (o.got.size() < kHelloBytes) return;
  ParsedHello h;
  if (!ParseHello(o.got, kAnswerMagic, &h) || h.from != static_cast<uint32_t>(o.replica) ||
      h.to != static_cast<uint32_t>(replica_) || h.replicas != static_cast<uint32_t>(replicas_) ||
      !SameSecret(h.secret, secret_)) {
    return GiveUp(o, absl::StrCat(Where(o), " answered the hello, but not as replica ", o.replica,
                                  " of this configuration"));
  }
  conns_[static_cast<size_t>(o.replica)] = std::move(o.conn);
}

void Join::OnIncoming(Incoming& c) {
  if (!c.secure) {
    const Io io = c.conn.Handshake();
    if (io == Io::kWantRead || io == Io::kWantWrite) {
      c.events = EventsFor(io);
      return;
    }
    if (io != Io::kDone) return Refuse(c);  // no certificate, a wrong one, or not TLS
    c.secure = true;
    c.events = POLLIN;
  }
  ReadHello(c);
}

void Join::ReadHello(Incoming& c) {
  char buf[kHelloBytes];
  Io io;
  const size_t k = c.conn.Recv(buf, kHelloBytes - c.got.size(), &io);
  if (k == 0) {
    if (io == Io::kWantRead || io == Io::kWantWrite) {
      c.events = EventsFor(io);
      return;
    }
    return Refuse(c);
  }
  c.got.append(buf, k);
  if (c.got.size() < kHelloBytes) return;
  ParsedHello h;
  const bool ok = ParseHello(c.got, kHelloMagic, &h) && h.to == static_cast<uint32_t>(replica_) &&
                  h.replicas == static_cast<uint32_t>(replicas_) &&
                  h.from > static_cast<uint32_t>(replica_) &&
                  h.from < static_cast<uint32_t>(replicas_) && !conns_[h.from].open() &&
                  SameSecret(h.secret, secret_);
  const std::string answer =
      ok ? Hello(kAnswerMagic, replica_, static_cast<int>(h.from), replicas_, peers_[h.from].secret)
         : std::string();
  Io sent;
  if (!ok || c.conn.Send(answer.data(), answer.size(), &sent) != answer.size()) return Refuse(c);
  conns_[h.from] = std::move(c.conn);
}

absl::Status Join::Missing(std::chrono::milliseconds timeout) const {
  std::vector<std::string> missing;
  std::string last;
  for (int s = 0; s < replicas_; ++s) {
    if (s == replica_ || conns_[static_cast<size_t>(s)].open()) continue;
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
