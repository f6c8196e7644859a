// ONNX export: the layers describe themselves (Layer::EmitOnnx) through ProtoGraph, which
// writes the ONNX protobuf messages.
#include "common/model_io/onnx_export.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/core/check.h"
#include "common/io/atomic_file.h"
#include "common/model_io/safetensors.h"
#include "common/nn/onnx_graph.h"
#include "proto/onnx_model.pb.h"

namespace localpar {
namespace {

namespace ox = ::localpar::onnx;

class ProtoGraph final : public OnnxGraph {
 public:
  ProtoGraph(ox::GraphProto* g, const std::vector<ParamInfo>& params) : g_(g) {
    for (const ParamInfo& p : params) names_[p.value] = &p;
  }

  std::string Op(const std::string& type, const std::vector<std::string>& inputs,
                 const std::vector<OnnxAttribute>& attributes = {}) override {
    ox::NodeProto* n = g_->add_node();
    n->set_op_type(type);
    for (const std::string& i : inputs) n->add_input(i);
    std::string out = Fresh(type);
    n->add_output(out);
    n->set_name(out);
    for (const OnnxAttribute& a : attributes) {
      ox::AttributeProto* p = n->add_attribute();
      p->set_name(a.name);
      switch (a.type) {
        case OnnxAttribute::kInt:
          p->set_type(ox::AttributeProto::INT);
          p->set_i(a.ints.at(0));
          break;
        case OnnxAttribute::kInts:
          p->set_type(ox::AttributeProto::INTS);
          for (int64_t v : a.ints) p->add_ints(v);
          break;
        case OnnxAttribute::kFloat:
          p->set_type(ox::AttributeProto::FLOAT);
          p->set_f(a.f);
          break;
      }
    }
    return out;
  }
  std::string Floats(const std::string& hint, const std::vector<int64_t>& dims,
                     const std::vector<float>& values) override {
    return Initializer(Fresh(hint), dims, values);
  }
  std::string Ints(const std::vector<int64_t>& values) override {
    ox::TensorProto* t = g_->add_initializer();
    std::string name = Fresh("shape");
    t->set_name(name);
    t->set_data_type(ox::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    t->set_raw_data(values.data(), values.size() * sizeof(int64_t));
    return name;
  }
  std::string Index(int64_t v) override {
    ox::TensorProto* t = g_->add_initializer();
    std::string name = Fresh("index");
    t->set_name(name);
    t->set_data_type(ox::TensorProto::INT64);
    t->set_raw_data(&v, sizeof(v));
    return name;
  }
  std::string Parameter(const Layer&, const Param& p, bool torch_layout) override {
    auto it = names_.find(&p);
    LP_CHECK_MSG(it != names_.end(), "parameter %s is not among the exported ones", p.name.c_str());
    const ParamInfo& info = *it->second;
    // A tied parameter is used twice: its initializer is written once.
    const std::pair<const Param*, bool> key{&p, torch_layout};
    if (auto done = written_.find(key); done != written_.end()) return done->second;
    // (the other layout of one already written gets a name of its own)
    const bool other = written_.count({&p, !torch_layout}) > 0;
    const std::string name =
        other ? info.readable + (torch_layout ? ".torch" : ".stored") : info.readable;
    written_[key] = name;
    if (torch_layout) {
      std::vector<int64_t> shape;
      const std::vector<float> values = TorchOrder(info, &shape);
      return Initializer(name, shape, values);
    }
    return Initializer(name, std::vector<int64_t>(p.value.shape().begin(), p.value.shape().end()),
                       p.value.ToHost());
  }
  // A named scalar constant (the input transform's).
  std::string NamedScalar(const std::string& name, float v) { return Initializer(name, {}, {v}); }

 private:
  std::string Fresh(const std::string& hint) { return absl::StrCat(hint, "_", next_++); }
  std::string Initializer(const std::string& name, const std::vector<int64_t>& dims,
                          const std::vector<float>& values) {
    ox::TensorProto* t = g_->add_initializer();
    t->set_name(name);
    t->set_data_type(ox::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    t->set_raw_data(values.data(), values.size() * sizeof(float));
    return name;
  }

  ox::GraphProto* g_;
  std::map<const Param*, const ParamInfo*> names_;
  int next_ = 0;
  std::map<std::pair<const Param*, bool>, std::string> written_;
};

// [N, dims...]; with `positions`, dims[0] is T, any length up to dims[0].
void SetType(ox::ValueInfoProto* v, int elem, const std::vector<int64_t>& dims, bool positions) {
  ox::TypeProto::Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem);
  ox::TensorShapeProto::Dimension* n = t->mutable_shape()->add_dim();
  n->set_dim_param("N");
  for (size_t i = 0; i < dims.size(); ++i) {
    if (positions && i == 0) {
      t->mutable_shape()->add_dim()->set_dim_param("T");
    } else {
      t->mutable_shape()->add_dim()->set_dim_value(dims[i]);
    }
  }
}

// Moves the large initializers' bytes into external.path, in graph order, each at an aligned
// offset; the graph keeps only references.
absl::Status MoveToExternalData(ox::GraphProto* g, const OnnxExternalData& external) {
  // Move the large initializers' bytes out, in graph order, each at an aligned offset.
  std::vector<ox::TensorProto*> moved;
  uint64_t at = 0;
  for (ox::TensorProto& t : *g->mutable_initializer()) {
    if (t.raw_data().size() < external.min_bytes) continue;
    at = (at + 4095) / 4096 * 4096;
    auto entry = [&](const char* key, const std::string& value) {
      ox::StringStringEntryProto* e = t.add_external_data();
      e->set_key(key);
      e->set_value(value);
    };
    entry("location", external.location);
    entry("offset", absl::StrCat(at));
    entry("length", absl::StrCat(t.raw_data().size()));
    t.set_data_location(ox::TensorProto::EXTERNAL);
    at += t.raw_data().size();
    moved.push_back(&t);
  }
  absl::Status written = WriteFileAtomicallyFrom(external.path, [&](const ByteSink& sink) {
    uint64_t pos = 0;
    const std::string zeros(4096, '\0');
    for (ox::TensorProto* t : moved) {
      const uint64_t pad = (pos + 4095) / 4096 * 4096 - pos;
      if (absl::Status s = sink(std::string_view(zeros.data(), pad)); !s.ok()) return s;
      if (absl::Status s = sink(t->raw_data()); !s.ok()) return s;
      pos += pad + t->raw_data().size();
      t->clear_raw_data();  // the graph keeps only the reference
    }
    return absl::OkStatus();
  });
  return written;
}

}  // namespace

absl::StatusOr<std::string> ExportOnnx(TrainedModel& trained, int stage, const std::string& name,
                                       const OnnxExternalData* external) {
  const ModelConfig& config = trained.config;
  Model& model = *trained.model;
  if (stage < 0 || stage >= model.num_stages()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stage=", stage, ": the job has stages 0..", model.num_stages() - 1));
  }
  ox::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("localpar");
  ox::OperatorSetIdProto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
  ox::GraphProto* g = m.mutable_graph();
  g->set_name(name);
  // The layers of stages 0..stage and only the last one's head.
  std::vector<ParamInfo> params;
  for (ParamInfo& p : DescribeParams(config, model, stage)) {
    if (!p.head || p.stage == stage) params.push_back(std::move(p));
  }
  ProtoGraph graph(g, params);

  const bool tokens = model.stage(0).input_dtype() == DType::kI32;
  const InputNormalization& norm = trained.normalization;
  const Shape& in = config.input_shape;
  // Images arrive as PyTorch hands them over, [N, C, H, W]; localpar computes in [H, W, C].
  const bool image = !tokens && !norm.tokens && in.size() == 3;
  std::vector<int64_t> dims(in.begin(), in.end());
  if (image) dims = {in[2], in[0], in[1]};
  ox::ValueInfoProto* input = g->add_input();
  input->set_name("input");
  SetType(input, tokens ? ox::TensorProto::INT64 : ox::TensorProto::FLOAT, dims, tokens);
  std::string x = "input";
  const bool pixels = norm.scale != 1.0f;  // trained on pixel bytes, which it scaled itself
  std::string described;
  if (!tokens && !norm.tokens) {
    if (image) x = graph.ToNhwc(x);
    // (value - mean) * inv_std, as training normalised (value = byte * scale for pixels).
    x = graph.Op("Sub", {x, graph.NamedScalar("input_mean", norm.mean)});
    x = graph.Op("Mul", {x, graph.NamedScalar("input_inv_std", norm.inv_std)});
    described = absl::StrCat(
        image ? "float32 [N, C, H, W]" : "float32 [N, ...]",
        pixels
            ? absl::StrFormat(", pixels scaled to [0, 1] (byte * %.9g, as torchvision's ToTensor() "
                              "gives them); normalised inside the graph",
                              norm.scale)
            : ", values as the training files held them; normalised inside the graph");
  } else {
    described = absl::StrCat("int64 token ids [N, T], T any length up to the context (", in[0],
                             "); causal, so position t's logits are those of the first t + 1");
  }
  input->set_doc_string(described);
  ox::StringStringEntryProto* what = m.add_metadata_props();
  what->set_key("localpar.input");
  what->set_value(described);
  for (int k = 0; k <= stage; ++k) {
    for (int i = 0; i < model.stage(k).num_layers(); ++i)
      x = model.stage(k).layer(i).EmitOnnx(graph, x);
  }
  for (int i = 0; i < model.stage(stage).num_head_layers(); ++i) {
    x = model.stage(stage).head_layer(i).EmitOnnx(graph, x);
  }
  const Shape& cur =
      model.stage(stage).num_head_layers() > 0
          ? model.stage(stage).head_layer(model.stage(stage).num_head_layers() - 1).output_shape()
          : model.stage(stage).output_shape();
  ox::NodeProto* id = g->add_node();
  id->set_op_type("Identity");
  id->add_input(x);
  id->add_output("logits");
  ox::ValueInfoProto* out = g->add_output();
  out->set_name("logits");
  SetType(out, ox::TensorProto::FLOAT, std::vector<int64_t>(cur.begin(), cur.end()),
          tokens && cur.size() > 1);
  ox::StringStringEntryProto* meta = m.add_metadata_props();
  meta->set_key("localpar.stage");
  meta->set_value(absl::StrCat(stage));
  ox::StringStringEntryProto* names = m.add_metadata_props();
  names->set_key("localpar.class_names");  // logit i is class i, by name
  names->set_value(ClassNamesJson(trained.weights));
  if (external) {
    if (absl::Status s = MoveToExternalData(g, *external); !s.ok()) return s;
  }
  std::string bytes;
  if (!m.SerializeToString(&bytes)) {
    return absl::ResourceExhaustedError(
        "the ONNX graph with its weights passes protobuf's 2 GiB limit: export with "
        "--external_data");
  }
  return bytes;
}

}  // namespace localpar
