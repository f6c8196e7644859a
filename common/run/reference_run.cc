// The reference training loop.
#include "common/run/reference_run.h"

#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/core/device.h"
#include "common/data/dataset.h"
#include "common/job/data_spec.h"
#include "common/job/spec.h"
#include "common/model_io/model_file.h"
#include "common/model_io/regroup.h"
#include "common/model_io/stage_snapshot.h"
#include "common/model_io/tensor_proto.h"
#include "common/nn/trainer.h"
#include "common/run/ledger.h"
#include "common/run/run_io.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One batch of `data` in backend tensors.
void Upload(const BatchAssembler& a, Backend& be, Tensor* x, Tensor* y) {
  x->Ensure(be, a.x_shape(), a.x_dtype());
  y->Ensure(be, a.y_shape(), DType::kI32);
  be.CopyFromHost(x->raw(), a.x(), a.x_bytes());
  be.CopyFromHost(y->raw(), a.y(), a.y_bytes());
}

// The run's models: one per replica (Job.replicas), the first read from --init_from; the
// trainer starts the others from it.
struct Replicas {
  std::vector<std::unique_ptr<Model>> models;
  InitNotes notes;
  std::vector<Model*> pointers() const {
    std::vector<Model*> out;
    for (const auto& m : models) out.push_back(m.get());
    return out;
  }
};

absl::StatusOr<Replicas> BuildReplicas(Backend& be, const v1::Job& job, const RunOptions& o,
                                       std::ostream& log) {
  const ModelConfig config = ToModelConfig(job);
  Replicas out;
  for (int r = 0; r < job.replicas(); ++r) {
    std::string error;
    out.models.push_back(Model::Create(be, config, &error));
    if (!out.models.back()) return absl::InvalidArgumentError(error);
  }
  if (!o.init_from.empty()) {
    absl::StatusOr<InitNotes> notes = LoadInitialWeights(o.init_from, config, *out.models[0], log);
    if (!notes.ok()) return notes.status();
    out.notes = *std::move(notes);
  }
  return out;
}

// --resume: the checkpoint, what regrouping it for this layout changed, and each stage's
// training figures since its last epoch.
struct Resumed {
  FoundCheckpoint found;
  std::string root;  // the directory holding the workers' snapshot directories
  std::optional<RegroupPlan> regroup;
  std::vector<EpochProgress> progress;
};

absl::StatusOr<Resumed> Resume(const std::string& root, const v1::Job& job, Replicas& replicas,
                               std::ostream& log) {
  // A lambda below takes `dir`: a plain variable, not a structured binding.
  const std::pair<std::string, uint64_t> split = SplitResumePath(root);
  const std::string dir = split.first;
  const uint64_t only = split.second;
  absl::StatusOr<FoundCheckpoint> found = FindLatestCheckpoint(dir, "", "", only);
  if (!found.ok()) return found.status();
  absl::StatusOr<RegroupPlan> plan = PlanRegroup(found->manifest, found->dir, job);
  if (!plan.ok()) return plan.status();
  Resumed out;
  const int from_replicas = plan->from_replicas;
  const bool changes = ChangesLayout(*plan);
  // In the checkpoint's own layout, replicas that synchronise every few steps each read
  // their own snapshots after the trainer is made (RestoreEach), so they are not
  // synchronised here; in another layout they are, on loading.
  if (absl::Status s = LoadCheckpointInto(
          found->manifest, found->dir,
          [&](int k, int r) { return LocalSnapshotDir(dir, k, r, from_replicas); }, job,
          *replicas.models[0], &out.progress, /*synchronise=*/changes);
      !s.ok()) {
    return s;
  }
  // The checkpoint is read once: the other replicas copy the first's state.
  for (size_t r = 1; r < replicas.models.size(); ++r) {
    replicas.models[r]->CopyStateFrom(*replicas.models[0]);
  }
  log << "resuming from " << found->dir << " at step " << found->manifest.step() << "\n";
  if (changes) {
    log << DescribeRegroup(*plan) << "\n";
    out.regroup = *plan;
  }
  out.found = *std::move(found);
  out.root = dir;
  return out;
}

// Replicas that synchronise every few steps each kept their own weights, optimizer and
// outer state since the last synchronisation: each reads its own snapshots (the same
// layout as the checkpoint's). After the trainer is made, which starts every replica from
// the first's parameters.
absl::Status RestoreEach(const Resumed& resumed, Replicas& replicas) {
  const v1::CheckpointManifest& m = resumed.found.manifest;
  const int count = static_cast<int>(replicas.models.size());
  for (int r = 0; r < count; ++r) {
    Model& model = *replicas.models[static_cast<size_t>(r)];
    for (int k = 0; k < model.num_stages(); ++k) {
      const v1::StageSnapshot* snap = FindSnapshot(m, k, r);
      if (snap == nullptr) {
        return absl::DataLossError(absl::StrCat(
            resumed.found.dir, "/MANIFEST: has no snapshot of stage ", k, " replica ", r));
      }
      EpochProgress progress;
      if (absl::Status s =
              RestoreStageSnapshot(&model.stage(k), k, LocalSnapshotDir(resumed.root, k, r, count),
                                   *snap, m.fingerprint(), &progress, r);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

// The books and the trainer at the checkpoint's step; the data cursor there.
DataCursor StartAt(const Resumed& resumed, RunLedger& ledger, ReferenceTrainer& trainer) {
  const v1::CheckpointManifest& m = resumed.found.manifest;
  v1::RunReport history;
  if (!history.ParseFromString(m.report())) history.Clear();
  if (resumed.regroup) *history.add_regroups() = RegroupRecord(*resumed.regroup);
  const DataCursor cursor{m.step(), m.epoch(), m.batch_in_epoch()};
  ledger.Restore(history, cursor);
  trainer.ResumeAt(m.step());
  return cursor;
}

// The batch plan's items, one at a time, through the trainer into the ledger.
class Loop {
 public:
  Loop(const v1::Job& job, const DataSplit& data, Backend& be, ReferenceTrainer& trainer,
       RunLedger& ledger, int stages)
      : be_(be),
        trainer_(trainer),
        ledger_(ledger),
        stages_(stages),
        train_(data.train, job.batch_size()),
        test_(data.test, job.eval_batch_size()),
        train_stats_(stages),
        test_stats_(stages) {}

  void StartFigures(const std::vector<EpochProgress>& restored) {
    for (size_t k = 0; k < restored.size() && k < train_stats_.size(); ++k) {
      train_stats_[k] = restored[k].head;
    }
  }

  // Why Run stopped early without `stop`: a batch that could not be read.
  const absl::Status& error() const { return error_; }

  // Every item of `plan`; true when `stop` ended it before the last step.
  bool Run(BatchPlan& plan, const std::atomic<bool>* stop) {
    start_ = epoch_start_ = Clock::now();
    for (PlanItem item; plan.Next(&item);) {
      ledger_.Fed(item);
      if (item.kind == PlanItem::kTrain) {
        const int64_t step = Train(plan, item);
        if (!error_.ok()) return false;
        if (stop && stop->load() && step < ledger_.total_steps()) return true;
      } else if (item.kind == PlanItem::kEndOfEpoch) {
        ledger_.AddTrainSeconds(Seconds(epoch_start_, Clock::now()));
      } else if (item.kind == PlanItem::kEval) {
        Evaluate(plan, item);
        if (!error_.ok()) return false;
      } else {
        Score(item);
      }
    }
    return false;
  }

 private:
  ProgressLine Line(const PlanItem& item) const {
    const double elapsed = Seconds(start_, Clock::now());
    return ProgressLine{item.epoch,
                        ledger_.epochs(),
                        trainer_.step(),
                        ledger_.total_steps(),
                        examples_ / std::max(elapsed, 1e-9),
                        train_stats_,
                        elapsed};
  }

  // A training step; returns the steps done.
  int64_t Train(const BatchPlan& plan, const PlanItem& item) {
    if (error_ = train_.Gather(plan.order(), item.begin, item.rows, item.epoch - 1); !error_.ok()) {
      return item.step;
    }
    Upload(train_, be_, &x_, &y_);
    std::vector<HeadStats> s = trainer_.TrainStep(x_, y_);
    for (int k = 0; k < stages_; ++k) train_stats_[k].Add(s[k]);
    examples_ += item.rows;
    ProgressLine line = Line(item);
    line.step = item.step + 1;
    ledger_.Progress(line);
    ledger_.TrainFigures(line.step, item.epoch, train_stats_, line.examples_per_second);
    return line.step;
  }

  // One batch of an evaluation; its first says so while it is scored.
  void Evaluate(const BatchPlan& plan, const PlanItem& item) {
    if (item.begin == 0) {
      ProgressLine line = Line(item);
      line.evaluating = true;
      ledger_.Progress(line, /*force=*/true);
    }
    if (error_ = test_.Gather(plan.test_order(), item.begin, item.rows); !error_.ok()) return;
    Upload(test_, be_, &x_, &y_);
    std::vector<HeadStats> s = trainer_.EvalBatch(x_, y_);
    for (int k = 0; k < stages_; ++k) test_stats_[k].Add(s[k]);
  }

  // The end of an evaluation: within the epoch (interim), or the epoch's own.
  void Score(const PlanItem& item) {
    Scores scores;
    scores.step = trainer_.step();
    scores.epoch = item.epoch;
    scores.interim = item.interim;
    scores.eval = test_stats_;
    if (!item.interim) {
      scores.train = train_stats_;
      scores.seconds = Seconds(epoch_start_, Clock::now());
      train_stats_.assign(stages_, HeadStats());
      epoch_start_ = Clock::now();
    }
    ledger_.Scored(scores);
    test_stats_.assign(stages_, HeadStats());
  }

  Backend& be_;
  ReferenceTrainer& trainer_;
  RunLedger& ledger_;
  const int stages_;
  BatchAssembler train_, test_;
  Tensor x_, y_;
  std::vector<HeadStats> train_stats_, test_stats_;
  Clock::time_point start_, epoch_start_;
  int64_t examples_ = 0;
  absl::Status error_;  // a batch that could not be read ends the run
};

}  // namespace

absl::StatusOr<v1::RunReport> RunReference(const v1::Job& job, const DataSplit& data,
                                           const RunOptions& options, std::ostream& log,
                                           std::ostream& out) {
  PickedBackend picked = PickBackend({options.device, options.threads});
  if (!picked.backend) {
    return picked.bad_name ? absl::InvalidArgumentError(picked.error)
                           : absl::FailedPreconditionError(picked.error);
  }
  Backend& be = *picked.backend;
  ApplyJobToBackend(job, be);
  absl::StatusOr<Replicas> replicas = BuildReplicas(be, job, options, log);
  if (!replicas.ok()) return replicas.status();
  if (absl::Status s = CheckReplicasFitData(job, data.train.size()); !s.ok()) return s;
  std::optional<Resumed> resumed;
  if (!options.resume.empty()) {
    absl::StatusOr<Resumed> r = Resume(options.resume, job, *replicas, log);
    if (!r.ok()) return r.status();
    resumed = *std::move(r);
  }
  absl::StatusOr<std::unique_ptr<RunLedger>> opened =
      RunLedger::Open(job, data.train.size(), data.test.size(),
                      RunLedgerOptions(options.out_dir, options.progress, log, replicas->notes));
  if (!opened.ok()) return opened.status();
  RunLedger& ledger = **opened;
  ReferenceTrainer trainer(replicas->pointers(), ToStepSettings(job, ledger.total_steps()));
  const DataCursor cursor = resumed ? StartAt(*resumed, ledger, trainer) : DataCursor{};
  if (resumed && job.replica_sync().every() > 1 && !resumed->regroup) {
    if (absl::Status s = RestoreEach(*resumed, *replicas); !s.ok()) return s;
  }
  if (resumed) {
    absl::StatusOr<v1::Job> before = CheckpointJob(resumed->found.manifest, resumed->found.dir);
    if (before.ok()) {
      if (std::string note = ledger.ResumeNote(*before, cursor.step); !note.empty()) {
        log << note << "\n";
      }
    }
  }
  Model& model = *replicas->models[0];
  const int stages = model.num_stages();
  RunFacts facts{options.version, be.Describe(), model.num_parameters(), stages, job.replicas()};
  log << absl::StrFormat(
      "%s: %s, %d stage%s%s, %d parameters, %d train / %d %s examples, %s\n", job.name(),
      v1::UpdateRule_Name(job.rule()), stages, stages == 1 ? "" : "s",
      job.replicas() > 1 ? absl::StrCat(" x ", job.replicas(), " replicas") : "", facts.parameters,
      data.train.size(), data.test.size(), EvalSplitName(job), facts.backend);
  log << "length: " << StepsNote(job, data.train.size()) << "\n";

  Loop loop(job, data, be, trainer, ledger, stages);
  if (resumed) loop.StartFigures(resumed->progress);
  BatchPlan plan = ledger.Plan(cursor);
  const bool interrupted = loop.Run(plan, options.stop);
  if (!loop.error().ok()) return loop.error();  // data that changed under the run
  ledger.Done();

  v1::RunReport report = ledger.Report(facts);
  report.set_interrupted(interrupted);
  RunOutputs outputs;
  outputs.out_dir = options.out_dir;
  if (options.weights_pb_limit_mib > 0) {
    outputs.weights_pb_limit = int64_t{options.weights_pb_limit_mib} << 20;
  }
  outputs.data = &data;
  outputs.model = &model;
  v1::ModelWeights weights;
  if (!options.out_dir.empty()) weights = SnapshotModel(model);
  if (absl::Status s = WriteRunOutputs(job, report, std::move(weights), outputs, out); !s.ok()) {
    return s;
  }
  return report;
}

}  // namespace localpar
