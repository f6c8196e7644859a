// The link to stage 0.
#include "services/coordinator/pipeline_link.h"

namespace localpar {

// Acknowledgements and errors are small and the event loop takes them at once; the bound
// only matters if that loop stalls, and then it slows the pipeline rather than memory.
constexpr size_t kMaxQueuedReplies = 4096;

PipelineLink::PipelineLink(v1::Worker::Stub& first, const SecurityOptions& security)
    : up_(kMaxQueuedReplies) {
  ctx_.set_wait_for_ready(true);
  AddToken(ctx_, security);
  stream_ = first.Stream(&ctx_);
  reader_ = std::thread([this] { ReadLoop(); });
}

PipelineLink::~PipelineLink() {
  if (reader_.joinable()) {
    ctx_.TryCancel();
    up_.Close();  // unblock the reader if the event loop stopped taking items
    reader_.join();
  }
}

bool PipelineLink::Send(const v1::DownItem& item) { return !broken_ && stream_->Write(item); }

void PipelineLink::ReadLoop() {
  v1::UpItem up;
  while (stream_->Read(&up)) {
    if (!up_.Push(std::move(up))) break;
  }
  status_ = stream_->Finish();
  broken_ = true;
  up_.Close();
}

grpc::Status PipelineLink::Finish() {
  if (!finished_) {
    finished_ = true;
    stream_->WritesDone();
    reader_.join();
  }
  return status_;
}

}  // namespace localpar
