// The reference training loop.
#include "common/job/run.h"

#include <unistd.h>

#include <chrono>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job/metrics_log.h"
#include "common/job/model_file.h"
#include "common/job/progress.h"
#include "common/job/report.h"
#include "common/job/tensor_codec.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

// metrics.jsonl gets the training figures every this many steps (and each epoch's at its end).
constexpr int64_t kMetricsEvery = 10;

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

absl::StatusOr<std::unique_ptr<Backend>> PickBackend(const RunOptions& o) {
  if (o.device == "cuda" || o.device == "auto") {
    if (auto gpu = MakeCudaBackend(0)) return gpu;
    if (o.device == "cuda") {
      return absl::FailedPreconditionError("--device=cuda: no CUDA device is available");
    }
  } else if (o.device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", o.device, ": expected cpu, cuda or auto"));
  }
  CpuOptions cpu;
  cpu.threads = o.threads;
  return MakeCpuBackend(cpu);
}

BatchAssembler::BatchAssembler(const Dataset& data, int64_t max_rows)
    : data_(data),
      x_(static_cast<size_t>(max_rows * data.example_size())),
      y_(static_cast<size_t>(max_rows * data.label_size)) {}

void BatchAssembler::Gather(const std::vector<int64_t>& order, int64_t begin, int64_t rows) {
  rows_ = rows;
  GatherBatch(data_, order, begin, rows, x_.data(), y_.data());
}

Shape BatchAssembler::y_shape() const {
  if (data_.label_size == 1) return {rows_};
  return {rows_, data_.label_size};
}

Shape BatchAssembler::x_shape() const {
  Shape s{rows_};
  s.insert(s.end(), data_.example_shape.begin(), data_.example_shape.end());
  return s;
}

absl::StatusOr<DataSplit> LoadJobData(const v1::Job& job) {
  const v1::Data& d = job.data();
  DataSplit split;
  if (d.has_synthetic()) {
    const v1::Synthetic& s = d.synthetic();
    SyntheticOptions o;
    o.train_examples = s.train_examples();
    o.test_examples = s.test_examples();
    o.shape.assign(s.shape().begin(), s.shape().end());
    o.classes = s.classes();
    o.seed = s.seed();
    o.noise = s.noise();
    split = MakeSynthetic(o);
  } else if (d.has_text()) {
    TextCorpusOptions o;
    o.paths.assign(d.text().paths().begin(), d.text().paths().end());
    o.seq_len = d.text().seq_len();
    o.holdout_fraction = d.text().holdout_fraction();
    absl::StatusOr<DataSplit> t = LoadTextCorpus(o, d.train_limit(), d.test_limit());
    if (!t.ok()) return t.status();
    return *std::move(t);  // token ids: never standardised
  } else if (d.has_numpy() || d.has_image_folder()) {
    absl::StatusOr<DataSplit> u =
        d.has_numpy() ? LoadNumpy(ToNumpySource(d.numpy()), d.train_limit(), d.test_limit())
                      : LoadImageFolders(d.image_folder().train_dir(), d.image_folder().test_dir(),
                                         d.train_limit(), d.test_limit());
    if (!u.ok()) return u.status();
    split = *std::move(u);
    if (split.test.y.empty() && d.holdout_fraction() == 0) {
      return absl::InvalidArgumentError(
          "data.numpy: there are no x_test/y_test arrays; set data.holdout_fraction to score "
          "epochs on held-out training examples");
    }
  } else {
    absl::StatusOr<DataSplit> f =
        d.has_cifar10()
            ? LoadCifar10(d.cifar10().dir(), d.train_limit(), d.test_limit())
            : LoadFashionMnist(d.fashion_mnist().dir(), d.train_limit(), d.test_limit());
    if (!f.ok()) return f.status();
    split = *std::move(f);
  }
  if (d.holdout_fraction() > 0) HoldOut(split, d.holdout_fraction());
  Standardize(split);
  return split;
}

absl::StatusOr<v1::RunReport> RunReference(const v1::Job& job, const DataSplit& data,
                                           const RunOptions& options, std::ostream& log) {
  absl::StatusOr<std::unique_ptr<Backend>> be_or = PickBackend(options);
  if (!be_or.ok()) return be_or.status();
  Backend& be = **be_or;
  ApplyJobToBackend(job, be);
  std::string error;
  const ModelConfig config = ToModelConfig(job);
  std::unique_ptr<Model> model = Model::Create(be, config, &error);
  if (!model) return absl::InvalidArgumentError(error);
  if (!options.init_from.empty()) {
    absl::StatusOr<v1::ModelWeights> init = ReadAnyWeightsFile(options.init_from, config, *model);
    if (!init.ok()) return init.status();
    if (absl::Status s = LoadWeights(*init, options.init_from, config, *model); !s.ok()) return s;
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
  BatchPlan plan(job, data.train.size(), data.test.size());
  ReferenceTrainer trainer(replicas, ToTrainerOptions(job, plan.total_steps()));
  const int stages = model->num_stages();

  v1::RunReport report;
  DescribeRun(job, options.version, &report);
  report.set_job(job.name());
  report.set_rule(v1::UpdateRule_Name(job.rule()));
  report.set_backend(be.Describe());
  report.set_stages(stages);
  report.set_parameters(static_cast<double>(model->num_parameters()));
  log << absl::StrFormat("%s: %s, %d stages%s, %d parameters, %d train / %d test examples, %s\n",
                         report.job(), report.rule(), stages,
                         job.replicas() > 1 ? absl::StrCat(" x ", job.replicas(), " replicas") : "",
                         model->num_parameters(), data.train.size(), data.test.size(),
                         report.backend());

  const bool bytes = job.data().has_text();  // byte-level: bits per byte beside the nats
  ProgressPrinter progress(log, isatty(STDERR_FILENO), options.progress);
  progress.set_bytes(bytes);
  Clock::time_point start_of_run = Clock::now();
  double examples_so_far = 0;
  std::unique_ptr<MetricsLog> metrics;
  if (!options.out_dir.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsLog>> opened = MetricsLog::Open(options.out_dir);
    if (!opened.ok()) return opened.status();
    metrics = *std::move(opened);
    metrics->set_bytes(bytes);
  }
  const ScheduleConfig schedule = ToTrainerOptions(job, plan.total_steps()).schedule;
  auto point = [&](const char* kind, int epoch, int64_t step) {
    MetricsPoint p;
    p.kind = kind;
    p.step = step;
    p.epoch = epoch;
    p.wall_seconds = Seconds(start_of_run, Clock::now());
    p.lr = LearningRate(schedule, step, plan.total_steps());
    p.examples_per_second =
        std::string_view(kind) == "train" ? examples_so_far / std::max(p.wall_seconds, 1e-9) : 0;
    return p;
  };
  BatchAssembler train(data.train, job.batch_size()), test(data.test, job.eval_batch_size());
  Tensor x, y;
  std::vector<HeadStats> train_stats(stages), test_stats(stages);
  const auto start = Clock::now();
  auto epoch_start = start;
  double train_seconds = 0;
  int64_t examples = 0;
  start_of_run = start;
  for (PlanItem item; plan.Next(&item);) {
    if (item.kind == PlanItem::kTrain) {
      train.Gather(plan.order(), item.begin, item.rows);
      Upload(train, be, &x, &y);
      std::vector<HeadStats> s = trainer.TrainStep(x, y);
      for (int k = 0; k < stages; ++k) train_stats[k].Add(s[k]);
      examples += item.rows;
      const double elapsed = Seconds(start, Clock::now());
      ProgressLine line{item.epoch,
                        job.epochs(),
                        item.step + 1,
                        plan.total_steps(),
                        examples / std::max(elapsed, 1e-9),
                        train_stats,
                        elapsed};
      progress.Update(line);
      examples_so_far = static_cast<double>(examples);
      // Every kMetricsEvery steps: the epoch so far.
      if (metrics && (item.step + 1) % kMetricsEvery == 0) {
        metrics->Write(point("train", item.epoch, item.step + 1), train_stats);
      }
    } else if (item.kind == PlanItem::kEndOfEpoch) {
      train_seconds += Seconds(epoch_start, Clock::now());
    } else if (item.kind == PlanItem::kEval) {
      if (item.begin == 0) {  // an evaluation's first test batch: say so while it is scored
        const double elapsed = Seconds(start, Clock::now());
        ProgressLine line{item.epoch,
                          job.epochs(),
                          trainer.step(),
                          plan.total_steps(),
                          examples / std::max(elapsed, 1e-9),
                          train_stats,
                          elapsed,
                          /*evaluating=*/true};
        progress.Update(line, /*force=*/true);
      }
      test.Gather(plan.test_order(), item.begin, item.rows);
      Upload(test, be, &x, &y);
      std::vector<HeadStats> s = trainer.EvalBatch(x, y);
      for (int k = 0; k < stages; ++k) test_stats[k].Add(s[k]);
    } else if (item.interim) {  // an evaluation within the epoch (eval_every_steps)
      v1::Evaluation* e = report.add_evaluations();
      e->set_step(trainer.step());
      e->set_epoch(item.epoch);
      AddHeadFigures(test_stats, e->mutable_test());
      progress.InterimResult(trainer.step(), item.epoch, test_stats);
      if (metrics) metrics->Write(point("eval", item.epoch, trainer.step()), test_stats);
      test_stats.assign(stages, HeadStats());
    } else {
      v1::EpochFigures* e = report.add_epochs();
      e->set_epoch(item.epoch);
      e->set_seconds(Seconds(epoch_start, Clock::now()));
      AddHeadFigures(train_stats, e->mutable_train());
      AddHeadFigures(test_stats, e->mutable_test());
      progress.EpochResult(item.epoch, test_stats, e->seconds());
      if (metrics) {
        metrics->Write(point("epoch", item.epoch, trainer.step()), train_stats);
        metrics->Write(point("test", item.epoch, trainer.step()), test_stats);
      }
      train_stats.assign(stages, HeadStats());
      test_stats.assign(stages, HeadStats());
      epoch_start = Clock::now();
    }
  }
  progress.Done();
  AddBitsPerByte(job, &report);
  report.set_steps(static_cast<int32_t>(trainer.step()));
  report.set_train_examples(static_cast<double>(examples));
  report.set_wall_seconds(Seconds(start, Clock::now()));
  report.set_examples_per_second(examples / std::max(train_seconds, 1e-9));
  if (!options.out_dir.empty()) {
    v1::ModelWeights weights = SnapshotModel(*model);
    DescribeWeights(job, data.normalization, &weights);
    absl::Status st = WriteReport(report, options.out_dir);
    if (st.ok()) st = WriteWeightsFile(weights, options.out_dir + "/weights.pb");
    if (!st.ok()) return st;
  }
  return report;
}

}  // namespace localpar
