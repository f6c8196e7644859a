// The replicas of a stage connected to one another for the gradient gather: one TCP
// connection per pair of replicas, made once per configuration, and a gather of each
// replica's bucket over them. It replaces Gloo's TCP transport, which trusted whoever
// connected to its port (a stranger's frame with an unknown slot aborted the worker).
//
// Joining (ReplicaMesh::Listen, then Connect):
//   - each replica listens on an ephemeral port of its collective host and publishes
//     "HOST PORT SECRET" through the coordinator's rendezvous (SECRET: 32 random bytes in
//     hex, fresh for every configuration);
//   - replica r connects to every replica below it and accepts every replica above it;
//   - a connection opens with a hello carrying the acceptor's secret, which only a reader
//     of the rendezvous knows, and is answered with the connector's secret, so each end
//     proves itself to the other;
//   - anything else that connects (a wrong or short hello, a silent socket, a replica that
//     is already connected) is closed and counted, and joining goes on; once every peer is
//     connected the listening socket is closed, so nothing else can connect.
// Gathering: every frame is a fixed header (magic, the gather's sequence number, its float
// count) and the floats. A frame that does not match, a closed connection or a peer that
// sends nothing before the deadline ends the gather with an error naming the replica; the
// mesh is then failed, and the coordinator configures the stage again. Nothing a peer sends
// can end the process.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace localpar {

class ReplicaMesh {
 public:
  // Listens on `host` (the worker's collective host). `what` names the stage in messages
  // ("stage 2").
  static absl::StatusOr<std::unique_ptr<ReplicaMesh>> Listen(const std::string& host, int replica,
                                                             int replicas, std::string what);
  ~ReplicaMesh();

  // What this replica publishes at the rendezvous: "HOST PORT SECRET".
  std::string published() const;

  // Connects to the replicas whose published values are `published` (one per replica, in
  // replica order, this one's included), within `timeout`.
  absl::Status Connect(const std::vector<std::string>& published,
                       std::chrono::milliseconds timeout);

  // Gathers n floats from every replica into out (replicas * n floats, in replica order).
  // `timeout` bounds the wait for the slowest peer.
  absl::Status AllGather(const float* in, int64_t n, float* out, std::chrono::milliseconds timeout);

  // Shuts every connection: a peer waiting on this replica fails at once.
  void Close();

  // Connections refused while joining (strangers, wrong secrets, duplicates).
  int refused() const { return refused_; }

 private:
  struct Peer;
  ReplicaMesh(int replica, int replicas, std::string what);

  const int replica_;
  const int replicas_;
  const std::string what_;
  std::string host_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::string secret_;    // 32 raw bytes
  std::vector<int> fds_;  // per replica; -1 for this one
  uint64_t sequence_ = 0;
  int refused_ = 0;
  absl::Status failed_;
};

}  // namespace localpar
