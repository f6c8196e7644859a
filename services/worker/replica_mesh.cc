// The replicas' own TCP mesh: joining with secrets from the rendezvous, and the gather.
#include "services/worker/replica_mesh.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/nn/replica_sync.h"
#include "common/nn/step.h"
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
    : replica_(replica), replicas_(replicas), what_(std::move(what)) {
  conns_.resize(static_cast<size_t>(replicas));
}

ReplicaMesh::~ReplicaMesh() { Close(); }

absl::StatusOr<std::unique_ptr<ReplicaMesh>> ReplicaMesh::Listen(
    const std::string& host, int replica, int replicas, std::string what,
    std::shared_ptr<const mesh::Tls> tls) {
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
  mesh->tls_ = std::move(tls);
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
  absl::Status joined = mesh::Join(replica_, replicas_, what_, secret_, peers, tls_.get(), &conns_,
                                   &listen_fd_, &refused_)
                            .Run(timeout);
  if (!joined.ok()) {
    Close();
    return failed_ = joined;
  }
  const int one = 1;
  for (const mesh::Conn& c : conns_) {
    if (c.open()) setsockopt(c.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return absl::OkStatus();
}

absl::Status ReplicaMesh::AllGather(const float* in, int64_t n, float* out,
                                    std::chrono::milliseconds timeout) {
  if (!failed_.ok()) return failed_;
  const size_t payload = static_cast<size_t>(n) * sizeof(float);
  if (payload > 0) std::memcpy(out + static_cast<size_t>(replica_) * n, in, payload);
  std::vector<Out> send(static_cast<size_t>(replicas_));
  std::vector<In> recv(static_cast<size_t>(replicas_));
  for (int s = 0; s < replicas_; ++s) {
    if (s == replica_) continue;
    send[static_cast<size_t>(s)] = {reinterpret_cast<const char*>(in), payload};
    recv[static_cast<size_t>(s)] = {reinterpret_cast<char*>(out + static_cast<size_t>(s) * n),
                                    payload};
  }
  return Exchange(send, recv, timeout);
}

namespace {

// The verdict on one replica's part of a chunk: how many non-finite values, and the first's
// index in the bucket (kNone when there is none).
constexpr uint64_t kNone = ~uint64_t{0};
constexpr size_t kVerdictBytes = 16;

}  // namespace

void ReplicaMesh::ReduceChunk(ReduceFormat format, int64_t begin, size_t mine) {
  const size_t R = static_cast<size_t>(replicas_);
  reduced_.resize(mine * sizeof(float) + R * kVerdictBytes);
  // The elements: floats as they are, or each word's two bfloat16 values.
  const float* parts = parts_.data();
  size_t elements = mine;
  uint64_t first_index = static_cast<uint64_t>(begin);
  if (format == ReduceFormat::kBf16Pairs) {
    elements = 2 * mine;
    first_index *= 2;
    decoded_.resize(R * elements);
    mesh::UnpackBf16Pairs(parts_.data(), static_cast<int64_t>(R * elements), decoded_.data());
    parts = decoded_.data();
  }
  if (format == ReduceFormat::kFloat32) {
    SumInReplicaOrder(parts, replicas_, static_cast<int64_t>(mine),
                      reinterpret_cast<float*>(reduced_.data()));
  } else {
    decoded_sum_.resize(elements);
    SumInReplicaOrder(parts, replicas_, static_cast<int64_t>(elements), decoded_sum_.data());
    mesh::PackBf16Pairs(decoded_sum_.data(), static_cast<int64_t>(elements),
                        reinterpret_cast<float*>(reduced_.data()));
  }
  for (size_t r = 0; r < R; ++r) {
    uint64_t bad_values = 0, first = kNone;
    for (size_t i = 0; i < elements; ++i) {
      if (std::isfinite(parts[r * elements + i])) continue;
      if (first == kNone) first = first_index + i;
      ++bad_values;
    }
    char* v = reduced_.data() + mine * sizeof(float) + r * kVerdictBytes;
    PutU64(v, bad_values);
    PutU64(v + 8, first);
  }
}

absl::Status ReplicaMesh::AllReduce(const float* in, int64_t n, float* sum, NonFiniteParts* bad,
                                    std::chrono::milliseconds timeout, ReduceFormat format) {
  if (!failed_.ok()) return failed_;
  const size_t R = static_cast<size_t>(replicas_), me = static_cast<size_t>(replica_);
  std::vector<int64_t> begin(R), count(R);
  for (size_t c = 0; c < R; ++c)
    MicroBatchRange(n, replicas_, static_cast<int>(c), &begin[c], &count[c]);
  const size_t mine = static_cast<size_t>(count[me]);
  const size_t verdicts = R * kVerdictBytes;
  // Chunk c of this bucket to its owner, c; every replica's part of chunk `me` here.
  parts_.resize(R * mine);
  if (mine > 0) std::memcpy(&parts_[me * mine], in + begin[me], mine * sizeof(float));
  std::vector<Out> send(R);
  std::vector<In> recv(R);
  for (size_t s = 0; s < R; ++s) {
    if (s == me) continue;
    send[s] = {reinterpret_cast<const char*>(in + begin[s]),
               static_cast<size_t>(count[s]) * sizeof(float)};
    recv[s] = {reinterpret_cast<char*>(&parts_[s * mine]), mine * sizeof(float)};
  }
  if (absl::Status e = Exchange(send, recv, timeout); !e.ok()) return e;
  // The chunk's sum in replica order, then a verdict on each replica's part.
  ReduceChunk(format, begin[me], mine);
  // Every chunk's sum and verdicts from its owner.
  std::vector<size_t> at(R, 0);
  size_t total = 0;
  for (size_t s = 0; s < R; ++s) {
    at[s] = total;
    if (s != me) total += static_cast<size_t>(count[s]) * sizeof(float) + verdicts;
  }
  sums_.resize(total);
  for (size_t s = 0; s < R; ++s) {
    if (s == me) continue;
    send[s] = {reduced_.data(), reduced_.size()};
    recv[s] = {sums_.data() + at[s], static_cast<size_t>(count[s]) * sizeof(float) + verdicts};
  }
  if (absl::Status e = Exchange(send, recv, timeout); !e.ok()) return e;
  *bad = NonFiniteParts();
  std::vector<uint64_t> bad_values(R, 0), first(R, kNone);
  for (size_t s = 0; s < R; ++s) {
    const char* chunk = s == me ? reduced_.data() : sums_.data() + at[s];
    const size_t bytes = static_cast<size_t>(count[s]) * sizeof(float);
    if (bytes > 0) std::memcpy(sum + begin[s], chunk, bytes);
    for (size_t r = 0; r < R; ++r) {
      const uint64_t k = GetU64(chunk + bytes + r * kVerdictBytes);
      const uint64_t f = GetU64(chunk + bytes + r * kVerdictBytes + 8);
      const uint64_t per_word = format == ReduceFormat::kBf16Pairs ? 2 : 1;
      const uint64_t lo = per_word * static_cast<uint64_t>(begin[s]),
                     hi = lo + per_word * static_cast<uint64_t>(count[s]);
      // A verdict is checked like any field from the wire: it must fit the owner's chunk.
      if (k > hi - lo || (k == 0) != (f == kNone) || (k > 0 && (f < lo || f >= hi))) {
        Close();
        return failed_ = absl::UnavailableError(
                   absl::StrCat("replica ", replica_, " of ", what_, ": replica ", s,
                                " sent a verdict that does not fit its chunk (", k,
                                " non-finite values of ", hi - lo, ")"));
      }
      bad_values[r] += k;
      first[r] = std::min(first[r], f);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    if (bad_values[r] == 0) continue;
    *bad = {static_cast<int>(r), static_cast<int64_t>(bad_values[r]),
            static_cast<int64_t>(first[r])};
    break;
  }
  return absl::OkStatus();
}

namespace {

// Why the connection to replica s failed.
std::string Broken(int s, const mesh::Conn& c) {
  if (c.error_number() != 0) return Lost(s, c.error_number());
  return absl::StrCat("the TLS connection to replica ", s, " failed: ", c.error());
}

}  // namespace

// The progress of one exchange with one replica.
struct ReplicaMesh::Progress {
  size_t sent = 0, received = 0;
  short send_waits = POLLOUT, recv_waits = POLLIN;  // what each direction waits for
  char header[kFrameHeaderBytes];
  char out_header[kFrameHeaderBytes];
};

// Sends to replica s until its socket is full or the frame is out; "" or why it failed.
std::string ReplicaMesh::SendSome(int s, const Out& o, Progress& p) {
  mesh::Conn& c = conns_[static_cast<size_t>(s)];
  while (p.sent < kFrameHeaderBytes + o.bytes) {
    const bool head = p.sent < kFrameHeaderBytes;
    const char* from = head ? p.out_header + p.sent : o.data + (p.sent - kFrameHeaderBytes);
    const size_t left = head ? kFrameHeaderBytes - p.sent : kFrameHeaderBytes + o.bytes - p.sent;
    mesh::Io io;
    const size_t k = c.Send(from, left, &io);
    if (k == 0) {
      if (io == mesh::Io::kWantRead || io == mesh::Io::kWantWrite) {
        p.send_waits = mesh::EventsFor(io);
        return "";
      }
      return io == mesh::Io::kClosed ? absl::StrCat("replica ", s, " closed its connection")
                                     : Broken(s, c);
    }
    p.sent += k;
    bytes_sent_ += static_cast<int64_t>(k);
    p.send_waits = POLLOUT;
  }
  return "";
}

// Reads from replica s until nothing waits or the frame is in, checking its header first.
std::string ReplicaMesh::RecvSome(int s, const In& i, Progress& p) {
  mesh::Conn& c = conns_[static_cast<size_t>(s)];
  while (p.received < kFrameHeaderBytes + i.bytes) {
    const bool head = p.received < kFrameHeaderBytes;
    char* to = head ? p.header + p.received : i.data + (p.received - kFrameHeaderBytes);
    const size_t left =
        head ? kFrameHeaderBytes - p.received : kFrameHeaderBytes + i.bytes - p.received;
    mesh::Io io;
    const size_t k = c.Recv(to, left, &io);
    if (k == 0) {
      if (io == mesh::Io::kWantRead || io == mesh::Io::kWantWrite) {
        p.recv_waits = mesh::EventsFor(io);
        return "";
      }
      return io == mesh::Io::kClosed ? absl::StrCat("replica ", s, " closed its connection")
                                     : Broken(s, c);
    }
    p.received += k;
    p.recv_waits = POLLIN;
    if (head && p.received >= kFrameHeaderBytes) {
      const uint64_t sequence = GetU64(p.header + 8), words = GetU64(p.header + 16);
      const uint64_t due = i.bytes / sizeof(float);
      if (std::memcmp(p.header, kFrameMagic, 8) != 0 || sequence != sequence_ || words != due) {
        return absl::StrCat(
            "replica ", s, " sent a frame that is not this gather's bucket (gather ", sequence,
            " of ", words, " floats where gather ", sequence_, " of ", due, " was due)");
      }
    }
  }
  return "";
}

absl::Status ReplicaMesh::Exchange(const std::vector<Out>& outgoing,
                                   const std::vector<In>& incoming,
                                   std::chrono::milliseconds timeout) {
  std::vector<Progress> progress(static_cast<size_t>(replicas_));
  for (int s = 0; s < replicas_; ++s) {
    if (s == replica_) continue;
    char* h = progress[static_cast<size_t>(s)].out_header;
    std::memcpy(h, kFrameMagic, 8);
    PutU64(h + 8, sequence_);
    PutU64(h + 16, static_cast<uint64_t>(outgoing[static_cast<size_t>(s)].bytes / sizeof(float)));
  }
  const auto deadline = Clock::now() + timeout;
  auto fail = [&](std::string why) {
    Close();
    return failed_ = absl::UnavailableError(
               absl::StrCat("replica ", replica_, " of ", what_, ": ", std::move(why)));
  };
  while (true) {
    std::vector<pollfd> polls;
    std::vector<int> who;
    bool pending = false;  // bytes decrypted already, which poll does not see
    for (int s = 0; s < replicas_; ++s) {
      if (s == replica_) continue;
      const Progress& p = progress[static_cast<size_t>(s)];
      const bool sending = p.sent < kFrameHeaderBytes + outgoing[static_cast<size_t>(s)].bytes;
      const bool receiving =
          p.received < kFrameHeaderBytes + incoming[static_cast<size_t>(s)].bytes;
      if (!sending && !receiving) continue;
      const short events =
          static_cast<short>((sending ? p.send_waits : 0) | (receiving ? p.recv_waits : 0));
      polls.push_back({conns_[static_cast<size_t>(s)].fd(), events, 0});
      who.push_back(s);
      pending = pending || (receiving && conns_[static_cast<size_t>(s)].Pending());
    }
    if (polls.empty()) break;
    if (Clock::now() >= deadline) {
      std::vector<std::string> late;
      for (int s : who) late.push_back(std::to_string(s));
      return fail(absl::StrCat("replica(s) ", absl::StrJoin(late, ", "),
                               " did not complete the gather within ", timeout.count() / 1000.0,
                               " s"));
    }
    if (poll(polls.data(), polls.size(), pending ? 0 : MillisUntil(deadline)) < 0 &&
        errno != EINTR) {
      return fail(absl::StrCat("poll: ", Errno(errno)));
    }
    for (size_t k = 0; k < polls.size(); ++k) {
      const int s = who[k];
      if (polls[k].revents == 0 && !conns_[static_cast<size_t>(s)].Pending()) continue;
      Progress& p = progress[static_cast<size_t>(s)];
      std::string why = SendSome(s, outgoing[static_cast<size_t>(s)], p);
      if (why.empty()) why = RecvSome(s, incoming[static_cast<size_t>(s)], p);
      if (!why.empty()) return fail(std::move(why));
    }
  }
  ++sequence_;
  return absl::OkStatus();
}

void ReplicaMesh::Close() {
  for (mesh::Conn& c : conns_) c.Close();
  CloseFd(listen_fd_);
  if (failed_.ok())
    failed_ = absl::CancelledError(absl::StrCat("the mesh of ", what_, " is closed"));
}

}  // namespace localpar
