// A job in the core's terms: the model, the step settings, stage regrouping, fingerprints.
#include "common/job/spec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job/data_spec.h"
#include "common/job/layer_spec.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace localpar {

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
    const float scale = job.stages(static_cast<int>(begin)).lr_scale();
    for (int64_t k = begin; k < begin + count; ++k) {
      const v1::Stage& st = job.stages(static_cast<int>(k));
      if (st.lr_scale() != scale) {
        return absl::InvalidArgumentError(
            absl::StrCat("stages=", stages, ": stages[", k, "].lr_scale (", st.lr_scale(),
                         ") differs from stages[", begin, "].lr_scale (", scale,
                         "), and they would merge into one stage with one learning rate"));
      }
      names.push_back(st.name().empty() ? absl::StrCat("stage", k) : st.name());
      for (const v1::Layer& l : st.layers()) *merged->add_layers() = l;
      if (st.has_head()) {
        *merged->mutable_head() = st.head();
      } else {
        merged->clear_head();
      }
    }
    merged->set_name(absl::StrJoin(names, "+"));
    merged->set_lr_scale(scale);
  }
  return out;
}

std::string JobFingerprint(const v1::Job& job, const std::string& settings) {
  // A run's length is not its identity: a finished run extended with a larger max_steps
  // (or more epochs) is the same run, and resumes from its own snapshots.
  v1::Job identity = job;
  identity.clear_epochs();
  identity.clear_max_steps();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    identity.SerializeToCodedStream(&out);
  }
  bytes += settings;
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return absl::StrFormat("%016x", h);
}

v1::Job NetworkOf(const v1::Job& job) {
  v1::Job out = job;
  out.clear_name();
  out.clear_replicas();
  // Every rule keeps the same state (parameters and optimizer moments) and a checkpoint is
  // taken where no gradient is in flight, so the rule may change on resume too.
  out.clear_rule();
  out.clear_micro_batches();
  out.clear_pipeline_schedule();
  // A finished run may be extended: the length changes the plan ahead, not the state.
  out.clear_epochs();
  out.clear_max_steps();
  out.clear_stages();
  v1::Stage* all = out.add_stages();
  for (const v1::Stage& st : job.stages()) {
    for (const v1::Layer& l : st.layers()) *all->add_layers() = l;
  }
  return out;
}

std::string NetworkFingerprint(const v1::Job& job, const std::string& settings) {
  return JobFingerprint(NetworkOf(job), settings);
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
    m.optimizer.decay_matrices_only = a.decay_matrices_only();
  }
  m.optimizer.clip_norm = job.optimizer().clip_norm();
  Shape cur = m.input_shape;
  for (const v1::Stage& st : job.stages()) {
    StageConfig s;
    s.name = st.name();
    s.declared_input.assign(st.input_shape().begin(), st.input_shape().end());
    for (const v1::Layer& l : st.layers()) ExpandLayer(LayerFromSpec(l), &cur, &s.layers);
    s.head.kind = static_cast<HeadConfig::Kind>(st.head().kind());
    if (st.head().hidden() > 0) s.head.hidden = st.head().hidden();
    if (st.head().channels() > 0) s.head.channels = st.head().channels();
    s.head.tie_embedding = st.head().tie_embedding();
    Shape head_in = cur;
    for (const v1::Layer& l : st.head().layers()) {
      ExpandLayer(LayerFromSpec(l), &head_in, &s.head.layers);
    }
    if (st.lr_scale() > 0) s.lr_scale = st.lr_scale();
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
  return absl::InvalidArgumentError(absl::StrCat(
      "replicas: ",
      absl::StrCat(
          "each epoch's last batch has ", last, " rows (", train_examples,
          " training examples, batch_size ", job.batch_size(), "), fewer than ", job.replicas(),
          " replicas",
          job.micro_batches() > 1 ? absl::StrCat(" x ", job.micro_batches(), " micro-batches") : "",
          " need; change batch_size or data.train_limit")));
}

StepSettings ToStepSettings(const v1::Job& job, int64_t total_steps) {
  StepSettings o;
  o.rule = ToUpdateRule(job.rule());
  o.micro_batches = job.micro_batches();
  o.pipeline = static_cast<PipelineSchedule>(job.pipeline_schedule());
  o.replicas = std::max(1, job.replicas());
  if (job.replica_sync().every() > 1) {
    o.sync_every = job.replica_sync().every();
    o.outer_lr = job.replica_sync().outer_lr();
    o.outer_momentum = job.replica_sync().outer_momentum();
    o.sync_bf16 = job.replica_sync().bf16();
  }
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
