// The compute thread's view of its session's queues: what StageCompute talks to instead of
// sockets, so that a test runs it over in-memory queues.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <optional>

#include "common/nn/executor.h"
#include "proto/localpar.pb.h"

namespace localpar {

// The compute thread's view of the session's queues.
class ComputeLinks {
 public:
  virtual ~ComputeLinks() = default;
  // The next checked item from upstream; nullopt once the stream has ended.
  virtual std::optional<v1::DownItem> NextItem() = 0;
  // To the next stage (never called on the last). `ready` waits until the bytes are filled.
  virtual void SendDown(grpc::ByteBuffer item, std::function<void()> ready) = 0;
  // To the stage before (or the coordinator).
  virtual void SendUp(grpc::ByteBuffer item) = 0;
  // A training batch about to go down will be answered by one gradient (or an error): the
  // session takes that many, and refuses any more in-band instead of queueing them.
  virtual void OweGradient() = 0;
  // A gradient returned from downstream, in order. kPending only when !wait; kGone once the
  // downstream link has closed.
  virtual PortState NextGradient(bool wait, v1::Gradient* out) = 0;
  // Queue depths, for statistics.
  virtual void QueueDepths(int64_t* inbound, int64_t* inbound_capacity, int64_t* outbound,
                           int64_t* outbound_capacity) = 0;
};

}  // namespace localpar
