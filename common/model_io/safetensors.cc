// safetensors files: readable names and PyTorch layouts, the job and the input transform in
// the metadata.
#include "common/model_io/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/io/atomic_file.h"
#include "common/io/regular_file.h"
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

// A header larger than this is not one localpar reads (a 1B-parameter model's is ~100 KiB).
constexpr uint64_t kMaxHeaderBytes = uint64_t{256} << 20;
// A safetensors header or index nests two or three deep; protobuf's JSON parser takes
// minutes over 100,000 nested brackets, so anything past this is refused before parsing.
constexpr int kMaxJsonDepth = 32;

// How deep `json` nests its arrays and objects (brackets inside strings do not count);
// stops counting once past `limit`.
int JsonDepth(const std::string& json, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : json) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

// Parses a header or index, refusing deep nesting before the parser sees it.
absl::Status ParseJsonStruct(const std::string& json, const std::string& path, const char* what,
                             google::protobuf::Struct* out) {
  if (JsonDepth(json, kMaxJsonDepth) > kMaxJsonDepth) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", what, " nests deeper than ", kMaxJsonDepth, " levels"));
  }
  if (!google::protobuf::util::JsonStringToMessage(json, out).ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", what, " is not JSON"));
  }
  return absl::OkStatus();
}

// A whole number of bytes (data_offsets, shape extents), as JSON's doubles hold them.
bool WholeNumber(double d) { return d >= 0 && d <= 1e15 && d == std::floor(d); }

size_t DtypeBytes(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "I64" || dtype == "F64") return 8;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

std::string FileName(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

// One tensor as it will be written: a parameter, or the zero batch count after a batch norm.
struct Item {
  std::string name;
  const ParamInfo* param = nullptr;  // null: num_batches_tracked (an I64 zero)
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

std::vector<Item> ItemsOf(const std::vector<ParamInfo>& params) {
  std::vector<Item> items;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    Item it;
    it.name = p.readable;
    it.param = &p;
    it.shape = p.layer->TorchLayout(*p.value, p.nchw_source).shape;
    it.bytes = static_cast<uint64_t>(p.value->value.numel()) * sizeof(float);
    items.push_back(std::move(it));
    // After a batch norm's last tensor: PyTorch's num_batches_tracked buffer (an int64
    // scalar), so that load_state_dict(strict=True) finds every name it expects. localpar
    // does not count batches (its running averages use a fixed momentum): it holds 0.
    const bool last_of_layer = i + 1 == params.size() || params[i + 1].layer != p.layer;
    if (p.layer->tracks_batches() && last_of_layer) {
      Item count;
      count.name =
          absl::StrCat(p.readable.substr(0, p.readable.rfind('.')), ".num_batches_tracked");
      count.bytes = sizeof(int64_t);
      items.push_back(std::move(count));
    }
  }
  return items;
}

std::string MetadataJson(const v1::ModelWeights& weights) {
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
  return absl::StrCat("\"__metadata__\":{", absl::StrJoin(meta, ","), "}");
}

// Writes items [begin, end) as one safetensors file, a tensor at a time.
absl::Status WriteItems(const std::vector<Item>& items, size_t begin, size_t end,
                        const std::string& metadata, const std::string& path) {
  std::string header = "{" + metadata;
  uint64_t at = 0;
  for (size_t i = begin; i < end; ++i) {
    const Item& it = items[i];
    header += absl::StrCat(",", JsonString(it.name), ":{\"dtype\":\"", it.param ? "F32" : "I64",
                           "\",\"shape\":[", absl::StrJoin(it.shape, ","), "],\"data_offsets\":[",
                           at, ",", at + it.bytes, "]}");
    at += it.bytes;
  }
  header += "}";
  while ((8 + header.size()) % 8 != 0) header += ' ';
  const uint64_t len = header.size();
  return WriteFileAtomicallyFrom(path, [&](const ByteSink& sink) {
    if (absl::Status s = sink(std::string_view(reinterpret_cast<const char*>(&len), 8)); !s.ok())
      return s;
    if (absl::Status s = sink(header); !s.ok()) return s;
    for (size_t i = begin; i < end; ++i) {
      const Item& it = items[i];
      if (!it.param) {
        const int64_t zero = 0;
        if (absl::Status s = sink(std::string_view(reinterpret_cast<const char*>(&zero), 8));
            !s.ok())
          return s;
        continue;
      }
      const std::vector<float> torch = TorchOrder(*it.param, nullptr);
      if (absl::Status s = sink(std::string_view(reinterpret_cast<const char*>(torch.data()),
                                                 torch.size() * sizeof(float)));
          !s.ok())
        return s;
    }
    return absl::OkStatus();
  });
}

}  // namespace

std::string ClassNamesJson(const v1::ModelWeights& weights) {
  std::vector<std::string> quoted;
  for (const std::string& n : weights.class_names()) quoted.push_back(JsonString(n));
  return absl::StrCat("[", absl::StrJoin(quoted, ","), "]");
}

bool LooksLikeSafetensors(const std::string& first_bytes) {
  return first_bytes.size() >= 9 && first_bytes[8] == '{';
}

absl::Status SafetensorsReader::AddFile(const std::string& path, bool keep_metadata) {
  if (absl::Status s = CheckRegularFile(path, "weights file"); !s.ok()) return s;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t header_len = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&header_len), 8)) {
    return absl::DataLossError(absl::StrCat(path, ": shorter than a safetensors header"));
  }
  if (header_len > size - 8 || header_len > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": the safetensors header length ", header_len,
                                            " runs past the end of the file (", size,
                                            " bytes) or past ", kMaxHeaderBytes >> 20, " MiB"));
  }
  std::string json(header_len, '\0');
  if (!in.read(json.data(), static_cast<std::streamsize>(header_len))) {
    return absl::DataLossError(absl::StrCat(path, ": cannot read the safetensors header"));
  }
  google::protobuf::Struct header;
  if (absl::Status s = ParseJsonStruct(json, path, "the safetensors header", &header); !s.ok()) {
    return s;
  }
  const uint64_t data_at = 8 + header_len, data_len = size - data_at;
  for (const auto& [name, value] : header.fields()) {
    const auto& f = value.struct_value().fields();
    if (name == "__metadata__") {
      if (!keep_metadata) continue;
      for (const auto& [k, v] : f) metadata_[k] = v.string_value();
      continue;
    }
    auto get = [&](const char* key) -> const google::protobuf::Value* {
      auto i = f.find(key);
      return i == f.end() ? nullptr : &i->second;
    };
    const google::protobuf::Value *dtype = get("dtype"), *shape = get("shape"),
                                  *offsets = get("data_offsets");
    Entry e;
    e.file = path;
    e.dtype = dtype ? dtype->string_value() : "";
    const size_t unit = DtypeBytes(e.dtype);
    if (unit == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", name, ": dtype ", e.dtype.empty() ? "(none)" : e.dtype,
                       " is not one localpar reads (F32, F64, F16, BF16, I32, I64)"));
    }
    double count = 1;
    if (shape) {
      for (const auto& v : shape->list_value().values()) {
        const double d = v.number_value();
        if (!WholeNumber(d)) {
          return absl::DataLossError(absl::StrCat(path, ": ", name, ": shape holds ", d));
        }
        e.shape.push_back(static_cast<int64_t>(d));
        count *= d;
      }
    }
    if (!offsets || offsets->list_value().values_size() != 2) {
      return absl::DataLossError(absl::StrCat(path, ": ", name, ": no data_offsets"));
    }
    const double begin = offsets->list_value().values(0).number_value();
    const double end = offsets->list_value().values(1).number_value();
    if (!WholeNumber(begin) || !WholeNumber(end) || end < begin ||
        end > static_cast<double>(data_len) || end - begin != count * static_cast<double>(unit)) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", name, ": data_offsets [", begin, ", ", end, "] do not hold its ",
                       count, " ", e.dtype, " values within the file's ", data_len, " data bytes"));
    }
    e.offset = data_at + static_cast<uint64_t>(begin);
    e.bytes = static_cast<uint64_t>(end - begin);
    if (!tensors_.emplace(name, std::move(e)).second) {
      return absl::DataLossError(absl::StrCat(path, ": ", name, " is in more than one shard"));
    }
  }
  ++files_;
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  SafetensorsReader r;
  r.source_ = path;
  std::error_code ec;
  std::string index = path;
  if (std::filesystem::is_directory(path, ec)) {
    index = (std::filesystem::path(path) / kSafetensorsIndex).string();
    if (!std::filesystem::exists(index, ec)) {
      const std::string single = (std::filesystem::path(path) / "model.safetensors").string();
      if (std::filesystem::exists(single, ec)) {
        if (absl::Status s = r.AddFile(single, true); !s.ok()) return s;
        return r;
      }
      return absl::NotFoundError(absl::StrCat(path, ": a directory with neither ",
                                              kSafetensorsIndex, " nor model.safetensors"));
    }
  }
  if (!absl::EndsWith(index, ".index.json")) {
    if (absl::Status s = r.AddFile(path, true); !s.ok()) return s;
    return r;
  }
  if (absl::Status s = CheckRegularFile(index, "weights index"); !s.ok()) return s;
  std::error_code size_ec;
  if (std::filesystem::file_size(index, size_ec) > kMaxHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat(index, ": an index larger than ", kMaxHeaderBytes >> 20, " MiB"));
  }
  std::ifstream in(index, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(index, ": cannot open"));
  std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  google::protobuf::Struct root;
  if (absl::Status s = ParseJsonStruct(json, index, "the index", &root); !s.ok()) return s;
  auto map = root.fields().find("weight_map");
  if (map == root.fields().end() || !map->second.has_struct_value()) {
    return absl::DataLossError(absl::StrCat(index, ": has no \"weight_map\" object"));
  }
  // Shards in the order the index first names them; each a plain name beside the index.
  const std::filesystem::path dir = std::filesystem::path(index).parent_path();
  std::vector<std::string> shards;
  std::map<std::string, std::string> shard_of;
  for (const auto& [name, file] : map->second.struct_value().fields()) {
    const std::string& f = file.string_value();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
        f.find('\\') != std::string::npos || f.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(index, ": weight_map[", name, "] is \"", f,
                                                     "\", not a file name beside the index"));
    }
    shard_of[name] = f;
    if (std::find(shards.begin(), shards.end(), f) == shards.end()) shards.push_back(f);
  }
  std::sort(shards.begin(), shards.end());
  for (size_t i = 0; i < shards.size(); ++i) {
    if (absl::Status s = r.AddFile((dir / shards[i]).string(), i == 0); !s.ok()) return s;
  }
  for (const auto& [name, file] : shard_of) {
    auto it = r.tensors_.find(name);
    if (it == r.tensors_.end() || FileName(it->second.file) != file) {
      return absl::DataLossError(absl::StrCat(index, ": weight_map puts ", name, " in ", file,
                                              ", which does not hold it"));
    }
  }
  if (r.tensors_.size() != shard_of.size()) {
    for (const auto& [name, e] : r.tensors_) {
      if (!shard_of.count(name)) {
        return absl::DataLossError(absl::StrCat(index, ": ", FileName(e.file), " holds ", name,
                                                ", which weight_map lacks"));
      }
    }
  }
  r.source_ = index;
  return r;
}

absl::Status SafetensorsReader::ReadFloats(const std::string& name, const Entry& e,
                                           std::vector<float>* out) const {
  if (e.dtype != "F32") {
    return absl::InvalidArgumentError(
        absl::StrCat(e.file, ": ", name, ": dtype is ", e.dtype, ", not F32"));
  }
  std::ifstream in(e.file, std::ios::binary);
  out->resize(e.bytes / sizeof(float));
  if (!in || !in.seekg(static_cast<std::streamoff>(e.offset)) ||
      !in.read(reinterpret_cast<char*>(out->data()), static_cast<std::streamsize>(e.bytes))) {
    return absl::DataLossError(
        absl::StrCat(e.file, ": ", name, ": cannot read ", e.bytes, " bytes at ", e.offset));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ModelWeights> ReadSafetensors(const SafetensorsReader& file,
                                                 const ModelConfig& config, Model& model,
                                                 InitNotes* notes) {
  const std::string& path = file.source();
  std::vector<std::string> held;
  for (const auto& [name, e] : file.tensors()) {
    if (!absl::EndsWith(name, ".num_batches_tracked")) held.push_back(name);
  }
  absl::StatusOr<v1::ModelWeights> gathered = GatherParams(
      path, config, model, held,
      [&](const ParamInfo& p, std::vector<float>* ours) -> absl::StatusOr<bool> {
        auto it = file.tensors().find(p.readable);
        if (it == file.tensors().end()) return false;
        const SafetensorsReader::Entry& e = it->second;
        const ExportLayout layout = p.layer->TorchLayout(*p.value, p.nchw_source);
        if (e.dtype != "F32") {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": ", p.readable, ": dtype is ", e.dtype, ", not F32"));
        }
        if (e.shape != layout.shape) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": ", p.readable, " has shape [", absl::StrJoin(e.shape, ","),
                           "], the job's network has [", absl::StrJoin(layout.shape, ","), "]"));
        }
        std::vector<float> torch;
        if (absl::Status s = file.ReadFloats(p.readable, e, &torch); !s.ok()) return s;
        *ours = torch;
        if (!layout.to_ours.empty()) {
          for (size_t i = 0; i < torch.size(); ++i) (*ours)[layout.to_ours[i]] = torch[i];
        }
        return true;
      },
      notes);
  if (!gathered.ok()) return gathered.status();
  v1::ModelWeights w = *std::move(gathered);
  const std::map<std::string, std::string>& m = file.metadata();
  auto number = [&](const char* key, float fallback) {
    auto i = m.find(key);
    return i == m.end() ? fallback : std::strtof(i->second.c_str(), nullptr);
  };
  v1::InputTransform* in = w.mutable_input();
  in->set_scale(number("input_scale", 0));
  in->set_mean(number("input_mean", 0));
  in->set_inv_std(number("input_inv_std", 1));
  auto tokens = m.find("input_tokens");
  in->set_tokens(tokens != m.end() && tokens->second == "true");
  if (auto job = m.find("job"); job != m.end()) w.set_job_text(job->second);
  auto names = m.find("class_names");
  if (names != m.end()) {
    google::protobuf::ListValue list;
    if (JsonDepth(names->second, kMaxJsonDepth) > kMaxJsonDepth ||
        !google::protobuf::util::JsonStringToMessage(names->second, &list).ok()) {
      return absl::DataLossError(
          absl::StrCat(path, ": __metadata__.class_names is not a JSON list of strings"));
    }
    for (const auto& v : list.values()) w.add_class_names(v.string_value());
  }
  return w;
}

absl::Status WriteSafetensors(const std::vector<ParamInfo>& params, const v1::ModelWeights& weights,
                              const std::string& path) {
  const std::vector<Item> items = ItemsOf(params);
  return WriteItems(items, 0, items.size(), MetadataJson(weights), path);
}

absl::StatusOr<std::vector<std::string>> WriteShardedSafetensors(
    const std::vector<ParamInfo>& params, const v1::ModelWeights& weights, const std::string& dir,
    int64_t shard_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::FailedPreconditionError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  const std::vector<Item> items = ItemsOf(params);
  // Shard boundaries: a new stage, or the size limit passed.
  std::vector<size_t> starts;
  uint64_t in_shard = 0;
  int stage = -1;
  for (size_t i = 0; i < items.size(); ++i) {
    const int s = items[i].param ? items[i].param->stage : stage;
    const bool full = shard_bytes > 0 && in_shard > 0 &&
                      in_shard + items[i].bytes > static_cast<uint64_t>(shard_bytes);
    if (starts.empty() || s != stage || (full && items[i].param)) {
      starts.push_back(i);
      in_shard = 0;
    }
    stage = s;
    in_shard += items[i].bytes;
  }
  starts.push_back(items.size());
  const size_t n = starts.size() - 1;
  const std::string metadata = MetadataJson(weights);
  std::vector<std::string> names;
  uint64_t total = 0;
  std::string weight_map;
  for (size_t k = 0; k < n; ++k) {
    names.push_back(absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, n));
    if (absl::Status s = WriteItems(items, starts[k], starts[k + 1], metadata,
                                    (std::filesystem::path(dir) / names.back()).string());
        !s.ok()) {
      return s;
    }
    for (size_t i = starts[k]; i < starts[k + 1]; ++i) {
      total += items[i].bytes;
      absl::StrAppend(&weight_map, weight_map.empty() ? "" : ",\n    ", JsonString(items[i].name),
                      ": ", JsonString(names.back()));
    }
  }
  const std::string index =
      absl::StrCat("{\n  \"metadata\": {\"total_size\": ", total,
                   ", \"format\": \"pt\", \"producer\": \"localpar\", \"shards\": ", n,
                   "},\n  \"weight_map\": {\n    ", weight_map, "\n  }\n}\n");
  if (absl::Status s =
          WriteFileAtomically((std::filesystem::path(dir) / kSafetensorsIndex).string(), index);
      !s.ok()) {
    return s;
  }
  return names;
}

}  // namespace localpar
