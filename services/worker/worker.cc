// The layer worker: stage compute by update rule, the upstream and downstream links, and
// validation of everything that arrives from outside.
#include "services/worker/worker.h"

#include <google/protobuf/descriptor.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job/checkpoint.h"
#include "common/job/job.h"
#include "common/job/tensor_codec.h"
#include "services/common/grpc_util.h"
#include "services/common/wire.h"

namespace localpar {
namespace {

constexpr size_t kMaxIntervals = 4096;

void ToProto(const HeadStats& s, v1::HeadStatistics* out) {
  out->set_loss_sum(s.loss_sum);
  out->set_correct(s.correct);
  out->set_count(s.count);
}

v1::UpItem ErrorItem(uint64_t seq, int stage, const absl::Status& s) {
  v1::UpItem up;
  v1::ItemError* e = up.mutable_error();
  e->set_seq(seq);
  e->set_stage(stage);
  e->set_code(static_cast<int>(s.code()));
  e->set_message(std::string(s.message()));
  return up;
}

uint64_t SeqOf(const v1::DownItem& item) {
  return item.has_batch() ? item.batch().seq() : item.control().seq();
}

double SecondsSince(int64_t start_ns) { return (MonotonicNanos() - start_ns) * 1e-9; }

}  // namespace

// ---------------------------------------------------------------------------------------
// One upstream stream. Threads: the gRPC handler thread reads and validates items; the
// compute thread trains; a sender thread writes activations downstream; a reader thread
// takes gradients, acknowledgements and errors coming back from downstream.
class WorkerService::Session {
 public:
  Session(WorkerService& w, grpc::ServerContext* ctx, UpStream* up)
      : w_(w),
        ctx_(ctx),
        up_(up),
        inbound_(w.options_.queue_capacity),
        outbound_(w.options_.queue_capacity),
        grads_(256) {
    last_ = w_.stage_index_ + 1 == w_.num_stages_;
    rule_ = w_.trainer_.rule;
    max_delay_ = rule_ == UpdateRule::kOverlap ? w_.config_.overlap_max_delay() : 0;
    int slots = std::max(w_.trainer_.micro_batches, max_delay_ + 1);
    eval_slot_ = slots;
    inputs_.resize(slots + 1);
    labels_.resize(slots + 1);
    wants_gradients_ = !last_ && (rule_ == UpdateRule::kOverlap || rule_ == UpdateRule::kBackprop);
  }

  grpc::Status Run() {
    if (!last_) {
      down_ctx_.set_wait_for_ready(true);
      AddToken(down_ctx_, w_.options_.security);
      down_ = OpenDownStream(*w_.downstream_, &down_ctx_);
      sender_ = std::thread([this] { SenderLoop(); });
      down_reader_ = std::thread([this] { DownReaderLoop(); });
    }
    compute_ = std::thread([this] { ComputeLoop(); });
    v1::DownItem item;
    while (up_->Read(&item)) {
      if (w_.metrics_) w_.metrics_->AddBytes(false, static_cast<int64_t>(item.ByteSizeLong()));
      absl::Status s = w_.CheckItem(item);
      if (!s.ok()) {
        if (s.code() == absl::StatusCode::kCancelled) continue;  // SKIP policy: counted, dropped
        WriteUp(ErrorItem(SeqOf(item), w_.stage_index_, s));
        continue;
      }
      if (!inbound_.Push(std::move(item))) break;
    }
    inbound_.Close();
    compute_.join();
    outbound_.Close();
    if (sender_.joinable()) sender_.join();
    if (down_reader_.joinable()) down_reader_.join();
    {
      std::lock_guard<std::mutex> lock(w_.mu_);
      w_.stats_.set_queue_max_depth(std::max<int64_t>(
          w_.stats_.queue_max_depth(), std::max(inbound_.max_depth(), outbound_.max_depth())));
    }
    if (downstream_failed_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("stage ", w_.stage_index_ + 1, " (downstream) was lost"));
    }
    if (shutdown_after_) w_.RequestShutdown();
    return grpc::Status::OK;
  }

 private:
  void WriteUp(const v1::UpItem& item) { WriteUp(FrameItem(item)); }
  void WriteUp(const grpc::ByteBuffer& framed) {
    std::lock_guard<std::mutex> lock(up_mu_);
    up_->Write(framed);
  }

  void SendDown(grpc::ByteBuffer item, std::function<void()> ready = nullptr) {
    if (last_) return;
    int64_t start = MonotonicNanos();
    outbound_.Push(Outgoing{std::move(item), std::move(ready)});
    send_wait_ += SecondsSince(start);
  }

  void SenderLoop() {
    while (std::optional<Outgoing> item = outbound_.Pop()) {
      if (item->ready) item->ready();  // a device-to-host copy still in flight
      if (w_.metrics_) w_.metrics_->AddBytes(true, static_cast<int64_t>(item->bytes.Length()));
      if (!down_->Write(item->bytes)) {
        downstream_failed_ = true;
        outbound_.Close();  // unblock the compute thread if it waits to hand on a batch
        break;
      }
    }
    down_->WritesDone();
  }

  void DownReaderLoop() {
    v1::UpItem up;
    while (down_->Read(&up)) {
      if (up.has_gradient()) {
        grads_.Push(std::move(*up.mutable_gradient()));
      } else {
        if (up.has_error() && wants_gradients_) {
          // The batch died downstream: no gradient will come for it.
          v1::Gradient none;
          none.set_seq(up.error().seq());
          grads_.Push(std::move(none));
        }
        WriteUp(up);
      }
    }
    grpc::Status st = down_->Finish();
    if (!st.ok()) {
      downstream_failed_ = true;
      std::cerr << "worker " << w_.stage_index_
                << ": downstream stream ended: " << st.error_message() << "\n";
      ctx_->TryCancel();  // take the upstream link down too, so the failure propagates
    }
    grads_.Close();
  }

  void ComputeLoop() {
    int64_t wait_start = MonotonicNanos();
    while (std::optional<v1::DownItem> item = inbound_.Pop()) {
      receive_wait_ = SecondsSince(wait_start);
      std::lock_guard<std::mutex> compute(w_.compute_mu_);
      if (item->has_control()) {
        HandleControl(*item);
      } else if (item->batch().phase() == v1::EVAL) {
        Eval(*item->mutable_batch());
      } else {
        Train(*item->mutable_batch());
      }
      wait_start = MonotonicNanos();
    }
    if (max_delay_ > 0) FlushPending();
  }

  // Hands y on as this batch's activations for the next stage, straight from its memory
  // (see services/common/wire.h); labels move along.
  void SendActivations(v1::Batch& b, const Tensor& y) {
    if (last_) return;
    v1::Batch nb;
    nb.set_seq(b.seq());
    nb.set_epoch(b.epoch());
    nb.set_phase(b.phase());
    nb.set_step(b.step());
    nb.set_micro_batch(b.micro_batch());
    nb.set_micro_batches(b.micro_batches());
    nb.set_batch_rows(b.batch_rows());
    WireBytes bytes =
        PrepareActivations(y, w_.wire_, w_.host_backend(), &staging_, nb.mutable_activations());
    *nb.mutable_labels() = std::move(*b.mutable_labels());
    SendDown(FrameBatch(nb, bytes), std::move(bytes.ready));
  }

  // Returns dx upstream, straight from its memory like activations (always float32).
  void SendGradient(const v1::Batch& b, int micro_batch, const Tensor& dx) {
    v1::Gradient g;
    g.set_seq(b.seq());
    g.set_step(b.step());
    g.set_micro_batch(micro_batch);
    WireBytes bytes = PrepareActivations(dx, WireFormat::kF32, w_.host_backend(), &grad_staging_,
                                         g.mutable_grad());
    if (bytes.ready) bytes.ready();
    WriteUp(FrameGradient(g, bytes));
  }

  // Applies a gradient returned from downstream to `slot`; false when none came.
  bool ApplyReturned(const v1::Gradient& g, int slot) {
    if (!g.has_grad()) return false;
    DecodeTensorInto(g.grad(), *w_.backend_, &returned_);
    w_.stage_->Backward(slot, returned_, nullptr);
    return true;
  }

  void Eval(v1::Batch& b) {
    Tensor& x = inputs_[eval_slot_];
    Tensor& y = labels_[eval_slot_];
    TakeActivations(b.mutable_activations(), *w_.backend_, &x);
    DecodeTensorInto(b.labels(), *w_.backend_, &y);
    ForwardContext ctx{false, 0};
    const Tensor& out = w_.stage_->Forward(x, eval_slot_, ctx);
    HeadStats hs = w_.stage_->Head(eval_slot_, y, HeadMode::kEval, 1.0f, ctx);
    eval_.Add(hs);
    SendActivations(b, out);
    if (w_.metrics_) w_.metrics_->AddExamples(false, hs.count);
  }

  void Train(v1::Batch& b) {
    int64_t start = MonotonicNanos();
    Stage& st = *w_.stage_;
    const int k = w_.stage_index_;
    const int m = rule_ == UpdateRule::kBackprop ? b.micro_batch() : 0;
    const int M = rule_ == UpdateRule::kBackprop ? std::max(1, b.micro_batches()) : 1;
    const int slot = max_delay_ > 0 ? static_cast<int>(b.step() % (max_delay_ + 1)) : m;
    const float scale = LossScale(b.batch_rows(), w_.labels_per_example_);
    const float lr = LearningRate(w_.trainer_.schedule, b.step(), w_.trainer_.total_steps);
    Tensor& x = inputs_[slot];
    Tensor& labels = labels_[slot];
    TakeActivations(b.mutable_activations(), *w_.backend_, &x);
    DecodeTensorInto(b.labels(), *w_.backend_, &labels);
    ForwardContext ctx{true, StepSeed(w_.trainer_.seed, b.step(), m)};
    const Tensor& y = st.Forward(x, slot, ctx);
    double forward = SecondsSince(start);
    send_wait_ = 0;
    SendActivations(b, y);
    int64_t backward_start = MonotonicNanos();
    HeadStats hs;
    bool update = true;
    switch (rule_) {
      case UpdateRule::kGreedy:
      case UpdateRule::kChunked:
        hs = st.Head(slot, labels, HeadMode::kLocal, scale, ctx);
        st.Backward(slot, st.head_grad(slot), nullptr);
        break;
      case UpdateRule::kOverlap:
        hs = st.Head(slot, labels, HeadMode::kLocal, scale, ctx);
        st.Backward(slot, st.head_grad(slot), k > 0 ? &dx_ : nullptr);
        if (k > 0) SendGradient(b, 0, dx_);
        if (!last_) {
          if (max_delay_ == 0) {
            std::optional<v1::Gradient> g = grads_.Pop();
            if (g) ApplyReturned(*g, slot);
          } else {
            pending_.push_back(b.step());
            current_step_ = b.step();
            ApplyArrived(false);
          }
        }
        break;
      case UpdateRule::kBackprop:
        if (last_) {
          hs = st.Head(slot, labels, HeadMode::kLocal, scale, ctx);
          st.Backward(slot, st.head_grad(slot), k > 0 ? &dx_ : nullptr);
          if (k > 0) SendGradient(b, m, dx_);
        } else {
          hs = st.Head(slot, labels, HeadMode::kProbe, scale, ctx);
          if (m == M - 1) {
            // GPipe flush: every micro-batch's gradient, in order, then one update.
            for (int j = 0; j < M; ++j) {
              std::optional<v1::Gradient> g = grads_.Pop();
              if (!g || !g->has_grad()) continue;
              DecodeTensorInto(g->grad(), *w_.backend_, &returned_);
              st.Backward(j, returned_, k > 0 ? &dx_ : nullptr);
              if (k > 0) SendGradient(b, j, dx_);
            }
          }
        }
        update = m == M - 1;
        break;
    }
    // The backward phase excludes time spent waiting to hand activations or gradients on.
    double backward = SecondsSince(backward_start);
    int64_t update_start = MonotonicNanos();
    if (update) st.Step(lr);
    double update_seconds = SecondsSince(update_start);
    if (w_.options_.debug_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(w_.options_.debug_delay_ms));
    }
    int64_t end = MonotonicNanos();
    if (WorkerMetrics* m = w_.metrics_) {
      m->ObservePhase("receive_wait", receive_wait_);
      m->ObservePhase("forward", forward);
      m->ObservePhase("backward", backward);
      m->ObservePhase("update", update_seconds);
      m->ObservePhase("send_wait", send_wait_);
      m->AddExamples(true, x.rows());
      if (update) m->AddStep();
      if (hs.count > 0) m->SetTrainHead(hs.mean_loss(), hs.accuracy());
      m->SetQueue(true, static_cast<int64_t>(inbound_.size()),
                  static_cast<int64_t>(inbound_.capacity()));
      m->SetQueue(false, static_cast<int64_t>(outbound_.size()),
                  static_cast<int64_t>(outbound_.capacity()));
      if (++batches_ % 16 == 1) m->SetMemory(ResidentBytes(), w_.backend_->DeviceBytesInUse());
    }
    std::lock_guard<std::mutex> lock(w_.mu_);
    w_.stats_.set_queue_depth(static_cast<int64_t>(inbound_.size()));
    w_.stats_.set_queue_max_depth(std::max<int64_t>(
        w_.stats_.queue_max_depth(), std::max(inbound_.max_depth(), outbound_.max_depth())));
    w_.recent_.Add(hs);
    if (update) w_.stats_.set_steps(w_.stats_.steps() + 1);
    w_.stats_.set_examples(w_.stats_.examples() + x.rows());
    train_seconds_ += (end - start) * 1e-9;
    v1::Interval iv;
    iv.set_seq(b.seq());
    iv.set_start_ns(start);
    iv.set_end_ns(end);
    w_.intervals_.push_back(iv);
    if (w_.intervals_.size() > kMaxIntervals) w_.intervals_.pop_front();
  }

  // Asynchronous OVERLAP: applies every gradient that has arrived, waiting only for those
  // that would otherwise fall more than max_delay steps behind (or for all, to flush).
  void ApplyArrived(bool flush) {
    const int64_t step = current_step_;
    while (!pending_.empty()) {
      bool must_wait = flush || pending_.front() + max_delay_ <= step;
      std::optional<v1::Gradient> g = must_wait ? grads_.Pop() : grads_.TryPop();
      if (!g) {
        if (must_wait) pending_.clear();  // downstream is gone
        return;
      }
      int64_t sent = pending_.front();
      pending_.pop_front();
      ApplyReturned(*g, static_cast<int>(sent % (max_delay_ + 1)));
      std::lock_guard<std::mutex> lock(w_.mu_);
      int64_t delay = step - sent;
      w_.delay_sum_ += static_cast<double>(delay);
      ++w_.delay_count_;
      if (delay > w_.stats_.overlap_max_delay_seen()) w_.stats_.set_overlap_max_delay_seen(delay);
    }
  }

  void FlushPending() { ApplyArrived(true); }

  void HandleControl(v1::DownItem& item) {
    const v1::Control& c = item.control();
    if (max_delay_ > 0) FlushPending();
    if (c.kind() == v1::Control::CHECKPOINT) {
      int64_t steps;
      {
        std::lock_guard<std::mutex> lock(w_.mu_);
        steps = w_.stats_.steps();
      }
      std::string file = absl::StrCat(c.path(), "/stage-", w_.stage_index_, ".ckpt");
      absl::Status s = SaveStageFile(*w_.stage_, w_.stage_index_, steps, file);
      if (!s.ok()) {
        // The marker stops here: the checkpoint cannot commit without this stage.
        WriteUp(ErrorItem(c.seq(), w_.stage_index_, s));
        return;
      }
    }
    if (c.kind() == v1::Control::END_OF_EPOCH || c.kind() == v1::Control::END_OF_EVAL) {
      std::lock_guard<std::mutex> lock(w_.mu_);
      v1::EpochStatistics& e = w_.epochs_[c.epoch()];
      e.set_epoch(c.epoch());
      if (c.kind() == v1::Control::END_OF_EPOCH) {
        ToProto(w_.recent_, e.mutable_train());
        e.set_train_seconds(train_seconds_);
        e.set_resident_bytes(ResidentBytes());
        w_.recent_ = HeadStats();
        train_seconds_ = 0;
      } else if (c.kind() == v1::Control::END_OF_EVAL) {
        ToProto(eval_, e.mutable_eval());
        if (w_.metrics_) w_.metrics_->SetEvalAccuracy(eval_.accuracy());
        eval_ = HeadStats();
      }
    }
    if (c.kind() == v1::Control::SHUTDOWN) shutdown_after_ = true;
    if (last_) {
      v1::UpItem up;
      v1::Ack* ack = up.mutable_ack();
      ack->set_seq(c.seq());
      ack->set_kind(c.kind());
      ack->set_epoch(c.epoch());
      WriteUp(up);
    } else {
      SendDown(FrameItem(item));
    }
  }

  WorkerService& w_;
  grpc::ServerContext* ctx_;
  UpStream* up_;
  std::mutex up_mu_;  // one writer at a time on the upstream stream
  BoundedQueue<v1::DownItem> inbound_;
  struct Outgoing {
    grpc::ByteBuffer bytes;
    std::function<void()> ready;  // waits for the bytes (see WireBytes)
  };
  BoundedQueue<Outgoing> outbound_;  // framed items for the next stage
  BoundedQueue<v1::Gradient> grads_;
  grpc::ClientContext down_ctx_;
  std::unique_ptr<DownStream> down_;
  std::thread compute_, sender_, down_reader_;
  std::atomic<bool> downstream_failed_{false};
  bool shutdown_after_ = false;  // a SHUTDOWN control item passed through
  bool last_ = false;
  bool wants_gradients_ = false;
  UpdateRule rule_;
  int max_delay_ = 0;
  int eval_slot_ = 1;
  std::vector<Tensor> inputs_, labels_;
  Tensor dx_, returned_;
  // Host bytes of converted or device tensors on their way out, pinned while sent.
  Tensor staging_, grad_staging_;
  std::deque<int64_t> pending_;  // async OVERLAP: steps awaiting their returned gradient
  int64_t current_step_ = 0;
  HeadStats eval_;
  double train_seconds_ = 0;
  double receive_wait_ = 0, send_wait_ = 0;  // of the batch being computed
  int64_t batches_ = 0;
};

// ---------------------------------------------------------------------------------------
WorkerService::WorkerService(const WorkerOptions& options, WorkerMetrics* metrics)
    : options_(options), metrics_(metrics) {
  // Worker.Stream writes pre-framed UpItems (returned gradients without a copy): the same
  // messages on the wire, written as bytes. Requests stay ordinary DownItems.
  const int stream_method = google::protobuf::DescriptorPool::generated_pool()
                                ->FindServiceByName(v1::Worker::service_full_name())
                                ->FindMethodByName("Stream")
                                ->index();
  MarkMethodStreamed(
      stream_method,
      new grpc::internal::BidiStreamingHandler<WorkerService, v1::DownItem, grpc::ByteBuffer>(
          [](WorkerService* self, grpc::ServerContext* ctx, UpStream* up) {
            return self->ServeStream(ctx, up);
          },
          this));
}
WorkerService::~WorkerService() = default;

grpc::Status WorkerService::Configure(grpc::ServerContext* ctx, const v1::ConfigureRequest* req,
                                      v1::ConfigureResponse* resp) {
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) return auth;
  std::lock_guard<std::mutex> lock(mu_);
  if (streaming_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "cannot reconfigure while an upstream stream is open");
  }
  v1::Job job = req->job();
  ApplyJobDefaults(job);
  if (absl::Status s = ValidateJob(job); !s.ok()) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("job: ", s.message())));
  }
  if (req->stage() < 0 || req->stage() >= job.stages_size()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("stage: ", req->stage(), " is not in 0..", job.stages_size() - 1)));
  }
  bool last = req->stage() + 1 == job.stages_size();
  if (last != req->downstream().empty()) {
    return ToGrpcStatus(absl::InvalidArgumentError(last ? "downstream: the last stage has none"
                                                        : "downstream: required for this stage"));
  }
  if (req->overlap_max_delay() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("overlap_max_delay: must be >= 0"));
  }
  if (!backend_) {
    if (options_.device == "cuda" || options_.device == "auto") backend_ = MakeCudaBackend(0);
    if (!backend_ && options_.device == "cuda") {
      return ToGrpcStatus(absl::FailedPreconditionError("--device=cuda: no CUDA device"));
    }
    if (!backend_) {
      CpuOptions cpu;
      cpu.threads = options_.threads;
      backend_ = MakeCpuBackend(cpu);
    }
  }
  ApplyJobToBackend(job, *backend_);
  ModelConfig mc = ToModelConfig(job);
  Shape in = StageInputShape(mc, req->stage());
  std::string error;
  stage_ = Stage::Create(*backend_, mc.stages[req->stage()], in, mc.classes, mc.optimizer,
                         StageSeed(mc.seed, req->stage()), &error);
  if (!stage_) return ToGrpcStatus(absl::InvalidArgumentError(error));
  int64_t restored_steps = 0;
  if (!req->restore_path().empty()) {
    std::string file = absl::StrCat(req->restore_path(), "/stage-", req->stage(), ".ckpt");
    if (absl::Status s = LoadStageFile(*stage_, file); !s.ok()) {
      stage_.reset();
      configured_ = false;
      return ToGrpcStatus(s);
    }
    restored_steps = stage_->optimizer().steps();
  }
  config_ = *req;
  *config_.mutable_job() = job;
  stage_index_ = req->stage();
  num_stages_ = job.stages_size();
  classes_ = JobClasses(job);
  labels_per_example_ = JobLabelsPerExample(job);
  wire_ = static_cast<WireFormat>(job.wire());
  trainer_ = ToTrainerOptions(job, req->total_steps());
  if (metrics_) metrics_->Configure(job.name(), stage_index_);
  downstream_ = last ? nullptr : MakeChannel(req->downstream(), options_.security);
  if (!host_backend_ && backend_->device() != DeviceType::kCPU) {
    host_backend_ = backend_->MakeStagingHost();  // page-locked: asynchronous copies
  }
  auto rejected = stats_.rejected();  // refusals before this Configure still count
  stats_ = v1::StatsResponse();
  *stats_.mutable_rejected() = rejected;
  stats_.set_stage(stage_index_);
  stats_.set_steps(restored_steps);
  stats_.set_queue_capacity(options_.queue_capacity);
  recent_ = HeadStats();
  epochs_.clear();
  intervals_.clear();
  configured_ = true;
  resp->set_backend(backend_->Describe());
  resp->set_parameters(stage_->num_parameters());
  for (int64_t d : stage_->input_shape()) resp->add_input_shape(d);
  for (int64_t d : stage_->output_shape()) resp->add_output_shape(d);
  return grpc::Status::OK;
}

void WorkerService::Reject(const std::string& reason) {
  if (metrics_) metrics_->AddRejected(reason);
  std::lock_guard<std::mutex> lock(mu_);
  (*stats_.mutable_rejected())[reason] += 1;
}

// Everything that arrives from outside is checked here before it reaches the compute
// thread. Returns CANCELLED for items dropped silently by the SKIP policy.
absl::Status WorkerService::CheckItem(const v1::DownItem& item) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!configured_) {
    lock.unlock();
    Reject("before_configure");
    return absl::FailedPreconditionError(
        absl::StrCat("item seq ", SeqOf(item), " arrived before Configure"));
  }
  Shape in = stage_->input_shape();
  v1::ConfigureRequest::NonFinite policy = config_.non_finite();
  lock.unlock();
  if (item.has_control()) {
    const v1::Control& c = item.control();
    if (c.kind() == v1::Control::CHECKPOINT && c.path().empty()) {
      Reject("unknown_control");
      return absl::InvalidArgumentError("control.path: a CHECKPOINT needs a directory");
    }
    if (!v1::Control::Kind_IsValid(c.kind()) || c.kind() == v1::Control::KIND_UNSPECIFIED) {
      Reject("unknown_control");
      return absl::InvalidArgumentError(
          absl::StrCat("control.kind: unknown control item ", static_cast<int>(c.kind())));
    }
    return absl::OkStatus();
  }
  if (!item.has_batch()) {
    Reject("empty_item");
    return absl::InvalidArgumentError("item: neither batch nor control is set");
  }
  const v1::Batch& b = item.batch();
  if (absl::Status s = CheckWireTensor(b.activations(), "batch.activations"); !s.ok()) {
    Reject("malformed_tensor");
    return s;
  }
  const v1::DType wire = WireDType(wire_);
  if (b.activations().dtype() != v1::F32 &&
      (stage_index_ == 0 || b.activations().dtype() != wire)) {
    Reject("wrong_dtype");
    return absl::InvalidArgumentError(absl::StrCat(
        "batch.activations.dtype: this stage takes F32",
        stage_index_ > 0 && wire != v1::F32 ? absl::StrCat(" or ", v1::DType_Name(wire)) : "",
        " activations, got ", v1::DType_Name(b.activations().dtype())));
  }
  const auto& shape = b.activations().shape();
  Shape per_example(shape.begin() + 1, shape.end());
  if (NumElements(per_example) != NumElements(in) || shape[0] <= 0) {
    Reject("wrong_shape");
    return absl::InvalidArgumentError(
        absl::StrCat("batch.activations.shape: [", absl::StrJoin(shape, ","),
                     "] does not fit stage ", stage_index_, "'s input ", ShapeString(in)));
  }
  if (absl::Status s = CheckWireTensor(b.labels(), "batch.labels"); !s.ok()) {
    Reject("malformed_tensor");
    return s;
  }
  const auto& lshape = b.labels().shape();
  const int64_t want_labels = shape[0] * labels_per_example_;
  if (b.labels().dtype() != v1::I32 || lshape.empty() || lshape[0] != shape[0] ||
      NumElements(Shape(lshape.begin(), lshape.end())) != want_labels) {
    Reject("wrong_labels");
    return absl::InvalidArgumentError(
        absl::StrCat("batch.labels: need I32 with ", labels_per_example_,
                     " label(s) for each of the ", shape[0], " examples, got ",
                     v1::DType_Name(b.labels().dtype()), " [", absl::StrJoin(lshape, ","), "]"));
  }
  const int32_t* labels = reinterpret_cast<const int32_t*>(b.labels().data().data());
  for (int64_t i = 0; i < want_labels; ++i) {
    if (labels[i] < 0 || labels[i] >= classes_) {
      Reject("label_out_of_range");
      return absl::InvalidArgumentError(
          absl::StrCat("batch.labels[", i, "] = ", labels[i], " is outside 0..", classes_ - 1));
    }
  }
  if (b.phase() != v1::TRAIN && b.phase() != v1::EVAL) {
    Reject("unknown_phase");
    return absl::InvalidArgumentError("batch.phase: must be TRAIN or EVAL");
  }
  if (b.phase() == v1::TRAIN && b.micro_batches() > 0 &&
      (b.micro_batch() < 0 || b.micro_batch() >= b.micro_batches() ||
       b.micro_batches() != trainer_.micro_batches)) {
    Reject("bad_micro_batch");
    return absl::InvalidArgumentError(absl::StrCat("batch.micro_batch: ", b.micro_batch(), " of ",
                                                   b.micro_batches(), " does not fit the job's ",
                                                   trainer_.micro_batches, " micro-batches"));
  }
  // The first NaN or Inf, in whichever format the activations travel.
  const std::string& bytes = b.activations().data();
  int64_t bad = -1;
  if (b.activations().dtype() == v1::F32) {
    const float* x = reinterpret_cast<const float*>(bytes.data());
    for (int64_t i = 0, n = static_cast<int64_t>(bytes.size() / 4); i < n && bad < 0; ++i) {
      if (!std::isfinite(x[i])) bad = i;
    }
  } else {
    // All-ones exponent: bf16 0x7f80, f16 0x7c00.
    const uint16_t mask = b.activations().dtype() == v1::BF16 ? 0x7f80 : 0x7c00;
    const uint16_t* h = reinterpret_cast<const uint16_t*>(bytes.data());
    for (int64_t i = 0, n = static_cast<int64_t>(bytes.size() / 2); i < n && bad < 0; ++i) {
      if ((h[i] & mask) == mask) bad = i;
    }
  }
  if (bad < 0) return absl::OkStatus();
  if (policy == v1::ConfigureRequest::SKIP) {
    Reject("non_finite_skipped");
    return absl::CancelledError("skipped");
  }
  Reject("non_finite");
  return absl::InvalidArgumentError(
      absl::StrCat("batch.activations: non-finite value at index ", bad));
}

grpc::Status WorkerService::ServeStream(grpc::ServerContext* ctx, UpStream* up) {
  // Feeding a stage is as privileged as configuring it.
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) return auth;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (streaming_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this worker already has an upstream stream");
    }
    streaming_ = true;
  }
  grpc::Status result;
  bool configured;
  {
    std::lock_guard<std::mutex> lock(mu_);
    configured = configured_;
  }
  if (!configured) {
    // Keep serving, refusing each item, so a client learns what is wrong.
    v1::DownItem item;
    while (up->Read(&item)) {
      absl::Status s = CheckItem(item);
      up->Write(FrameItem(ErrorItem(SeqOf(item), -1, s)));
    }
  } else {
    Session session(*this, ctx, up);
    result = session.Run();
  }
  std::lock_guard<std::mutex> lock(mu_);
  streaming_ = false;
  return result;
}

grpc::Status WorkerService::Stats(grpc::ServerContext*, const v1::StatsRequest* req,
                                  v1::StatsResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  *resp = stats_;
  ToProto(recent_, resp->mutable_recent());
  for (const auto& [epoch, e] : epochs_) *resp->add_epochs() = e;
  resp->set_resident_bytes(ResidentBytes());
  resp->set_baseline_bytes(baseline_bytes_);
  if (stage_) {
    resp->set_state_bytes(stage_->StateBytes());
    resp->set_activation_bytes_per_example(stage_->ActivationBytesPerExample());
  }
  if (delay_count_ > 0) resp->set_overlap_mean_delay(delay_sum_ / delay_count_);
  if (req->include_intervals()) {
    for (const v1::Interval& iv : intervals_) *resp->add_intervals() = iv;
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::GetWeights(grpc::ServerContext* ctx, const v1::WeightsRequest*,
                                       v1::StageWeights* resp) {
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) return auth;
  std::lock_guard<std::mutex> compute(compute_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  if (!configured_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "not configured");
  *resp = SnapshotStage(*stage_, stage_index_);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Shutdown(grpc::ServerContext* ctx, const v1::ShutdownRequest*,
                                     v1::ShutdownResponse*) {
  if (grpc::Status auth = CheckToken(*ctx, options_.security); !auth.ok()) return auth;
  RequestShutdown();
  return grpc::Status::OK;
}

void WorkerService::RequestShutdown() {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  shutdown_ = true;
  shutdown_cv_.notify_all();
}

void WorkerService::WaitForShutdown() {
  std::unique_lock<std::mutex> lock(shutdown_mu_);
  shutdown_cv_.wait(lock, [&] { return shutdown_; });
}

namespace {

// Self-pipe: a handler (not sigwait) because libraries such as OpenBLAS start threads before
// main, with signals unblocked, so any thread may be the one that receives SIGTERM.
int g_signal_pipe[2] = {-1, -1};
void OnTerminate(int sig) {
  char c = static_cast<char>(sig);
  (void)!write(g_signal_pipe[1], &c, 1);
}

}  // namespace

int RunWorker(const WorkerOptions& options) {
  ConfigureAllocatorForMessages();
  if (pipe(g_signal_pipe) != 0) return 1;
  struct sigaction sa = {};
  sa.sa_handler = OnTerminate;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  std::unique_ptr<MetricsServer> metrics_server;
  std::unique_ptr<WorkerMetrics> metrics;
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> ms =
        MetricsServer::Start(options.metrics_listen);
    if (!ms.ok()) {
      std::cerr << "localpar_worker: " << ms.status().message() << "\n";
      return 2;
    }
    metrics_server = *std::move(ms);
    metrics = std::make_unique<WorkerMetrics>(metrics_server->registry());
  }
  WorkerService service(options, metrics.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServer(builder);
  int port = 0;
  builder.AddListeningPort(options.listen, ServerCredentials(options.security), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "localpar_worker: cannot listen on " << options.listen
              << " (in use, or not a valid address)\n";
    return 2;
  }
  if (!options.port_file.empty()) {
    std::string tmp = options.port_file + ".tmp";
    // "GRPC_PORT METRICS_PORT" (0 when metrics are off).
    std::ofstream(tmp) << port << " " << (metrics_server ? metrics_server->port() : 0) << "\n";
    std::filesystem::rename(tmp, options.port_file);
  }
  std::cerr << "localpar_worker: serving on port " << port;
  if (metrics_server) std::cerr << ", metrics on port " << metrics_server->port();
  std::cerr << "\n";
  std::thread signals([&] {
    char c = 0;
    if (read(g_signal_pipe[0], &c, 1) == 1 && c != 0) {
      std::cerr << "localpar_worker: signal " << int{c} << ": draining and shutting down\n";
      service.RequestShutdown();
    }
  });
  service.WaitForShutdown();
  // Streams in flight get a grace period to finish their batches.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  char zero = 0;
  (void)!write(g_signal_pipe[1], &zero, 1);  // wake the signal thread if no signal came
  signals.join();
  return 0;
}

}  // namespace localpar
