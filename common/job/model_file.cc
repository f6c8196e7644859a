// Weights files with what using them needs, parameter names, and safetensors.
#include "common/job/model_file.h"

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/core/check.h"
#include "common/io/atomic_file.h"
#include "common/job/job.h"
#include "common/job/tensor_codec.h"
#include "common/nn/head.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace localpar {
namespace {

using K = LayerConfig::Kind;

int ParamCount(const LayerConfig& c) {
  switch (c.kind) {
    case K::kLinear:
    case K::kDense:
    case K::kConv2d:
    case K::kLayerNorm:
      return 2;
    case K::kBatchNorm:
    case K::kCausalSelfAttention:
      return 4;
    case K::kEmbedding:
      return 1;
    case K::kResidual: {
      int n = 0;
      for (const LayerConfig& b : c.body) n += ParamCount(b);
      return n;
    }
    default:
      return 0;
  }
}

// Where each parameter `c` owns comes from: its readable prefix ("<where>.<kind>"), its
// layer's kind and kernel, in order.
struct Origin {
  std::string prefix;
  const char* kind;
  int64_t kernel;
};
void LayerOrigins(const LayerConfig& c, const std::string& where, std::vector<Origin>* out) {
  const std::string here = absl::StrCat(where, ".", LayerKindName(c.kind));
  if (c.kind == K::kResidual) {
    for (size_t j = 0; j < c.body.size(); ++j) {
      LayerOrigins(c.body[j], absl::StrCat(here, ".", j), out);
    }
    return;
  }
  for (int i = 0; i < ParamCount(c); ++i) out->push_back({here, LayerKindName(c.kind), c.kernel});
}

std::string StageLabel(const ModelConfig& config, int k) {
  return config.stages[k].name.empty() ? absl::StrCat("stage", k) : config.stages[k].name;
}

// PyTorch's layout of one of our parameters, and the permutation between the two: element
// `to_ours[i]` of our tensor is element i of PyTorch's.
struct Layout {
  std::vector<int64_t> shape;
  std::vector<int64_t> to_ours;  // empty: the same order
};

Layout TorchLayout(const ParamInfo& p) {
  Layout l;
  const Shape& s = p.value->value.shape();
  l.shape.assign(s.begin(), s.end());
  auto transpose = [&](int64_t rows, int64_t cols) {  // ours [rows, cols] -> [cols, rows]
    l.shape = {cols, rows};
    l.to_ours.resize(static_cast<size_t>(rows * cols));
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r) l.to_ours[c * rows + r] = r * cols + c;
    }
  };
  const bool matrix = s.size() == 2;
  if (!matrix) return l;
  if ((p.layer_kind == "linear" || p.layer_kind == "dense") && p.param == "weight") {
    transpose(s[0], s[1]);
  } else if (p.layer_kind == "causal_self_attention" &&
             (p.param == "qkv_weight" || p.param == "out_weight")) {
    transpose(s[0], s[1]);
  } else if (p.layer_kind == "conv2d" && p.param == "weight") {
    // Ours: [(ky * kw + kx) * cin + ci, co]; PyTorch's: [co, ci, ky, kx]. kh = kw = k.
    const int64_t fan_in = s[0], cout = s[1], k = p.kernel;
    const int64_t cin = k > 0 ? fan_in / (k * k) : 0;
    LP_CHECK_MSG(k > 0 && cin * k * k == fan_in,
                 "conv weight [%lld, %lld] does not match kernel %lld",
                 static_cast<long long>(fan_in), static_cast<long long>(cout),
                 static_cast<long long>(p.kernel));
    l.shape = {cout, cin, k, k};
    l.to_ours.resize(static_cast<size_t>(fan_in * cout));
    int64_t i = 0;
    for (int64_t co = 0; co < cout; ++co) {
      for (int64_t ci = 0; ci < cin; ++ci) {
        for (int64_t ky = 0; ky < k; ++ky) {
          for (int64_t kx = 0; kx < k; ++kx)
            l.to_ours[i++] = ((ky * k + kx) * cin + ci) * cout + co;
        }
      }
    }
  }
  return l;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

const v1::NamedTensor* FindParam(const v1::ModelWeights& w, int stage, const std::string& name) {
  if (stage >= w.stages_size()) return nullptr;
  for (const v1::NamedTensor& nt : w.stages(stage).params()) {
    if (nt.name() == name) return &nt;
  }
  return nullptr;
}

absl::StatusOr<v1::ModelWeights> ReadSafetensors(const std::string& path, const std::string& bytes,
                                                 const ModelConfig& config, Model& model) {
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > bytes.size() - 8) {
    return absl::DataLossError(absl::StrCat(path, ": the safetensors header length ", header_len,
                                            " runs past the end of the file"));
  }
  google::protobuf::Struct header;
  const std::string json = bytes.substr(8, header_len);
  if (!google::protobuf::util::JsonStringToMessage(json, &header).ok()) {
    return absl::DataLossError(absl::StrCat(path, ": the safetensors header is not JSON"));
  }
  const size_t data_at = 8 + header_len, data_len = bytes.size() - data_at;
  std::vector<ParamInfo> params = DescribeParams(config, model, model.num_stages() - 1);
  v1::ModelWeights w;
  for (int k = 0; k < model.num_stages(); ++k) w.add_stages()->set_stage(k);
  for (const ParamInfo& p : params) {
    auto it = header.fields().find(p.readable);
    if (it == header.fields().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": has no tensor ", p.readable, ", which the job's network has"));
    }
    const auto& f = it->second.struct_value().fields();
    auto get = [&](const char* key) -> const google::protobuf::Value* {
      auto i = f.find(key);
      return i == f.end() ? nullptr : &i->second;
    };
    const google::protobuf::Value *dtype = get("dtype"), *shape = get("shape"),
                                  *offsets = get("data_offsets");
    if (!dtype || dtype->string_value() != "F32") {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", p.readable, ": dtype is not F32"));
    }
    Layout layout = TorchLayout(p);
    std::vector<int64_t> got;
    if (shape) {
      for (const auto& v : shape->list_value().values())
        got.push_back(static_cast<int64_t>(v.number_value()));
    }
    if (got != layout.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", p.readable, " has shape [", absl::StrJoin(got, ","),
                       "], the job's network has [", absl::StrJoin(layout.shape, ","), "]"));
    }
    if (!offsets || offsets->list_value().values_size() != 2) {
      return absl::DataLossError(absl::StrCat(path, ": ", p.readable, ": no data_offsets"));
    }
    const double begin = offsets->list_value().values(0).number_value();
    const double end = offsets->list_value().values(1).number_value();
    const size_t want = static_cast<size_t>(p.value->value.numel()) * sizeof(float);
    if (begin < 0 || end < begin || end > static_cast<double>(data_len) ||
        static_cast<size_t>(end - begin) != want) {
      return absl::DataLossError(absl::StrCat(path, ": ", p.readable, ": data_offsets [", begin,
                                              ", ", end, "] do not hold ", want, " bytes"));
    }
    const char* src = bytes.data() + data_at + static_cast<size_t>(begin);
    std::vector<float> torch(static_cast<size_t>(p.value->value.numel()));
    std::memcpy(torch.data(), src, want);
    std::vector<float> ours = torch;
    if (!layout.to_ours.empty()) {
      for (size_t i = 0; i < torch.size(); ++i) ours[layout.to_ours[i]] = torch[i];
    }
    v1::NamedTensor* nt = w.mutable_stages(p.stage)->add_params();
    nt->set_name(p.file_name);
    v1::Tensor* t = nt->mutable_tensor();
    t->set_dtype(v1::F32);
    for (int64_t d : p.value->value.shape()) t->add_shape(d);
    t->set_data(ours.data(), want);
  }
  auto meta = header.fields().find("__metadata__");
  if (meta != header.fields().end()) {
    const auto& m = meta->second.struct_value().fields();
    auto number = [&](const char* key, float* out) {
      auto i = m.find(key);
      if (i != m.end()) {
        std::string s = i->second.string_value();
        *out = std::strtof(s.c_str(), nullptr);
      }
    };
    v1::InputTransform* in = w.mutable_input();
    float v = 0;
    number("input_scale", &v);
    in->set_scale(v);
    number("input_mean", &v);
    in->set_mean(v);
    v = 1;
    number("input_inv_std", &v);
    in->set_inv_std(v);
    auto tokens = m.find("input_tokens");
    in->set_tokens(tokens != m.end() && tokens->second.string_value() == "true");
  }
  return w;
}

}  // namespace

std::vector<float> TorchOrder(const ParamInfo& p, std::vector<int64_t>* shape) {
  Layout layout = TorchLayout(p);
  std::vector<float> ours = p.value->value.ToHost();
  if (shape) *shape = layout.shape;
  if (layout.to_ours.empty()) return ours;
  std::vector<float> torch(ours.size());
  for (size_t i = 0; i < torch.size(); ++i) torch[i] = ours[layout.to_ours[i]];
  return torch;
}

void DescribeWeights(const v1::Job& job, const InputNormalization& norm,
                     v1::ModelWeights* weights) {
  v1::InputTransform* in = weights->mutable_input();
  in->set_scale(norm.scale);
  in->set_mean(norm.mean);
  in->set_inv_std(norm.inv_std);
  in->set_tokens(norm.tokens);
  weights->clear_input_shape();
  for (int64_t d : JobInputShape(job)) weights->add_input_shape(d);
  weights->set_classes(JobClasses(job));
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

std::vector<ParamInfo> DescribeParams(const ModelConfig& config, Model& model, int last_stage) {
  std::vector<ParamInfo> out;
  for (int k = 0; k <= last_stage && k < model.num_stages(); ++k) {
    Stage& stage = model.stage(k);
    const std::string label = StageLabel(config, k);
    std::vector<Origin> origins;
    auto walk = [&](const std::vector<LayerConfig>& layers, const std::string& where) {
      for (size_t i = 0; i < layers.size(); ++i) {
        LayerOrigins(layers[i], absl::StrCat(label, ".", where, ".", i), &origins);
      }
    };
    walk(config.stages[k].layers, "layers");
    const size_t body_params = origins.size();
    std::vector<LayerConfig> head;
    std::string error;
    LP_CHECK(
        HeadLayers(config.stages[k].head, stage.output_shape(), config.classes, &head, &error));
    walk(head, "head");
    std::vector<Param*> params = stage.params();
    LP_CHECK_MSG(params.size() == origins.size(), "stage %d: %zu parameters, %zu described", k,
                 params.size(), origins.size());
    for (size_t i = 0; i < params.size(); ++i) {
      ParamInfo p;
      p.stage = k;
      p.file_name = absl::StrCat(i, ".", params[i]->name);
      p.readable = absl::StrCat(origins[i].prefix, ".", params[i]->name);
      p.layer_kind = origins[i].kind;
      p.param = params[i]->name;
      p.kernel = origins[i].kernel;
      p.head = i >= body_params;
      p.value = params[i];
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

absl::StatusOr<v1::ModelWeights> ReadAnyWeightsFile(const std::string& path,
                                                    const ModelConfig& config, Model& model) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // A safetensors file starts with its header's length and then '{'.
  if (bytes.size() >= 9 && bytes[8] == '{') return ReadSafetensors(path, bytes, config, model);
  v1::ModelWeights w;
  if (!w.ParseFromString(bytes)) {
    return absl::DataLossError(
        absl::StrCat(path, ": neither a localpar weights file nor a safetensors file"));
  }
  return w;
}

absl::StatusOr<TrainedModel> OpenTrainedModel(const v1::Job& job, const std::string& weights_path,
                                              Backend& backend) {
  TrainedModel t;
  t.backend = &backend;
  t.config = ToModelConfig(job);
  std::string error;
  t.model = Model::Create(backend, t.config, &error);
  if (!t.model) return absl::InvalidArgumentError(error);
  absl::StatusOr<v1::ModelWeights> w = ReadAnyWeightsFile(weights_path, t.config, *t.model);
  if (!w.ok()) return w.status();
  t.weights = *std::move(w);
  if (absl::Status s = LoadWeights(t.weights, weights_path, t.config, *t.model); !s.ok()) return s;
  t.normalization = WeightsNormalization(t.weights);
  if (!t.weights.has_input() && JobLabelsPerExample(job) > 1) t.normalization.tokens = true;
  return t;
}

absl::Status WriteSafetensors(const std::vector<ParamInfo>& params, const v1::ModelWeights& weights,
                              const std::string& path) {
  std::string header = "{\"__metadata__\":{";
  const v1::InputTransform& in = weights.input();
  std::vector<std::string> meta = {
      absl::StrCat("\"format\":\"pt\""),
      absl::StrCat("\"producer\":\"localpar\""),
      absl::StrCat(
          "\"layout\":\"pytorch (linear [out,in], conv [out,in,kh,kw]); activations NHWC\""),
      absl::StrCat("\"input_scale\":", JsonString(absl::StrFormat("%.9g", in.scale()))),
      absl::StrCat("\"input_mean\":", JsonString(absl::StrFormat("%.9g", in.mean()))),
      absl::StrCat("\"input_inv_std\":", JsonString(absl::StrFormat("%.9g", in.inv_std()))),
      absl::StrCat("\"input_tokens\":", JsonString(in.tokens() ? "true" : "false")),
      absl::StrCat("\"input_shape\":",
                   JsonString(absl::StrCat("[", absl::StrJoin(weights.input_shape(), ","), "]"))),
      absl::StrCat("\"classes\":", JsonString(absl::StrCat(weights.classes()))),
      absl::StrCat("\"job\":", JsonString(weights.job_text()))};
  header += absl::StrJoin(meta, ",") + "}";
  std::string data;
  for (const ParamInfo& p : params) {
    std::vector<int64_t> shape;
    const std::vector<float> torch = TorchOrder(p, &shape);
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(torch.data()), torch.size() * sizeof(float));
    header += absl::StrCat(",", JsonString(p.readable), ":{\"dtype\":\"F32\",\"shape\":[",
                           absl::StrJoin(shape, ","), "],\"data_offsets\":[", begin, ",",
                           data.size(), "]}");
  }
  header += "}";
  while ((8 + header.size()) % 8 != 0) header += ' ';
  uint64_t len = header.size();
  std::string file(reinterpret_cast<const char*>(&len), 8);
  file += header;
  file += data;
  return WriteFileAtomically(path, file);
}

}  // namespace localpar
