// The link to stage 0.
#include "services/coordinator/pipeline_link.h"

#include "services/coordinator/replica_stats.h"

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
  const v1::DType x_dtype = a.x_dtype() == DType::kI32 ? v1::I32 : v1::F32;
  SetWireTensor(b->mutable_activations(), x_dtype, a.x_shape(), rows,
                static_cast<const char*>(a.x()) + begin * per_x * 4);
  SetWireTensor(b->mutable_labels(), v1::I32, a.y_shape(), rows, a.y() + begin * per_y);
  return item;
}

// Acknowledgements and errors are small and the event loop takes them at once; the bound
// only matters if that loop stalls, and then it slows the pipeline rather than memory.
constexpr size_t kMaxQueuedReplies = 4096;

PipelineLink::PipelineLink(std::vector<v1::Worker::Stub*> firsts, const SecurityOptions& security)
    : replies_(kMaxQueuedReplies) {
  open_ = static_cast<int>(firsts.size());
  for (v1::Worker::Stub* first : firsts) {
    auto c = std::make_unique<Chain>();
    c->ctx.set_wait_for_ready(true);
    AddToken(c->ctx, security);
    c->stream = first->Stream(&c->ctx);
    chains_.push_back(std::move(c));
  }
  for (int r = 0; r < replicas(); ++r) {
    chains_[r]->reader = std::thread([this, r] { ReadLoop(r); });
  }
}

PipelineLink::~PipelineLink() {
  for (auto& c : chains_) c->ctx.TryCancel();
  replies_.Close();  // unblock the readers if the event loop stopped taking items
  for (auto& c : chains_) {
    if (c->reader.joinable()) c->reader.join();
  }
}

bool PipelineLink::Send(const v1::DownItem& item) {
  for (int r = 0; r < replicas(); ++r) {
    if (!SendTo(r, item)) return false;
  }
  return true;
}

bool PipelineLink::SendTo(int replica, const v1::DownItem& item) {
  return !broken_ && chains_[replica]->stream->Write(item);
}

void PipelineLink::ReadLoop(int replica) {
  Chain& c = *chains_[replica];
  v1::UpItem up;
  while (c.stream->Read(&up)) {
    if (!replies_.Push({replica, std::move(up)})) break;
  }
  c.status = c.stream->Finish();
  broken_ = true;
  if (!c.status.ok()) {
    // One chain lost is the whole pipeline lost: the others would only wait for it.
    for (auto& other : chains_) other->ctx.TryCancel();
  }
  if (--open_ == 0) replies_.Close();
}

std::optional<v1::UpItem> PipelineLink::Next() {
  while (std::optional<std::pair<int, v1::UpItem>> p = replies_.Pop()) {
    auto& [replica, up] = *p;
    if (replicas() == 1) return std::move(up);
    if (up.has_ack()) {
      // Every chain acknowledges each control item; its evaluation's figures add up.
      auto [it, first] = acks_.try_emplace(up.ack().seq());
      if (first) {
        it->second.second = up.ack();
      } else {
        MergeReplicaScores(up.ack(), &it->second.second);
      }
      if (++it->second.first < replicas()) continue;
      *up.mutable_ack() = std::move(it->second.second);
      acks_.erase(it);
    } else if (up.has_saved()) {
      up.mutable_saved()->mutable_snapshot()->set_replica(replica);  // the chain says which
    } else if (up.has_error()) {
      up.mutable_error()->set_replica(replica);
    }
    return std::move(up);
  }
  return std::nullopt;
}

void PipelineLink::Break(const grpc::Status& why) {
  {
    std::lock_guard<std::mutex> lock(break_mu_);
    if (!break_status_.ok()) return;
    break_status_ = why;
  }
  broken_ = true;
  for (auto& c : chains_) c->ctx.TryCancel();
}

grpc::Status PipelineLink::Finish() {
  if (!finished_) {
    finished_ = true;
    for (auto& c : chains_) c->stream->WritesDone();
    for (auto& c : chains_) {
      if (c->reader.joinable()) c->reader.join();
    }
    std::lock_guard<std::mutex> lock(break_mu_);
    status_ = break_status_;
    for (auto& c : chains_) {
      if (status_.ok() && !c->status.ok()) status_ = c->status;
    }
  }
  return status_;
}

}  // namespace localpar
