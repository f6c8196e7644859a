// Job parsing, defaults and validation.
#include "common/job/job.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/data/dataset.h"
#include "common/data/user_data.h"
#include "common/job/suggest.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/text_format.h"

namespace localpar {
namespace {

// The text between the first two double quotes after `after` in `message` ("" if none).
std::string Quoted(const std::string& message, const std::string& after) {
  size_t at = message.find(after);
  if (at == std::string::npos) return "";
  size_t begin = message.find('"', at + after.size());
  if (begin == std::string::npos) return "";
  size_t end = message.find('"', begin + 1);
  return end == std::string::npos ? "" : message.substr(begin + 1, end - begin - 1);
}

// Every enum type of the job format with a field named `field`, and its value names.
std::vector<std::string> EnumValuesOfField(const std::string& field) {
  std::vector<std::string> values;
  const google::protobuf::FileDescriptor* file = v1::Job::descriptor()->file();
  std::function<void(const google::protobuf::Descriptor*)> visit =
      [&](const google::protobuf::Descriptor* d) {
        for (int i = 0; i < d->field_count(); ++i) {
          const google::protobuf::FieldDescriptor* f = d->field(i);
          if (f->name() != field || !f->enum_type()) continue;
          for (int v = 0; v < f->enum_type()->value_count(); ++v) {
            const std::string& name = f->enum_type()->value(v)->name();
            if (name.find("UNSPECIFIED") == std::string::npos &&
                std::find(values.begin(), values.end(), name) == values.end()) {
              values.push_back(name);
            }
          }
        }
        for (int i = 0; i < d->nested_type_count(); ++i) visit(d->nested_type(i));
      };
  for (int i = 0; i < file->message_type_count(); ++i) visit(file->message_type(i));
  return values;
}

// What the parser says, with a suggestion for a misspelt field or enum value, and every
// valid value of an enum.
std::string WithSuggestion(const std::string& message) {
  if (message.find("has no field named") != std::string::npos) {
    const std::string type = Quoted(message, "Message type");
    const std::string name = Quoted(message, "has no field named");
    const google::protobuf::Descriptor* d =
        google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(type);
    if (!d) return message;
    std::vector<std::string> fields;
    for (int i = 0; i < d->field_count(); ++i) fields.push_back(d->field(i)->name());
    const std::string best = Closest(name, fields);
    return best.empty() ? absl::StrCat(message, " Its fields: ", absl::StrJoin(fields, ", "), ".")
                        : absl::StrCat(message, " Did you mean \"", best, "\"?");
  }
  if (message.find("Unknown enumeration value") != std::string::npos) {
    const std::string value = Quoted(message, "enumeration value of");
    const std::vector<std::string> values = EnumValuesOfField(Quoted(message, "for field"));
    if (values.empty()) return message;
    const std::string best = Closest(value, values);
    return absl::StrCat(message, best.empty() ? "" : absl::StrCat(" Did you mean ", best, "?"),
                        " Valid values: ", absl::StrJoin(values, ", "), ".");
  }
  return message;
}

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  CollectErrors(std::string source, const std::string& text)
      : source_(std::move(source)), text_(text) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    // The parser reports a bad enum value at the token after it: point at the value.
    const std::string value = Quoted(message, "enumeration value of");
    if (!value.empty()) FindBefore(value, &line, &column);
    // The parser counts from 0; editors count from 1.
    errors_.push_back(
        absl::StrCat(source_, ":", line + 1, ":", column + 1, ": ", WithSuggestion(message)));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    AddError(line, column, message);
  }
  std::string str() const { return absl::StrJoin(errors_, "\n"); }

 private:
  // Moves (line, column) back to the last occurrence of `token` at or before it, if any.
  void FindBefore(const std::string& token, int* line, google::protobuf::io::ColumnNumber* column) {
    size_t at = 0;
    for (int l = 0; l < *line && at != std::string::npos; ++l) {
      at = text_.find('\n', at);
      if (at != std::string::npos) ++at;
    }
    if (at == std::string::npos) return;
    const size_t limit = std::min(text_.size(), at + static_cast<size_t>(*column));
    const size_t found = text_.rfind(token, limit);
    if (found == std::string::npos) return;
    const size_t line_start = text_.rfind('\n', found);
    *line = static_cast<int>(std::count(text_.begin(), text_.begin() + found, '\n'));
    *column = static_cast<int>(found - (line_start == std::string::npos ? 0 : line_start + 1));
  }

  std::string source_;
  const std::string& text_;
  std::vector<std::string> errors_;
};

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

bool Finite(float v) { return std::isfinite(v); }

absl::Status ValidateLayer(const v1::Layer& l, const std::string& at) {
  switch (l.kind_case()) {
    case v1::Layer::KIND_NOT_SET:
      return Invalid(at, "no layer kind set (linear, relu, conv2d, ...)");
    case v1::Layer::kLinear:
      if (l.linear().out_features() <= 0)
        return Invalid(at + ".linear.out_features", "must be > 0");
      if (l.linear().in_features() < 0) return Invalid(at + ".linear.in_features", "must be >= 0");
      break;
    case v1::Layer::kConv2D: {
      const auto& c = l.conv2d();
      if (c.out_channels() <= 0) return Invalid(at + ".conv2d.out_channels", "must be > 0");
      if (c.kernel() <= 0 || c.stride() <= 0 || c.padding() < 0) {
        return Invalid(at + ".conv2d", "kernel and stride must be > 0, padding >= 0");
      }
      break;
    }
    case v1::Layer::kMaxPool:
    case v1::Layer::kAvgPool: {
      const auto& p = l.has_max_pool() ? l.max_pool() : l.avg_pool();
      if (p.kernel() <= 0 || p.stride() <= 0 || p.padding() < 0) {
        return Invalid(at, "pool kernel and stride must be > 0, padding >= 0");
      }
      break;
    }
    case v1::Layer::kDropout:
      if (!(l.dropout().rate() >= 0.0f && l.dropout().rate() < 1.0f)) {
        return Invalid(at + ".dropout.rate", "must be in [0, 1)");
      }
      break;
    case v1::Layer::kLayerNorm:
      if (!(l.layer_norm().eps() > 0.0f) || !Finite(l.layer_norm().eps())) {
        return Invalid(at + ".layer_norm.eps", "must be a finite number > 0");
      }
      break;
    case v1::Layer::kEmbedding:
      if (l.embedding().vocab() <= 0) return Invalid(at + ".embedding.vocab", "must be > 0");
      if (l.embedding().dim() <= 0) return Invalid(at + ".embedding.dim", "must be > 0");
      break;
    case v1::Layer::kDense:
      if (l.dense().out_features() <= 0) return Invalid(at + ".dense.out_features", "must be > 0");
      if (l.dense().in_features() < 0) return Invalid(at + ".dense.in_features", "must be >= 0");
      break;
    case v1::Layer::kBatchNorm:
      if (!(l.batch_norm().eps() > 0.0f) || !Finite(l.batch_norm().eps())) {
        return Invalid(at + ".batch_norm.eps", "must be a finite number > 0");
      }
      if (!(l.batch_norm().momentum() >= 0.0f && l.batch_norm().momentum() <= 1.0f)) {
        return Invalid(at + ".batch_norm.momentum", "must be in [0, 1]");
      }
      break;
    case v1::Layer::kCausalSelfAttention:
      if (l.causal_self_attention().heads() <= 0) {
        return Invalid(at + ".causal_self_attention.heads", "must be > 0");
      }
      break;
    case v1::Layer::kTransformerBlock:
      if (l.transformer_block().heads() <= 0) {
        return Invalid(at + ".transformer_block.heads", "must be > 0");
      }
      if (l.transformer_block().mlp_hidden() < 0) {
        return Invalid(at + ".transformer_block.mlp_hidden", "must be > 0");
      }
      break;
    case v1::Layer::kResidual:
      if (l.residual().body().empty()) return Invalid(at + ".residual.body", "is empty");
      for (int i = 0; i < l.residual().body_size(); ++i) {
        absl::Status s =
            ValidateLayer(l.residual().body(i), absl::StrCat(at, ".residual.body[", i, "]"));
        if (!s.ok()) return s;
      }
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

void AppendLayerConfigs(const v1::Layer& l, Shape* cur, std::vector<LayerConfig>* out);

// The core config of one job layer. A transformer block needs its input's width, so
// conversion tracks the shape (`cur`) and may emit more than one layer.
LayerConfig ToLayerConfig(const v1::Layer& l, const Shape& cur) {
  using K = LayerConfig::Kind;
  LayerConfig c;
  switch (l.kind_case()) {
    case v1::Layer::kLinear:
      c.kind = K::kLinear;
      c.out_features = l.linear().out_features();
      c.in_features = l.linear().in_features();
      break;
    case v1::Layer::kRelu:
      c.kind = K::kRelu;
      break;
    case v1::Layer::kGelu:
      c.kind = K::kGelu;
      break;
    case v1::Layer::kLayerNorm:
      c.kind = K::kLayerNorm;
      c.eps = l.layer_norm().eps();
      break;
    case v1::Layer::kDropout:
      c.kind = K::kDropout;
      c.dropout = l.dropout().rate();
      break;
    case v1::Layer::kConv2D:
      c.kind = K::kConv2d;
      c.out_features = l.conv2d().out_channels();
      c.kernel = l.conv2d().kernel();
      c.stride = l.conv2d().stride();
      c.padding = l.conv2d().padding();
      break;
    case v1::Layer::kMaxPool:
    case v1::Layer::kAvgPool: {
      const auto& p = l.has_max_pool() ? l.max_pool() : l.avg_pool();
      c.kind = l.has_max_pool() ? K::kMaxPool : K::kAvgPool;
      c.kernel = p.kernel();
      c.stride = p.stride();
      c.padding = p.padding();
      break;
    }
    case v1::Layer::kGlobalAvgPool:
      c.kind = K::kGlobalAvgPool;
      break;
    case v1::Layer::kFlatten:
      c.kind = K::kFlatten;
      break;
    case v1::Layer::kEmbedding:
      c.kind = K::kEmbedding;
      c.vocab = l.embedding().vocab();
      c.dim = l.embedding().dim();
      break;
    case v1::Layer::kResidual: {
      c.kind = K::kResidual;
      Shape inner = cur;
      for (const auto& b : l.residual().body()) AppendLayerConfigs(b, &inner, &c.body);
      break;
    }
    case v1::Layer::kDense:
      c.kind = K::kDense;
      c.out_features = l.dense().out_features();
      c.in_features = l.dense().in_features();
      break;
    case v1::Layer::kBatchNorm:
      c.kind = K::kBatchNorm;
      c.eps = l.batch_norm().eps();
      c.momentum = l.batch_norm().momentum();
      break;
    case v1::Layer::kPositionalEncoding:
      c.kind = K::kPositionalEncoding;
      break;
    case v1::Layer::kCausalSelfAttention:
      c.kind = K::kCausalSelfAttention;
      c.heads = l.causal_self_attention().heads();
      break;
    case v1::Layer::kTransformerBlock:  // expanded by AppendLayerConfigs
      break;
    case v1::Layer::KIND_NOT_SET:
      break;
  }
  return c;
}

void AppendLayerConfigs(const v1::Layer& l, Shape* cur, std::vector<LayerConfig>* out) {
  using K = LayerConfig::Kind;
  std::vector<LayerConfig> made;
  if (l.kind_case() == v1::Layer::kTransformerBlock) {
    const v1::TransformerBlock& t = l.transformer_block();
    int64_t dim = cur->empty() ? 0 : cur->back();
    auto make = [](K kind, int64_t width = 0) {
      LayerConfig c;
      c.kind = kind;
      c.out_features = width;
      return c;
    };
    LayerConfig attention = make(K::kCausalSelfAttention);
    attention.heads = t.heads();
    LayerConfig attend = make(K::kResidual), mlp = make(K::kResidual);
    attend.body = {make(K::kLayerNorm), attention};
    mlp.body = {make(K::kLayerNorm), make(K::kDense, t.mlp_hidden() > 0 ? t.mlp_hidden() : 4 * dim),
                make(K::kGelu), make(K::kDense, dim)};
    made = {attend, mlp};
  } else {
    made = {ToLayerConfig(l, *cur)};
  }
  for (LayerConfig& c : made) {
    Shape next;
    std::string ignored;  // ValidateModel reports shape errors with full context
    if (InferLayerShape(c, *cur, &next, &ignored)) *cur = next;
    out->push_back(std::move(c));
  }
}

}  // namespace

namespace {

absl::StatusOr<v1::Job> ParseJobText(const std::string& text, const std::string& source) {
  v1::Job job;
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors(source, text);
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &job)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid job file ", errors.str()));
  }
  ApplyJobDefaults(job);
  return job;
}

absl::StatusOr<std::string> ReadJobFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("job file ", path, ": cannot open"));
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

absl::Status ApplyOverrides(const v1::JobOverrides& o, v1::Job* job) {
  if (!o.rule().empty()) {
    const RuleSpec* rule = FindRule(o.rule());
    if (!rule) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rule=", o.rule(), ": expected ", RuleNameList()));
    }
    job->set_rule(static_cast<v1::UpdateRule>(rule->rule));
  }
  if (o.epochs() > 0) job->set_epochs(o.epochs());
  if (o.max_steps() > 0) job->set_max_steps(o.max_steps());
  if (o.has_seed()) job->set_seed(static_cast<uint64_t>(o.seed()));
  if (o.replicas() > 0) job->set_replicas(o.replicas());
  if (o.batch_size() < 0) return absl::InvalidArgumentError("--batch_size: must be >= 0");
  if (o.batch_size() > 0) job->set_batch_size(o.batch_size());
  if (!(o.lr() >= 0) || !std::isfinite(o.lr())) {
    return absl::InvalidArgumentError("--lr: must be a finite number >= 0");
  }
  if (o.lr() > 0) {
    v1::Schedule* s = job->mutable_schedule();
    const double old_lr = s->lr() > 0 ? s->lr() : 1e-3;  // the schedule's default
    s->set_min_lr(static_cast<float>(s->min_lr() * o.lr() / old_lr));
    s->set_lr(static_cast<float>(o.lr()));
  }
  if (o.eval_every_steps() < 0)
    return absl::InvalidArgumentError("--eval_every_steps: must be >= 0");
  if (o.eval_every_steps() > 0) job->set_eval_every_steps(o.eval_every_steps());
  if (o.stages() > 0) {
    absl::StatusOr<v1::Job> regrouped = RegroupStages(*job, o.stages());
    if (!regrouped.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", regrouped.status().message()));
    }
    *job = *std::move(regrouped);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Job> ParseJob(const std::string& text, const std::string& source) {
  absl::StatusOr<v1::Job> job = ParseJobText(text, source);
  if (!job.ok()) return job.status();
  absl::Status s = ValidateJob(*job);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid job file ", source, ": ", s.message()));
  }
  return job;
}

absl::StatusOr<v1::Job> LoadJobFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadJobFile(path);
  if (!text.ok()) return text.status();
  return ParseJob(*text, path);
}

absl::StatusOr<v1::Job> LoadJobWithOverrides(const std::string& path,
                                             const v1::JobOverrides& overrides) {
  absl::StatusOr<std::string> text = ReadJobFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<v1::Job> job = ParseJobText(*text, path);
  if (!job.ok()) return job.status();
  if (absl::Status s = ApplyOverrides(overrides, &*job); !s.ok()) return s;
  // The data's own shape and class count, before anything is checked against them.
  if (absl::Status s = ResolveDataShape(&*job); !s.ok()) return s;
  if (absl::Status s = ValidateJob(*job); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid job file ", path, ": ", s.message()));
  }
  return job;
}

namespace {

// Every layer field with a documented default, filled where it is zero.
void ApplyLayerDefaults(v1::Layer& l) {
  switch (l.kind_case()) {
    case v1::Layer::kConv2D: {
      v1::Conv2dLayer* c = l.mutable_conv2d();
      if (c->kernel() == 0) c->set_kernel(3);
      if (c->stride() == 0) c->set_stride(1);
      break;
    }
    case v1::Layer::kMaxPool:
    case v1::Layer::kAvgPool: {
      v1::PoolLayer* p = l.has_max_pool() ? l.mutable_max_pool() : l.mutable_avg_pool();
      if (p->kernel() == 0) p->set_kernel(2);
      if (p->stride() == 0) p->set_stride(p->kernel());
      break;
    }
    case v1::Layer::kLayerNorm:
      if (l.layer_norm().eps() == 0.0f) l.mutable_layer_norm()->set_eps(1e-5f);
      break;
    case v1::Layer::kBatchNorm:
      if (l.batch_norm().eps() == 0.0f) l.mutable_batch_norm()->set_eps(1e-5f);
      if (l.batch_norm().momentum() == 0.0f) l.mutable_batch_norm()->set_momentum(0.1f);
      break;
    case v1::Layer::kCausalSelfAttention:
      if (l.causal_self_attention().heads() == 0) l.mutable_causal_self_attention()->set_heads(1);
      break;
    case v1::Layer::kTransformerBlock:
      if (l.transformer_block().heads() == 0) l.mutable_transformer_block()->set_heads(1);
      break;  // mlp_hidden 0 stays: it means 4 x the block's width, known only from shapes
    case v1::Layer::kResidual:
      for (v1::Layer& b : *l.mutable_residual()->mutable_body()) ApplyLayerDefaults(b);
      break;
    default:
      break;
  }
}

}  // namespace

void ApplyJobDefaults(v1::Job& job) {
  if (job.name().empty()) job.set_name("job");
  if (job.batch_size() == 0) job.set_batch_size(128);
  if (job.epochs() == 0) job.set_epochs(1);
  if (job.micro_batches() == 0) job.set_micro_batches(1);
  if (job.replicas() == 0) job.set_replicas(1);
  if (job.eval_batch_size() == 0) job.set_eval_batch_size(1000);
  v1::Data* data = job.mutable_data();
  if (data->source_case() == v1::Data::SOURCE_NOT_SET) data->mutable_fashion_mnist();
  if (data->has_fashion_mnist() && data->fashion_mnist().dir().empty()) {
    data->mutable_fashion_mnist()->set_dir(kDefaultFashionMnistDir);
  }
  if (data->has_text()) {
    v1::TextCorpus* t = data->mutable_text();
    if (t->paths().empty()) t->add_paths(kDefaultTextCorpusDir);
    if (t->seq_len() == 0) t->set_seq_len(64);
    if (t->holdout_fraction() == 0.0f) t->set_holdout_fraction(0.1f);
  }
  if (data->has_synthetic()) {
    v1::Synthetic* s = data->mutable_synthetic();
    if (s->train_examples() == 0) s->set_train_examples(1024);
    if (s->test_examples() == 0) s->set_test_examples(256);
    if (s->shape().empty()) {
      for (int64_t d : {28, 28, 1}) s->add_shape(d);
    }
    if (s->classes() == 0) s->set_classes(10);
    if (s->noise() == 0.0f) s->set_noise(1.0f);
  }
  if (job.optimizer().kind_case() == v1::Optimizer::KIND_NOT_SET) {
    job.mutable_optimizer()->mutable_adamw();
  }
  if (job.optimizer().has_adamw()) {
    v1::AdamW* a = job.mutable_optimizer()->mutable_adamw();
    if (a->beta1() == 0.0f) a->set_beta1(0.9f);
    if (a->beta2() == 0.0f) a->set_beta2(0.999f);
    if (a->eps() == 0.0f) a->set_eps(1e-8f);
  }
  if (job.schedule().lr() == 0.0f) job.mutable_schedule()->set_lr(1e-3f);
  for (v1::Stage& st : *job.mutable_stages()) {
    for (v1::Layer& l : *st.mutable_layers()) ApplyLayerDefaults(l);
    if (st.head().kind() == v1::Head::MLP && st.head().hidden() == 0) {
      st.mutable_head()->set_hidden(256);
    }
    if (st.head().kind() == v1::Head::CONV_POOL_LINEAR && st.head().channels() == 0) {
      st.mutable_head()->set_channels(32);
    }
  }
}

namespace {

absl::Status ValidateRun(const v1::Job& job) {
  if (job.rule() == v1::UPDATE_RULE_UNSPECIFIED || !v1::UpdateRule_IsValid(job.rule())) {
    return Invalid("rule", "required: " + RuleNameList());
  }
  if (!v1::GemmMath_IsValid(job.gemm_precision())) {
    return Invalid("gemm_precision", "expected GEMM_F32, GEMM_TF32 or GEMM_BF16");
  }
  if (!v1::WireFormat_IsValid(job.wire())) {
    return Invalid("wire", "expected WIRE_F32, WIRE_BF16 or WIRE_F16");
  }
  if (job.batch_size() <= 0) return Invalid("batch_size", "must be > 0");
  if (job.epochs() <= 0) return Invalid("epochs", "must be > 0");
  if (job.eval_batch_size() <= 0) return Invalid("eval_batch_size", "must be > 0");
  if (job.eval_limit() < 0) return Invalid("eval_limit", "must be >= 0 (0: every example)");
  if (job.eval_every_steps() < 0) {
    return Invalid("eval_every_steps", "must be >= 0 (0: only at the end of each epoch)");
  }
  if (job.max_steps() < 0) return Invalid("max_steps", "must be >= 0");
  if (job.micro_batches() <= 0) return Invalid("micro_batches", "must be > 0");
  if (job.micro_batches() > 1 && !Rule(ToUpdateRule(job.rule())).splits_micro_batches) {
    std::string splitting;
    for (const RuleSpec* r : AllRules()) {
      if (r->splits_micro_batches) {
        absl::StrAppend(&splitting, splitting.empty() ? "" : " or ", r->name);
      }
    }
    return Invalid("micro_batches",
                   absl::StrCat("only ", splitting, " splits a batch into micro-batches"));
  }
  if (job.micro_batches() > job.batch_size()) {
    return Invalid("micro_batches",
                   absl::StrCat(job.micro_batches(), " exceeds batch_size ", job.batch_size()));
  }
  if (job.replicas() < 1 || job.replicas() > kMaxReplicas) {
    return Invalid("replicas", absl::StrCat("must be in 1..", kMaxReplicas));
  }
  if (int64_t need = int64_t{job.replicas()} * job.micro_batches(); need > job.batch_size()) {
    return Invalid(
        "replicas",
        job.micro_batches() > 1
            ? absl::StrCat(job.replicas(), " replicas x ", job.micro_batches(),
                           " micro-batches need a batch of at least ", need,
                           " rows (every replica's share splits into the micro-batches); "
                           "batch_size is ",
                           job.batch_size())
            : absl::StrCat(job.replicas(), " exceeds batch_size ", job.batch_size(),
                           " (every replica needs at least one row of each batch)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::Data& d) {
  if (d.train_limit() < 0) return Invalid("data.train_limit", "must be >= 0");
  if (d.test_limit() < 0) return Invalid("data.test_limit", "must be >= 0");
  if (d.has_synthetic()) {
    const v1::Synthetic& s = d.synthetic();
    if (s.train_examples() <= 0) return Invalid("data.synthetic.train_examples", "must be > 0");
    if (s.test_examples() <= 0) return Invalid("data.synthetic.test_examples", "must be > 0");
    if (s.classes() < 2) return Invalid("data.synthetic.classes", "must be >= 2");
    for (int64_t v : s.shape()) {
      if (v <= 0) return Invalid("data.synthetic.shape", "every extent must be > 0");
    }
    if (!(s.noise() >= 0.0f) || !Finite(s.noise())) {
      return Invalid("data.synthetic.noise", "must be a finite number >= 0");
    }
  }
  if (!(d.holdout_fraction() >= 0.0f && d.holdout_fraction() < 1.0f)) {
    return Invalid("data.holdout_fraction", "must be in [0, 1)");
  }
  if (d.has_text() && d.holdout_fraction() > 0.0f) {
    return Invalid("data.holdout_fraction", "use data.text.holdout_fraction for a text corpus");
  }
  if (d.has_numpy()) {
    const v1::Numpy& n = d.numpy();
    if (n.npz().empty() && (n.x_train().empty() || n.y_train().empty())) {
      return Invalid("data.numpy", "set npz, or x_train and y_train");
    }
    if (!n.npz().empty() &&
        !(n.x_train().empty() && n.y_train().empty() && n.x_test().empty() && n.y_test().empty())) {
      return Invalid("data.numpy", "set npz or the .npy files, not both");
    }
    if (n.x_test().empty() != n.y_test().empty()) {
      return Invalid("data.numpy", "x_test and y_test come together");
    }
  }
  if (d.has_image_folder() && d.image_folder().train_dir().empty()) {
    return Invalid("data.image_folder.train_dir", "required: one subfolder of PNGs per class");
  }
  if (d.has_image_folder() && d.image_folder().test_dir().empty() && d.holdout_fraction() == 0) {
    return Invalid("data.image_folder.test_dir",
                   "required unless data.holdout_fraction holds some training images out");
  }
  if (d.has_cifar10() && d.cifar10().dir().empty()) {
    return Invalid("data.cifar10.dir", "required: the directory holding data_batch_1.bin etc.");
  }
  if (d.has_text()) {
    const v1::TextCorpus& t = d.text();
    for (int i = 0; i < t.paths_size(); ++i) {
      if (t.paths(i).empty()) return Invalid(absl::StrCat("data.text.paths[", i, "]"), "is empty");
    }
    if (t.seq_len() <= 0 || t.seq_len() > 4096) {
      return Invalid("data.text.seq_len", "must be in 1..4096");
    }
    if (!(t.holdout_fraction() > 0.0f && t.holdout_fraction() < 1.0f)) {
      return Invalid("data.text.holdout_fraction", "must be in (0, 1)");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimization(const v1::Job& job) {
  const v1::Schedule& sc = job.schedule();
  if (!(sc.lr() > 0.0f) || !Finite(sc.lr())) return Invalid("schedule.lr", "must be > 0");
  if (!(sc.min_lr() >= 0.0f) || !Finite(sc.min_lr())) {
    return Invalid("schedule.min_lr", "must be >= 0");
  }
  if (sc.warmup_steps() < 0) return Invalid("schedule.warmup_steps", "must be >= 0");
  if (job.optimizer().has_sgd()) {
    const v1::Sgd& s = job.optimizer().sgd();
    if (!(s.momentum() >= 0.0f && s.momentum() < 1.0f)) {
      return Invalid("optimizer.sgd.momentum", "must be in [0, 1)");
    }
    if (!(s.weight_decay() >= 0.0f) || !Finite(s.weight_decay())) {
      return Invalid("optimizer.sgd.weight_decay", "must be >= 0");
    }
    return absl::OkStatus();
  }
  const v1::AdamW& a = job.optimizer().adamw();
  if (!(a.beta1() >= 0.0f && a.beta1() < 1.0f)) {
    return Invalid("optimizer.adamw.beta1", "must be in [0, 1)");
  }
  if (!(a.beta2() >= 0.0f && a.beta2() < 1.0f)) {
    return Invalid("optimizer.adamw.beta2", "must be in [0, 1)");
  }
  if (!(a.eps() > 0.0f) || !Finite(a.eps())) return Invalid("optimizer.adamw.eps", "must be > 0");
  if (!(a.weight_decay() >= 0.0f) || !Finite(a.weight_decay())) {
    return Invalid("optimizer.adamw.weight_decay", "must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateStages(const v1::Job& job) {
  if (job.stages().empty()) return Invalid("stages", "a job needs at least one stage");
  for (int k = 0; k < job.stages_size(); ++k) {
    const v1::Stage& st = job.stages(k);
    std::string at = absl::StrCat("stages[", k, "]");
    for (int i = 0; i < st.layers_size(); ++i) {
      absl::Status s = ValidateLayer(st.layers(i), absl::StrCat(at, ".layers[", i, "]"));
      if (!s.ok()) return s;
    }
    if (!v1::Head::Kind_IsValid(st.head().kind())) {
      return Invalid(at + ".head.kind",
                     "expected LINEAR, POOL_LINEAR, MLP, CONV_POOL_LINEAR or "
                     "LANGUAGE_MODEL");
    }
    if (st.head().hidden() < 0) return Invalid(at + ".head.hidden", "must be > 0");
    if (st.head().channels() < 0) return Invalid(at + ".head.channels", "must be > 0");
    for (int64_t v : st.input_shape()) {
      if (v <= 0) return Invalid(at + ".input_shape", "every extent must be > 0");
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Field by field (each error names its field), then the shapes through every stage.
absl::Status ValidateJob(const v1::Job& job) {
  for (absl::Status s : {ValidateRun(job), ValidateData(job.data()), ValidateOptimization(job),
                         ValidateStages(job)}) {
    if (!s.ok()) return s;
  }
  std::string error;
  if (!ValidateModel(ToModelConfig(job), &error)) return absl::InvalidArgumentError(error);
  return absl::OkStatus();
}

Shape JobInputShape(const v1::Job& job) {
  const v1::Data& d = job.data();
  if (d.has_synthetic()) {
    const auto& s = d.synthetic().shape();
    return Shape(s.begin(), s.end());
  }
  if (d.has_cifar10()) return {32, 32, 3};
  if (d.has_text()) return {d.text().seq_len()};
  if (d.has_fashion_mnist() && !d.fashion_mnist().shape().empty()) {
    const auto& s = d.fashion_mnist().shape();
    return Shape(s.begin(), s.end());
  }
  if (d.has_numpy()) return Shape(d.numpy().shape().begin(), d.numpy().shape().end());
  if (d.has_image_folder()) {
    return Shape(d.image_folder().shape().begin(), d.image_folder().shape().end());
  }
  return {28, 28, 1};  // Fashion-MNIST's, until the files have been read
}

int32_t JobClasses(const v1::Job& job) {
  if (job.data().has_synthetic()) return job.data().synthetic().classes();
  if (job.data().has_text()) return 256;  // bytes
  if (job.data().has_fashion_mnist() && job.data().fashion_mnist().classes() > 0) {
    return job.data().fashion_mnist().classes();
  }
  if (job.data().has_numpy()) return job.data().numpy().classes();
  if (job.data().has_image_folder()) return job.data().image_folder().classes();
  return 10;
}

namespace {

// Fills a user data source's shape and classes from `split`, or checks the ones set.
template <typename Source>
absl::Status ResolveFrom(const DataSplit& split, const std::string& field, const std::string& what,
                         Source* src) {
  const Shape& got = split.train.example_shape;
  if (!src->shape().empty() &&
      !std::equal(src->shape().begin(), src->shape().end(), got.begin(), got.end())) {
    return MarkDataError(absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: [", absl::StrJoin(src->shape(), ","), "], but ", what,
                     " hold examples of shape ", ShapeString(got))));
  }
  if (src->classes() > 0 && src->classes() != split.train.classes) {
    return MarkDataError(
        absl::InvalidArgumentError(absl::StrCat(field, ".classes: ", src->classes(), ", but ", what,
                                                " have labels 0..", split.train.classes - 1)));
  }
  src->clear_shape();
  for (int64_t d : got) src->add_shape(d);
  src->set_classes(split.train.classes);
  return absl::OkStatus();
}

}  // namespace

NumpySource ToNumpySource(const v1::Numpy& n) {
  NumpySource s;
  s.npz = n.npz();
  s.x_train = n.x_train();
  s.y_train = n.y_train();
  s.x_test = n.x_test();
  s.y_test = n.y_test();
  return s;
}

absl::Status ResolveDataShape(v1::Job* job) {
  v1::Data* d = job->mutable_data();
  if (d->has_numpy()) {
    absl::StatusOr<DataSplit> s = LoadNumpy(ToNumpySource(d->numpy()), 0, 0);
    if (!s.ok()) return MarkDataError(s.status());
    const std::string what = d->numpy().npz().empty() ? d->numpy().x_train() : d->numpy().npz();
    return ResolveFrom(*s, "data.numpy", what, d->mutable_numpy());
  }
  if (d->has_image_folder()) {
    absl::StatusOr<DataSplit> s =
        LoadImageFolders(d->image_folder().train_dir(), d->image_folder().test_dir(), 0, 0);
    if (!s.ok()) return MarkDataError(s.status());
    return ResolveFrom(*s, "data.image_folder", d->image_folder().train_dir(),
                       d->mutable_image_folder());
  }
  if (!job->data().has_fashion_mnist()) return absl::OkStatus();
  v1::FashionMnist* f = job->mutable_data()->mutable_fashion_mnist();
  absl::StatusOr<IdxDataShape> read = ReadFashionMnistShape(f->dir());
  if (!read.ok()) return MarkDataError(read.status());
  const std::string files = absl::StrCat("the IDX files in ", f->dir());
  if (!f->shape().empty() && !std::equal(f->shape().begin(), f->shape().end(),
                                         read->example_shape.begin(), read->example_shape.end())) {
    return MarkDataError(absl::InvalidArgumentError(absl::StrCat(
        "data.fashion_mnist.shape: [", absl::StrJoin(f->shape(), ","), "], but ", files,
        " hold examples of shape [", absl::StrJoin(read->example_shape, ","), "]")));
  }
  if (f->classes() > 0 && f->classes() != read->classes) {
    return MarkDataError(absl::InvalidArgumentError(
        absl::StrCat("data.fashion_mnist.classes: ", f->classes(), ", but ", files,
                     " have labels 0..", read->classes - 1)));
  }
  f->clear_shape();
  for (int64_t d : read->example_shape) f->add_shape(d);
  f->set_classes(read->classes);
  return absl::OkStatus();
}

namespace {
constexpr char kDataErrorPayload[] = "type.localpar/data-error";
}  // namespace

absl::Status MarkDataError(absl::Status s) {
  if (!s.ok()) s.SetPayload(kDataErrorPayload, absl::Cord("1"));
  return s;
}

bool IsDataError(const absl::Status& s) { return s.GetPayload(kDataErrorPayload).has_value(); }

int64_t JobLabelsPerExample(const v1::Job& job) {
  return job.data().has_text() ? job.data().text().seq_len() : 1;
}

// job.proto's UpdateRule numbers are the core's (common/nn/program.h); a test checks the
// names agree.
UpdateRule ToUpdateRule(v1::UpdateRule rule) { return static_cast<UpdateRule>(rule); }

absl::StatusOr<v1::Job> RegroupStages(const v1::Job& job, int stages) {
  const int have = job.stages_size();
  if (stages < 1 || stages > have) {
    return absl::InvalidArgumentError(absl::StrCat("stages=", stages, ": the job has ", have,
                                                   " stages, so it regroups into 1..", have));
  }
  v1::Job out = job;
  out.clear_stages();
  for (int g = 0; g < stages; ++g) {
    int64_t begin, count;
    MicroBatchRange(have, stages, g, &begin, &count);
    v1::Stage* merged = out.add_stages();
    *merged->mutable_input_shape() = job.stages(static_cast<int>(begin)).input_shape();
    std::vector<std::string> names;
    for (int64_t k = begin; k < begin + count; ++k) {
      const v1::Stage& st = job.stages(static_cast<int>(k));
      names.push_back(st.name().empty() ? absl::StrCat("stage", k) : st.name());
      for (const v1::Layer& l : st.layers()) *merged->add_layers() = l;
      if (st.has_head()) {
        *merged->mutable_head() = st.head();
      } else {
        merged->clear_head();
      }
    }
    merged->set_name(absl::StrJoin(names, "+"));
  }
  return out;
}

std::string JobFingerprint(const v1::Job& job, const std::string& settings) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    job.SerializeToCodedStream(&out);
  }
  bytes += settings;
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return absl::StrFormat("%016x", h);
}

ModelConfig ToModelConfig(const v1::Job& job) {
  ModelConfig m;
  m.input_shape = JobInputShape(job);
  m.classes = JobClasses(job);
  m.seed = job.seed();
  if (job.optimizer().has_sgd()) {
    const v1::Sgd& s = job.optimizer().sgd();
    m.optimizer.kind = OptimizerConfig::Kind::kSgd;
    m.optimizer.momentum = s.momentum();
    m.optimizer.nesterov = s.nesterov();
    m.optimizer.weight_decay = s.weight_decay();
  } else {
    const v1::AdamW& a = job.optimizer().adamw();
    m.optimizer.kind = OptimizerConfig::Kind::kAdamW;
    m.optimizer.beta1 = a.beta1();
    m.optimizer.beta2 = a.beta2();
    m.optimizer.eps = a.eps();
    m.optimizer.weight_decay = a.weight_decay();
  }
  Shape cur = m.input_shape;
  for (const v1::Stage& st : job.stages()) {
    StageConfig s;
    s.name = st.name();
    s.declared_input.assign(st.input_shape().begin(), st.input_shape().end());
    for (const v1::Layer& l : st.layers()) AppendLayerConfigs(l, &cur, &s.layers);
    s.head.kind = static_cast<HeadConfig::Kind>(st.head().kind());
    if (st.head().hidden() > 0) s.head.hidden = st.head().hidden();
    if (st.head().channels() > 0) s.head.channels = st.head().channels();
    m.stages.push_back(std::move(s));
  }
  return m;
}

void ApplyJobToBackend(const v1::Job& job, Backend& backend) {
  backend.set_gemm_precision(static_cast<GemmPrecision>(job.gemm_precision()));
}

absl::Status CheckReplicasFitData(const v1::Job& job, int64_t train_examples) {
  const int64_t last = train_examples % job.batch_size();
  const int64_t need = int64_t{std::max(1, job.replicas())} * std::max(1, job.micro_batches());
  if (last == 0 || last >= need) return absl::OkStatus();
  return Invalid(
      "replicas",
      absl::StrCat(
          "each epoch's last batch has ", last, " rows (", train_examples,
          " training examples, batch_size ", job.batch_size(), "), fewer than ", job.replicas(),
          " replicas",
          job.micro_batches() > 1 ? absl::StrCat(" x ", job.micro_batches(), " micro-batches") : "",
          " need; change batch_size or data.train_limit"));
}

TrainerOptions ToTrainerOptions(const v1::Job& job, int64_t total_steps) {
  TrainerOptions o;
  o.rule = ToUpdateRule(job.rule());
  o.micro_batches = job.micro_batches();
  o.replicas = std::max(1, job.replicas());
  o.total_steps = total_steps;
  o.seed = job.seed();
  o.wire = static_cast<WireFormat>(job.wire());
  o.schedule.kind = job.schedule().kind() == v1::Schedule::COSINE ? ScheduleConfig::Kind::kCosine
                                                                  : ScheduleConfig::Kind::kConstant;
  o.schedule.lr = job.schedule().lr();
  o.schedule.warmup_steps = job.schedule().warmup_steps();
  o.schedule.min_lr = job.schedule().min_lr();
  return o;
}

}  // namespace localpar
