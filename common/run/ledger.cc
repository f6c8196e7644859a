// The run ledger.
#include "common/run/ledger.h"

#include <algorithm>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "common/core/cpu_clock.h"
#include "common/job/data_spec.h"
#include "common/nn/optimizer.h"
#include "common/run/report.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

ScheduleConfig ScheduleOf(const v1::Job& job) {
  ScheduleConfig s;
  s.kind = job.schedule().kind() == v1::Schedule::COSINE ? ScheduleConfig::Kind::kCosine
                                                         : ScheduleConfig::Kind::kConstant;
  s.lr = job.schedule().lr();
  s.warmup_steps = job.schedule().warmup_steps();
  s.min_lr = job.schedule().min_lr();
  return s;
}

// Where a ledger without a log prints: nowhere (a stream with no buffer drops everything).
std::ostream& Discard() {
  static std::ostream none(nullptr);
  return none;
}

}  // namespace

RunLedger::RunLedger(const v1::Job& job, int64_t train_examples, int64_t test_examples,
                     const LedgerOptions& options)
    : job_(job),
      train_n_(train_examples),
      test_n_(test_examples),
      total_steps_(TotalSteps(job, train_examples)),
      steps_per_epoch_(StepsPerEpoch(job, train_examples)),
      options_(options),
      validation_(std::string(EvalSplitName(job)) == "validation"),
      progress_(options.log ? *options.log : Discard(), options.live, options.progress) {
  progress_.set_bytes(JobReadsBytes(job));
  progress_.set_split(EvalSplitName(job));
}

RunLedger::~RunLedger() = default;

absl::StatusOr<std::unique_ptr<RunLedger>> RunLedger::Open(const v1::Job& job,
                                                           int64_t train_examples,
                                                           int64_t test_examples,
                                                           const LedgerOptions& options) {
  std::unique_ptr<RunLedger> ledger(new RunLedger(job, train_examples, test_examples, options));
  if (!options.out_dir.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(options.out_dir);
    if (!log.ok()) return log.status();
    ledger->metrics_ = *std::move(log);
    ledger->metrics_->set_bytes(JobReadsBytes(job));
  }
  return ledger;
}

BatchPlan RunLedger::Plan(const DataCursor& start) const {
  return BatchPlan(job_, train_n_, test_n_, start);
}

// ---- feeding ----------------------------------------------------------------------------

void RunLedger::Restore(const v1::RunReport& history, const DataCursor& at) {
  std::lock_guard<std::mutex> lock(mu_);
  // Figures this process scored itself stay; the checkpoint's fill in the rest (a
  // rollback scores the steps after the checkpoint again, replacing them).
  for (const v1::EpochFigures& e : history.epochs()) epochs_.emplace(e.epoch(), e);
  for (const v1::Evaluation& e : history.evaluations()) evaluations_.emplace(e.step(), e);
  if (history.regroups_size() > 0) regroups_ = history.regroups();
  if (fed_steps_ == 0 && train_examples_ == 0 && resumed_wall_seconds_ == 0) {
    resumed_wall_seconds_ = history.wall_seconds();  // a run resumed in a new process
    resumed_examples_ = history.train_examples();
  }
  fed_steps_ = at.step;
  epochs_fed_ = at.epoch;
  train_examples_ = history.train_examples();
}

void RunLedger::Fed(const PlanItem& item) {
  std::lock_guard<std::mutex> lock(mu_);
  if (item.kind == PlanItem::kTrain) {
    if (first_feed_cpu_ < 0) first_feed_cpu_ = ProcessCpuSeconds();
    fed_steps_ = item.step + 1;
    train_examples_ += static_cast<double>(item.rows);
  } else if (item.kind == PlanItem::kEndOfEval && !item.interim) {
    epochs_fed_ = item.epoch;
  }
}

int64_t RunLedger::fed_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fed_steps_;
}

double RunLedger::train_examples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return train_examples_;
}

int RunLedger::epochs_fed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epochs_fed_;
}

// ---- checkpoints ------------------------------------------------------------------------

bool RunLedger::CheckpointDue(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (checkpoint_requested_) {
    checkpoint_requested_ = false;
    return true;
  }
  if (options_.checkpoint_every_steps > 0 && step % options_.checkpoint_every_steps == 0) {
    return true;
  }
  return options_.checkpoint_every_seconds > 0 &&
         SecondsBetween(last_checkpoint_, Clock::now()) >= options_.checkpoint_every_seconds;
}

void RunLedger::RequestCheckpoint() {
  std::lock_guard<std::mutex> lock(mu_);
  checkpoint_requested_ = true;
}

void RunLedger::CheckpointStarted(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  last_checkpoint_step_ = step;
  last_checkpoint_ = Clock::now();
}

int64_t RunLedger::last_checkpoint_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_checkpoint_step_;
}

void RunLedger::ForgetCheckpointInFlight() {
  std::lock_guard<std::mutex> lock(mu_);
  last_checkpoint_step_ = -1;
}

// ---- figures ----------------------------------------------------------------------------

double RunLedger::Uptime() const { return SecondsBetween(started_, Clock::now()); }

std::string RunLedger::ResumeNote(const v1::Job& before, int64_t step) const {
  const int64_t was = TotalSteps(before, train_n_);
  if (was == total_steps_) return "";
  std::string s =
      absl::StrCat("the run is ", total_steps_, " steps now; the checkpoint's run had ", was);
  if (step >= total_steps_) {
    return absl::StrCat(s, ", and the checkpoint is at step ", step, ": nothing is left to train");
  }
  const double rate_was = LearningRate(ScheduleOf(before), step, was);
  const double rate_is = learning_rate(step);
  if (job_.schedule().kind() == v1::Schedule::CONSTANT) {
    return absl::StrCat(s, "; the constant schedule goes on as it was (rate ", rate_is, ")");
  }
  return absl::StrCat(s, "; the ", v1::Schedule::Kind_Name(job_.schedule().kind()),
                      " schedule is stretched over ", total_steps_, " steps: at step ", step,
                      " the rate is ", rate_is, " (", rate_was, " in the checkpoint's run)");
}

double RunLedger::learning_rate(int64_t step) const {
  return LearningRate(ScheduleOf(job_), step, total_steps_);
}

MetricsPoint RunLedger::Point(const char* kind, int epoch, int64_t step, double eps) const {
  MetricsPoint p;
  p.kind = kind;
  p.step = step;
  p.epoch = epoch;
  p.wall_seconds = Uptime();
  p.lr = LearningRate(ScheduleOf(job_), step, total_steps_);
  p.examples_per_second = eps;
  p.positions = JobLabelsPerExample(job_);
  return p;
}

void RunLedger::Progress(const ProgressLine& line, bool force) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_.Update(line, force);
}

void RunLedger::TrainFigures(int64_t step, int epoch, const std::vector<HeadStats>& so_far,
                             double examples_per_second) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!metrics_ || step == logged_step_) return;
  const double now = Uptime();
  const int64_t every = options_.train_line_every_steps;
  // A monitor's line also at once when the last stage reaches a step that an evaluation
  // follows: its time against the evaluation's is how long the evaluation took.
  const int64_t eval_every = job_.eval_every_steps();
  const bool before_eval = every <= 0 && eval_every > 0 && step % eval_every == 0;
  const bool due = every > 0 ? step % every == 0
                             : before_eval || now - logged_at_ >= options_.train_line_every_seconds;
  if (!due) return;
  logged_step_ = step;
  logged_at_ = now;
  metrics_->Write(Point("train", epoch, step, examples_per_second), so_far);
}

void RunLedger::Scored(const Scores& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (s.interim) {
    v1::Evaluation e;
    e.set_step(s.step);
    e.set_epoch(s.epoch);
    AddHeadFigures(s.eval, validation_ ? e.mutable_validation() : e.mutable_test());
    evaluations_[s.step] = std::move(e);
    progress_.InterimResult(s.step, s.epoch, s.eval);
    if (metrics_) metrics_->Write(Point("eval", s.epoch, s.step, 0), s.eval);
    return;
  }
  v1::EpochFigures e;
  e.set_epoch(s.epoch);
  e.set_seconds(std::max(0.0, s.seconds));
  std::vector<HeadStats> train = s.train;
  train.resize(s.eval.size());
  AddHeadFigures(train, e.mutable_train());
  AddHeadFigures(s.eval, validation_ ? e.mutable_validation() : e.mutable_test());
  epochs_[s.epoch] = std::move(e);
  progress_.EpochResult(s.epoch, s.eval, s.seconds);
  if (metrics_) {
    metrics_->Write(Point("epoch", s.epoch, s.step, 0), train);
    metrics_->Write(Point(validation_ ? "validation" : "test", s.epoch, s.step, 0), s.eval);
  }
}

void RunLedger::AddTrainSeconds(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  train_seconds_ += seconds;
}

void RunLedger::Done() {
  std::lock_guard<std::mutex> lock(mu_);
  progress_.Done();
}

bool RunLedger::epoch_scored(int epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  return epochs_.count(epoch) > 0;
}

// ---- the report -------------------------------------------------------------------------

double RunLedger::wall_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resumed_wall_seconds_ + Uptime();
}

v1::RunReport RunLedger::History() const {
  v1::RunReport r;
  const double wall = wall_seconds();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [epoch, e] : epochs_) *r.add_epochs() = e;
  for (const auto& [step, e] : evaluations_) *r.add_evaluations() = e;
  *r.mutable_regroups() = regroups_;
  r.set_train_examples(train_examples_);
  r.set_wall_seconds(wall);
  return r;
}

v1::RunReport RunLedger::Report(const RunFacts& facts) const {
  v1::RunReport r = History();
  DescribeRun(job_, facts.version, &r);
  r.set_job(job_.name());
  r.set_rule(v1::UpdateRule_Name(job_.rule()));
  r.set_backend(facts.backend);
  r.set_stages(facts.stages);
  r.set_replicas(std::max(1, facts.replicas));
  r.set_parameters(static_cast<double>(facts.parameters));
  {
    std::lock_guard<std::mutex> lock(mu_);
    r.set_steps(static_cast<int32_t>(fed_steps_));
    if (first_feed_cpu_ >= 0) r.set_process_cpu_seconds(ProcessCpuSeconds() - first_feed_cpu_);
    // This process's throughput: a resumed run's examples and seconds before it count in
    // neither.
    const double seconds = train_seconds_ > 0 ? train_seconds_ : Uptime();
    r.set_examples_per_second(std::max(train_examples_ - resumed_examples_, 0.0) /
                              std::max(seconds, 1e-9));
  }
  r.set_eval_split(EvalSplitName(job_));
  for (const std::string& h : options_.init_fresh_heads) r.add_init_fresh_heads(h);
  for (const std::string& h : options_.init_unused_heads) r.add_init_unused_heads(h);
  AddBitsPerByte(job_, &r);
  return r;
}

}  // namespace localpar
