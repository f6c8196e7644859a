// `localpar export` and `localpar predict`: using a trained model.
#include <filesystem>
#include <fstream>
#include <ostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/core/device.h"
#include "common/data/npy.h"
#include "common/io/atomic_file.h"
#include "common/job/parse.h"
#include "common/model_io/onnx_export.h"
#include "common/model_io/predict.h"
#include "common/model_io/safetensors.h"
#include "common/run/reference_run.h"
#include "services/common/exit_codes.h"
#include "services/localpar/command_flags.h"
#include "services/localpar/open_model.h"

namespace localpar {

absl::Status OpenModel(const std::string& job_path, const v1::JobOverrides& overrides,
                       const std::string& weights_path, const v1::DeviceConfig& device,
                       std::ostream& err, std::unique_ptr<Backend>* backend, TrainedModel* model) {
  absl::StatusOr<v1::Job> job = LoadJobWithOverrides(job_path, overrides);
  if (!job.ok()) return JobLoadError(job.status());
  DeviceChoice o;
  o.device = device.device();
  o.threads = std::max(1, device.threads());
  PickedBackend picked = PickBackend(o);
  if (!picked.backend) return UsageError(picked.error);
  *backend = std::move(picked.backend);
  absl::StatusOr<TrainedModel> m =
      OpenTrainedModel(*job, weights_path, **backend, overrides.stages() > 0);
  if (!m.ok()) {
    const bool missing = m.status().code() == absl::StatusCode::kNotFound;
    return CodedError(missing ? kExitUsage : kExitBadJob, std::string(m.status().message()));
  }
  *model = *std::move(m);
  if (!model->layout_note.empty()) err << "localpar: " << model->layout_note << "\n";
  return absl::OkStatus();
}

namespace {

int LastStage(const TrainedModel& m) { return static_cast<int>(m.config.stages.size()) - 1; }

// A CSV field, quoted when it holds a comma, a quote or a line break (RFC 4180).
std::string CsvField(const std::string& v) {
  if (v.find_first_of(",\"\n\r") == std::string::npos) return v;
  std::string out = "\"";
  for (char ch : v) {
    out += ch;
    if (ch == '"') out += '"';
  }
  return out + "\"";
}

}  // namespace

namespace {

// "read: 3221 MB in 9.1 s, 354 MB/s; written: ...": the whole-model operations' figures.
std::string Figures(const v1::ModelWeights& weights, double read_seconds, absl::Time write_start) {
  const int64_t bytes = WeightsBytes(weights);
  return absl::StrCat("read: ", TransferFigures(bytes, read_seconds), "; written: ",
                      TransferFigures(bytes, absl::ToDoubleSeconds(absl::Now() - write_start)));
}

}  // namespace

absl::Status ExportCommand(const Args& args, const Io& io) {
  v1::ExportCommand c;
  std::vector<std::string> pos;
  absl::StatusOr<bool> go = ParseCommandArgs(
      "export",
      "localpar export JOB_FILE WEIGHTS --out=PATH [flags]\n"
      "Writes the weights that JOB_FILE trained (weights.pb from --out of run or "
      "train) as a safetensors file or a directory of safetensors shards with "
      "Hugging Face's index, or the network with its input normalisation as an "
      "ONNX model (opset 17) that ONNX Runtime runs.",
      args, &c, KeepOverrides({"stages", "data_path"}), {"JOB_FILE", "WEIGHTS"}, &pos, io.out);
  if (!go.ok() || !*go) return go.status();
  if (c.out().empty()) return CodedError(kExitUsage, "--out: name the file to write");
  if (c.shard_mib() < 0) return CodedError(kExitUsage, "--shard_mib must be >= 0");
  std::string format = c.format();
  std::string named;  // the format --out's file name says
  if (absl::EndsWith(c.out(), ".onnx")) named = "onnx";
  if (absl::EndsWith(c.out(), ".safetensors")) named = "safetensors";
  std::error_code ec;
  // Shards: --out names a directory (DIR/, an existing one, or with --shard_mib).
  const bool sharded = named.empty() && (absl::EndsWith(c.out(), "/") || c.has_shard_mib() ||
                                         std::filesystem::is_directory(c.out(), ec));
  if (sharded && format.empty()) format = "safetensors";
  if (c.has_shard_mib() && !sharded) {
    return CodedError(kExitUsage, absl::StrCat("--shard_mib: --out=", c.out(),
                                               " names one file; name a directory for shards"));
  }
  if (format.empty()) format = named;
  if (!named.empty() && format != named) {
    return CodedError(kExitUsage, absl::StrCat("--out=", c.out(), " names a .", named,
                                               " file, but --format=", c.format(),
                                               "; make them agree (or leave --format out)"));
  }
  if (format != "onnx" && format != "safetensors") {
    return CodedError(
        kExitUsage, c.format().empty()
                        ? absl::StrCat("--out=", c.out(),
                                       ": name a .safetensors or .onnx file, or set --format")
                        : absl::StrCat("--format=", c.format(), ": expected safetensors or onnx"));
  }
  if (c.has_external_data() && format != "onnx") {
    return CodedError(kExitUsage, "--external_data applies to --format=onnx only");
  }
  if (c.has_stage() && c.stage() < 0) return CodedError(kExitUsage, "--stage must be >= 0");
  std::unique_ptr<Backend> backend;
  TrainedModel model;
  const absl::Time start = absl::Now();
  if (absl::Status s =
          OpenModel(pos[0], c.overrides(), pos[1], DeviceDefaults(), io.err, &backend, &model);
      !s.ok()) {
    return s;
  }
  const double read_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const absl::Time write_start = absl::Now();
  const int stage = c.has_stage() ? c.stage() : LastStage(model);
  if (stage > LastStage(model)) {
    return CodedError(
        kExitUsage, absl::StrCat("--stage=", stage, ": the job has stages 0..", LastStage(model)));
  }
  absl::Status written;
  bool external = false;
  if (format == "onnx") {
    // Past 1.5 GiB of parameters the graph cannot hold them (protobuf's 2 GiB limit).
    external = c.has_external_data()
                   ? c.external_data()
                   : model.model->num_parameters() * int64_t{4} > (int64_t{3} << 29);
    OnnxExternalData data;
    data.path = c.out() + ".data";
    data.location = std::filesystem::path(data.path).filename().string();
    absl::StatusOr<std::string> bytes = ExportOnnx(
        model, stage, model.config.stages.empty() ? "" : pos[0], external ? &data : nullptr);
    if (!bytes.ok()) return CodedError(kExitFailure, std::string(bytes.status().message()));
    written = WriteFileAtomically(c.out(), *bytes);
  } else if (sharded) {
    absl::StatusOr<std::vector<std::string>> shards =
        WriteShardedSafetensors(DescribeParams(model.config, *model.model, stage), model.weights,
                                c.out(), int64_t{c.shard_mib()} << 20);
    if (!shards.ok()) return CodedError(kExitFailure, std::string(shards.status().message()));
    io.out << c.out() << ": safetensors in " << shards->size() << " shard(s) with "
           << kSafetensorsIndex << ", stages 0.." << stage << "\n"
           << Figures(model.weights, read_seconds, write_start) << "\n";
    return absl::OkStatus();
  } else {
    written =
        WriteSafetensors(DescribeParams(model.config, *model.model, stage), model.weights, c.out());
  }
  if (!written.ok()) return CodedError(kExitFailure, std::string(written.message()));
  io.out << c.out() << ": " << format << ", stages 0.." << stage;
  if (external) io.out << ", weights in " << c.out() << ".data";
  io.out << "\n" << Figures(model.weights, read_seconds, write_start) << "\n";
  return absl::OkStatus();
}

namespace {

// predict --out: the probabilities (or logits) as .npy, or a .csv with a row per example
// (and position): example[,file][,position],predicted, then a column per class by name.
absl::Status WriteProbabilities(const v1::PredictCommand& c, const TrainedModel& model,
                                const Examples& ex, const Shape& shape,
                                const std::vector<float>& values) {
  const int64_t classes = shape.back();
  const int64_t rows = static_cast<int64_t>(values.size()) / classes;
  absl::Status s;
  if (absl::EndsWith(c.out(), ".npy")) {
    s = WriteNpyFile(c.out(), std::vector<int64_t>(shape.begin(), shape.end()), values);
  } else {
    auto best = [&](int64_t r) {
      const float* p = values.data() + r * classes;
      return std::max_element(p, p + classes) - p;
    };
    const bool files = !ex.files.empty();
    std::string csv = "example";
    if (files) csv += ",file";
    if (shape.size() > 2) csv += ",position";
    csv += ",predicted";
    for (int64_t k = 0; k < classes; ++k) absl::StrAppend(&csv, ",", CsvField(ClassName(model, k)));
    csv += "\n";
    const int64_t positions = rows / std::max<int64_t>(1, ex.count);
    for (int64_t r = 0; r < rows; ++r) {
      absl::StrAppend(&csv, r / positions);
      if (files) absl::StrAppend(&csv, ",", CsvField(ex.files[r / positions]));
      if (shape.size() > 2) absl::StrAppend(&csv, ",", r % positions);
      absl::StrAppend(&csv, ",", CsvField(ClassName(model, best(r))));
      for (int64_t k = 0; k < classes; ++k)
        absl::StrAppend(&csv, absl::StrFormat(",%.6g", values[r * classes + k]));
      csv += "\n";
    }
    s = WriteFileAtomically(c.out(), csv);
  }
  return s.ok() ? s : CodedError(kExitFailure, std::string(s.message()));
}

}  // namespace

absl::Status PredictCommand(const Args& args, const Io& io) {
  v1::PredictCommand c = PredictDefaults();
  std::vector<std::string> pos;
  absl::StatusOr<bool> go = ParseCommandArgs(
      "predict",
      "localpar predict JOB_FILE WEIGHTS --input=PATH [flags]\n"
      "Runs the trained network on your examples, with the input normalisation "
      "of training, and prints accuracy when labels are known.\n"
      "Images go in as the training files held them: raw pixels 0..255 (bytes "
      "or floats); with\n--input_scaled, floats already in [0, 1]. Values that "
      "contradict that are refused.",
      args, &c, KeepOverrides({"stages", "data_path"}), {"JOB_FILE", "WEIGHTS"}, &pos, io.out);
  if (!go.ok() || !*go) return go.status();
  if (c.input().empty())
    return CodedError(
        kExitUsage,
        "--input: name an .npy file, an IDX file, a PNG, or a folder of PNGs (flat, or "
        "one subfolder per class)");
  if (c.batch_size() < 1) return CodedError(kExitUsage, "--batch_size must be >= 1");
  if (c.has_stage() && c.stage() < 0) return CodedError(kExitUsage, "--stage must be >= 0");
  if (!c.out().empty() && !absl::EndsWith(c.out(), ".csv") && !absl::EndsWith(c.out(), ".npy")) {
    return CodedError(kExitUsage,
                      absl::StrCat("--out=", c.out(), ": expected a .csv or .npy file name"));
  }
  std::unique_ptr<Backend> backend;
  TrainedModel model;
  if (absl::Status s =
          OpenModel(pos[0], c.overrides(), pos[1], c.compute(), io.err, &backend, &model);
      !s.ok()) {
    return s;
  }
  const int stage = c.has_stage() ? c.stage() : LastStage(model);
  if (stage > LastStage(model)) {
    return CodedError(
        kExitUsage, absl::StrCat("--stage=", stage, ": the job has stages 0..", LastStage(model)));
  }
  absl::StatusOr<Examples> ex = ReadExamples(c.input(), c.labels(), model.config.input_shape);
  if (!ex.ok()) return CodedError(kExitBadData, std::string(ex.status().message()));
  if (absl::Status s = MatchClassNames(model, &*ex); !s.ok()) {
    return CodedError(kExitBadData, absl::StrCat(c.input(), ": ", s.message()));
  }
  // Labels come from --labels, or from an image folder's class folders.
  if (absl::Status s = CheckLabels(model, *ex); !s.ok()) {
    return CodedError(kExitBadData,
                      absl::StrCat(c.labels().empty() ? c.input() : c.labels(), ": ", s.message()));
  }
  if (std::string note = ToChannelsLast(model.config.input_shape, &*ex); !note.empty()) {
    io.err << "localpar: " << c.input() << ": " << note << "\n";
  }
  absl::StatusOr<std::vector<float>> inputs = PrepareInputs(model, *ex, c.input_scaled());
  if (!inputs.ok()) {
    return CodedError(kExitBadData, absl::StrCat(c.input(), ": ", inputs.status().message()));
  }
  Shape shape;
  std::vector<float> probs =
      PredictLogits(model, stage, *inputs, ex->count, c.batch_size(), &shape);
  const int64_t classes = shape.back();
  std::vector<float> logits = probs;
  SoftmaxRows(&probs, classes);
  const int64_t rows = static_cast<int64_t>(probs.size()) / classes;
  if (!ex->labels.empty() && static_cast<int64_t>(ex->labels.size()) == rows) {
    int64_t correct = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = probs.data() + r * classes;
      int64_t best = std::max_element(p, p + classes) - p;
      correct += best == ex->labels[r];
    }
    io.out << absl::StrFormat("accuracy: %.2f%% (%d of %d, stage %d's head)\n",
                              100.0 * correct / rows, correct, rows, stage);
  } else {
    io.out << absl::StrFormat("%d examples, stage %d's head\n", ex->count, stage);
  }
  // A classifier's first predictions by class name, each example by its file where known.
  const bool per_example = shape.size() == 2;
  auto best = [&](int64_t r) {
    const float* p = probs.data() + r * classes;
    return std::max_element(p, p + classes) - p;
  };
  auto example_name = [&](int64_t r) {
    return r < static_cast<int64_t>(ex->files.size()) ? ex->files[r] : absl::StrCat("example ", r);
  };
  constexpr int64_t kShown = 10;
  if (per_example) {
    for (int64_t r = 0; r < std::min(rows, kShown); ++r) {
      io.out << absl::StrFormat("  %s: %s (%.1f%%)\n", example_name(r), ClassName(model, best(r)),
                                100.0 * probs[r * classes + best(r)]);
    }
    if (rows > kShown) {
      io.out << absl::StrFormat("  ... %d more%s\n", rows - kShown,
                                c.out().empty() ? " (--out=FILE.csv writes every one)" : "");
    }
  }
  if (!c.out().empty()) {
    if (absl::Status s = WriteProbabilities(c, model, *ex, shape, c.logits() ? logits : probs);
        !s.ok()) {
      return s;
    }
    io.out << (c.logits() ? "logits: " : "probabilities: ") << c.out() << "\n";
  }
  return absl::OkStatus();
}

}  // namespace localpar
