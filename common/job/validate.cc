// Validation: field by field, each error naming its field path, then the shapes through
// every stage and head.
#include "common/job/validate.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job/data_source.h"
#include "common/job/layer_spec.h"
#include "common/job/limits.h"
#include "common/job/spec.h"
#include "common/nn/layer_kind.h"
#include "common/nn/rule.h"

namespace localpar {
namespace {

// Blocks (residuals) nested `depth` deep around their innermost layer.
std::string NestingError(int depth) {
  return absl::StrCat("blocks nest ", depth,
                      " deep (a residual in a residual's body is 2); at most ", kMaxLayerNesting);
}

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

bool Finite(float v) { return std::isfinite(v); }

// A name printed to terminals (progress, tables, status): no control characters, so a job
// file cannot retitle, clear or colour the terminal of whoever runs or watches it.
absl::Status CheckName(const std::string& field, const std::string& name) {
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      return Invalid(field, absl::StrFormat("holds a control character (byte 0x%02x at %d); "
                                            "names are printed to terminals",
                                            c, i));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateReplicaSync(const v1::Job& job) {
  const v1::ReplicaSync& sync = job.replica_sync();
  if (sync.every() < 0) return Invalid("replica_sync.every", "must be >= 0 (0 or 1: every step)");
  if (sync.every() <= 1) {
    if (sync.has_outer_lr() || sync.has_outer_momentum() || sync.bf16()) {
      return Invalid(sync.has_outer_lr()         ? "replica_sync.outer_lr"
                     : sync.has_outer_momentum() ? "replica_sync.outer_momentum"
                                                 : "replica_sync.bf16",
                     "applies only with replica_sync.every > 1 (--sync_every)");
    }
    return absl::OkStatus();
  }
  if (job.replicas() < 2) {
    return Invalid("replica_sync.every",
                   absl::StrCat("synchronises replicas, and the job has ", job.replicas(),
                                " (set replicas, or --replicas, to 2 or more)"));
  }
  if (!(sync.outer_lr() > 0.0f) || !Finite(sync.outer_lr())) {
    return Invalid("replica_sync.outer_lr", "must be a finite number > 0");
  }
  if (!(sync.outer_momentum() >= 0.0f && sync.outer_momentum() < 1.0f)) {
    return Invalid("replica_sync.outer_momentum", "must be in [0, 1)");
  }
  return absl::OkStatus();
}

absl::Status ValidateRun(const v1::Job& job) {
  if (absl::Status s = CheckName("name", job.name()); !s.ok()) return s;
  for (int k = 0; k < job.stages_size(); ++k) {
    if (absl::Status s = CheckName(absl::StrCat("stages[", k, "].name"), job.stages(k).name());
        !s.ok()) {
      return s;
    }
  }
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
  if (job.max_steps() < 0) return Invalid("max_steps", "must be >= 0");
  if (job.epochs() < 0 || (job.epochs() == 0 && job.max_steps() <= 0)) {
    return Invalid("epochs", "must be > 0 (or unset, with max_steps setting the run's length)");
  }
  if (job.eval_batch_size() <= 0) return Invalid("eval_batch_size", "must be > 0");
  if (job.eval_limit() < 0) return Invalid("eval_limit", "must be >= 0 (0: every example)");
  if (job.eval_every_steps() < 0) {
    return Invalid("eval_every_steps", "must be >= 0 (0: only at the end of each epoch)");
  }
  if (job.micro_batches() <= 0) return Invalid("micro_batches", "must be > 0");
  const RuleSpec& rule = Rule(ToUpdateRule(job.rule()));
  std::string splitting;
  for (const RuleSpec* r : AllRules()) {
    if (r->splits_micro_batches)
      absl::StrAppend(&splitting, splitting.empty() ? "" : " or ", r->name);
  }
  if (job.micro_batches() > 1 && !rule.splits_micro_batches) {
    return Invalid("micro_batches",
                   absl::StrCat("only ", splitting, " splits a batch into micro-batches"));
  }
  if (!v1::PipelineSchedule_IsValid(job.pipeline_schedule())) {
    return Invalid("pipeline_schedule", "expected PIPELINE_GPIPE, PIPELINE_1F1B or PIPELINE_ZB");
  }
  if (job.pipeline_schedule() != v1::PIPELINE_GPIPE && !rule.splits_micro_batches) {
    return Invalid("pipeline_schedule",
                   absl::StrCat("orders micro-batches, and ", rule.name, " has none (only ",
                                splitting, " splits a batch into micro-batches)"));
  }
  if (job.micro_batches() > job.batch_size()) {
    return Invalid("micro_batches",
                   absl::StrCat(job.micro_batches(), " exceeds batch_size ", job.batch_size()));
  }
  if (job.replicas() < 1 || job.replicas() > kMaxReplicas) {
    return Invalid("replicas", absl::StrCat("must be in 1..", kMaxReplicas));
  }
  if (absl::Status s = ValidateReplicaSync(job); !s.ok()) return s;
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
  if (!(d.holdout_fraction() >= 0.0f && d.holdout_fraction() < 1.0f)) {
    return Invalid("data.holdout_fraction", "must be in [0, 1)");
  }
  const DataSource& source = DataSourceOf(d);
  if (source.OwnValidation() && d.holdout_fraction() > 0.0f) {
    return Invalid("data.holdout_fraction",
                   absl::StrCat("use data.", source.name(),
                                ".holdout_fraction (it holds out its own validation split)"));
  }
  return source.Validate(d);
}

absl::Status ValidateOptimization(const v1::Job& job) {
  const v1::Schedule& sc = job.schedule();
  if (!(sc.lr() > 0.0f) || !Finite(sc.lr())) return Invalid("schedule.lr", "must be > 0");
  if (!(sc.min_lr() >= 0.0f) || !Finite(sc.min_lr())) {
    return Invalid("schedule.min_lr", "must be >= 0");
  }
  if (sc.warmup_steps() < 0) return Invalid("schedule.warmup_steps", "must be >= 0");
  if (!(job.optimizer().clip_norm() >= 0.0f) || !Finite(job.optimizer().clip_norm())) {
    return Invalid("optimizer.clip_norm", "must be a finite number >= 0 (0: no clipping)");
  }
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
  if (job.stages_size() > kMaxStages) {
    return Invalid("stages", absl::StrCat(job.stages_size(), " stages; at most ", kMaxStages,
                                          " (each stage is a worker)"));
  }
  for (int k = 0; k < job.stages_size(); ++k) {
    const v1::Stage& st = job.stages(k);
    std::string at = absl::StrCat("stages[", k, "]");
    for (int i = 0; i < st.layers_size(); ++i) {
      if (int depth = LayerSpecNesting(st.layers(i)) - 1; depth > kMaxLayerNesting) {
        return Invalid(absl::StrCat(at, ".layers[", i, "]"), NestingError(depth));
      }
      absl::Status s = ValidateLayerSpec(st.layers(i), absl::StrCat(at, ".layers[", i, "]"));
      if (!s.ok()) return s;
    }
    if (!v1::Head::Kind_IsValid(st.head().kind())) {
      return Invalid(at + ".head.kind",
                     "expected LINEAR, POOL_LINEAR, MLP, CONV_POOL_LINEAR or "
                     "LANGUAGE_MODEL");
    }
    for (int i = 0; i < st.head().layers_size(); ++i) {
      const std::string where = absl::StrCat(at, ".head.layers[", i, "]");
      if (int depth = LayerSpecNesting(st.head().layers(i)) - 1; depth > kMaxLayerNesting) {
        return Invalid(where, NestingError(depth));
      }
      absl::Status s = ValidateLayerSpec(st.head().layers(i), where);
      if (!s.ok()) return s;
    }
    if (!(st.lr_scale() >= 0) || !std::isfinite(st.lr_scale())) {
      return Invalid(at + ".lr_scale", "must be a finite number >= 0 (0: 1)");
    }
    if (st.head().hidden() < 0) return Invalid(at + ".head.hidden", "must be > 0");
    if (st.head().channels() < 0) return Invalid(at + ".head.channels", "must be > 0");
    for (int64_t v : st.input_shape()) {
      if (v <= 0) return Invalid(at + ".input_shape", "every extent must be > 0");
    }
  }
  return absl::OkStatus();
}

// Token ids (data.text, data.tokens) go to an embedding whose table holds a row for each,
// and an embedding reads nothing else.
absl::Status CheckInputKind(const v1::Job& job, const ModelConfig& model) {
  const DataSource& source = DataSourceOf(job.data());
  const std::vector<LayerConfig>& layers = model.stages[0].layers;
  const LayerKind* first = layers.empty() ? nullptr : FindLayerKind(layers[0].kind);
  const int64_t vocab = first ? first->TokenVocab(layers[0]) : 0;
  if (source.TokenIds() && vocab > 0) {
    const int32_t ids = source.Classes(job.data());
    if (vocab >= ids) return absl::OkStatus();
    return Invalid(absl::StrCat("stages[0].layers[0].", first->name(), ".vocab"),
                   absl::StrCat(vocab, " rows, but data.", source.name(), " has ", ids,
                                " token ids: each needs a row of the table"));
  }
  if (source.TokenIds()) {
    return Invalid("stages[0].layers[0]",
                   absl::StrCat("data.", source.name(),
                                " gives token ids, which only an embedding reads: the model "
                                "must begin with one"));
  }
  if (vocab == 0) return absl::OkStatus();
  std::vector<std::string> token_sources;
  for (const DataSource* s : AllDataSources()) {
    if (s->TokenIds()) token_sources.push_back(absl::StrCat("data.", s->name()));
  }
  return Invalid("stages[0].layers[0]",
                 absl::StrCat("an embedding reads token ids, which data.", source.name(),
                              " does not give (", absl::StrJoin(token_sources, " and "), " do)"));
}

}  // namespace

absl::Status ValidateJobFields(const v1::Job& job) {
  for (absl::Status s : {ValidateRun(job), ValidateData(job.data()), ValidateOptimization(job),
                         ValidateStages(job)}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Field by field (each error names its field), then the shapes through every stage.
absl::Status ValidateJob(const v1::Job& job) {
  if (absl::Status s = ValidateJobFields(job); !s.ok()) return s;
  std::string error;
  const ModelConfig model = ToModelConfig(job);
  if (absl::Status s = CheckInputKind(job, model); !s.ok()) return s;
  if (!ValidateModel(model, &error)) return absl::InvalidArgumentError(error);
  return absl::OkStatus();
}

}  // namespace localpar
