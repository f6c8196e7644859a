// Weights files with what using them needs, parameter names, and loading weights into a
// model, checked parameter by parameter.
#include "common/model_io/model_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/core/check.h"
#include "common/core/cpu_backend.h"
#include "common/data/dataset.h"
#include "common/io/regular_file.h"
#include "common/job/data_spec.h"
#include "common/job/spec.h"
#include "common/model_io/safetensors.h"
#include "common/model_io/tensor_proto.h"
#include "google/protobuf/text_format.h"

namespace localpar {
namespace {

const v1::NamedTensor* FindParam(const v1::ModelWeights& w, int stage, const std::string& name) {
  if (stage >= w.stages_size()) return nullptr;
  for (const v1::NamedTensor& nt : w.stages(stage).params()) {
    if (nt.name() == name) return &nt;
  }
  return nullptr;
}

}  // namespace

std::vector<float> TorchOrder(const ParamInfo& p, std::vector<int64_t>* shape) {
  const ExportLayout layout = p.layer->TorchLayout(*p.value, p.nchw_source);
  std::vector<float> ours = p.value->value.ToHost();
  if (shape) *shape = layout.shape;
  if (layout.to_ours.empty()) return ours;
  std::vector<float> torch(ours.size());
  for (size_t i = 0; i < torch.size(); ++i) torch[i] = ours[layout.to_ours[i]];
  return torch;
}

void DescribeWeights(const v1::Job& job, const InputNormalization& norm,
                     const std::vector<std::string>& class_names, v1::ModelWeights* weights) {
  v1::InputTransform* in = weights->mutable_input();
  in->set_scale(norm.scale);
  in->set_mean(norm.mean);
  in->set_inv_std(norm.inv_std);
  in->set_tokens(norm.tokens);
  weights->clear_input_shape();
  for (int64_t d : JobInputShape(job)) weights->add_input_shape(d);
  weights->set_classes(JobClasses(job));
  weights->clear_class_names();
  for (const std::string& n : class_names) weights->add_class_names(n);
  google::protobuf::TextFormat::PrintToString(job, weights->mutable_job_text());
}

InputNormalization WeightsNormalization(const v1::ModelWeights& weights) {
  InputNormalization n;
  if (!weights.has_input() || weights.input().scale() == 0.0f) return n;  // an older file
  n.scale = weights.input().scale();
  n.mean = weights.input().mean();
  n.inv_std = weights.input().inv_std();
  n.tokens = weights.input().tokens();
  return n;
}

namespace {

// One parameter as PyTorch would name it, the (innermost) layer it belongs to, and the
// image its layer's input was flattened from (empty when none).
struct Named {
  const Layer* layer;
  Param* param;
  std::string name;
  Shape nchw_source;
};

// Each parameter of `layer` (in params() order) under `prefix`: a composite layer's child
// modules by their PyTorch names, then the parameter's. `*nchw` follows the image a
// flatten turned into features in NHWC order, until a layer that changes the shape uses it.
void Describe(const Layer& layer, const std::string& prefix, Shape* nchw, std::vector<Named>* out) {
  std::vector<const Layer*> children = layer.children();
  if (!children.empty()) {
    for (size_t j = 0; j < children.size(); ++j) {
      Shape inner = *nchw;
      Describe(*children[j], absl::StrCat(prefix, ".", layer.TorchChildName(j)), &inner, out);
    }
  } else {
    // params() is not const, but naming the parameters changes nothing.
    for (Param* p : const_cast<Layer&>(layer).params()) {
      out->push_back({&layer, p, absl::StrCat(prefix, ".", layer.TorchName(*p)), *nchw});
    }
  }
  if (layer.flattens_image() && layer.input_shape().size() == 3) {
    *nchw = layer.input_shape();
  } else if (layer.output_shape() != layer.input_shape()) {
    nchw->clear();
  }
}

}  // namespace

std::vector<ParamInfo> DescribeStageParams(Stage& stage, int k, int* global, Shape* nchw) {
  std::vector<ParamInfo> out;
  std::vector<Named> names;
  for (int i = 0; i < stage.num_layers(); ++i, ++*global) {
    Describe(stage.layer(i), absl::StrCat("layers.", *global), nchw, &names);
  }
  const size_t body_params = names.size();
  // A head is named by the layer it follows.
  const std::string head =
      *global == 0 ? std::string("heads.input") : absl::StrCat("heads.", *global - 1);
  Shape head_nchw = *nchw;
  for (int i = 0; i < stage.num_head_layers(); ++i) {
    Describe(stage.head_layer(i), absl::StrCat(head, ".", i), &head_nchw, &names);
  }
  std::vector<Param*> params = stage.params();
  LP_CHECK_MSG(params.size() == names.size(), "stage %d: %zu parameters, %zu described", k,
               params.size(), names.size());
  for (size_t i = 0; i < params.size(); ++i) {
    LP_CHECK_MSG(params[i] == names[i].param, "stage %d: parameter %zu out of order", k, i);
    ParamInfo p;
    p.stage = k;
    p.file_name = absl::StrCat(i, ".", params[i]->name);
    p.readable = names[i].name;
    p.layer = names[i].layer;
    p.nchw_source = names[i].nchw_source;
    p.head = i >= body_params;
    p.value = params[i];
    out.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<TensorSpec>>> StageTensorSpecs(const ModelConfig& config) {
  std::string error;
  if (!ValidateModel(config, &error)) return absl::InvalidArgumentError(error);
  CpuBackend cpu{CpuOptions{}};
  std::vector<std::vector<TensorSpec>> specs;
  for (size_t k = 0; k < config.stages.size(); ++k) {
    std::unique_ptr<Stage> stage =
        Stage::Create(cpu, config.stages[k], StageInputShape(config, static_cast<int>(k)),
                      config.classes, config.optimizer, config.seed, &error);
    if (!stage) return absl::InvalidArgumentError(error);
    std::vector<TensorSpec>& out = specs.emplace_back();
    std::vector<Param*> params = stage->params();
    for (size_t i = 0; i < params.size(); ++i) {
      out.push_back(TensorSpec{absl::StrCat(i, ".", params[i]->name), params[i]->value.shape()});
    }
  }
  return specs;
}

std::vector<ParamInfo> DescribeParams(const ModelConfig&, Model& model, int last_stage) {
  std::vector<ParamInfo> out;
  int global = 0;  // layers are numbered through the whole network, whatever the split
  Shape nchw;
  for (int k = 0; k <= last_stage && k < model.num_stages(); ++k) {
    for (ParamInfo& p : DescribeStageParams(model.stage(k), k, &global, &nchw)) {
      out.push_back(std::move(p));
    }
  }
  return out;
}

absl::Status LoadWeights(const v1::ModelWeights& weights, const std::string& source,
                         const ModelConfig& config, Model& model) {
  if (weights.stages_size() != model.num_stages()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": holds ", weights.stages_size(), " stages, the job has ", model.num_stages(),
        " (if it was trained with --stages=", weights.stages_size(), ", pass that here too)"));
  }
  std::vector<ParamInfo> params = DescribeParams(config, model, model.num_stages() - 1);
  // Check everything before copying anything.
  std::vector<int> count(model.num_stages(), 0);
  for (const ParamInfo& p : params) {
    ++count[p.stage];
    const v1::NamedTensor* nt = FindParam(weights, p.stage, p.file_name);
    if (!nt) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": stage ", p.stage, " has no ",
                                                     p.file_name, " (", p.readable, ")"));
    }
    if (absl::Status s = CheckWireTensor(nt->tensor(), p.file_name); !s.ok()) {
      return absl::DataLossError(absl::StrCat(source, ": ", s.message()));
    }
    Shape got(nt->tensor().shape().begin(), nt->tensor().shape().end());
    if (nt->tensor().dtype() != v1::F32 || got != p.value->value.shape()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", p.readable, " (stage ", p.stage, " ", p.file_name, ") is ",
                       v1::DType_Name(nt->tensor().dtype()), " ", ShapeString(got),
                       ", the job's network has F32 ", ShapeString(p.value->value.shape())));
    }
  }
  for (int k = 0; k < model.num_stages(); ++k) {
    if (weights.stages(k).params_size() != count[k]) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": stage ", k, " holds ", weights.stages(k).params_size(),
                       " parameters, the job's network has ", count[k]));
    }
  }
  for (const ParamInfo& p : params) {
    DecodeTensorInto(FindParam(weights, p.stage, p.file_name)->tensor(), p.value->value.backend(),
                     &p.value->value);
  }
  return absl::OkStatus();
}

std::string HeadName(const std::string& name) {
  if (!absl::StartsWith(name, "heads.")) return "";
  const size_t dot = name.find('.', 6);
  return dot == std::string::npos ? name : name.substr(0, dot);
}

absl::StatusOr<v1::ModelWeights> GatherParams(const std::string& source, const ModelConfig& config,
                                              Model& model,
                                              const std::vector<std::string>& source_names,
                                              const ParamLookup& lookup, InitNotes* notes) {
  std::vector<ParamInfo> params = DescribeParams(config, model, model.num_stages() - 1);
  v1::ModelWeights w;
  for (int k = 0; k < model.num_stages(); ++k) w.add_stages()->set_stage(k);
  std::set<std::string> used, fresh;
  for (const ParamInfo& p : params) {
    const size_t n = static_cast<size_t>(p.value->value.numel());
    std::vector<float> ours;
    absl::StatusOr<bool> found = lookup(p, &ours);
    if (!found.ok()) return found.status();
    if (!*found) {
      if (!p.head) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": has no tensor ", p.readable, ", which the job's network has"));
      }
      // A boundary the file's network did not have: the head starts from its seeded values.
      fresh.insert(HeadName(p.readable));
      ours = p.value->value.ToHost();
    } else {
      used.insert(p.readable);
      if (ours.size() != n) {
        return absl::DataLossError(absl::StrCat(source, ": ", p.readable, ": ", ours.size(),
                                                " values, the job's network has ", n));
      }
    }
    v1::NamedTensor* nt = w.mutable_stages(p.stage)->add_params();
    nt->set_name(p.file_name);
    v1::Tensor* t = nt->mutable_tensor();
    t->set_dtype(v1::F32);
    for (int64_t d : p.value->value.shape()) t->add_shape(d);
    t->set_data(ours.data(), n * sizeof(float));
  }
  // A head starts fresh only as a whole: one the source holds part of is a damaged file,
  // never a half-initialised head.
  for (const ParamInfo& p : params) {
    if (p.head && fresh.count(HeadName(p.readable)) && used.count(p.readable)) {
      for (const ParamInfo& q : params) {
        if (HeadName(q.readable) == HeadName(p.readable) && !used.count(q.readable)) {
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": has no tensor ", q.readable, " but holds ", p.readable,
                           " of the same head (", HeadName(p.readable), "): a damaged file"));
        }
      }
    }
  }
  // Whatever the source holds beyond the network: heads of boundaries the job does not
  // have are left out (and said); anything else means another network.
  std::set<std::string> unused;
  for (const std::string& name : source_names) {
    if (used.count(name)) continue;
    const std::string head = HeadName(name);
    if (head.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": holds ", name, ", which the job's network does not have (another network?)"));
    }
    if (!fresh.count(head)) unused.insert(head);
  }
  if (notes) {
    notes->fresh_heads.assign(fresh.begin(), fresh.end());
    notes->unused_heads.assign(unused.begin(), unused.end());
  }
  return w;
}

int64_t WeightsBytes(const v1::ModelWeights& weights) {
  int64_t bytes = 0;
  for (const v1::StageWeights& s : weights.stages()) {
    for (const v1::NamedTensor& p : s.params())
      bytes += static_cast<int64_t>(p.tensor().data().size());
  }
  return bytes;
}

std::string TransferFigures(int64_t bytes, double seconds) {
  const double mb = static_cast<double>(bytes) / 1e6;
  return absl::StrFormat("%.0f MB in %.1f s, %.0f MB/s", mb, seconds, mb / std::max(seconds, 1e-3));
}

void DropGradients(Model& model) {
  for (int k = 0; k < model.num_stages(); ++k) {
    for (Param* p : model.stage(k).params()) p->grad = Tensor();
  }
}

absl::StatusOr<std::string> WriteRunWeights(const v1::ModelWeights& weights,
                                            const ModelConfig& config, Model* model,
                                            const std::string& dir, int64_t pb_limit) {
  if (WeightsBytes(weights) <= pb_limit) {
    const std::string path = dir + "/weights.pb";
    if (absl::Status s = WriteWeightsFile(weights, path); !s.ok()) return s;
    return path;
  }
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<Model> built;
  if (!model) {
    // The model only names and lays out the tensors: it is built a stage at a time, and each
    // parameter then reads its values from `weights` where they are (no copy), so this adds
    // at most one stage's initial values to the weights already held.
    cpu = std::make_unique<CpuBackend>(CpuOptions{});
    const std::shared_ptr<const void> keep(&weights, [](const void*) {});
    absl::Status wrapped;
    std::string error;
    built = Model::Create(*cpu, config, &error, [&](int k, Stage& stage) {
      std::vector<Param*> params = stage.params();
      if (!wrapped.ok()) return;
      if (k >= weights.stages_size() ||
          weights.stages(k).params_size() != static_cast<int>(params.size())) {
        wrapped = absl::InvalidArgumentError(
            absl::StrCat("the run's weights do not match the job's network at stage ", k));
        return;
      }
      for (size_t i = 0; i < params.size(); ++i) {
        Param& p = *params[i];
        p.grad = Tensor();
        const v1::NamedTensor* nt = FindParam(weights, k, absl::StrCat(i, ".", p.name));
        const Shape shape = p.value.shape();
        if (nt == nullptr || nt->tensor().dtype() != v1::F32 ||
            Shape(nt->tensor().shape().begin(), nt->tensor().shape().end()) != shape ||
            nt->tensor().data().size() != p.value.nbytes()) {
          wrapped = absl::InvalidArgumentError(
              absl::StrCat("the run's weights: stage ", k, " parameter ", i, ".", p.name,
                           " is missing or has another shape than the job's network"));
          return;
        }
        p.value = Tensor::Wrap(*cpu, const_cast<char*>(nt->tensor().data().data()), shape,
                               DType::kF32, keep);
      }
    });
    if (!built) return absl::InvalidArgumentError(error);
    if (!wrapped.ok()) return wrapped;
    model = built.get();
  }
  const std::string path = dir + "/weights";
  absl::StatusOr<std::vector<std::string>> shards = WriteShardedSafetensors(
      DescribeParams(config, *model, model->num_stages() - 1), weights, path, 0);
  if (!shards.ok()) return shards.status();
  return path;
}

std::string DescribeInitNotes(const InitNotes& notes, int stages) {
  if (notes.fresh_heads.empty() && notes.unused_heads.empty()) return "";
  std::string s =
      notes.file_stages > 0
          ? absl::StrCat("the file has ", notes.file_stages, " stages, the job ", stages)
          : absl::StrCat("the file's stage boundaries differ from the job's ", stages, " stages");
  absl::StrAppend(&s, "; every layer carries over");
  if (!notes.fresh_heads.empty()) {
    absl::StrAppend(&s, "; starting fresh (seeded): ", absl::StrJoin(notes.fresh_heads, ", "));
  }
  if (!notes.unused_heads.empty()) {
    absl::StrAppend(&s, "; left out: ", absl::StrJoin(notes.unused_heads, ", "));
  }
  return s;
}

absl::StatusOr<v1::ModelWeights> ReadAnyWeightsFile(const std::string& path,
                                                    const ModelConfig& config, Model& model,
                                                    InitNotes* notes) {
  std::error_code ec;
  const bool set = std::filesystem::is_directory(path, ec) || absl::EndsWith(path, ".index.json");
  std::string first(9, '\0');
  std::ifstream in;
  if (!set) {  // a set's files are opened (and checked) one by one by SafetensorsReader
    if (absl::Status s = CheckRegularFile(path, "weights file"); !s.ok()) return s;
    in.open(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
    first.resize(static_cast<size_t>(in.read(first.data(), 9).gcount()));
  }
  // A safetensors file starts with its header's length and then '{'.
  if (set || LooksLikeSafetensors(first)) {
    absl::StatusOr<SafetensorsReader> file = SafetensorsReader::Open(path);
    if (!file.ok()) return file.status();
    absl::StatusOr<v1::ModelWeights> w = ReadSafetensors(*file, config, model, notes);
    auto job = file->metadata().find("job");
    v1::Job trained;
    if (w.ok() && notes && job != file->metadata().end() &&
        google::protobuf::TextFormat::ParseFromString(job->second, &trained)) {
      notes->file_stages = trained.stages_size();
    }
    return w;
  }
  in.clear();
  in.seekg(0);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  v1::ModelWeights w;
  if (!w.ParseFromString(bytes)) {
    return absl::DataLossError(
        absl::StrCat(path, ": neither a localpar weights file nor a safetensors file"));
  }
  if (w.stages_size() == model.num_stages() || w.job_text().empty()) return w;
  // Another stage split: build the network the file was trained as, load it, and match
  // its parameters to the job's by readable name.
  v1::Job trained;
  if (!google::protobuf::TextFormat::ParseFromString(w.job_text(), &trained)) {
    return absl::DataLossError(absl::StrCat(path, ": its job_text does not parse"));
  }
  CpuBackend cpu{CpuOptions{}};
  const ModelConfig source_config = ToModelConfig(trained);
  std::string error;
  std::unique_ptr<Model> source = Model::Create(cpu, source_config, &error);
  if (!source) return absl::InvalidArgumentError(absl::StrCat(path, ": its job: ", error));
  DropGradients(*source);
  if (absl::Status s = LoadWeights(w, path, source_config, *source); !s.ok()) return s;
  std::map<std::string, ParamInfo> by_name;
  std::vector<std::string> names;
  for (ParamInfo& p : DescribeParams(source_config, *source, source->num_stages() - 1)) {
    names.push_back(p.readable);
    by_name.emplace(p.readable, std::move(p));
  }
  absl::StatusOr<v1::ModelWeights> gathered = GatherParams(
      path, config, model, names,
      [&](const ParamInfo& p, std::vector<float>* ours) -> absl::StatusOr<bool> {
        auto it = by_name.find(p.readable);
        if (it == by_name.end()) return false;
        if (it->second.value->value.shape() != p.value->value.shape()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": ", p.readable, " is ", ShapeString(it->second.value->value.shape()),
              ", the job's network has ", ShapeString(p.value->value.shape())));
        }
        *ours = it->second.value->value.ToHost();
        return true;
      },
      notes);
  if (!gathered.ok()) return gathered.status();
  if (notes) notes->file_stages = source->num_stages();
  *gathered->mutable_input() = w.input();
  gathered->mutable_input_shape()->CopyFrom(w.input_shape());
  gathered->set_classes(w.classes());
  gathered->mutable_class_names()->CopyFrom(w.class_names());
  gathered->set_job_text(w.job_text());
  return gathered;
}

absl::StatusOr<TrainedModel> OpenTrainedModel(const v1::Job& job, const std::string& weights_path,
                                              Backend& backend, bool stages_asked) {
  TrainedModel t;
  t.backend = &backend;
  t.config = ToModelConfig(job);
  std::string error;
  t.model = Model::Create(backend, t.config, &error);
  if (!t.model) return absl::InvalidArgumentError(error);
  InitNotes notes;
  absl::StatusOr<v1::ModelWeights> w = ReadAnyWeightsFile(weights_path, t.config, *t.model, &notes);
  if (!w.ok()) return w.status();
  if (!notes.fresh_heads.empty()) {
    // A head the weights never trained would be presented as trained: take the weights'
    // own split, or refuse one the user asked for.
    const std::string heads = absl::StrJoin(notes.fresh_heads, ", ");
    const int trained = notes.file_stages;
    if (stages_asked || trained <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          weights_path, ": as ", job.stages_size(), " stages the model would have heads ", heads,
          " that these weights never trained",
          trained > 0
              ? absl::StrCat(" (they were trained as ", trained,
                             trained == 1 ? " stage" : " stages", ": pass --stages=", trained,
                             ", or leave it out)")
              : " (the file does not say its split: pass the --stages it was trained with)"));
    }
    absl::StatusOr<v1::Job> theirs = RegroupStages(job, trained);
    if (!theirs.ok()) return theirs.status();
    absl::StatusOr<TrainedModel> again = OpenTrainedModel(*theirs, weights_path, backend, true);
    if (!again.ok()) return again.status();
    again->layout_note =
        absl::StrCat(weights_path, " was trained as ", trained, " stage", trained == 1 ? "" : "s",
                     ": using that split (the job file has ", job.stages_size(), ")");
    return again;
  }
  t.weights = *std::move(w);
  if (absl::Status s = LoadWeights(t.weights, weights_path, t.config, *t.model); !s.ok()) return s;
  t.normalization = WeightsNormalization(t.weights);
  if (!t.weights.has_input() && JobLabelsPerExample(job) > 1) t.normalization.tokens = true;
  return t;
}

}  // namespace localpar
