// The coordinator's link to stage 0: it writes batches and control items, and a reader
// thread queues what comes back up the pipeline (acknowledgements, in-band errors) for the
// coordinator's event loop. The reader does nothing else.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include "common/job/run.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/bounded_queue.h"
#include "services/common/grpc_util.h"

namespace localpar {

// A batch item of rows [begin, begin + rows) of `batch`, with `meta`'s placement (seq,
// epoch, phase, step, micro-batch) and the activations and labels as raw tensors.
v1::DownItem MakeBatchItem(const BatchAssembler& batch, int64_t begin, int64_t rows,
                           const v1::Batch& meta);

class PipelineLink {
 public:
  PipelineLink(v1::Worker::Stub& first, const SecurityOptions& security);
  ~PipelineLink();

  // False once the link is broken.
  bool Send(const v1::DownItem& item);
  // The next item that came back up, in order; nullopt once the stream has ended.
  std::optional<v1::UpItem> Next() { return replies_.Pop(); }
  // Closes the sending side (once) and waits for the stream's end; returns its status.
  grpc::Status Finish();
  bool broken() const { return broken_; }

 private:
  void ReadLoop();

  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DownItem, v1::UpItem>> stream_;
  BoundedQueue<v1::UpItem> replies_;
  std::thread reader_;
  std::atomic<bool> broken_{false};
  bool finished_ = false;
  grpc::Status status_;
};

}  // namespace localpar
