// The coordinator: configuration, data streaming, evaluation, progress and the report.
#include "services/coordinator/coordinator.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job/checkpoint.h"
#include "common/job/run.h"
#include "common/job/tensor_codec.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/grpc_util.h"
#include "services/common/metrics.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::system_clock::time_point Deadline(int seconds) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
}

void SetWireTensor(v1::Tensor* t, v1::DType dtype, const Shape& shape, const void* data,
                   size_t bytes) {
  t->set_dtype(dtype);
  for (int64_t d : shape) t->add_shape(d);
  t->set_data(data, bytes);
}

HeadStats FromProto(const v1::HeadStatistics& s) {
  HeadStats h;
  h.loss_sum = s.loss_sum();
  h.correct = s.correct();
  h.count = s.count();
  return h;
}

// The link to stage 0: writes batches and control items, and reads acknowledgements and
// in-band errors coming back up the pipeline.
class Pipeline {
 public:
  // `on_item` sees every acknowledgement and error, on the reader thread, before waiters
  // are woken (so a checkpoint commits before a later DRAIN's ack is visible).
  Pipeline(v1::Worker::Stub& first, const SecurityOptions& security,
           std::function<void(const v1::UpItem&)> on_item)
      : on_item_(std::move(on_item)) {
    ctx_.set_wait_for_ready(true);
    AddToken(ctx_, security);
    stream_ = first.Stream(&ctx_);
    reader_ = std::thread([this] { ReadLoop(); });
  }
  ~Pipeline() {
    if (reader_.joinable()) {
      ctx_.TryCancel();
      reader_.join();
    }
  }

  bool Send(const v1::DownItem& item) { return !broken_ && stream_->Write(item); }

  // Waits for the acknowledgement of control item `seq`; false if the pipeline broke.
  bool WaitAck(uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return broken_ || acked_.count(seq) > 0; });
    return acked_.count(seq) > 0;
  }

  // Closes the stream (once); returns the final status.
  grpc::Status Finish() {
    if (reader_.joinable()) {
      stream_->WritesDone();
      reader_.join();
    }
    return status_;
  }

 private:
  void ReadLoop() {
    v1::UpItem up;
    while (stream_->Read(&up)) {
      if (on_item_) on_item_(up);
      if (up.has_ack()) {
        std::lock_guard<std::mutex> lock(mu_);
        acked_.insert(up.ack().seq());
        cv_.notify_all();
      } else if (up.has_error()) {
        std::cerr << "\nlocalpar: stage " << up.error().stage() << " refused item "
                  << up.error().seq() << ": " << up.error().message() << "\n";
      }
    }
    status_ = stream_->Finish();
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    cv_.notify_all();
  }

  std::function<void(const v1::UpItem&)> on_item_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DownItem, v1::UpItem>> stream_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<uint64_t> acked_;
  std::atomic<bool> broken_{false};
  grpc::Status status_;
};

class Coordinator;

// The Coordinator gRPC service: a job's status for `localpar status`.
class StatusService final : public v1::Coordinator::Service {
 public:
  explicit StatusService(Coordinator& c) : c_(c) {}
  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*, v1::JobStatus*) override;
  grpc::Status Checkpoint(grpc::ServerContext*, const v1::CheckpointRequest*,
                          v1::CheckpointResponse*) override;

 private:
  Coordinator& c_;
};

class Coordinator {
 public:
  Coordinator(const CoordinatorOptions& o, v1::Job job, DataSplit data, CoordinatorMetrics* metrics)
      : o_(o), job_(std::move(job)), data_(std::move(data)), metrics_(metrics) {}

  const std::string& job_name() const { return job_.name(); }
  uint64_t seed() const { return job_.seed(); }

  int Run() {
    if (resume_) next_checkpoint_id_ = resume_->manifest.id() + 1;
    const int stages = job_.stages_size();
    total_steps_ = TotalSteps(job_, data_.train.size());
    for (const std::string& addr : o_.workers) {
      stubs_.push_back(v1::Worker::NewStub(MakeChannel(addr, o_.security)));
    }
    StatusService status(*this);
    std::unique_ptr<grpc::Server> status_server;
    if (!o_.status_listen.empty()) {
      grpc::ServerBuilder builder;
      ConfigureServer(builder);
      int port = 0;
      builder.AddListeningPort(o_.status_listen, ServerCredentials(o_.security), &port);
      builder.RegisterService(&status);
      status_server = builder.BuildAndStart();
      if (!status_server || port == 0) {
        std::cerr << "localpar: cannot serve status on " << o_.status_listen << "\n";
        return kExitUsage;
      }
      if (!o_.status_port_file.empty()) {
        std::string tmp = o_.status_port_file + ".tmp";
        std::ofstream(tmp) << port << "\n";
        std::rename(tmp.c_str(), o_.status_port_file.c_str());
      }
    }
    auto start = Clock::now();
    started_ = start;
    std::thread progress([&] { ProgressLoop(); });
    // Train; when the pipeline breaks and checkpoints exist, wait for every stage to come
    // back (the launcher or Kubernetes restarts them), roll all of them back to the last
    // committed checkpoint and replay from its data cursor.
    std::unique_ptr<Pipeline> pipe;
    bool drained = false;
    int rc = kExitOk;
    for (int attempt = 0;; ++attempt) {
      rc = ConfigureAll();
      if (rc != kExitOk) break;
      pipe = std::make_unique<Pipeline>(*stubs_[0], o_.security,
                                        [this](const v1::UpItem& up) { OnPipelineItem(up); });
      bool fed = Feed(*pipe);
      uint64_t drain = NextSeq();
      drained = fed && SendControl(*pipe, v1::Control::DRAIN, 0, drain) && pipe->WaitAck(drain);
      if (drained) break;
      rc = Recover(*pipe, attempt);
      if (rc != kExitOk) break;
    }
    {
      std::lock_guard<std::mutex> lock(progress_mu_);
      done_ = true;
    }
    progress_cv_.notify_all();
    progress.join();
    if (!drained) return rc;
    report_.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    rc = Collect(stages);
    // Shutdown travels in-band like every control item: each worker passes it on, then
    // exits once its upstream stream closes.
    uint64_t bye = NextSeq();
    if (SendControl(*pipe, v1::Control::SHUTDOWN, 0, bye)) pipe->WaitAck(bye);
    grpc::Status fin = pipe->Finish();
    if (!fin.ok() && rc == kExitOk) return LostWorker(*pipe);
    if (stopped_early_) {
      std::cerr << "localpar: stopped after step " << report_.steps << " at checkpoint "
                << last_committed_ << "; continue with --resume\n";
    }
    return rc;
  }

 private:
  uint64_t NextSeq() { return ++seq_; }

  // Which stages answer a Stats call now ("" when all do).
  std::string Unreachable(int deadline_s) {
    std::vector<v1::StatsResponse> s = PollStats(false, deadline_s);
    std::string lost;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k].stage() < 0) {
        absl::StrAppend(&lost, lost.empty() ? "" : ", ", "stage ", k, " (", o_.workers[k], ")");
      }
    }
    return lost;
  }

  int Recover(Pipeline& pipe, int attempt) {
    grpc::Status st = pipe.Finish();
    std::string lost = Unreachable(2);
    std::string last = last_committed_.empty() ? "none" : last_committed_;
    if (o_.checkpoint_dir.empty() || attempt >= o_.max_recoveries) {
      std::cerr << "\nlocalpar: the pipeline broke ("
                << (lost.empty() ? "every stage still answers" : "lost " + lost) << "; "
                << st.error_message() << ")"
                << (o_.checkpoint_dir.empty()
                        ? "; no --checkpoint_dir to recover from"
                        : "; giving up after " + std::to_string(attempt) + " recoveries")
                << "; last checkpoint: " << last << "\n";
      return kExitWorkerLost;
    }
    std::cerr << "\nlocalpar: the pipeline broke ("
              << (lost.empty() ? "a stream failed" : "lost " + lost) << "); waiting up to "
              << o_.recovery_timeout_s << " s for every stage\n";
    // Exponential backoff up to 2 s between probes, within the deadline.
    auto deadline = Clock::now() + std::chrono::seconds(o_.recovery_timeout_s);
    std::chrono::milliseconds backoff(100);
    while (!(lost = Unreachable(1)).empty()) {
      if (Clock::now() > deadline) {
        std::cerr << "localpar: " << lost << " did not come back within " << o_.recovery_timeout_s
                  << " s; last checkpoint: " << last << "\n";
        return kExitWorkerLost;
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    }
    {
      std::lock_guard<std::mutex> lock(checkpoint_mu_);
      pending_checkpoints_.clear();  // markers in flight died with the pipeline
    }
    absl::StatusOr<FoundCheckpoint> found = FindLatestCheckpoint(o_.checkpoint_dir);
    RemoveUncommittedCheckpoints(o_.checkpoint_dir);
    if (found.ok()) {
      for (const std::string& why : found->skipped) {
        std::cerr << "localpar: skipping a damaged checkpoint: " << why << "\n";
      }
      std::cerr << "localpar: rolling every stage back to " << found->dir << " (step "
                << found->manifest.step() << ") and replaying\n";
      next_checkpoint_id_ = std::max(next_checkpoint_id_, found->manifest.id() + 1);
      resume_ = *std::move(found);
    } else {
      std::cerr << "localpar: no committed checkpoint yet; restarting from step 0\n";
      resume_.reset();
    }
    last_started_step_ = -1;
    ++recoveries_;
    return kExitOk;
  }

  int ConfigureAll() {
    for (int k = 0; k < static_cast<int>(stubs_.size()); ++k) {
      v1::ConfigureRequest req;
      *req.mutable_job() = job_;
      req.set_stage(k);
      if (k + 1 < static_cast<int>(stubs_.size())) req.set_downstream(o_.workers[k + 1]);
      req.set_total_steps(total_steps_);
      req.set_non_finite(o_.non_finite);
      req.set_overlap_max_delay(o_.overlap_max_delay);
      if (resume_) req.set_restore_path(resume_->dir);
      v1::ConfigureResponse resp;
      grpc::Status st;
      // A worker refuses while its previous upstream stream is still winding down.
      auto until = Clock::now() + std::chrono::seconds(o_.configure_timeout_s);
      do {
        grpc::ClientContext ctx;
        ctx.set_wait_for_ready(true);
        ctx.set_deadline(Deadline(o_.configure_timeout_s));
        AddToken(ctx, o_.security);
        st = stubs_[k]->Configure(&ctx, req, &resp);
        if (st.error_code() != grpc::StatusCode::FAILED_PRECONDITION ||
            st.error_message().find("stream is open") == std::string::npos) {
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      } while (Clock::now() < until);
      if (!st.ok()) {
        std::cerr << "localpar: configuring stage " << k << " at " << o_.workers[k]
                  << " failed: " << st.error_message() << "\n";
        if (st.error_code() == grpc::StatusCode::DATA_LOSS ||
            st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
          return kExitFailure;  // a checkpoint file the worker could not restore
        }
        return st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? kExitBadJob
                                                                     : kExitWorkerLost;
      }
      if (k == 0) report_.parameters = 0;
      report_.parameters += resp.parameters();
      if (k == 0) report_.backend = resp.backend();
    }
    return kExitOk;
  }

  bool SendControl(Pipeline& pipe, v1::Control::Kind kind, int epoch, uint64_t seq) {
    v1::DownItem item;
    v1::Control* c = item.mutable_control();
    c->set_seq(seq);
    c->set_kind(kind);
    c->set_epoch(epoch);
    return pipe.Send(item);
  }

  bool SendBatch(Pipeline& pipe, const BatchAssembler& a, int64_t begin, int64_t rows, int epoch,
                 v1::Phase phase, int64_t step, int mb, int mbs) {
    v1::DownItem item;
    v1::Batch* b = item.mutable_batch();
    b->set_seq(NextSeq());
    b->set_epoch(epoch);
    b->set_phase(phase);
    b->set_step(step);
    b->set_micro_batch(mb);
    b->set_micro_batches(mbs);
    b->set_batch_rows(a.rows());
    Shape xs = a.x_shape();
    xs[0] = rows;
    int64_t per = NumElements(xs) / std::max<int64_t>(rows, 1);
    SetWireTensor(b->mutable_activations(), v1::F32, xs, a.x() + begin * per,
                  static_cast<size_t>(rows * per) * 4);
    Shape ys = a.y_shape();
    ys[0] = rows;
    int64_t labels_per = NumElements(ys) / std::max<int64_t>(rows, 1);
    SetWireTensor(b->mutable_labels(), v1::I32, ys, a.y() + begin * labels_per,
                  static_cast<size_t>(rows * labels_per) * 4);
    return pipe.Send(item);
  }

  // The same batches in the same order as the reference trainer (RunReference).
  bool Feed(Pipeline& pipe) {
    const int64_t batch = job_.batch_size(), n = data_.train.size();
    const int mbs = job_.rule() == v1::BACKPROP ? job_.micro_batches() : 1;
    BatchAssembler train(data_.train, batch), test(data_.test, job_.eval_batch_size());
    std::vector<int64_t> test_order(static_cast<size_t>(data_.test.size()));
    for (int64_t i = 0; i < data_.test.size(); ++i) test_order[i] = i;
    // Where to start: the beginning, or a checkpoint's data cursor.
    int64_t step = resume_ ? resume_->manifest.step() : 0;
    int first_epoch = resume_ ? resume_->manifest.epoch() : 0;
    int64_t first_batch = resume_ ? resume_->manifest.batch_in_epoch() : 0;
    fed_steps_ = step;
    for (int epoch = first_epoch; epoch < job_.epochs() && step < total_steps_; ++epoch) {
      epoch_ = epoch + 1;
      if (metrics_) metrics_->SetEpoch(epoch + 1);
      std::vector<int64_t> order = EpochOrder(n, job_.seed(), epoch);
      int64_t b0 = epoch == first_epoch ? first_batch * batch : 0;
      for (int64_t b = b0; b < n && step < total_steps_; b += batch) {
        train.Gather(order, b, std::min(batch, n - b));
        for (int m = 0; m < mbs; ++m) {
          int64_t begin, rows;
          MicroBatchRange(train.rows(), mbs, m, &begin, &rows);
          if (!SendBatch(pipe, train, begin, rows, epoch + 1, v1::TRAIN, step, m, mbs))
            return false;
        }
        ++step;
        fed_steps_ = step;
        if (metrics_) {
          metrics_->AddIngested(train.rows());
          metrics_->SetProgress(static_cast<double>(step) / static_cast<double>(total_steps_));
        }
        report_.train_examples += train.rows();
        if (CheckpointDue(step) && !StartCheckpoint(pipe, step, epoch, b / batch + 1)) return false;
        if (o_.stop_after_steps > 0 && step >= o_.stop_after_steps && step < total_steps_) {
          if (last_started_step_ != step && !StartCheckpoint(pipe, step, epoch, b / batch + 1)) {
            return false;
          }
          stopped_early_ = true;
          report_.steps = step;
          return true;
        }
      }
      if (!SendControl(pipe, v1::Control::END_OF_EPOCH, epoch + 1, NextSeq())) return false;
      for (int64_t b = 0; b < data_.test.size(); b += job_.eval_batch_size()) {
        test.Gather(test_order, b,
                    std::min<int64_t>(job_.eval_batch_size(), data_.test.size() - b));
        if (!SendBatch(pipe, test, 0, test.rows(), epoch + 1, v1::EVAL, step, 0, 1)) return false;
      }
      if (!SendControl(pipe, v1::Control::END_OF_EVAL, epoch + 1, NextSeq())) return false;
      epochs_sent_ = epoch + 1;
    }
    report_.steps = step;
    // A final checkpoint, so a finished run can be extended or evaluated later.
    if (!o_.checkpoint_dir.empty() && last_started_step_ != step) {
      int epoch = std::min(job_.epochs(), epochs_sent_.load());
      if (!StartCheckpoint(pipe, step, epoch, 0)) return false;
    }
    return true;
  }

  bool CheckpointDue(int64_t step) {
    if (o_.checkpoint_dir.empty()) return false;
    if (checkpoint_requested_.exchange(false)) return true;
    if (o_.checkpoint_every_steps > 0 && step % o_.checkpoint_every_steps == 0) return true;
    return o_.checkpoint_every_seconds > 0 &&
           Clock::now() - last_checkpoint_start_ >=
               std::chrono::duration<double>(o_.checkpoint_every_seconds);
  }

  // Places a CHECKPOINT marker after training step `step`; it commits when acknowledged.
  // (epoch, batch_in_epoch) is the data cursor of the next batch.
  bool StartCheckpoint(Pipeline& pipe, int64_t step, int epoch, int64_t batch_in_epoch) {
    uint64_t id = next_checkpoint_id_++;
    std::string dir = o_.checkpoint_dir + "/" + CheckpointDirName(id);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      std::cerr << "localpar: checkpoint " << dir << ": " << ec.message() << "\n";
      return true;  // training goes on; this checkpoint is skipped
    }
    const int64_t per_epoch = (data_.train.size() + job_.batch_size() - 1) / job_.batch_size();
    if (batch_in_epoch >= per_epoch) {
      ++epoch;
      batch_in_epoch = 0;
    }
    v1::CheckpointManifest m;
    m.set_id(id);
    m.set_job(job_.name());
    m.set_rule(v1::UpdateRule_Name(job_.rule()));
    m.set_step(step);
    m.set_epoch(epoch);
    m.set_batch_in_epoch(batch_in_epoch);
    m.set_seed(job_.seed());
    for (int k = 0; k < job_.stages_size(); ++k)
      m.add_stage_files(absl::StrCat("stage-", k, ".ckpt"));
    uint64_t seq = NextSeq();
    {
      std::lock_guard<std::mutex> lock(checkpoint_mu_);
      pending_checkpoints_[seq] = PendingCheckpoint{dir, m, Clock::now()};
    }
    last_checkpoint_start_ = Clock::now();
    last_started_step_ = step;
    v1::DownItem item;
    v1::Control* c = item.mutable_control();
    c->set_seq(seq);
    c->set_kind(v1::Control::CHECKPOINT);
    c->set_path(std::filesystem::absolute(dir).string());
    return pipe.Send(item);
  }

  // Reader thread: commits a checkpoint when its marker comes back acknowledged (every
  // stage saved), or gives it up when a stage reports an error for it.
  void OnPipelineItem(const v1::UpItem& up) {
    if (up.has_ack() && up.ack().kind() == v1::Control::END_OF_EVAL) {
      // Every stage has scored this epoch: keep the figures (a later recovery reconfigures
      // the workers, which forgets them).
      std::vector<v1::StatsResponse> stats = PollStats(false, 5);
      std::lock_guard<std::mutex> lock(checkpoint_mu_);
      epoch_stats_[up.ack().epoch()] = std::move(stats);
      return;
    }
    uint64_t seq = up.has_ack() ? up.ack().seq() : up.has_error() ? up.error().seq() : 0;
    std::unique_lock<std::mutex> lock(checkpoint_mu_);
    auto it = pending_checkpoints_.find(seq);
    if (it == pending_checkpoints_.end()) {
      if (up.has_error() && metrics_) metrics_->AddError();
      return;
    }
    PendingCheckpoint p = it->second;
    pending_checkpoints_.erase(it);
    lock.unlock();
    if (up.has_error()) {
      std::cerr << "\nlocalpar: checkpoint " << p.dir << " failed at stage " << up.error().stage()
                << ": " << up.error().message() << "\n";
      return;
    }
    p.manifest.set_created_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count());
    absl::Status st = WriteManifest(p.dir, p.manifest);
    if (!st.ok()) {
      std::cerr << "\nlocalpar: checkpoint " << p.dir << " not committed: " << st.message() << "\n";
      return;
    }
    double seconds = std::chrono::duration<double>(Clock::now() - p.started).count();
    last_committed_ = p.dir;
    last_commit_ = Clock::now();
    if (metrics_) metrics_->CheckpointCommitted(seconds);
    PruneCheckpoints(o_.checkpoint_dir, o_.keep_checkpoints);
  }

  std::vector<v1::StatsResponse> PollStats(bool intervals, int deadline_s) {
    std::vector<v1::StatsResponse> out(stubs_.size());
    for (size_t k = 0; k < stubs_.size(); ++k) {
      grpc::ClientContext ctx;
      ctx.set_deadline(Deadline(deadline_s));
      v1::StatsRequest req;
      req.set_include_intervals(intervals);
      if (!stubs_[k]->Stats(&ctx, req, &out[k]).ok()) out[k].set_stage(-1);
    }
    return out;
  }

  // Wakes every interval (or at once when training ends) to print finished epochs and a
  // progress line built from the workers' statistics.
  void ProgressLoop() {
    const bool tty = isatty(STDERR_FILENO);
    auto start = Clock::now();
    int printed_epochs = 0;
    auto print_epochs = [&] {
      while (true) {
        std::vector<v1::StatsResponse> s;
        {
          std::lock_guard<std::mutex> lock(checkpoint_mu_);
          auto it = epoch_stats_.find(printed_epochs + 1);
          if (it == epoch_stats_.end()) break;
          s = it->second;
        }
        ++printed_epochs;
        std::string accs;
        for (const auto& st : s) {
          for (const auto& e : st.epochs()) {
            if (e.epoch() == printed_epochs) {
              absl::StrAppendFormat(&accs, " s%d %.2f%%", st.stage(),
                                    100 * FromProto(e.eval()).accuracy());
            }
          }
        }
        std::cerr << (tty ? "\r\033[K" : "") << "epoch " << printed_epochs << ": test accuracy"
                  << accs << "\n";
      }
    };
    while (true) {
      {
        std::unique_lock<std::mutex> lock(progress_mu_);
        progress_cv_.wait_for(lock, std::chrono::milliseconds(tty ? 500 : 2000),
                              [&] { return done_; });
        if (done_) break;
      }
      print_epochs();
      if (metrics_) {
        metrics_->SetCheckpointAge(
            std::chrono::duration<double>(Clock::now() - last_commit_).count());
      }
      if (!o_.progress) continue;
      std::vector<v1::StatsResponse> s = PollStats(false, 1);
      double el = std::chrono::duration<double>(Clock::now() - start).count();
      int64_t done_examples = s.empty() ? 0 : s.back().examples();
      int64_t total = total_steps_ * job_.batch_size();
      int width = 20;
      int filled =
          total > 0 ? static_cast<int>(width * std::min<int64_t>(done_examples, total) / total) : 0;
      std::string losses;
      for (const auto& st : s) {
        absl::StrAppendFormat(&losses, " s%d %.3f", st.stage(), FromProto(st.recent()).mean_loss());
      }
      std::cerr << absl::StrFormat("%sepoch %d/%d [%s%s] %.0f ex/s loss%s%s", tty ? "\r\033[K" : "",
                                   epoch_.load(), job_.epochs(), std::string(filled, '#'),
                                   std::string(width - filled, ' '),
                                   done_examples / std::max(el, 1e-9), losses, tty ? "" : "\n");
    }
    if (tty && o_.progress) std::cerr << "\r\033[K";
    print_epochs();
  }

  int Collect(int stages) {
    std::vector<v1::StatsResponse> stats = PollStats(o_.trace, 10);
    v1::ModelWeights weights;
    for (int k = 0; k < stages; ++k) {
      if (stats[k].stage() < 0) {
        std::cerr << "localpar: stage " << k << " at " << o_.workers[k] << " stopped answering\n";
        return kExitWorkerLost;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(Deadline(30));
      AddToken(ctx, o_.security);
      grpc::Status st = stubs_[k]->GetWeights(&ctx, v1::WeightsRequest(), weights.add_stages());
      if (!st.ok()) {
        std::cerr << "localpar: stage " << k << ": GetWeights failed: " << st.error_message()
                  << "\n";
        return kExitWorkerLost;
      }
    }
    report_.job = job_.name();
    report_.rule = v1::UpdateRule_Name(job_.rule());
    report_.stages = stages;
    double slowest = 0;
    for (int e = 1; e <= epochs_sent_; ++e) {
      EpochReport er;
      er.epoch = e;
      er.train.resize(stages);
      er.test.resize(stages);
      // Prefer the figures kept when the epoch's evaluation finished (they survive a
      // recovery); fall back to the workers' current statistics.
      std::vector<v1::StatsResponse> source = stats;
      {
        std::lock_guard<std::mutex> lock(checkpoint_mu_);
        auto it = epoch_stats_.find(e);
        if (it != epoch_stats_.end() && static_cast<int>(it->second.size()) == stages) {
          source = it->second;
        }
      }
      for (int k = 0; k < stages; ++k) {
        for (const auto& es : source[k].epochs()) {
          if (es.epoch() != e) continue;
          er.train[k] = FromProto(es.train());
          er.test[k] = FromProto(es.eval());
          er.seconds = std::max(er.seconds, es.train_seconds());
        }
      }
      report_.epochs.push_back(er);
    }
    for (int k = 0; k < stages; ++k) {
      double busy = 0;
      for (const auto& es : stats[k].epochs()) busy += es.train_seconds();
      StageReport sr;
      sr.examples_per_second = busy > 0 ? stats[k].examples() / busy : 0;
      sr.resident_bytes = stats[k].resident_bytes();
      if (stats[k].epochs_size() > 0) sr.resident_bytes_first = stats[k].epochs(0).resident_bytes();
      sr.queue_max_depth = stats[k].queue_max_depth();
      sr.baseline_bytes = stats[k].baseline_bytes();
      sr.state_bytes = stats[k].state_bytes();
      sr.activation_bytes_per_example = stats[k].activation_bytes_per_example();
      for (const auto& es : stats[k].epochs())
        sr.resident_bytes_by_epoch.push_back(es.resident_bytes());
      sr.queue_capacity = stats[k].queue_capacity();
      sr.overlap_max_delay = stats[k].overlap_max_delay_seen();
      sr.overlap_mean_delay = stats[k].overlap_mean_delay();
      for (const auto& [reason, n] : stats[k].rejected()) sr.rejected += n;
      slowest = std::max(slowest, busy);
      report_.stage_reports.push_back(sr);
    }
    report_.examples_per_second = report_.train_examples / std::max(report_.wall_seconds, 1e-9);
    std::cout << ReportTable(report_);
    if (o_.out_dir.empty()) return kExitOk;
    absl::Status st = WriteReport(report_, o_.out_dir);
    if (st.ok()) st = WriteWeightsFile(weights, o_.out_dir + "/weights.pb");
    if (st.ok() && o_.trace) st = WriteTrace(stats);
    if (!st.ok()) {
      std::cerr << "localpar: " << st.message() << "\n";
      return kExitFailure;
    }
    std::cout << "report: " << o_.out_dir << "/report.json\n";
    return kExitOk;
  }

  absl::Status WriteTrace(const std::vector<v1::StatsResponse>& stats) {
    std::string path = o_.out_dir + "/trace.json";
    std::ofstream out(path);
    out << "{\"stages\": [";
    for (size_t k = 0; k < stats.size(); ++k) {
      out << (k ? ",\n" : "\n") << "  {\"stage\": " << k << ", \"intervals\": [";
      for (int i = 0; i < stats[k].intervals_size(); ++i) {
        const v1::Interval& iv = stats[k].intervals(i);
        out << (i ? ", " : "") << "[" << iv.seq() << ", " << iv.start_ns() << ", " << iv.end_ns()
            << "]";
      }
      out << "]}";
    }
    out << "\n]}\n";
    if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
    return absl::OkStatus();
  }

  int LostWorker(Pipeline& pipe) {
    std::vector<v1::StatsResponse> s = PollStats(false, 2);
    std::string lost;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k].stage() < 0)
        absl::StrAppend(&lost, lost.empty() ? "" : ", ", "stage ", k, " (", o_.workers[k], ")");
    }
    grpc::Status st = pipe.Finish();
    std::cerr << "\nlocalpar: the pipeline broke: "
              << (lost.empty() ? std::string("no stage is unreachable") : "lost " + lost) << "; "
              << st.error_message() << "\n";
    return kExitWorkerLost;
  }

  CoordinatorOptions o_;
  v1::Job job_;
  DataSplit data_;
  friend class StatusService;
  struct PendingCheckpoint {
    std::string dir;
    v1::CheckpointManifest manifest;
    Clock::time_point started;
  };

 public:
  std::optional<FoundCheckpoint> resume_;  // set before Run() when resuming
  Clock::time_point last_commit_ = Clock::now();
  std::atomic<bool> checkpoint_requested_{false};

 private:
  uint64_t next_checkpoint_id_ = 1;
  Clock::time_point last_checkpoint_start_ = Clock::now();
  int64_t last_started_step_ = -1;
  bool stopped_early_ = false;
  std::string last_committed_;
  std::mutex checkpoint_mu_;
  std::map<uint64_t, PendingCheckpoint> pending_checkpoints_;
  std::map<int, std::vector<v1::StatsResponse>> epoch_stats_;  // by epoch, at END_OF_EVAL
  int recoveries_ = 0;
  CoordinatorMetrics* metrics_;
  std::atomic<int64_t> fed_steps_{0};
  std::atomic<Clock::time_point> started_{Clock::now()};
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
  int64_t total_steps_ = 0;
  uint64_t seq_ = 0;
  std::atomic<int> epoch_{0};
  std::atomic<int> epochs_sent_{0};
  std::mutex progress_mu_;
  std::condition_variable progress_cv_;
  bool done_ = false;
  RunReport report_;
};

grpc::Status StatusService::Status(grpc::ServerContext*, const v1::StatusRequest*,
                                   v1::JobStatus* out) {
  out->set_job(c_.job_.name());
  out->set_rule(v1::UpdateRule_Name(c_.job_.rule()));
  out->set_epoch(c_.epoch_);
  out->set_epochs(c_.job_.epochs());
  out->set_progress(c_.total_steps_ > 0
                        ? static_cast<double>(c_.fed_steps_) / static_cast<double>(c_.total_steps_)
                        : 0.0);
  out->set_uptime_seconds(std::chrono::duration<double>(Clock::now() - c_.started_.load()).count());
  std::vector<v1::StatsResponse> stats = c_.PollStats(false, 2);
  for (size_t k = 0; k < stats.size(); ++k) {
    v1::StageStatus* s = out->add_stages();
    s->set_stage(static_cast<int>(k));
    s->set_address(c_.o_.workers[k]);
    s->set_reachable(stats[k].stage() >= 0);
    s->set_examples(stats[k].examples());
    s->set_steps(stats[k].steps());
    s->set_loss(FromProto(stats[k].recent()).mean_loss());
    s->set_queue_depth(stats[k].queue_depth());
    s->set_queue_capacity(stats[k].queue_capacity());
    int64_t rejected = 0;
    for (const auto& [reason, n] : stats[k].rejected()) rejected += n;
    s->set_rejected(rejected);
  }
  return grpc::Status::OK;
}

grpc::Status StatusService::Checkpoint(grpc::ServerContext* ctx, const v1::CheckpointRequest*,
                                       v1::CheckpointResponse* out) {
  if (grpc::Status auth = CheckToken(*ctx, c_.o_.security); !auth.ok()) return auth;
  if (c_.o_.checkpoint_dir.empty()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this run has no --checkpoint_dir");
  }
  c_.checkpoint_requested_ = true;
  out->set_message("a checkpoint follows the next training step, under " + c_.o_.checkpoint_dir);
  return grpc::Status::OK;
}

}  // namespace

absl::StatusOr<v1::Job> LoadJobWithOverrides(const CoordinatorOptions& o) {
  absl::StatusOr<v1::Job> job = LoadJobFile(o.job_path);
  if (!job.ok()) return job.status();
  if (!o.rule.empty()) {
    v1::UpdateRule rule;
    if (!v1::UpdateRule_Parse(o.rule, &rule) || rule == v1::UPDATE_RULE_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rule=", o.rule, ": expected BACKPROP, GREEDY, CHUNKED or OVERLAP"));
    }
    job->set_rule(rule);
  }
  if (o.epochs > 0) job->set_epochs(o.epochs);
  if (o.max_steps > 0) job->set_max_steps(o.max_steps);
  if (o.seed >= 0) job->set_seed(static_cast<uint64_t>(o.seed));
  if (o.stages > 0) {
    absl::StatusOr<v1::Job> regrouped = RegroupStages(*job, o.stages);
    if (!regrouped.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", regrouped.status().message()));
    }
    job = *std::move(regrouped);
  }
  if (absl::Status s = ValidateJob(*job); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(o.job_path, ": ", s.message()));
  }
  if (o.overlap_max_delay > 0 && job->rule() != v1::OVERLAP) {
    return absl::InvalidArgumentError("--overlap_max_delay applies to the OVERLAP rule only");
  }
  return job;
}

int RunCoordinator(const CoordinatorOptions& o) {
  ConfigureAllocatorForMessages();
  absl::StatusOr<v1::Job> job = LoadJobWithOverrides(o);
  if (!job.ok()) {
    std::cerr << "localpar: " << job.status().message() << "\n";
    return kExitBadJob;
  }
  if (static_cast<int>(o.workers.size()) != job->stages_size()) {
    std::cerr << "localpar: --workers lists " << o.workers.size() << " addresses but job "
              << job->name() << " has " << job->stages_size() << " stages\n";
    return kExitUsage;
  }
  absl::StatusOr<DataSplit> data = LoadJobData(*job);
  if (!data.ok()) {
    std::cerr << "localpar: " << data.status().message() << "\n";
    return kExitBadData;
  }
  std::unique_ptr<MetricsServer> metrics_server;
  std::unique_ptr<CoordinatorMetrics> metrics;
  if (!o.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> ms = MetricsServer::Start(o.metrics_listen);
    if (!ms.ok()) {
      std::cerr << "localpar: " << ms.status().message() << "\n";
      return kExitUsage;
    }
    metrics_server = *std::move(ms);
    metrics = std::make_unique<CoordinatorMetrics>(metrics_server->registry(), job->name());
    if (!o.metrics_port_file.empty()) {
      std::string tmp = o.metrics_port_file + ".tmp";
      std::ofstream(tmp) << metrics_server->port() << "\n";
      std::rename(tmp.c_str(), o.metrics_port_file.c_str());
    }
  }
  Coordinator c(o, *std::move(job), *std::move(data), metrics.get());
  bool resume = o.resume;
  if (o.resume_if_present && !o.checkpoint_dir.empty()) {
    resume = FindLatestCheckpoint(o.checkpoint_dir).ok();
    if (!resume)
      std::cerr << "localpar: no checkpoint in " << o.checkpoint_dir << "; starting fresh\n";
  }
  if (resume) {
    if (o.checkpoint_dir.empty()) {
      std::cerr << "localpar: --resume needs --checkpoint_dir\n";
      return kExitUsage;
    }
    absl::StatusOr<FoundCheckpoint> found = FindLatestCheckpoint(o.checkpoint_dir);
    if (!found.ok()) {
      std::cerr << "localpar: cannot resume: " << found.status().message() << "\n";
      return kExitFailure;
    }
    for (const std::string& why : found->skipped) {
      std::cerr << "localpar: skipping a damaged checkpoint: " << why << "\n";
    }
    if (found->uncommitted > 0) {
      std::cerr << "localpar: discarding " << found->uncommitted
                << " newer checkpoint(s) that never committed\n";
    }
    RemoveUncommittedCheckpoints(o.checkpoint_dir);
    if (found->manifest.job() != c.job_name() || found->manifest.seed() != c.seed()) {
      std::cerr << "localpar: " << found->dir << " belongs to job " << found->manifest.job()
                << " (seed " << found->manifest.seed() << "), not this one\n";
      return kExitFailure;
    }
    std::cerr << "localpar: resuming from " << found->dir << " at step " << found->manifest.step()
              << "\n";
    c.resume_ = *std::move(found);
  }
  return c.Run();
}

}  // namespace localpar
