// Builds the ONNX graph layer by layer from the model's configs and parameter values.
#include "common/job/onnx_export.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/core/check.h"
#include "common/nn/head.h"
#include "proto/onnx_model.pb.h"

namespace localpar {
namespace {

using K = LayerConfig::Kind;
namespace ox = ::localpar::onnx;

class GraphBuilder {
 public:
  explicit GraphBuilder(ox::GraphProto* g) : g_(g) {}

  std::string Fresh(const std::string& hint) { return absl::StrCat(hint, "_", next_++); }

  // A node with one output; attributes are added by the caller through the returned node.
  ox::NodeProto* Node(const std::string& op, const std::vector<std::string>& inputs,
                      std::string* output) {
    ox::NodeProto* n = g_->add_node();
    n->set_op_type(op);
    for (const std::string& i : inputs) n->add_input(i);
    *output = Fresh(op);
    n->add_output(*output);
    n->set_name(*output);
    return n;
  }
  std::string Op(const std::string& op, const std::vector<std::string>& inputs) {
    std::string out;
    Node(op, inputs, &out);
    return out;
  }

  std::string Floats(const std::string& name, const std::vector<int64_t>& dims, const float* data,
                     size_t count) {
    ox::TensorProto* t = g_->add_initializer();
    t->set_name(name);
    t->set_data_type(ox::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    t->set_raw_data(data, count * sizeof(float));
    return name;
  }
  std::string Floats(const std::string& name, const std::vector<int64_t>& dims,
                     const std::vector<float>& data) {
    return Floats(name, dims, data.data(), data.size());
  }
  std::string Scalar(float v) { return Floats(Fresh("const"), {}, &v, 1); }
  std::string Index(int64_t v) {  // an int64 scalar
    ox::TensorProto* t = g_->add_initializer();
    std::string name = Fresh("index");
    t->set_name(name);
    t->set_data_type(ox::TensorProto::INT64);
    t->set_raw_data(&v, sizeof(v));
    return name;
  }
  std::string Ints(const std::vector<int64_t>& values) {
    ox::TensorProto* t = g_->add_initializer();
    std::string name = Fresh("shape");
    t->set_name(name);
    t->set_data_type(ox::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    t->set_raw_data(values.data(), values.size() * sizeof(int64_t));
    return name;
  }

 private:
  ox::GraphProto* g_;
  int next_ = 0;
};

void IntsAttr(ox::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
  ox::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(ox::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
void IntAttr(ox::NodeProto* n, const std::string& name, int64_t v) {
  ox::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(ox::AttributeProto::INT);
  a->set_i(v);
}
void FloatAttr(ox::NodeProto* n, const std::string& name, float v) {
  ox::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(ox::AttributeProto::FLOAT);
  a->set_f(v);
}

class Exporter {
 public:
  Exporter(ox::GraphProto* g, const std::vector<ParamInfo>& params) : b_(g), params_(params) {}

  // Emits layer `c` on x (per-example shape `in`); returns the output's name.
  std::string Layer(const LayerConfig& c, const Shape& in, const std::string& x) {
    switch (c.kind) {
      case K::kLinear: {
        std::string flat = x;
        if (in.size() != 1) {
          ox::NodeProto* n = b_.Node("Flatten", {x}, &flat);
          IntAttr(n, "axis", 1);
        }
        return Affine(flat);
      }
      case K::kDense:
        return Affine(x);
      case K::kRelu:
        return b_.Op("Relu", {x});
      case K::kGelu: {
        // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as localpar computes it.
        std::string cube = b_.Op("Mul", {x, b_.Op("Mul", {x, x})});
        std::string inner = b_.Op("Add", {x, b_.Op("Mul", {cube, b_.Scalar(0.044715f)})});
        std::string t = b_.Op("Tanh", {b_.Op("Mul", {inner, b_.Scalar(0.7978845608028654f)})});
        std::string half = b_.Op("Mul", {x, b_.Scalar(0.5f)});
        return b_.Op("Mul", {half, b_.Op("Add", {t, b_.Scalar(1.0f)})});
      }
      case K::kLayerNorm: {
        const ParamInfo& gamma = Next();
        const ParamInfo& beta = Next();
        std::string out;
        ox::NodeProto* n = b_.Node("LayerNormalization", {x, Value(gamma), Value(beta)}, &out);
        IntAttr(n, "axis", -1);
        FloatAttr(n, "epsilon", c.eps);
        return out;
      }
      case K::kBatchNorm: {
        // Evaluation mode: y = x * scale + shift per channel (the last dimension), with
        // scale and shift computed from the running statistics exactly as localpar does.
        std::vector<float> gamma = Next().value->value.ToHost();
        std::vector<float> beta = Next().value->value.ToHost();
        std::vector<float> mean = Next().value->value.ToHost();
        std::vector<float> var = Next().value->value.ToHost();
        std::vector<float> scale(gamma.size()), shift(gamma.size());
        for (size_t i = 0; i < gamma.size(); ++i) {
          float rs = 1.0f / std::sqrt(var[i] + c.eps);
          scale[i] = gamma[i] * rs;
          shift[i] = beta[i] - mean[i] * scale[i];
        }
        const int64_t ch = static_cast<int64_t>(gamma.size());
        std::string scaled = b_.Op("Mul", {x, b_.Floats(b_.Fresh("bn_scale"), {ch}, scale)});
        return b_.Op("Add", {scaled, b_.Floats(b_.Fresh("bn_shift"), {ch}, shift)});
      }
      case K::kDropout:
        return x;
      case K::kConv2d: {
        const ParamInfo& w = Next();
        const ParamInfo& bias = Next();
        std::vector<int64_t> shape;  // [co, ci, k, k]: PyTorch's layout is ONNX's
        const std::vector<float> onnx = TorchOrder(w, &shape);
        std::string wn = b_.Floats(w.readable, shape, onnx);
        std::string out;
        ox::NodeProto* n = b_.Node("Conv", {ToNchw(x), wn, Value(bias)}, &out);
        IntsAttr(n, "kernel_shape", {c.kernel, c.kernel});
        IntsAttr(n, "strides", {c.stride, c.stride});
        IntsAttr(n, "pads", {c.padding, c.padding, c.padding, c.padding});
        return ToNhwc(out);
      }
      case K::kMaxPool:
      case K::kAvgPool: {
        std::string out;
        ox::NodeProto* n =
            b_.Node(c.kind == K::kMaxPool ? "MaxPool" : "AveragePool", {ToNchw(x)}, &out);
        IntsAttr(n, "kernel_shape", {c.kernel, c.kernel});
        IntsAttr(n, "strides", {c.stride, c.stride});
        IntsAttr(n, "pads", {c.padding, c.padding, c.padding, c.padding});
        if (c.kind == K::kAvgPool) IntAttr(n, "count_include_pad", 1);  // localpar divides by k*k
        return ToNhwc(out);
      }
      case K::kGlobalAvgPool: {
        std::string out;
        ox::NodeProto* n = b_.Node("ReduceMean", {x}, &out);
        IntsAttr(n, "axes", {1, 2});
        IntAttr(n, "keepdims", 0);
        return out;
      }
      case K::kFlatten: {
        std::string out;
        ox::NodeProto* n = b_.Node("Flatten", {x}, &out);
        IntAttr(n, "axis", 1);
        return out;
      }
      case K::kEmbedding: {
        const ParamInfo& table = Next();
        std::string out;
        ox::NodeProto* n = b_.Node("Gather", {Value(table), x}, &out);
        IntAttr(n, "axis", 0);
        return out;
      }
      case K::kResidual: {
        std::string y = x;
        Shape cur = in;
        for (const LayerConfig& l : c.body) {
          y = Layer(l, cur, y);
          cur = OutShape(l, cur);
        }
        return b_.Op("Add", {x, y});
      }
      case K::kPositionalEncoding: {
        std::string pe = b_.Floats(b_.Fresh("positional_encoding"), {in[0], in[1]},
                                   PositionalEncodingTable(in[0], in[1]));
        return b_.Op("Add", {x, pe});
      }
      case K::kCausalSelfAttention:
        return Attention(c, in, x);
    }
    LP_CHECK_MSG(false, "layer kind %s has no ONNX mapping", LayerKindName(c.kind));
    return x;
  }

  bool Done() const { return next_ == params_.size(); }

  static Shape OutShape(const LayerConfig& c, const Shape& in) {
    Shape out;
    std::string error;
    LP_CHECK_MSG(InferLayerShape(c, in, &out, &error), "%s", error.c_str());
    return out;
  }

 private:
  const ParamInfo& Next() {
    LP_CHECK(next_ < params_.size());
    return params_[next_++];
  }
  std::string Value(const ParamInfo& p) {
    std::vector<float> v = p.value->value.ToHost();
    return b_.Floats(
        p.readable,
        std::vector<int64_t>(p.value->value.shape().begin(), p.value->value.shape().end()), v);
  }
  // x W + b with W [in, out] as localpar stores it.
  std::string Affine(const std::string& x) {
    const ParamInfo& w = Next();
    const ParamInfo& bias = Next();
    return b_.Op("Add", {b_.Op("MatMul", {x, Value(w)}), Value(bias)});
  }
  std::string Transpose(const std::string& x, const std::vector<int64_t>& perm) {
    std::string out;
    ox::NodeProto* n = b_.Node("Transpose", {x}, &out);
    IntsAttr(n, "perm", perm);
    return out;
  }
  std::string ToNchw(const std::string& x) { return Transpose(x, {0, 3, 1, 2}); }
  std::string ToNhwc(const std::string& x) { return Transpose(x, {0, 2, 3, 1}); }

  // [N, T, D]: qkv = x Wqkv + b, split into heads, softmax(q k^T * scale) over earlier
  // positions, merged, then the output projection.
  std::string Attention(const LayerConfig& c, const Shape& in, const std::string& x) {
    const int64_t t = in[0], d = in[1], h = c.heads, dh = d / h;
    std::string qkv = Affine(x);  // [N, T, 3D]; columns (part, head, j)
    std::string split =
        Transpose(b_.Op("Reshape", {qkv, b_.Ints({0, t, 3, h, dh})}), {2, 0, 3, 1, 4});
    std::vector<std::string> parts;
    for (int64_t p = 0; p < 3; ++p) {
      std::string out;
      ox::NodeProto* n = b_.Node("Gather", {split, b_.Index(p)}, &out);
      IntAttr(n, "axis", 0);
      parts.push_back(out);  // [N, H, T, dh]
    }
    std::string scores = b_.Op("MatMul", {parts[0], Transpose(parts[1], {0, 1, 3, 2})});
    scores = b_.Op("Mul", {scores, b_.Scalar(1.0f / std::sqrt(static_cast<float>(dh)))});
    std::vector<float> mask(static_cast<size_t>(t * t), 0.0f);
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = i + 1; j < t; ++j) mask[i * t + j] = -INFINITY;
    }
    scores = b_.Op("Add", {scores, b_.Floats(b_.Fresh("causal_mask"), {t, t}, mask)});
    std::string probs;
    ox::NodeProto* sm = b_.Node("Softmax", {scores}, &probs);
    IntAttr(sm, "axis", -1);
    std::string ctx = b_.Op("MatMul", {probs, parts[2]});  // [N, H, T, dh]
    std::string merged =
        b_.Op("Reshape", {Transpose(ctx, {0, 2, 1, 3}), b_.Ints({0, t, d})});  // [N, T, D]
    return Affine(merged);
  }

  GraphBuilder b_;
  const std::vector<ParamInfo>& params_;
  size_t next_ = 0;
};

void SetType(ox::ValueInfoProto* v, int elem, const std::vector<int64_t>& dims) {
  ox::TypeProto::Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem);
  ox::TensorShapeProto::Dimension* n = t->mutable_shape()->add_dim();
  n->set_dim_param("N");
  for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
}

}  // namespace

absl::StatusOr<std::string> ExportOnnx(TrainedModel& trained, int stage, const std::string& name) {
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
  Exporter ex(g, params);

  const bool tokens = !config.stages.empty() && !config.stages[0].layers.empty() &&
                      config.stages[0].layers[0].kind == K::kEmbedding;
  ox::ValueInfoProto* input = g->add_input();
  input->set_name("input");
  SetType(input, tokens ? ox::TensorProto::INT64 : ox::TensorProto::FLOAT,
          std::vector<int64_t>(config.input_shape.begin(), config.input_shape.end()));
  std::string x = "input";
  const InputNormalization& norm = trained.normalization;
  GraphBuilder consts(g);
  if (!tokens && !norm.tokens) {
    input->set_doc_string("raw values (pixel bytes as 0..255); normalised inside the graph");
    // (raw * scale - mean) * inv_std, one float32 operation at a time, as training did.
    ox::NodeProto* n = g->add_node();
    auto scalar = [&](const std::string& nm, float v) { return consts.Floats(nm, {}, &v, 1); };
    n->set_op_type("Mul");
    n->add_input("input");
    n->add_input(scalar("input_scale", norm.scale));
    n->add_output("input_scaled");
    ox::NodeProto* s = g->add_node();
    s->set_op_type("Sub");
    s->add_input("input_scaled");
    s->add_input(scalar("input_mean", norm.mean));
    s->add_output("input_centred");
    ox::NodeProto* v = g->add_node();
    v->set_op_type("Mul");
    v->add_input("input_centred");
    v->add_input(scalar("input_inv_std", norm.inv_std));
    v->add_output("input_normalised");
    x = "input_normalised";
  } else {
    input->set_doc_string("token ids");
  }
  Shape cur = config.input_shape;
  for (int k = 0; k <= stage; ++k) {
    for (const LayerConfig& l : config.stages[k].layers) {
      x = ex.Layer(l, cur, x);
      cur = Exporter::OutShape(l, cur);
    }
  }
  std::vector<LayerConfig> head;
  std::string error;
  if (!HeadLayers(config.stages[stage].head, cur, config.classes, &head, &error)) {
    return absl::InvalidArgumentError(error);
  }
  for (const LayerConfig& l : head) {
    x = ex.Layer(l, cur, x);
    cur = Exporter::OutShape(l, cur);
  }
  LP_CHECK(ex.Done());
  ox::NodeProto* id = g->add_node();
  id->set_op_type("Identity");
  id->add_input(x);
  id->add_output("logits");
  ox::ValueInfoProto* out = g->add_output();
  out->set_name("logits");
  SetType(out, ox::TensorProto::FLOAT, std::vector<int64_t>(cur.begin(), cur.end()));
  ox::StringStringEntryProto* meta = m.add_metadata_props();
  meta->set_key("localpar.stage");
  meta->set_value(absl::StrCat(stage));
  return m.SerializeAsString();
}

}  // namespace localpar
