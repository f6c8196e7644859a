// The coordinator's link to stage 0: it writes batches and control items, and a reader
// thread per stream queues what comes back up the pipeline (acknowledgements, in-band
// errors) for the coordinator's event loop. The readers do nothing else.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/run/job_data.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/bounded_queue.h"
#include "services/common/grpc_util.h"

namespace localpar {

// A batch item of rows [begin, begin + rows) of `batch`, with `meta`'s placement (seq,
// epoch, phase, step, micro-batch) and the activations and labels as raw tensors.
v1::DownItem MakeBatchItem(const BatchAssembler& batch, int64_t begin, int64_t rows,
                           const v1::Batch& meta);

// With replicas, one stream to every replica of stage 0: each is the head of its own chain
// of replicas (replica r of every stage). Control items go down every chain; what comes back
// is merged so that the job runner sees one pipeline.
class PipelineLink {
 public:
  PipelineLink(std::vector<v1::Worker::Stub*> firsts, const SecurityOptions& security);
  ~PipelineLink();

  int replicas() const { return static_cast<int>(chains_.size()); }
  // Down every chain; false once the link is broken.
  bool Send(const v1::DownItem& item);
  // Down chain r only (a replica's share of a batch).
  bool SendTo(int replica, const v1::DownItem& item);
  // The next item that came back up, in order; nullopt once every stream has ended. An
  // acknowledgement comes once every chain has acknowledged it; a StageSaved or an error,
  // from any chain, with its replica set from the chain it came up.
  std::optional<v1::UpItem> Next();
  // Closes the sending side (once) and waits for every stream's end; returns the first
  // failure, or OK.
  grpc::Status Finish();
  bool broken() const { return broken_; }
  // Ends the link as a failed stream would, for a break learnt in band (a stage that came
  // back up the pipeline unconfigured): sending stops, every stream is cancelled, and
  // Finish returns `why`.
  void Break(const grpc::Status& why);

 private:
  struct Chain {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::DownItem, v1::UpItem>> stream;
    std::thread reader;
    grpc::Status status;
  };
  void ReadLoop(int replica);

  std::vector<std::unique_ptr<Chain>> chains_;
  BoundedQueue<std::pair<int, v1::UpItem>> replies_;
  std::atomic<int> open_{0};
  std::atomic<bool> broken_{false};
  // seq -> (chains that acknowledged it, their acknowledgements merged); Next's thread only.
  std::map<uint64_t, std::pair<int, v1::Ack>> acks_;
  bool finished_ = false;
  grpc::Status status_;
  std::mutex break_mu_;  // Break may come from the event loop while Finish runs
  grpc::Status break_status_;
};

}  // namespace localpar
