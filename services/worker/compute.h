// A worker's compute thread: takes the checked items of its upstream link in order and runs
// the stage's program for each training step or evaluation batch (common/nn/executor.h)
// over ports made of the link's queues, and acts on control items. It talks to the network
// only through ComputeLinks, so a test can run it without sockets.
#pragma once

#include <functional>
#include <optional>

#include "common/nn/executor.h"
#include "services/common/wire.h"
#include "services/worker/compute_links.h"
#include "services/worker/link_ports.h"
#include "services/worker/stage_host.h"
#include "services/worker/worker_stats.h"

namespace localpar {

class StageCompute {
 public:
  StageCompute(const ConfiguredStage& setup, StageHost& host, WorkerStats& stats,
               int debug_delay_ms);
  ~StageCompute();

  // Processes every item until the stream ends, then applies what is still owed.
  void Run(ComputeLinks& session);
  bool shutdown_requested() const { return shutdown_; }

 private:
  void RunStep(ComputeLinks& links, v1::DownItem first, double receive_wait);
  void Control(ComputeLinks& links, const v1::DownItem& item);
  bool SaveCheckpoint(ComputeLinks& links, const v1::Control& control);

  const ConfiguredStage& setup_;
  StageHost& host_;
  WorkerStats& stats_;
  const int debug_delay_ms_;
  StageExecutor executor_;
  std::unique_ptr<LinkPorts> ports_;
  bool shutdown_ = false;
};

}  // namespace localpar
