// Running a job on its workers.
#include "services/coordinator/job_runner.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/job/model_file.h"
#include "common/job/report.h"
#include "common/job/tensor_codec.h"
#include "common/nn/rule.h"
#include "services/common/exit_codes.h"
#include "services/common/program_config.h"
#include "services/coordinator/cluster_report.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

JobRunner::JobRunner(const v1::CoordinatorConfig& config, const SecurityOptions& security,
                     v1::Job job, DataSplit data, std::string fingerprint,
                     CoordinatorMetrics* metrics)
    : config_(config),
      security_(security),
      job_(std::move(job)),
      data_(std::move(data)),
      metrics_(metrics),
      pool_({config.workers().begin(), config.workers().end()}, job_.replicas(), security),
      checkpointer_(config, job_, std::move(fingerprint), metrics, [this] { return History(); }),
      total_steps_(TotalSteps(job_, data_.train.size())),
      monitor_(job_, total_steps_, StepsPerEpoch(job_, data_.train.size()), config.quiet(), pool_,
               board_, checkpointer_, metrics, feed_, epoch_stats_) {}

JobRunner::~JobRunner() = default;

void JobRunner::ResumeFrom(FoundCheckpoint found) {
  history_.Clear();
  if (!history_.ParseFromString(found.manifest.report())) history_.Clear();
  resume_ = std::move(found);
}

v1::RunReport JobRunner::History() {
  v1::RunReport r;
  std::vector<v1::StatsResponse> none(static_cast<size_t>(pool_.size()));
  AddClusterFigures(none, epoch_stats_.All(), history_, epochs_sent_, &r);
  AddEvaluations(&r);
  r.clear_stage_reports();
  r.set_wall_seconds(history_.wall_seconds() + SecondsSince(started_));
  return r;
}

void JobRunner::AddEvaluations(v1::RunReport* report) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const v1::Evaluation& e : history_.evaluations()) {
    if (!evaluations_.count(e.step())) *report->add_evaluations() = e;
  }
  for (const auto& [step, e] : evaluations_) *report->add_evaluations() = e;
}

int JobRunner::Run() {
  if (!config_.out().empty()) {
    absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(config_.out());
    if (!log.ok()) {
      std::cerr << "localpar: --out: " << log.status().message() << "\n";
      return kExitUsage;
    }
    monitor_.LogTo(*std::move(log));
  }
  monitor_.Start();
  std::unique_ptr<PipelineLink> link;
  int rc = kExitOk;
  bool collected = false;
  for (int attempt = 0;; ++attempt) {
    if ((rc = Configure()) != kExitOk) {
      // A stage lost while being configured comes back like one lost while training.
      if (rc != kExitWorkerLost || (rc = Recover(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                              "a stage was lost while configuring"),
                                                 attempt)) != kExitOk) {
        break;
      }
      continue;
    }
    std::vector<v1::Worker::Stub*> firsts;
    for (int r = 0; r < pool_.replicas(); ++r) firsts.push_back(&pool_.stub(0, r));
    link = std::make_unique<PipelineLink>(firsts, security_);
    StartEvents(*link);
    const bool fed = Feed(*link);
    const uint64_t drain = NextSeq();
    if (fed && SendControl(*link, v1::Control::DRAIN, 0, drain) && WaitAck(drain)) {
      // A stage lost after the last commit (before its weights were read) is recovered
      // like any other: from the final checkpoint, with nothing left to replay.
      rc = Collect();
      if (rc != kExitWorkerLost || !checkpointer_.enabled()) {
        collected = true;
        break;
      }
    }
    StopEvents(*link);
    if ((rc = Recover(link->Finish(), attempt)) != kExitOk) break;
  }
  monitor_.Stop();
  if (!collected) {
    if (link) StopEvents(*link);
    return rc;
  }
  // Shutdown travels in-band like every control item: each worker passes it on, then exits
  // once its upstream stream closes.
  const uint64_t bye = NextSeq();
  if (SendControl(*link, v1::Control::SHUTDOWN, 0, bye)) WaitAck(bye);
  grpc::Status fin = link->Finish();
  StopEvents(*link);
  if (!fin.ok()) {
    // The weights and the report are complete: a stage lost now loses nothing, but it may
    // not have been told to exit.
    std::string lost = pool_.Unreachable(2);
    std::cerr << "\nlocalpar: the run is complete, but "
              << (lost.empty() ? std::string("the pipeline") : lost)
              << " was lost while shutting down (" << fin.error_message()
              << "); a worker that missed SHUTDOWN keeps running until it is stopped\n";
  }
  if (stopped_early_) {
    std::cerr << "localpar: stopped after step " << steps_ << " at checkpoint "
              << checkpointer_.last_committed() << "; continue with --resume (localpar run: "
              << "--resume=" << checkpointer_.dir() << ")\n";
  }
  return rc;
}

// ---- events ---------------------------------------------------------------------------

void JobRunner::StartEvents(PipelineLink& link) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    acked_.clear();
    link_ended_ = false;
  }
  events_ = std::thread([this, &link] { EventLoop(link); });
}

void JobRunner::StopEvents(PipelineLink& link) {
  if (!events_.joinable()) return;
  link.Finish();
  events_.join();
}

void JobRunner::EventLoop(PipelineLink& link) {
  while (std::optional<v1::UpItem> up = link.Next()) {
    if (up->has_ack()) {
      const v1::Ack& a = up->ack();
      std::optional<std::pair<int64_t, int>> interim;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = interim_seqs_.find(a.seq());
        if (it != interim_seqs_.end()) interim = it->second;
      }
      if (a.kind() == v1::Control::END_OF_EVAL && interim) {
        // An evaluation within the epoch: every worker keeps its figures by this marker (the
        // first stages may have run on to the next one by now).
        std::vector<std::optional<v1::StatsResponse>> polled = pool_.PollStats(false, 5);
        std::vector<HeadStats> test;
        for (const auto& s : polled) {
          HeadStats h;
          if (s) {
            for (const v1::MarkedEvaluation& e : s->recent_evaluations()) {
              if (e.seq() == a.seq()) {
                h = HeadStats{e.eval().loss_sum(), e.eval().correct(), e.eval().count()};
              }
            }
          }
          test.push_back(h);
        }
        v1::Evaluation ev;
        ev.set_step(interim->first);
        ev.set_epoch(interim->second);
        AddHeadFigures(test, ev.mutable_test());
        {
          std::lock_guard<std::mutex> lock(mu_);
          evaluations_[interim->first] = ev;
        }
        monitor_.AddInterim(interim->first, interim->second, std::move(test));
      } else if (a.kind() == v1::Control::END_OF_EVAL) {
        // Every stage has scored this epoch: keep the figures (a later recovery configures
        // the workers again, which forgets them).
        std::vector<std::optional<v1::StatsResponse>> polled = pool_.PollStats(false, 5);
        std::vector<v1::StatsResponse> stats;
        for (auto& s : polled) stats.push_back(s ? *s : v1::StatsResponse());
        epoch_stats_.Put(a.epoch(), std::move(stats));
      }
      checkpointer_.OnAck(a.seq());  // commits, if this was a checkpoint's marker
      std::lock_guard<std::mutex> lock(mu_);
      acked_.insert(a.seq());
      acked_cv_.notify_all();
    } else if (up->has_saved()) {
      checkpointer_.OnSaved(up->saved());
    } else if (up->has_error() && up->error().stage() < 0) {
      // Only a worker with no configuration answers as stage -1. Mid-run that is a stage
      // restarted after this link was opened, which its upstream neighbour reached again
      // before anyone saw the old one go: the pipeline is broken even though every stream
      // is still up, and it is recovered (or given up) like any other break.
      if (metrics_) metrics_->AddError();
      if (!link.broken()) {
        std::cerr << "\nlocalpar: a stage answered item " << up->error().seq()
                  << " unconfigured: " << up->error().message() << "\n";
        link.Break(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "a stage restarted mid-run and lost its configuration"));
      }
    } else if (up->has_error() && !checkpointer_.OnError(up->error())) {
      std::cerr << "\nlocalpar: " << pool_.Name(up->error().stage(), up->error().replica())
                << " refused item " << up->error().seq() << ": " << up->error().message() << "\n";
      if (metrics_) metrics_->AddError();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  link_ended_ = true;
  acked_cv_.notify_all();
}

bool JobRunner::WaitAck(uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  acked_cv_.wait(lock, [&] { return link_ended_ || acked_.count(seq) > 0; });
  return acked_.count(seq) > 0;
}

// ---- feeding --------------------------------------------------------------------------

bool JobRunner::SendControl(PipelineLink& link, v1::Control::Kind kind, int epoch, uint64_t seq) {
  v1::DownItem item;
  v1::Control* c = item.mutable_control();
  c->set_seq(seq);
  c->set_kind(kind);
  c->set_epoch(epoch);
  return link.Send(item);
}

bool JobRunner::SendRows(PipelineLink& link, int replica, const BatchAssembler& a, int64_t begin,
                         int64_t rows, const v1::Batch& meta) {
  v1::DownItem item = MakeBatchItem(a, begin, rows, meta);
  item.mutable_batch()->set_seq(NextSeq());
  return link.SendTo(replica, item);
}

// Replica r takes rows MicroBatchRange(rows, replicas, r) and splits them into its
// micro-batches; every share of a step goes out before the next step's, so no replica
// waits in its exchange for a share still queued behind another step.
bool JobRunner::SendStep(PipelineLink& link, const BatchAssembler& a, int64_t rows, int job_micro,
                         v1::Batch meta) {
  meta.set_phase(v1::TRAIN);
  meta.set_batch_rows(rows);
  for (int r = 0; r < link.replicas(); ++r) {
    int64_t share_begin, share;
    MicroBatchRange(rows, link.replicas(), r, &share_begin, &share);
    const int parts = StepMicroBatches(job_micro, share);
    meta.set_micro_batches(parts);
    for (int m = 0; m < parts; ++m) {
      int64_t begin, count;
      MicroBatchRange(share, parts, m, &begin, &count);
      meta.set_micro_batch(m);
      if (!SendRows(link, r, a, share_begin + begin, count, meta)) return false;
    }
  }
  return true;
}

bool JobRunner::StartCheckpoint(PipelineLink& link, int64_t step, const DataCursor& cursor) {
  std::optional<v1::DownItem> marker =
      checkpointer_.Start(NextSeq(), step, cursor, train_examples_);
  return !marker || link.Send(*marker);  // a checkpoint that cannot start is skipped
}

// The same batches in the same order as the reference trainer (RunReference).
bool JobRunner::Feed(PipelineLink& link) {
  DataCursor start;
  if (resume_) {
    start = {resume_->manifest.step(), resume_->manifest.epoch(),
             resume_->manifest.batch_in_epoch()};
  }
  BatchPlan plan(job_, data_.train.size(), data_.test.size(), start);
  BatchAssembler train(data_.train, job_.batch_size()), test(data_.test, job_.eval_batch_size());
  const int job_micro =
      Rule(ToUpdateRule(job_.rule())).splits_micro_batches ? job_.micro_batches() : 1;
  feed_.fed_steps = start.step;
  steps_ = start.step;
  train_examples_ = resume_ ? history_.train_examples() : 0;
  epochs_sent_ = start.epoch;
  for (PlanItem item; plan.Next(&item);) {
    v1::Batch meta;
    meta.set_epoch(item.epoch);
    meta.set_step(item.step);
    if (item.kind == PlanItem::kTrain) {
      feed_.epoch = item.epoch;
      feed_.phase = FeedProgress::kTraining;
      if (metrics_) metrics_->SetEpoch(item.epoch);
      train.Gather(plan.order(), item.begin, item.rows);
      if (!SendStep(link, train, item.rows, job_micro, meta)) return false;
      const int64_t done = item.step + 1;
      feed_.fed_steps = steps_ = done;
      train_examples_ += static_cast<double>(item.rows);
      if (metrics_) {
        metrics_->AddIngested(item.rows);
        metrics_->SetProgress(static_cast<double>(done) / static_cast<double>(total_steps_));
      }
      if (checkpointer_.Due(done) && !StartCheckpoint(link, done, item.after)) return false;
      const int64_t stop = config_.stop_after_steps();
      if (stop > 0 && done >= stop && done < total_steps_) {
        if (checkpointer_.last_started_step() != done && !StartCheckpoint(link, done, item.after)) {
          return false;
        }
        stopped_early_ = true;
        return true;
      }
    } else if (item.kind == PlanItem::kEval) {
      feed_.phase = FeedProgress::kEvaluating;
      test.Gather(plan.test_order(), item.begin, item.rows);
      meta.set_phase(v1::EVAL);
      meta.set_batch_rows(item.rows);
      meta.set_micro_batches(1);
      // Each replica scores its share (a short batch may leave the last ones none).
      for (int r = 0; r < link.replicas(); ++r) {
        int64_t begin, rows;
        MicroBatchRange(item.rows, link.replicas(), r, &begin, &rows);
        if (rows > 0 && !SendRows(link, r, test, begin, rows, meta)) return false;
      }
    } else if (item.interim) {  // the end of an evaluation within the epoch
      const uint64_t seq = NextSeq();
      {
        std::lock_guard<std::mutex> lock(mu_);
        interim_seqs_[seq] = {item.step, item.epoch};
      }
      if (!SendControl(link, v1::Control::END_OF_EVAL, item.epoch, seq)) return false;
    } else {
      const bool end_of_epoch = item.kind == PlanItem::kEndOfEpoch;
      if (!SendControl(link, end_of_epoch ? v1::Control::END_OF_EPOCH : v1::Control::END_OF_EVAL,
                       item.epoch, NextSeq())) {
        return false;
      }
      if (!end_of_epoch) epochs_sent_ = item.epoch;
    }
  }
  feed_.phase = FeedProgress::kFinishing;
  // A final checkpoint, so a finished run can be extended or evaluated later.
  if (checkpointer_.enabled() && checkpointer_.last_started_step() != steps_) {
    DataCursor end{steps_, std::min(job_.epochs(), epochs_sent_), 0};
    if (!StartCheckpoint(link, steps_, end)) return false;
  }
  return true;
}

// ---- configuration and recovery -------------------------------------------------------

// Configures every stage, from resume_ when set; a stage that cannot restore its snapshot
// of that checkpoint (its volume lost, or a file damaged) falls back to the next older one.
int JobRunner::Configure() {
  feed_.phase = FeedProgress::kConfiguring;
  while (true) {
    StageSettings s;
    s.total_steps = total_steps_;
    s.non_finite = config_.non_finite();
    s.overlap_max_delay = config_.overlap_max_delay();
    s.fingerprint = checkpointer_.fingerprint();
    if (resume_) s.restore = &resume_->manifest;
    if (initial_) s.initial = &*initial_;
    if (rendezvous_) {
      // A fresh group for every configuration: replicas of an earlier one never meet these.
      rendezvous_->Clear();
      s.rendezvous = rendezvous_address_;
      s.rendezvous_group =
          absl::StrCat("run-", checkpointer_.fingerprint().substr(0, 12), "-", ++configurations_);
      s.rendezvous_timeout_s = config_.replica_timeout_s();
    }
    ConfigureOutcome out = pool_.ConfigureAll(job_, s, config_.configure_timeout_s());
    backend_ = out.backend;
    parameters_ = out.parameters;
    if (!out.restore_failed) return out.exit_code;
    std::optional<FoundCheckpoint> older = checkpointer_.OlderThan(resume_->manifest.id());
    if (!older) {
      std::cerr << "localpar: no older checkpoint under " << checkpointer_.dir()
                << " to fall back to; every stage must hold its snapshot of one checkpoint\n";
      return kExitFailure;
    }
    std::cerr << "localpar: falling back to " << older->dir << " (step " << older->manifest.step()
              << ")\n";
    ResumeFrom(*std::move(older));
  }
}

int JobRunner::Recover(const grpc::Status& st, int attempt) {
  feed_.phase = FeedProgress::kRecovering;
  std::string lost = pool_.Unreachable(2);
  const std::string last =
      checkpointer_.last_committed().empty() ? "none" : checkpointer_.last_committed();
  if (!checkpointer_.enabled() || attempt >= config_.max_recoveries()) {
    std::cerr << "\nlocalpar: the pipeline broke ("
              << (lost.empty() ? "every stage still answers" : "lost " + lost) << "; "
              << st.error_message() << ")"
              << (!checkpointer_.enabled()
                      ? "; no --checkpoint_dir to recover from"
                      : "; giving up after " + std::to_string(attempt) + " recoveries")
              << "; last checkpoint: " << last << "\n";
    return kExitWorkerLost;
  }
  std::cerr << "\nlocalpar: the pipeline broke ("
            << (lost.empty() ? "a stream failed" : "lost " + lost) << "); waiting up to "
            << config_.recovery_timeout_s() << " s for every stage\n";
  // Exponential backoff up to 2 s between probes, within the deadline.
  const auto deadline = Clock::now() + std::chrono::seconds(config_.recovery_timeout_s());
  std::chrono::milliseconds backoff(100);
  while (!(lost = pool_.Unreachable(1)).empty()) {
    if (Clock::now() > deadline) {
      std::cerr << "localpar: " << lost << " did not come back within "
                << config_.recovery_timeout_s() << " s; last checkpoint: " << last << "\n";
      return kExitWorkerLost;
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
  std::optional<FoundCheckpoint> back = checkpointer_.RollBack(std::cerr);
  if (back) {
    ResumeFrom(*std::move(back));
  } else {
    resume_.reset();
  }
  if (resume_) {
    std::cerr << "localpar: rolling every stage back to " << resume_->dir << " (step "
              << resume_->manifest.step() << ") and replaying\n";
  } else {
    std::cerr << "localpar: no committed checkpoint yet; restarting from step 0\n";
  }
  return kExitOk;
}

int JobRunner::LostWorker(const grpc::Status& final_status) {
  std::string lost = pool_.Unreachable(2);
  std::cerr << "\nlocalpar: the pipeline broke: "
            << (lost.empty() ? std::string("no stage is unreachable") : "lost " + lost) << "; "
            << final_status.error_message() << "\n";
  return kExitWorkerLost;
}

// ---- the end of a run -----------------------------------------------------------------

int JobRunner::CheckReplicasAgree(const v1::ModelWeights& weights) {
  for (int k = 0; k < pool_.size(); ++k) {
    const std::string want = weights.stages(k).SerializeAsString();
    for (int r = 1; r < pool_.replicas(); ++r) {
      absl::StatusOr<v1::StageWeights> w = pool_.Weights(k, r);
      if (!w.ok()) {
        std::cerr << "localpar: " << pool_.Name(k, r)
                  << ": GetWeights failed: " << w.status().message() << "\n";
        return kExitWorkerLost;
      }
      if (w->SerializeAsString() != want) {
        std::cerr << "localpar: " << pool_.Name(k, r) << " holds other weights than replica 0; "
                  << "the replicas did not take the same steps\n";
        return kExitFailure;
      }
    }
  }
  return kExitOk;
}

int JobRunner::Collect() {
  std::vector<std::optional<v1::StatsResponse>> polled = pool_.PollStats(config_.trace(), 10);
  std::vector<v1::StatsResponse> stats;
  v1::ModelWeights weights;
  for (int k = 0; k < pool_.size(); ++k) {
    if (!polled[k]) {
      std::cerr << "localpar: stage " << k << " at " << pool_.address(k) << " stopped answering\n";
      return kExitWorkerLost;
    }
    stats.push_back(*polled[k]);
    absl::StatusOr<v1::StageWeights> w = pool_.Weights(k);
    if (!w.ok()) {
      std::cerr << "localpar: stage " << k << ": GetWeights failed: " << w.status().message()
                << "\n";
      return kExitWorkerLost;
    }
    *weights.add_stages() = *std::move(w);
  }
  if (int rc = CheckReplicasAgree(weights); rc != kExitOk) return rc;
  DescribeWeights(job_, data_.normalization, &weights);
  // Nothing is lost from here on: end the progress line and print the last epoch's figures
  // before the table.
  monitor_.Stop();
  v1::RunReport report;
  DescribeRun(job_, VersionString(), &report);
  report.set_job(job_.name());
  report.set_rule(v1::UpdateRule_Name(job_.rule()));
  report.set_backend(backend_);
  report.set_stages(pool_.size());
  report.set_replicas(pool_.replicas());
  report.set_parameters(static_cast<double>(parameters_));
  report.set_steps(static_cast<int32_t>(steps_));
  report.set_train_examples(train_examples_);
  report.set_wall_seconds(history_.wall_seconds() + SecondsSince(started_));
  report.set_examples_per_second(train_examples_ / std::max(report.wall_seconds(), 1e-9));
  AddClusterFigures(stats, epoch_stats_.All(), history_, epochs_sent_, &report);
  AddEvaluations(&report);
  AddBitsPerByte(job_, &report);
  std::cout << ReportTable(report);
  int rc = kExitOk;
  if (absl::Status trained = CheckRunTrained(report); !trained.ok()) {
    std::cerr << "localpar: " << trained.message() << "\n";
    rc = kExitTrainingFailed;
  }
  if (checkpointer_.started() > 0 && checkpointer_.committed() == 0) {
    std::cerr << "localpar: every checkpoint of this run failed (" << checkpointer_.started()
              << " tried); see the messages above\n";
    rc = kExitFailure;
  }
  if (config_.out().empty()) return rc;
  absl::Status st = WriteReport(report, config_.out());
  if (st.ok()) st = WriteWeightsFile(weights, config_.out() + "/weights.pb");
  if (st.ok() && config_.trace())
    st = WriteJsonFile(ClusterTrace(stats), config_.out() + "/trace.json");
  if (!st.ok()) {
    std::cerr << "localpar: " << st.message() << "\n";
    return kExitFailure;
  }
  std::cout << "report: " << config_.out() << "/report.json\n";
  return rc;
}

}  // namespace localpar
