// Running a job on its workers.
#include "services/coordinator/job_runner.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job/spec.h"
#include "common/model_io/model_file.h"
#include "common/model_io/tensor_proto.h"
#include "common/run/report.h"
#include "common/run/run_io.h"
#include "services/common/exit_codes.h"
#include "services/common/interrupt.h"
#include "services/common/program_config.h"
#include "services/coordinator/cluster_report.h"
#include "services/coordinator/coordinator_metrics.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

v1::RunReport HistoryOf(const FoundCheckpoint& found) {
  v1::RunReport history;
  if (!history.ParseFromString(found.manifest.report())) history.Clear();
  return history;
}

}  // namespace

JobRunner::JobRunner(const v1::CoordinatorConfig& config, const SecurityOptions& security,
                     v1::Job job, DataSplit data, std::string fingerprint, RunLedger& ledger,
                     CoordinatorMetrics* metrics, std::ostream& log, std::ostream& out)
    : config_(config),
      security_(security),
      job_(std::move(job)),
      data_(std::move(data)),
      ledger_(ledger),
      log_(log),
      out_(out),
      pool_({config.workers().begin(), config.workers().end()}, job_.replicas(), security,
            int64_t{config.has_transfer_chunk_kib() ? config.transfer_chunk_kib() : 4096} << 10),
      checkpointer_(config, job_, std::move(fingerprint), metrics, ledger, log),
      feeder_(config, job_, data_, ledger, checkpointer_, progress_, metrics),
      events_(ledger, checkpointer_, pool_, metrics, log),
      monitor_(job_, ledger, pool_, board_, checkpointer_, progress_) {}

JobRunner::~JobRunner() = default;

void JobRunner::ResumeFrom(FoundCheckpoint found) { resume_ = std::move(found); }

DataCursor JobRunner::StartCursor() const {
  if (!resume_) return {};
  const v1::CheckpointManifest& m = resume_->manifest;
  return {m.step(), m.epoch(), m.batch_in_epoch()};
}

absl::Status JobRunner::Run() {
  monitor_.Start();
  std::unique_ptr<PipelineLink> link;
  absl::Status result;
  bool collected = false;
  for (int attempt = 0;; ++attempt) {
    if (absl::Status configured = Configure(); !configured.ok()) {
      // A stage lost while being configured comes back like one lost while training.
      if (ExitCodeOf(configured) != kExitWorkerLost) {
        result = configured;
        break;
      }
      result =
          Recover(grpc::Status(grpc::StatusCode::UNAVAILABLE, "a stage was lost while configuring"),
                  attempt);
      if (!result.ok()) break;
      continue;
    }
    std::vector<v1::Worker::Stub*> firsts;
    for (int r = 0; r < pool_.replicas(); ++r) firsts.push_back(&pool_.stub(0, r));
    link = std::make_unique<PipelineLink>(firsts, security_);
    events_.Start(*link);
    // The books start where the data does: at the checkpoint, or at step 0.
    ledger_.Restore(resume_ ? HistoryOf(*resume_) : v1::RunReport(), StartCursor());
    const bool fed = feeder_.Feed(*link, StartCursor());
    if (!feeder_.data_error().ok()) {
      result = feeder_.data_error();
      break;
    }
    uint64_t drain = 0;
    if (fed && feeder_.SendControl(*link, v1::Control::DRAIN, &drain) && events_.WaitAck(drain)) {
      // A stage lost after the last commit (before its weights were read) is recovered
      // like any other: from the final checkpoint, with nothing left to replay.
      result = Collect();
      if (ExitCodeOf(result) != kExitWorkerLost || !checkpointer_.enabled()) {
        collected = true;
        break;
      }
    }
    events_.Stop(*link);
    if (!(result = Recover(link->Finish(), attempt)).ok()) break;
  }
  monitor_.Stop();
  if (!collected) {
    if (link) events_.Stop(*link);
    return result;
  }
  // Shutdown travels in-band like every control item: each worker passes it on, then exits
  // once its upstream stream closes.
  uint64_t bye = 0;
  if (feeder_.SendControl(*link, v1::Control::SHUTDOWN, &bye)) events_.WaitAck(bye);
  grpc::Status fin = link->Finish();
  events_.Stop(*link);
  if (!fin.ok()) {
    // The weights and the report are complete: a stage lost now loses nothing, but it may
    // not have been told to exit.
    std::string lost = pool_.Unreachable(2);
    log_ << "\nlocalpar: the run is complete, but "
         << (lost.empty() ? std::string("the pipeline") : lost) << " was lost while shutting down ("
         << fin.error_message() << "); a worker that missed SHUTDOWN keeps running until it is "
         << "stopped\n";
  }
  if (feeder_.interrupted()) return Interrupted(result);
  if (feeder_.stopped_early()) {
    log_ << "localpar: stopped after step " << ledger_.fed_steps() << " at checkpoint "
         << checkpointer_.last_committed() << "; continue with --resume=" << checkpointer_.dir()
         << "\n";
  }
  return result;
}

// What a run stopped by a signal says: where it stopped, what it wrote, how to go on.
absl::Status JobRunner::Interrupted(const absl::Status& collected) const {
  if (!collected.ok() && ExitCodeOf(collected) != kExitTrainingFailed) return collected;
  std::string m = absl::StrCat("interrupted after step ", ledger_.fed_steps(), " of ",
                               ledger_.total_steps(), "; ");
  if (config_.out().empty()) {
    absl::StrAppend(&m, "no --out, so no weights or report were written");
  } else {
    absl::StrAppend(&m, "the weights after that step and the report so far are in ", config_.out());
  }
  if (checkpointer_.enabled() && !checkpointer_.last_committed().empty()) {
    absl::StrAppend(
        &m, "; checkpoint ", checkpointer_.last_committed(),
        " holds the run: to continue, run the same command with --resume=", checkpointer_.dir());
  } else {
    absl::StrAppend(&m,
                    "; with no --checkpoint_dir this run cannot be resumed (give one to be able "
                    "to stop and go on), so the rest of the training is lost");
  }
  return WithExitCode(absl::CancelledError(m), kExitInterrupted);
}

// ---- configuration and recovery -------------------------------------------------------

absl::Status JobRunner::Configure() {
  progress_.phase = FeedProgress::kConfiguring;
  while (true) {
    StageSettings s;
    s.total_steps = ledger_.total_steps();
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
    absl::StatusOr<ConfigureOutcome> out =
        pool_.ConfigureAll(job_, s, config_.configure_timeout_s());
    if (out.ok()) {
      backend_ = out->backend;
      parameters_ = out->parameters;
      return absl::OkStatus();
    }
    if (!resume_ || !absl::IsDataLoss(out.status())) return out.status();
    // A stage could not restore its snapshot of that checkpoint (its volume lost, or a file
    // damaged): every stage goes back to the next older one.
    std::optional<FoundCheckpoint> older = checkpointer_.OlderThan(resume_->manifest.id());
    if (!older) {
      return FailureError(
          absl::StrCat(out.status().message(), "; no older checkpoint under ", checkpointer_.dir(),
                       " to fall back to; every stage must hold its snapshot of one checkpoint"));
    }
    log_ << "localpar: " << out.status().message() << "; falling back to " << older->dir
         << " (step " << older->manifest.step() << ")\n";
    ResumeFrom(*std::move(older));
  }
}

absl::Status JobRunner::Recover(const grpc::Status& st, int attempt) {
  progress_.phase = FeedProgress::kRecovering;
  std::string lost = pool_.Unreachable(2);
  const std::string last =
      checkpointer_.last_committed().empty() ? "none" : checkpointer_.last_committed();
  if (!checkpointer_.enabled() || attempt >= config_.max_recoveries()) {
    return WorkerLostError(absl::StrCat(
        "the pipeline broke (", lost.empty() ? "every stage still answers" : "lost " + lost, "; ",
        st.error_message(), ")",
        !checkpointer_.enabled() ? "; no --checkpoint_dir to recover from"
                                 : absl::StrCat("; giving up after ", attempt, " recoveries"),
        "; last checkpoint: ", last));
  }
  log_ << "\nlocalpar: the pipeline broke (" << (lost.empty() ? "a stream failed" : "lost " + lost)
       << "); waiting up to " << config_.recovery_timeout_s() << " s for every stage\n";
  // Exponential backoff up to 2 s between probes, within the deadline.
  const auto deadline = Clock::now() + std::chrono::seconds(config_.recovery_timeout_s());
  std::chrono::milliseconds backoff(100);
  while (!(lost = pool_.Unreachable(1)).empty()) {
    if (InterruptRequested().load()) {
      return WithExitCode(absl::CancelledError(absl::StrCat("interrupted while waiting for ", lost,
                                                            "; last checkpoint: ", last)),
                          kExitInterrupted);
    }
    if (Clock::now() > deadline) {
      return WorkerLostError(absl::StrCat(lost, " did not come back within ",
                                          config_.recovery_timeout_s(),
                                          " s; last checkpoint: ", last));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
  std::optional<FoundCheckpoint> back = checkpointer_.RollBack(log_);
  if (back) {
    ResumeFrom(*std::move(back));
    log_ << "localpar: rolling every stage back to " << resume_->dir << " (step "
         << resume_->manifest.step() << ") and replaying\n";
  } else {
    resume_.reset();
    log_ << "localpar: no committed checkpoint yet; restarting from step 0\n";
  }
  return absl::OkStatus();
}

// ---- the end of a run -----------------------------------------------------------------

namespace {

// Field by field: a stage's weights may pass protobuf's 2 GiB serialisation limit.
bool SameWeights(const v1::StageWeights& a, const v1::StageWeights& b) {
  if (a.params_size() != b.params_size()) return false;
  for (int i = 0; i < a.params_size(); ++i) {
    const v1::NamedTensor &x = a.params(i), &y = b.params(i);
    if (x.name() != y.name() || x.tensor().dtype() != y.tensor().dtype() ||
        !std::equal(x.tensor().shape().begin(), x.tensor().shape().end(),
                    y.tensor().shape().begin(), y.tensor().shape().end()) ||
        x.tensor().data() != y.tensor().data()) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status JobRunner::CheckReplicasAgree(const v1::ModelWeights& weights, int64_t steps) {
  const StepSettings settings = ToStepSettings(job_, ledger_.total_steps());
  if (ReplicasStepAlone(settings) && steps > 0 && !SyncsAfter(settings, steps - 1)) {
    // Stopped between synchronisations: each replica holds its own weights.
    const int64_t since = steps % settings.sync_every;
    log_ << "localpar: the run stopped " << since << " step" << (since == 1 ? "" : "s")
         << " after its replicas last synchronised (every " << settings.sync_every
         << " steps); the weights written are replica 0's\n";
    return absl::OkStatus();
  }
  for (int k = 0; k < pool_.size(); ++k) {
    for (int r = 1; r < pool_.replicas(); ++r) {
      absl::StatusOr<v1::StageWeights> w = pool_.Weights(k, r);
      if (!w.ok()) {
        return CollectFailed(absl::StrCat(
            pool_.Name(k, r), ": collecting its weights failed: ", w.status().message()));
      }
      if (!SameWeights(*w, weights.stages(k))) {
        return FailureError(absl::StrCat(pool_.Name(k, r),
                                         " holds other weights than replica 0; the replicas did "
                                         "not take the same steps"));
      }
    }
  }
  return absl::OkStatus();
}

// A collection that failed: what was refused, and where the run's good weights are.
absl::Status JobRunner::CollectFailed(const std::string& what) {
  std::string m = absl::StrCat(what, "; no weights were written");
  if (checkpointer_.enabled() && !checkpointer_.last_committed().empty()) {
    absl::StrAppend(&m, "; checkpoint ", checkpointer_.last_committed(),
                    " holds the run's weights as of its step (--resume=", checkpointer_.dir(), ")");
  }
  return WorkerLostError(m);
}

absl::Status JobRunner::Collect() {
  // The job says what every stage must send back (built stage by stage on the CPU).
  absl::StatusOr<std::vector<std::vector<TensorSpec>>> specs =
      StageTensorSpecs(ToModelConfig(job_));
  if (!specs.ok()) return specs.status();
  pool_.ExpectWeights(*std::move(specs),
                      config_.has_collect_stall_s() ? config_.collect_stall_s() : 60);
  std::vector<std::optional<v1::StatsResponse>> polled = pool_.PollStats(config_.trace(), 10);
  std::vector<v1::StatsResponse> stats;
  v1::ModelWeights weights;
  std::string non_finite;  // the first NaN or infinity the weights hold
  const absl::Time collect_start = absl::Now();
  for (int k = 0; k < pool_.size(); ++k) {
    if (!polled[k]) {
      return WorkerLostError(
          absl::StrCat("stage ", k, " at ", pool_.address(k), " stopped answering"));
    }
    stats.push_back(*polled[k]);
    absl::StatusOr<v1::StageWeights> w = pool_.Weights(k, 0, &non_finite);
    if (!w.ok()) {
      return CollectFailed(
          absl::StrCat("stage ", k, ": collecting its weights failed: ", w.status().message()));
    }
    *weights.add_stages() = *std::move(w);
  }
  if (absl::Status agree = CheckReplicasAgree(weights, stats.empty() ? 0 : stats[0].steps());
      !agree.ok()) {
    return agree;
  }
  const double collect_seconds = absl::ToDoubleSeconds(absl::Now() - collect_start);
  // Nothing is lost from here on: end the progress line before the table.
  monitor_.Stop();
  v1::RunReport report = ledger_.Report(
      RunFacts{VersionString(), backend_, parameters_, pool_.size(), pool_.replicas()});
  report.set_interrupted(feeder_.interrupted());
  AddStageReports(stats, &report);
  absl::Status result = CheckRunTrained(report);
  // Non-finite weights belong to a run whose loss diverged (reported below, exit 6); in a
  // run the figures say trained well, a worker sent values it never computed.
  if (result.ok() && !non_finite.empty()) {
    return CollectFailed(absl::StrCat(non_finite, ", though every stage reported a finite loss"));
  }
  if (!result.ok()) result = WithExitCode(result, kExitTrainingFailed);
  if (result.ok() && checkpointer_.started() > 0 && checkpointer_.committed() == 0) {
    result = FailureError(absl::StrCat("every checkpoint of this run failed (",
                                       checkpointer_.started(), " tried); see the messages above"));
  }
  if (!config_.out().empty() && config_.trace()) {
    if (absl::Status st = WriteJsonFile(ClusterTrace(stats), config_.out() + "/trace.json");
        !st.ok()) {
      return FailureError(st.message());
    }
  }
  RunOutputs outputs;
  outputs.out_dir = config_.out();
  if (config_.has_weights_pb_limit_mib()) {
    outputs.weights_pb_limit = int64_t{config_.weights_pb_limit_mib()} << 20;
  }
  outputs.data = &data_;
  outputs.collect_seconds = collect_seconds;
  if (absl::Status st = WriteRunOutputs(job_, report, std::move(weights), outputs, out_);
      !st.ok()) {
    return FailureError(st.message());
  }
  return result;
}

}  // namespace localpar
