// What comes back up the pipeline, taken in order on a thread of its own: acknowledgements
// (a checkpoint's commits; an evaluation's figures, which travel with its marker, go to the
// ledger), the stages' snapshot reports, in-band errors, and a stage that answers
// unconfigured (which breaks the link: it was restarted mid-run).
#pragma once

#include <condition_variable>
#include <mutex>
#include <ostream>
#include <set>
#include <thread>

#include "common/run/ledger.h"
#include "services/common/metrics.h"
#include "services/coordinator/checkpointer.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/pipeline_link.h"
#include "services/coordinator/worker_pool.h"

namespace localpar {

// An evaluation's figures from its acknowledgement, checked (they come from peers): one
// score per stage, every stage once, counts and sums that make sense. INVALID_ARGUMENT says
// what is wrong.
absl::StatusOr<Scores> ScoresOf(const v1::Ack& ack, int stages);

class UpstreamEvents {
 public:
  UpstreamEvents(RunLedger& ledger, Checkpointer& checkpointer, WorkerPool& pool,
                 CoordinatorMetrics* metrics, std::ostream& log);
  ~UpstreamEvents();
  void Start(PipelineLink& link);
  // Ends the link's streams and waits for the thread.
  void Stop(PipelineLink& link);
  // Until control item `seq` is acknowledged (true) or the link ends (false).
  bool WaitAck(uint64_t seq);

 private:
  void Loop(PipelineLink& link);
  void OnAck(const v1::Ack& ack);

  RunLedger& ledger_;
  Checkpointer& checkpointer_;
  WorkerPool& pool_;
  CoordinatorMetrics* const metrics_;
  std::ostream& log_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable acked_cv_;
  std::set<uint64_t> acked_;
  bool ended_ = false;
};

}  // namespace localpar
