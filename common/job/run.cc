// The reference training loop and its report.
#include "common/job/run.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job/tensor_codec.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<HeadStats> Evaluate(ReferenceTrainer& trainer, Backend& be, const Dataset& data,
                                int64_t batch, int stages) {
  std::vector<HeadStats> total(stages);
  std::vector<int64_t> order(static_cast<size_t>(data.size()));
  for (int64_t i = 0; i < data.size(); ++i) order[i] = i;
  BatchAssembler assembler(data, batch);
  Tensor x, y;
  for (int64_t b = 0; b < data.size(); b += batch) {
    assembler.Gather(order, b, std::min(batch, data.size() - b));
    x.Ensure(be, assembler.x_shape());
    y.Ensure(be, assembler.y_shape(), DType::kI32);
    be.CopyFromHost(x.raw(), assembler.x(), assembler.x_bytes());
    be.CopyFromHost(y.raw(), assembler.y(), assembler.y_bytes());
    std::vector<HeadStats> s = trainer.EvalBatch(x, y);
    for (int k = 0; k < stages; ++k) total[k].Add(s[k]);
  }
  return total;
}

std::string StageLosses(const std::vector<HeadStats>& s) {
  std::string out;
  for (size_t k = 0; k < s.size(); ++k) {
    absl::StrAppendFormat(&out, " s%d %.3f", k, s[k].mean_loss());
  }
  return out;
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

int64_t TotalSteps(const v1::Job& job, int64_t train_examples) {
  int64_t per_epoch = (train_examples + job.batch_size() - 1) / job.batch_size();
  int64_t total = per_epoch * job.epochs();
  if (job.max_steps() > 0 && job.max_steps() < total) total = job.max_steps();
  return total;
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
  } else {
    absl::StatusOr<DataSplit> f =
        d.has_cifar10()
            ? LoadCifar10(d.cifar10().dir(), d.train_limit(), d.test_limit())
            : LoadFashionMnist(d.fashion_mnist().dir(), d.train_limit(), d.test_limit());
    if (!f.ok()) return f.status();
    split = *std::move(f);
  }
  Standardize(split);
  return split;
}

absl::StatusOr<RunReport> RunReference(const v1::Job& job, const DataSplit& data,
                                       const RunOptions& options, std::ostream& log) {
  absl::StatusOr<std::unique_ptr<Backend>> be_or = PickBackend(options);
  if (!be_or.ok()) return be_or.status();
  Backend& be = **be_or;
  ApplyJobToBackend(job, be);
  std::string error;
  std::unique_ptr<Model> model = Model::Create(be, ToModelConfig(job), &error);
  if (!model) return absl::InvalidArgumentError(error);

  const int64_t batch = job.batch_size();
  const int64_t n_train = data.train.size();
  const int64_t steps_per_epoch = (n_train + batch - 1) / batch;
  const int64_t total_steps = TotalSteps(job, n_train);
  ReferenceTrainer trainer(*model, ToTrainerOptions(job, total_steps));

  RunReport report;
  report.job = job.name();
  report.rule = v1::UpdateRule_Name(job.rule());
  report.backend = be.Describe();
  report.stages = model->num_stages();
  report.parameters = model->num_parameters();
  log << absl::StrFormat("%s: %s, %d stages, %d parameters, %d train / %d test examples, %s\n",
                         report.job, report.rule, report.stages, report.parameters, n_train,
                         data.test.size(), report.backend);

  const bool tty = isatty(STDERR_FILENO);
  BatchAssembler assembler(data.train, batch);
  Tensor x, y;
  auto start = Clock::now();
  double train_seconds = 0;
  for (int epoch = 0; epoch < job.epochs() && trainer.step() < total_steps; ++epoch) {
    auto epoch_start = Clock::now();
    EpochReport er;
    er.epoch = epoch + 1;
    er.train.resize(report.stages);
    std::vector<int64_t> order = EpochOrder(n_train, job.seed(), epoch);
    for (int64_t b = 0; b < n_train && trainer.step() < total_steps; b += batch) {
      int64_t n = std::min(batch, n_train - b);
      assembler.Gather(order, b, n);
      x.Ensure(be, assembler.x_shape());
      y.Ensure(be, assembler.y_shape(), DType::kI32);
      be.CopyFromHost(x.raw(), assembler.x(), assembler.x_bytes());
      be.CopyFromHost(y.raw(), assembler.y(), assembler.y_bytes());
      std::vector<HeadStats> s = trainer.TrainStep(x, y);
      for (int k = 0; k < report.stages; ++k) er.train[k].Add(s[k]);
      report.train_examples += n;
      int64_t step_in_epoch = b / batch + 1;
      if (options.progress && (step_in_epoch % 20 == 0 || b + n >= n_train)) {
        double el = Seconds(epoch_start, Clock::now());
        int width = 24;
        int filled = static_cast<int>(width * step_in_epoch / steps_per_epoch);
        log << absl::StrFormat(
            "%sepoch %d/%d [%s%s] %d/%d %.0f ex/s loss%s%s", tty ? "\r" : "", epoch + 1,
            job.epochs(), std::string(filled, '#'), std::string(width - filled, ' '), step_in_epoch,
            steps_per_epoch, (b + n) / std::max(el, 1e-9), StageLosses(er.train), tty ? "" : "\n");
        log.flush();
      }
    }
    train_seconds += Seconds(epoch_start, Clock::now());
    if (options.progress && tty) log << "\n";
    er.test = Evaluate(trainer, be, data.test, job.eval_batch_size(), report.stages);
    er.seconds = Seconds(epoch_start, Clock::now());
    std::string accs;
    for (int k = 0; k < report.stages; ++k) {
      absl::StrAppendFormat(&accs, " s%d %.2f%%", k, 100 * er.test[k].accuracy());
    }
    log << absl::StrFormat("epoch %d: test accuracy%s (%.1fs)\n", er.epoch, accs, er.seconds);
    report.epochs.push_back(std::move(er));
  }
  report.steps = trainer.step();
  report.wall_seconds = Seconds(start, Clock::now());
  report.examples_per_second = report.train_examples / std::max(train_seconds, 1e-9);

  if (!options.out_dir.empty()) {
    absl::Status st = WriteReport(report, options.out_dir);
    if (st.ok()) st = WriteWeightsFile(SnapshotModel(*model), options.out_dir + "/weights.pb");
    if (!st.ok()) return st;
  }
  return report;
}

absl::Status WriteReport(const RunReport& report, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  std::string path = dir + "/report.json", tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << ReportJson(report);
    if (!out) return absl::DataLossError(absl::StrCat(tmp, ": write failed"));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::DataLossError(absl::StrCat(path, ": ", ec.message()));
  return absl::OkStatus();
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string ReportJson(const RunReport& r) {
  auto stats = [](const std::vector<HeadStats>& s) {
    std::string out = "[";
    for (size_t k = 0; k < s.size(); ++k) {
      absl::StrAppendFormat(&out, "%s{\"stage\": %d, \"loss\": %.6f, \"accuracy\": %.6f}",
                            k ? ", " : "", k, s[k].mean_loss(), s[k].accuracy());
    }
    return out + "]";
  };
  std::string out = absl::StrFormat(
      "{\n  \"job\": %s,\n  \"rule\": %s,\n  \"backend\": %s,\n  \"stages\": %d,\n"
      "  \"parameters\": %d,\n  \"steps\": %d,\n  \"train_examples\": %d,\n"
      "  \"wall_seconds\": %.3f,\n  \"examples_per_second\": %.1f,\n  \"epochs\": [",
      JsonString(r.job), JsonString(r.rule), JsonString(r.backend), r.stages, r.parameters, r.steps,
      r.train_examples, r.wall_seconds, r.examples_per_second);
  for (size_t e = 0; e < r.epochs.size(); ++e) {
    absl::StrAppendFormat(
        &out, "%s\n    {\"epoch\": %d, \"seconds\": %.3f,\n     \"train\": %s,\n     \"test\": %s}",
        e ? "," : "", r.epochs[e].epoch, r.epochs[e].seconds, stats(r.epochs[e].train),
        stats(r.epochs[e].test));
  }
  out += "\n  ]";
  if (!r.stage_reports.empty()) {
    out += ",\n  \"stage_reports\": [";
    for (size_t k = 0; k < r.stage_reports.size(); ++k) {
      const StageReport& s = r.stage_reports[k];
      absl::StrAppendFormat(
          &out,
          "%s\n    {\"stage\": %d, \"examples_per_second\": %.1f, \"resident_bytes\": %d, "
          "\"resident_bytes_first_epoch\": %d, "
          "\"queue_max_depth\": %d, \"queue_capacity\": %d, \"overlap_max_delay\": %d, "
          "\"overlap_mean_delay\": %.3f, \"rejected\": %d, \"baseline_bytes\": %d, "
          "\"state_bytes\": %d, \"activation_bytes_per_example\": %d, "
          "\"resident_bytes_by_epoch\": [%s]}",
          k ? "," : "", k, s.examples_per_second, s.resident_bytes, s.resident_bytes_first,
          s.queue_max_depth, s.queue_capacity, s.overlap_max_delay, s.overlap_mean_delay,
          s.rejected, s.baseline_bytes, s.state_bytes, s.activation_bytes_per_example,
          absl::StrJoin(s.resident_bytes_by_epoch, ", "));
    }
    out += "\n  ]";
  }
  return out + "\n}\n";
}

std::string ReportTable(const RunReport& r) {
  std::string out = absl::StrFormat("\n%s (%s), %d steps, %.1f s, %.0f examples/s\n", r.job, r.rule,
                                    r.steps, r.wall_seconds, r.examples_per_second);
  if (r.epochs.empty()) return out;
  const EpochReport& last = r.epochs.back();
  out += "stage  train loss  train acc  test loss  test acc\n";
  for (int k = 0; k < r.stages; ++k) {
    absl::StrAppendFormat(&out, "%5d  %10.4f  %8.2f%%  %9.4f  %7.2f%%", k,
                          last.train[k].mean_loss(), 100 * last.train[k].accuracy(),
                          last.test[k].mean_loss(), 100 * last.test[k].accuracy());
    if (k < static_cast<int>(r.stage_reports.size())) {
      absl::StrAppendFormat(&out, "  %8.0f ex/s", r.stage_reports[k].examples_per_second);
    }
    out += "\n";
  }
  return out;
}

}  // namespace localpar
