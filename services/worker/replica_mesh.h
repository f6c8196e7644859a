// The replicas of a stage connected to one another for the gradient gather: one TCP
// connection per pair of replicas, made once per configuration, and a gather of each
// replica's bucket over them. It replaces Gloo's TCP transport, which trusted whoever
// connected to its port (a stranger's frame with an unknown slot aborted the worker).
//
// In a TLS cluster every connection is TLS 1.3 with the cluster's credentials, made before
// the hello (mesh_conn.h): nothing of the hello, the framing or the gradients crosses the
// network in the clear, and under --mtls a peer without a certificate from --tls_ca fails
// the handshake and is a stranger.
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
// Gathering and reducing: every frame is a fixed header (magic, the exchange's sequence
// number, its count of 4-byte words) and the words.
// AllReduce sums each element in replica order with a reduce-scatter then an all-gather:
// replica c owns chunk c of the bucket (MicroBatchRange over the replicas); every replica
// sends chunk c to its owner, which adds the R parts in replica order (the order
// SumInReplicaOrder uses, so the sum is the same bit for bit) and checks each part for
// non-finite values; then every owner sends its chunk's sum, with its verdict on each
// replica's part, to every replica. Each replica sends 2 (R - 1) / R of the bucket, where a
// gather sends (R - 1) x. A frame that does not match, a closed connection or a peer that
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
#include "services/worker/mesh_conn.h"

namespace localpar {

// Non-finite values in the replicas' parts of a bucket: the first replica (in replica order)
// whose part holds any, how many, and the index of its first (replica -1: none).
struct NonFiniteParts {
  int replica = -1;
  int64_t count = 0;
  int64_t first = -1;
};

// What a reduction's 4-byte words hold: a float each, or two bfloat16 values each (the
// element 2i in the low half of word i), added in float32 and the sum rounded to bfloat16.
enum class ReduceFormat { kFloat32, kBf16Pairs };

class ReplicaMesh {
 public:
  // Listens on `host` (the worker's collective host). `what` names the stage in messages
  // ("stage 2"). With `tls` every connection is TLS (mesh_conn.h); without, in the clear.
  static absl::StatusOr<std::unique_ptr<ReplicaMesh>> Listen(
      const std::string& host, int replica, int replicas, std::string what,
      std::shared_ptr<const mesh::Tls> tls = nullptr);
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

  // Every replica's n words added element by element in replica order, into sum (n words),
  // sending 2 (R - 1) / R of them; *bad says which replica's part held a NaN or an
  // infinity (the sum is then not to be used; its index counts elements, two a word with
  // kBf16Pairs).
  absl::Status AllReduce(const float* in, int64_t n, float* sum, NonFiniteParts* bad,
                         std::chrono::milliseconds timeout,
                         ReduceFormat format = ReduceFormat::kFloat32);

  // Bytes this replica has sent in gathers and reductions, frame headers included.
  int64_t bytes_sent() const { return bytes_sent_; }

  // Shuts every connection: a peer waiting on this replica fails at once.
  void Close();

  // Connections refused while joining (strangers, wrong secrets, duplicates).
  int refused() const { return refused_; }

 private:
  struct Peer;
  ReplicaMesh(int replica, int replicas, std::string what);
  // One frame to and one from every other replica s: outgoing[s] goes out, incoming[s] is
  // filled;
  // both sizes are multiples of 4 bytes. A peer's frame must carry this exchange's
  // sequence number and exactly recv[s]'s size.
  struct Out {
    const char* data = nullptr;
    size_t bytes = 0;
  };
  struct In {
    char* data = nullptr;
    size_t bytes = 0;
  };
  absl::Status Exchange(const std::vector<Out>& outgoing, const std::vector<In>& incoming,
                        std::chrono::milliseconds timeout);
  struct Progress;
  std::string SendSome(int s, const Out& o, Progress& p);
  std::string RecvSome(int s, const In& i, Progress& p);

  const int replica_;
  const int replicas_;
  const std::string what_;
  std::string host_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::shared_ptr<const mesh::Tls> tls_;
  std::string secret_;             // 32 raw bytes
  std::vector<mesh::Conn> conns_;  // per replica; closed for this one
  uint64_t sequence_ = 0;
  int64_t bytes_sent_ = 0;
  int refused_ = 0;
  // This replica's chunk: every replica's part, summed into reduced_ with a verdict on each
  // part (16 bytes: its count of non-finite elements, the first one's index in the bucket).
  void ReduceChunk(ReduceFormat format, int64_t begin, size_t words);
  std::vector<float> parts_;  // AllReduce: every replica's part of this replica's chunk
  std::vector<float> decoded_, decoded_sum_;  // kBf16Pairs: the parts and their sum as floats
  std::vector<char> reduced_;                 // its sum and verdicts, as sent
  std::vector<char> sums_;                    // the other chunks' sums and verdicts, as received
  absl::Status failed_;
};

}  // namespace localpar
