// The link to stage 0.
#include "services/coordinator/pipeline_link.h"

namespace localpar {
namespace {

void SetWireTensor(v1::Tensor* t, v1::DType dtype, Shape shape, int64_t rows, const void* data) {
  shape[0] = rows;
  t->set_dtype(dtype);
  for (int64_t d : shape) t->add_shape(d);
  t->set_data(data, static_cast<size_t>(NumElements(shape)) * 4);
}

}  // namespace

v1::DownItem MakeBatchItem(const BatchAssembler& a, int64_t begin, int64_t rows,
                           const v1::Batch& meta) {
  v1::DownItem item;
  v1::Batch* b = item.mutable_batch();
  *b = meta;
  const int64_t per_x = NumElements(a.x_shape()) / std::max<int64_t>(a.rows(), 1);
  const int64_t per_y = NumElements(a.y_shape()) / std::max<int64_t>(a.rows(), 1);
  SetWireTensor(b->mutable_activations(), v1::F32, a.x_shape(), rows, a.x() + begin * per_x);
  SetWireTensor(b->mutable_labels(), v1::I32, a.y_shape(), rows, a.y() + begin * per_y);
  return item;
}

// Acknowledgements and errors are small and the event loop takes them at once; the bound
// only matters if that loop stalls, and then it slows the pipeline rather than memory.
constexpr size_t kMaxQueuedReplies = 4096;

PipelineLink::PipelineLink(v1::Worker::Stub& first, const SecurityOptions& security)
    : replies_(kMaxQueuedReplies) {
  ctx_.set_wait_for_ready(true);
  AddToken(ctx_, security);
  stream_ = first.Stream(&ctx_);
  reader_ = std::thread([this] { ReadLoop(); });
}

PipelineLink::~PipelineLink() {
  if (reader_.joinable()) {
    ctx_.TryCancel();
    replies_.Close();  // unblock the reader if the event loop stopped taking items
    reader_.join();
  }
}

bool PipelineLink::Send(const v1::DownItem& item) { return !broken_ && stream_->Write(item); }

void PipelineLink::ReadLoop() {
  v1::UpItem up;
  while (stream_->Read(&up)) {
    if (!replies_.Push(std::move(up))) break;
  }
  status_ = stream_->Finish();
  broken_ = true;
  replies_.Close();
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
