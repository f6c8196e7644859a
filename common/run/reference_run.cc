// The reference training loop.
#include "common/run/reference_run.h"

#include <unistd.h>

#include <chrono>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job/job.h"
#include "common/model_io/model_file.h"
#include "common/model_io/regroup.h"
#include "common/model_io/tensor_proto.h"
#include "common/nn/trainer.h"
#include "common/run/device.h"
#include "common/run/ledger.h"
#include "common/run/report.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One batch of `data` in backend tensors.
void Upload(const BatchAssembler& a, Backend& be, Tensor* x, Tensor* y) {
  x->Ensure(be, a.x_shape());
  y->Ensure(be, a.y_shape(), DType::kI32);
  be.CopyFromHost(x->raw(), a.x(), a.x_bytes());
  be.CopyFromHost(y->raw(), a.y(), a.y_bytes());
}

}  // namespace

absl::StatusOr<v1::RunReport> RunReference(const v1::Job& job, const DataSplit& data,
                                           const RunOptions& options, std::ostream& log) {
  absl::StatusOr<std::unique_ptr<Backend>> be_or = PickBackend({options.device, options.threads});
  if (!be_or.ok()) return be_or.status();
  Backend& be = **be_or;
  ApplyJobToBackend(job, be);
  std::string error;
  const ModelConfig config = ToModelConfig(job);
  std::unique_ptr<Model> model = Model::Create(be, config, &error);
  if (!model) return absl::InvalidArgumentError(error);
  InitNotes notes;
  if (!options.init_from.empty()) {
    const absl::Time read_start = absl::Now();
    absl::StatusOr<v1::ModelWeights> init =
        ReadAnyWeightsFile(options.init_from, config, *model, &notes);
    if (!init.ok()) return init.status();
    if (absl::Status s = LoadWeights(*init, options.init_from, config, *model); !s.ok()) return s;
    log << "--init_from: " << options.init_from << ": "
        << TransferFigures(WeightsBytes(*init), absl::ToDoubleSeconds(absl::Now() - read_start))
        << "\n";
    if (std::string said = DescribeInitNotes(notes, model->num_stages()); !said.empty()) {
      log << "--init_from: " << said << "\n";
    }
  }
  if (absl::Status s = CheckReplicasFitData(job, data.train.size()); !s.ok()) return s;
  // Replicas (Job.replicas): one model each; the trainer starts them from the first.
  std::vector<std::unique_ptr<Model>> others;
  std::vector<Model*> replicas{model.get()};
  for (int r = 1; r < job.replicas(); ++r) {
    others.push_back(Model::Create(be, config, &error));
    if (!others.back()) return absl::InvalidArgumentError(error);
    replicas.push_back(others.back().get());
  }
  // --resume: every replica's model gets the checkpoint's state, regrouped for this layout.
  std::optional<FoundCheckpoint> resume;
  std::optional<RegroupPlan> regroup;
  std::vector<EpochProgress> restored;
  if (!options.resume.empty()) {
    absl::StatusOr<FoundCheckpoint> found = FindLatestCheckpoint(options.resume);
    if (!found.ok()) return found.status();
    absl::StatusOr<RegroupPlan> plan = PlanRegroup(found->manifest, found->dir, job);
    if (!plan.ok()) return plan.status();
    const int from_replicas = plan->from_replicas;
    const std::string root = options.resume;
    if (absl::Status s = LoadCheckpointInto(
            found->manifest, found->dir,
            [&](int k, int r) { return LocalSnapshotDir(root, k, r, from_replicas); }, job, *model,
            &restored);
        !s.ok()) {
      return s;
    }
    // The checkpoint is read once: the other replicas copy the first's state.
    for (size_t r = 1; r < replicas.size(); ++r) {
      Model* m = replicas[r];
      for (int k = 0; k < m->num_stages(); ++k) {
        std::vector<Param*> from = model->stage(k).params(), to = m->stage(k).params();
        for (size_t i = 0; i < from.size(); ++i) {
          for (Tensor Param::*t : {&Param::value, &Param::state1, &Param::state2}) {
            if (!((*from[i]).*t).defined()) continue;
            if (!((*to[i]).*t).defined()) (*to[i]).*t = Tensor::Zeros(be, from[i]->value.shape());
            ((*to[i]).*t).CopyFrom((*from[i]).*t);
          }
        }
        m->stage(k).optimizer().set_steps(model->stage(k).optimizer().steps());
      }
    }
    log << "resuming from " << found->dir << " at step " << found->manifest.step() << "\n";
    if (plan->from_stages != plan->to_stages || plan->from_replicas != plan->to_replicas ||
        plan->from_rule != plan->to_rule || !plan->fresh_heads.empty() ||
        !plan->unused_heads.empty()) {
      log << DescribeRegroup(*plan) << "\n";
      regroup = *plan;
    }
    resume = *std::move(found);
  }
  LedgerOptions lo;
  lo.out_dir = options.out_dir;
  lo.progress = options.progress;
  lo.live = isatty(STDERR_FILENO);
  lo.log = &log;
  lo.init_fresh_heads = notes.fresh_heads;
  lo.init_unused_heads = notes.unused_heads;
  absl::StatusOr<std::unique_ptr<RunLedger>> opened =
      RunLedger::Open(job, data.train.size(), data.test.size(), lo);
  if (!opened.ok()) return opened.status();
  RunLedger& ledger = **opened;
  ReferenceTrainer trainer(replicas, ToStepSettings(job, ledger.total_steps()));
  DataCursor cursor;
  if (resume) {
    const v1::CheckpointManifest& m = resume->manifest;
    v1::RunReport history;
    if (!history.ParseFromString(m.report())) history.Clear();
    if (regroup) *history.add_regroups() = RegroupRecord(*regroup);
    cursor = {m.step(), m.epoch(), m.batch_in_epoch()};
    ledger.Restore(history, cursor);
    trainer.ResumeAt(m.step());
  }
  const int stages = model->num_stages();
  RunFacts facts{options.version, be.Describe(), model->num_parameters(), stages, job.replicas()};
  log << absl::StrFormat("%s: %s, %d stages%s, %d parameters, %d train / %d %s examples, %s\n",
                         job.name(), v1::UpdateRule_Name(job.rule()), stages,
                         job.replicas() > 1 ? absl::StrCat(" x ", job.replicas(), " replicas") : "",
                         facts.parameters, data.train.size(), data.test.size(), EvalSplitName(job),
                         facts.backend);

  BatchAssembler train(data.train, job.batch_size()), test(data.test, job.eval_batch_size());
  Tensor x, y;
  std::vector<HeadStats> train_stats(stages), test_stats(stages);
  for (size_t k = 0; k < restored.size() && k < train_stats.size(); ++k) {
    train_stats[k] = restored[k].head;
  }
  const auto start = Clock::now();
  auto epoch_start = start;
  int64_t examples = 0;
  BatchPlan plan = ledger.Plan(cursor);
  bool interrupted = false;
  for (PlanItem item; !interrupted && plan.Next(&item);) {
    ledger.Fed(item);
    const double elapsed = Seconds(start, Clock::now());
    ProgressLine line{item.epoch,
                      job.epochs(),
                      trainer.step(),
                      ledger.total_steps(),
                      examples / std::max(elapsed, 1e-9),
                      train_stats,
                      elapsed};
    if (item.kind == PlanItem::kTrain) {
      train.Gather(plan.order(), item.begin, item.rows, item.epoch - 1);
      Upload(train, be, &x, &y);
      std::vector<HeadStats> s = trainer.TrainStep(x, y);
      for (int k = 0; k < stages; ++k) train_stats[k].Add(s[k]);
      examples += item.rows;
      line.recent = train_stats;
      line.step = item.step + 1;
      line.examples_per_second = examples / std::max(Seconds(start, Clock::now()), 1e-9);
      ledger.Progress(line);
      ledger.TrainFigures(line.step, item.epoch, train_stats, line.examples_per_second);
      interrupted = options.stop && options.stop->load() && line.step < ledger.total_steps();
    } else if (item.kind == PlanItem::kEndOfEpoch) {
      ledger.AddTrainSeconds(Seconds(epoch_start, Clock::now()));
    } else if (item.kind == PlanItem::kEval) {
      if (item.begin == 0) {  // an evaluation's first batch: say so while it is scored
        line.evaluating = true;
        ledger.Progress(line, /*force=*/true);
      }
      test.Gather(plan.test_order(), item.begin, item.rows);
      Upload(test, be, &x, &y);
      std::vector<HeadStats> s = trainer.EvalBatch(x, y);
      for (int k = 0; k < stages; ++k) test_stats[k].Add(s[k]);
    } else {  // the end of an evaluation: within the epoch (interim), or the epoch's own
      Scores scores;
      scores.step = trainer.step();
      scores.epoch = item.epoch;
      scores.interim = item.interim;
      scores.eval = test_stats;
      if (!item.interim) {
        scores.train = train_stats;
        scores.seconds = Seconds(epoch_start, Clock::now());
        train_stats.assign(stages, HeadStats());
        epoch_start = Clock::now();
      }
      ledger.Scored(scores);
      test_stats.assign(stages, HeadStats());
    }
  }
  ledger.Done();
  v1::RunReport report = ledger.Report(facts);
  report.set_interrupted(interrupted);
  if (!options.out_dir.empty()) {
    v1::ModelWeights weights = SnapshotModel(*model);
    DescribeWeights(job, data.normalization, data.class_names, &weights);
    absl::Status st = WriteReport(report, options.out_dir);
    if (!st.ok()) return st;
    const absl::Time write_start = absl::Now();
    absl::StatusOr<std::string> written = WriteRunWeights(
        weights, config, model.get(), options.out_dir,
        options.weights_pb_limit_mib > 0 ? int64_t{options.weights_pb_limit_mib} << 20
                                         : kWeightsPbLimitBytes);
    if (!written.ok()) return written.status();
    log << "weights: " << *written << " ("
        << TransferFigures(WeightsBytes(weights), absl::ToDoubleSeconds(absl::Now() - write_start))
        << ")\n";
  }
  return report;
}

}  // namespace localpar
