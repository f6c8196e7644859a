// The replicas of one stage as a group: they meet through the coordinator's Rendezvous
// service (a key-value store over gRPC, so no shared filesystem is assumed) and gather each
// step's gradient bucket (common/nn/replica_sync.h): CPU workers over their own
// authenticated TCP mesh (replica_mesh.h; TLS in a TLS cluster), CUDA workers with NCCL in device
// memory where this build has it (LOCALPAR_WITH_NCCL). The connections are made on first use, from
// the exchange thread, so that configuring the stages one after another never waits on a peer.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "common/core/backend.h"
#include "services/common/grpc_util.h"
#include "services/worker/replica_mesh.h"

namespace localpar {

struct ReplicaGroupOptions {
  std::string rendezvous;  // host:port of the coordinator's Rendezvous service
  std::string group;       // fresh for every configuration
  int stage = 0;
  int replica = 0;
  int replicas = 1;
  std::string host;  // this worker's address for its peers
  // What the replica runs (the job and the stage, JobFingerprint): replicas compare it at
  // the rendezvous before any exchange, so that two configured from different jobs (whose
  // buckets differ) fail with a clear error instead of inside the transport.
  std::string fingerprint;
  std::chrono::milliseconds timeout{60000};
  std::ostream* log = nullptr;  // what the group says of strangers (none: nothing)
};

class ReplicaGroup {
 public:
  ReplicaGroup(ReplicaGroupOptions options, const SecurityOptions& security);
  ~ReplicaGroup();

  // Whether AllGatherOnDevice works: a build with the CUDA backend and NCCL.
  static bool DeviceAvailable();

  // Gathers n floats from every replica into out (replicas * n floats, in replica order).
  // UNAVAILABLE naming the replicas that did not join, or the peer that was lost; once it
  // fails, every later call fails the same way.
  absl::Status AllGather(const float* in, int64_t n, float* out);
  // Every replica's n floats added element by element in replica order into sum, over the
  // mesh's reduce-scatter and all-gather (2 (R - 1) / R of the bucket sent); *bad names the
  // first replica whose part held a non-finite value (the sum is then not to be used).
  // kBf16Pairs: each word holds two bfloat16 values (ReplicaMesh::AllReduce).
  absl::Status AllReduce(const float* in, int64_t n, float* sum, NonFiniteParts* bad,
                         ReduceFormat format = ReduceFormat::kFloat32);
  // The same with device buffers of a CUDA `backend`, through NCCL on its stream; returns
  // once the gather is complete. A group uses one of the two, never both.
  absl::Status AllGatherOnDevice(const float* in, int64_t n, float* out, Backend& backend);

  // Drops the connections to the other replicas (from the thread that calls AllGather, when
  // its stream has ended): a replica still waiting on this one fails at once instead of at
  // its timeout, so that every replica's stream can end and the stage be configured again.
  void Close();

  const ReplicaGroupOptions& options() const { return options_; }

  // Read from any thread while the exchange thread gathers.
  double seconds() const { return seconds_.load(); }
  int64_t bytes_sent() const { return bytes_.load(); }

 private:
  class Impl;
  absl::Status Connect();
  absl::Status ConnectDevice();
  // One gather of n floats done, begun at `start`: its time and the bytes sent (the mesh's
  // own count where it has one).
  void Count(std::chrono::steady_clock::time_point start, int64_t n);

  const ReplicaGroupOptions options_;
  const SecurityOptions& security_;
  std::unique_ptr<Impl> impl_;
  absl::Status failed_;
  std::atomic<double> seconds_{0};
  std::atomic<int64_t> bytes_{0};
};

}  // namespace localpar
