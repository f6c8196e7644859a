// safetensors files: readable names and PyTorch layouts, the job and the input transform in
// the metadata.
#include "common/model_io/safetensors.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/io/atomic_file.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace localpar {
namespace {

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

}  // namespace

std::string ClassNamesJson(const v1::ModelWeights& weights) {
  std::vector<std::string> quoted;
  for (const std::string& n : weights.class_names()) quoted.push_back(JsonString(n));
  return absl::StrCat("[", absl::StrJoin(quoted, ","), "]");
}

bool LooksLikeSafetensors(const std::string& bytes) { return bytes.size() >= 9 && bytes[8] == '{'; }

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
    const ExportLayout layout = p.layer->TorchLayout(*p.value, p.nchw_source);
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
    auto names = m.find("class_names");
    if (names != m.end()) {
      google::protobuf::ListValue list;
      if (!google::protobuf::util::JsonStringToMessage(names->second.string_value(), &list).ok()) {
        return absl::DataLossError(
            absl::StrCat(path, ": __metadata__.class_names is not a JSON list of strings"));
      }
      for (const auto& v : list.values()) w.add_class_names(v.string_value());
    }
  }
  return w;
}

absl::Status WriteSafetensors(const std::vector<ParamInfo>& params, const v1::ModelWeights& weights,
                              const std::string& path) {
  std::string header = "{\"__metadata__\":{";
  const v1::InputTransform& in = weights.input();
  std::vector<std::string> meta = {
      absl::StrCat("\"format\":\"pt\""),
      absl::StrCat("\"producer\":\"localpar\""),
      absl::StrCat(
          "\"layout\":\"pytorch state_dict (linear [out,in] over NCHW-flattened inputs, conv "
          "[out,in,kh,kw], batch norm weight/bias/running_mean/running_var/num_batches_tracked)\""),
      absl::StrCat("\"input_scale\":", JsonString(absl::StrFormat("%.9g", in.scale()))),
      absl::StrCat("\"input_mean\":", JsonString(absl::StrFormat("%.9g", in.mean()))),
      absl::StrCat("\"input_inv_std\":", JsonString(absl::StrFormat("%.9g", in.inv_std()))),
      absl::StrCat("\"input_tokens\":", JsonString(in.tokens() ? "true" : "false")),
      absl::StrCat("\"input_shape\":",
                   JsonString(absl::StrCat("[", absl::StrJoin(weights.input_shape(), ","), "]"))),
      absl::StrCat("\"classes\":", JsonString(absl::StrCat(weights.classes()))),
      absl::StrCat("\"class_names\":", JsonString(ClassNamesJson(weights))),
      absl::StrCat("\"job\":", JsonString(weights.job_text()))};
  header += absl::StrJoin(meta, ",") + "}";
  std::string data;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    std::vector<int64_t> shape;
    const std::vector<float> torch = TorchOrder(p, &shape);
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(torch.data()), torch.size() * sizeof(float));
    header += absl::StrCat(",", JsonString(p.readable), ":{\"dtype\":\"F32\",\"shape\":[",
                           absl::StrJoin(shape, ","), "],\"data_offsets\":[", begin, ",",
                           data.size(), "]}");
    // After a batch norm's last tensor: PyTorch's num_batches_tracked buffer (an int64
    // scalar), so that load_state_dict(strict=True) finds every name it expects. localpar
    // does not count batches (its running averages use a fixed momentum): it holds 0.
    const bool last_of_layer = i + 1 == params.size() || params[i + 1].layer != p.layer;
    if (p.layer->tracks_batches() && last_of_layer) {
      const std::string name =
          absl::StrCat(p.readable.substr(0, p.readable.rfind('.')), ".num_batches_tracked");
      const int64_t zero = 0;
      const size_t at = data.size();
      data.append(reinterpret_cast<const char*>(&zero), sizeof(zero));
      header += absl::StrCat(",", JsonString(name), ":{\"dtype\":\"I64\",\"shape\":[],",
                             "\"data_offsets\":[", at, ",", data.size(), "]}");
    }
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
