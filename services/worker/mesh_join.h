// Joining the replicas' mesh (ReplicaMesh::Connect): replica r connects to every replica
// below it and accepts every replica above it, and each connection proves itself with the
// hello of mesh_wire.h before it counts; strangers are closed and counted. In a TLS cluster
// every connection first completes a TLS handshake (mesh_conn.h), and the hello runs inside
// it: a peer that fails the handshake is a stranger, and nothing it sent is read.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/worker/mesh_conn.h"
#include "services/worker/mesh_wire.h"

namespace localpar::mesh {

class Join {
 public:
  // `conns` (one per replica, closed where none) receives the proven connections; `tls`
  // (none: in the clear) secures them; `listen_fd` is the mesh's listening socket, closed
  // when joining ends; `refused` counts strangers.
  Join(int replica, int replicas, const std::string& what, const std::string& secret,
       const std::vector<Published>& peers, const Tls* tls, std::vector<Conn>* conns,
       int* listen_fd, int* refused);

  // Joins until every peer is connected, or `timeout` has passed (an error naming the
  // replicas that did not connect, and why the last try to each failed).
  absl::Status Run(std::chrono::milliseconds timeout);

 private:
  // A replica below this one: connect, shake hands (TLS), send the hello, read the answer.
  struct Outgoing {
    enum Stage { kConnecting, kHandshaking, kAnswering };
    int replica;
    Conn conn;
    Stage stage = kConnecting;
    short events = 0;  // what it waits for
    std::string got;
    Clock::time_point next_try;
    std::string last;  // why the last try failed
  };
  // A connection accepted and not yet proven.
  struct Incoming {
    Conn conn;
    bool secure = false;  // its handshake is complete (at once in the clear)
    short events = 0;
    std::string got;
    Clock::time_point deadline;
  };

  int Connected() const;
  void GiveUp(Outgoing& o, std::string why);
  void Refuse(Incoming& c);
  std::string Where(const Outgoing& o) const;
  void StartDue();
  // One poll over every socket in play, and what it found; an error only from poll itself.
  absl::Status Round(Clock::time_point deadline);
  void Accept();
  void OnOutgoing(Outgoing& o);
  void Answered(Outgoing& o);
  void OnIncoming(Incoming& c);
  void ReadHello(Incoming& c);
  absl::Status Missing(std::chrono::milliseconds timeout) const;

  const int replica_;
  const int replicas_;
  const std::string& what_;
  const std::string& secret_;
  const std::vector<Published>& peers_;
  const Tls* tls_;
  std::vector<Conn>& conns_;
  int& listen_fd_;
  int& refused_;
  std::vector<Outgoing> out_;
  std::vector<Incoming> in_;
};

}  // namespace localpar::mesh
