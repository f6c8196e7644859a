// A worker's compute thread: takes the checked items of its upstream link in order and runs
// the stage's program for each training step or evaluation batch (common/nn/executor.h)
// over ports made of the link's queues, and acts on control items. It talks to the network
// only through ComputeLinks, so a test can run it without sockets.
#pragma once

#include <functional>
#include <optional>

#include "common/nn/executor.h"
#include "services/common/wire.h"
#include "services/worker/stage_host.h"
#include "services/worker/worker_stats.h"

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
  // A gradient returned from downstream, in order. kPending only when !wait; kGone once the
  // downstream link has closed.
  virtual PortState NextGradient(bool wait, v1::Gradient* out) = 0;
  // Queue depths, for statistics.
  virtual void QueueDepths(int64_t* inbound, int64_t* inbound_capacity, int64_t* outbound,
                           int64_t* outbound_capacity) = 0;
};

class StageCompute {
 public:
  StageCompute(const StageSetup& setup, StageHost& host, WorkerStats& stats, int debug_delay_ms);
  ~StageCompute();

  // Processes every item until the stream ends, then applies what is still owed.
  void Run(ComputeLinks& session);
  bool shutdown_requested() const { return shutdown_; }

 private:
  class Ports;

  void RunStep(ComputeLinks& links, v1::DownItem first, double receive_wait);
  void Control(ComputeLinks& links, const v1::DownItem& item);
  bool SaveCheckpoint(ComputeLinks& links, const v1::Control& control);

  const StageSetup& setup_;
  StageHost& host_;
  WorkerStats& stats_;
  const int debug_delay_ms_;
  StageExecutor executor_;
  std::unique_ptr<Ports> ports_;
  bool shutdown_ = false;
};

// An ItemError for `seq`, raised at `stage`.
v1::UpItem ErrorItem(uint64_t seq, int stage, const absl::Status& status);

}  // namespace localpar
