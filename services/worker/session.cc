// A worker's upstream stream: reactor, queues and threads.
#include "services/worker/session.h"

#include <ostream>

#include "absl/strings/str_cat.h"
#include "common/nn/rule.h"
#include "services/worker/item_check.h"

namespace localpar {
namespace {

// Gradients returned from downstream wait here until the program applies them; more than
// this many means the peer sends gradients nobody asked for.
constexpr size_t kMaxPendingGradients = 256;

uint64_t SeqOf(const v1::DownItem& item) {
  return item.has_batch() ? item.batch().seq() : item.control().seq();
}

}  // namespace

StreamSession::StreamSession(grpc::CallbackServerContext* context,
                             std::shared_ptr<const ConfiguredStage> setup, StageHost& host,
                             WorkerStats& stats, const WorkerOptions& options,
                             std::function<void()> on_finish, std::function<void(bool)> on_done)
    : context_(context),
      setup_(std::move(setup)),
      host_(host),
      stats_(stats),
      options_(options),
      on_finish_(std::move(on_finish)),
      on_done_(std::move(on_done)),
      stage_(setup_ ? setup_->stage : -1),
      max_queued_writes_(static_cast<size_t>(options.config.queue_capacity()) + 4),
      inbound_(static_cast<size_t>(options.config.queue_capacity())),
      outbound_(static_cast<size_t>(options.config.queue_capacity())),
      grads_(kMaxPendingGradients) {}

StreamSession::~StreamSession() {
  // OnDone may run on the compute thread itself, right after it finished the RPC.
  if (compute_.joinable()) {
    if (compute_.get_id() == std::this_thread::get_id()) {
      compute_.detach();
    } else {
      compute_.join();
    }
  }
}

void StreamSession::Start() {
  if (setup_) compute_ = std::thread([this] { ComputeLoop(); });
  ResumeReading();
}

// ---- reading --------------------------------------------------------------------------

void StreamSession::OnReadDone(bool ok) {
  if (!ok) {  // the peer finished writing, or the call is over
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_ = false;
      reads_done_ = true;
    }
    inbound_.Close();
    if (!setup_) FinishWhenWritten(grpc::Status::OK);
    return;
  }
  HandleItem();
  {
    std::lock_guard<std::mutex> lock(mu_);
    reading_ = false;
  }
  ResumeReading();
}

void StreamSession::HandleItem() {
  const int64_t bytes = static_cast<int64_t>(read_buffer_.Length());
  stats_.AddBytes(false, bytes);
  if (setup_ && bytes > setup_->limits.max_item_bytes) {
    read_buffer_.Clear();
    stats_.Reject("item_too_large");
    Write(FrameItem(ErrorItem(
              0, stage_,
              absl::InvalidArgumentError(absl::StrCat("item: ", bytes, " bytes exceed the ",
                                                      setup_->limits.max_item_bytes,
                                                      " this job's largest batch needs")))),
          false);
    return;
  }
  v1::DownItem item;
  if (!grpc::SerializationTraits<v1::DownItem>::Deserialize(&read_buffer_, &item).ok()) {
    stats_.Reject("malformed_item");
    Write(FrameItem(ErrorItem(
              0, stage_,
              absl::InvalidArgumentError("item: the message is not a localpar.v1.DownItem"))),
          false);
    return;
  }
  // Only this reader thread touches last_seq_ (one read is in flight at a time).
  ItemCheck c = CheckDownItem(item, setup_ ? &setup_->limits : nullptr, last_seq_);
  if (c.verdict == ItemCheck::kAccept) {
    last_seq_ = SeqOf(item);
    std::lock_guard<std::mutex> lock(mu_);
    parked_ = std::move(item);
    return;
  }
  stats_.Reject(c.reason);
  if (c.verdict == ItemCheck::kReject) {
    Write(FrameItem(ErrorItem(SeqOf(item), stage_, c.status)), false);
  }
}

bool StreamSession::ReadWantedLocked() {
  if (reading_ || reads_done_ || finished_) return false;
  if (parked_) {
    if (!inbound_.TryPush(*parked_)) return false;
    parked_.reset();
  }
  if (writes_.size() >= max_queued_writes_) return false;  // replies are not being read
  reading_ = true;
  return true;
}

void StreamSession::ResumeReading() {
  bool start;
  {
    std::lock_guard<std::mutex> lock(mu_);
    start = ReadWantedLocked();
  }
  if (start) StartRead(&read_buffer_);
}

std::optional<v1::DownItem> StreamSession::NextItem() {
  std::optional<v1::DownItem> item = inbound_.Pop();
  ResumeReading();
  return item;
}

// ---- writing --------------------------------------------------------------------------

// One write in flight at a time; the rest queue behind it. Producers on our own threads
// wait while the queue is full; the reader (a gRPC thread) never waits, it stops reading.
void StreamSession::Write(grpc::ByteBuffer item, bool wait_for_room) {
  std::unique_lock<std::mutex> lock(mu_);
  const int stall_s = UpstreamStallSeconds(options_.config);
  if (wait_for_room && !write_room_.wait_for(lock, std::chrono::seconds(stall_s), [&] {
        return upstream_gone_ || writes_.size() < max_queued_writes_;
      })) {
    // The peer stopped reading what we owe it: end the stream rather than wait forever
    // (holding the stage, and with it GetWeights and shutdown).
    upstream_gone_ = true;
    write_room_.notify_all();
    lock.unlock();
    Say(absl::StrCat("upstream read nothing for ", stall_s, " s; ending its stream"));
    context_->TryCancel();
    return;
  }
  if (upstream_gone_ || finished_) return;
  writes_.push_back(std::move(item));
  if (writing_) return;
  writing_ = true;
  grpc::ByteBuffer* next = &writes_.front();
  lock.unlock();
  StartWrite(next);
}

void StreamSession::OnWriteDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  writes_.pop_front();
  if (!ok) {
    upstream_gone_ = true;
    writes_.clear();
  }
  write_room_.notify_all();
  grpc::ByteBuffer* next = writes_.empty() ? nullptr : &writes_.front();
  writing_ = next != nullptr;
  const bool finish = !next && finishing_ && !finished_;
  if (finish) finished_ = true;
  const bool read = ReadWantedLocked();
  lock.unlock();
  if (next) StartWrite(next);
  if (read) StartRead(&read_buffer_);
  if (finish) FinishNow(finish_status_);
}

void StreamSession::FinishWhenWritten(const grpc::Status& status) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finishing_) return;
  finishing_ = true;
  finish_status_ = status;
  if (writing_) return;  // OnWriteDone finishes once the queue is empty
  finished_ = true;
  lock.unlock();
  FinishNow(status);
}

void StreamSession::FinishNow(const grpc::Status& status) {
  on_finish_();
  Finish(status);
}

// The call is over for the peer (it cancelled, the deadline passed, the server shuts down):
// unblock every thread of the session so that it finishes, whatever it waits on.
void StreamSession::OnCancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    upstream_gone_ = true;
    write_room_.notify_all();
  }
  inbound_.Close();
  outbound_.Close();
  grads_.Close();
  down_ctx_.TryCancel();
}

// on_done_ runs after the session is deleted (a copy of it: the members are gone), so that
// whoever waits for sessions to end (the worker's shutdown) never tears down gRPC or the
// service while a session's destructor still releases its downstream call.
void StreamSession::OnDone() {
  const std::function<void(bool)> done = on_done_;
  const bool shutdown = shutdown_requested_;
  delete this;
  done(shutdown);
}

// ---- compute and the downstream link --------------------------------------------------

void StreamSession::ComputeLoop() {
  if (!setup_->last()) {
    down_ctx_.set_wait_for_ready(true);
    AddToken(down_ctx_, options_.security);
    down_ = std::make_unique<ClientStream>(setup_->downstream, WorkerStreamMethod(), &down_ctx_);
    sender_ = std::thread([this] { SenderLoop(); });
    down_reader_ = std::thread([this] { DownReaderLoop(); });
  }
  {
    StageCompute compute(*setup_, host_, stats_, options_.config.debug_delay_ms());
    compute.Run(*this);
    shutdown_requested_ = compute.shutdown_requested();
  }
  outbound_.Close();
  if (sender_.joinable()) sender_.join();
  if (down_reader_.joinable()) down_reader_.join();
  stats_.SetQueueMaxDepth(
      static_cast<int64_t>(std::max(inbound_.max_depth(), outbound_.max_depth())));
  FinishWhenWritten(downstream_failed_
                        ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       absl::StrCat("stage ", stage_ + 1, " (downstream) was lost"))
                        : grpc::Status::OK);
}

void StreamSession::SendDown(grpc::ByteBuffer item, std::function<void()> ready) {
  outbound_.Push(Outgoing{std::move(item), std::move(ready)});
}

void StreamSession::SenderLoop() {
  while (std::optional<Outgoing> item = outbound_.Pop()) {
    if (item->ready) item->ready();  // a device-to-host copy still in flight
    stats_.AddBytes(true, static_cast<int64_t>(item->bytes.Length()));
    if (!down_->Write(item->bytes)) {
      downstream_failed_ = true;
      outbound_.Close();  // unblock the compute thread if it waits to hand on a batch
      break;
    }
  }
  down_->WritesDone();
}

void StreamSession::Say(const std::string& line) const {
  if (options_.log != nullptr) *options_.log << absl::StrCat("worker ", stage_, ": ", line, "\n");
}

void StreamSession::DownReaderLoop() {
  const bool gradients = Rule(setup_->steps.rule).returns_gradients;
  grpc::ByteBuffer bytes;
  while (down_->Read(&bytes)) {
    v1::UpItem up;
    if (!ParseUpItem(&bytes, &up)) {
      Say("downstream sent a message that is not an UpItem");
      continue;
    }
    if (up.has_gradient()) {
      if (!gradients) continue;  // under a rule without gradients, noise from a broken peer
      v1::Gradient& g = *up.mutable_gradient();
      if (gradients_owed_.fetch_sub(1) <= 0 || !grads_.TryPush(g)) {
        ++gradients_owed_;
        stats_.Reject("bad_gradient");
        Write(FrameItem(ErrorItem(up.gradient().seq(), stage_,
                                  absl::InvalidArgumentError(absl::StrCat(
                                      "from stage ", stage_ + 1,
                                      ": gradient: none is owed (more gradients than training "
                                      "batches sent)")))),
              true);
        continue;
      }
      continue;
    }
    if (up.has_error()) {
      // Peer text: never relayed raw (escape sequences, megabytes of it).
      up.mutable_error()->set_message(SanitizePeerText(up.error().message()));
      if (gradients) {
        // The batch died downstream: no gradient will come for it. (An error may stand for
        // an item that owed none; the compute thread tells them apart by seq. Never wait
        // on a full queue for it.)
        v1::Gradient none;
        none.set_seq(up.error().seq());
        grads_.TryPush(none);
      }
    }
    Write(FrameItem(up), true);
  }
  grpc::Status st = down_->Finish();
  if (!st.ok()) {
    downstream_failed_ = true;
    Say(absl::StrCat("downstream stream ended: ", SanitizePeerText(st.error_message())));
    inbound_.Close();  // stop taking work; the stream ends with UNAVAILABLE
    outbound_.Close();
  }
  grads_.Close();
}

PortState StreamSession::NextGradient(bool wait, v1::Gradient* out) {
  std::optional<v1::Gradient> g = wait ? grads_.Pop() : grads_.TryPop();
  if (!g) return wait || grads_.closed() ? PortState::kGone : PortState::kPending;
  *out = *std::move(g);
  return PortState::kReady;
}

void StreamSession::QueueDepths(int64_t* inbound, int64_t* inbound_capacity, int64_t* outbound,
                                int64_t* outbound_capacity) {
  *inbound = static_cast<int64_t>(inbound_.size());
  *inbound_capacity = static_cast<int64_t>(inbound_.capacity());
  *outbound = static_cast<int64_t>(outbound_.size());
  *outbound_capacity = static_cast<int64_t>(outbound_.capacity());
}

}  // namespace localpar
