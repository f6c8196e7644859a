// Resuming a checkpoint with another stage split or replica count.
#include "common/model_io/regroup.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/cpu_backend.h"
#include "common/job/spec.h"
#include "common/model_io/model_file.h"
#include "common/nn/program.h"
#include "common/nn/replica_sync.h"
#include "google/protobuf/text_format.h"

namespace localpar {
namespace {

// The head names of a job's stages, in stage order: each by the layer it follows.
std::vector<std::string> HeadNames(const v1::Job& job) {
  const ModelConfig config = ToModelConfig(job);
  std::vector<std::string> out;
  size_t global = 0;
  for (const StageConfig& s : config.stages) {
    global += s.layers.size();
    out.push_back(global == 0 ? std::string("heads.input") : absl::StrCat("heads.", global - 1));
  }
  return out;
}

std::string Clip(std::string s) {
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  return s;
}

// Copies one of a parameter's tensors across backends (through the host).
void CopyState(const Tensor& from, Tensor* to, Backend& to_backend, const Shape& shape) {
  if (!from.defined()) {
    if (to->defined()) *to = Tensor::Zeros(to_backend, shape);
    return;
  }
  if (!to->defined()) *to = Tensor::Zeros(to_backend, shape);
  std::string host(from.nbytes(), '\0');
  if (host.empty()) return;
  from.backend().CopyToHost(host.data(), from.raw(), host.size());
  to->backend().CopyFromHost(to->raw(), host.data(), host.size());
}

// Whether any trainable parameter's weights differ from its synchronised ones (bitwise).
bool AwayFromSynchronised(Stage& stage) {
  for (Param* p : stage.params()) {
    if (!p->trainable || !p->outer.defined()) continue;
    if (p->value.ToHost() != p->outer.ToHost()) return true;
  }
  return false;
}

// Restores stage k of checkpoint `m` into `stage`: replica 0's state; every other
// replica's snapshot is checked (they agree). Replicas that synchronise every few steps
// (`sync`) are each read in replica order and their contributions summed as they come (in
// replica order, as a reduction adds them: two copies of the stage's floats, whatever the
// replica count); replica 0's state is then read again, so that its optimizer state is the
// stage's, and if any replica's weights differ from the synchronised ones the sum takes one
// outer step, as after a run's last step. `progress` sums the head's figures over the
// replicas; `seconds` receives the longest training time.
absl::Status RestoreStage(const v1::CheckpointManifest& m, const std::string& where,
                          const SnapshotRoots& roots, int k, const v1::ReplicaSync& sync,
                          Stage& stage, EpochProgress* progress, double* seconds) {
  const int replicas = std::max(1, m.replicas());
  const bool rare = sync.every() > 1 && replicas > 1;
  auto restore = [&](int r, EpochProgress* p) -> absl::Status {
    const v1::StageSnapshot* snap = FindSnapshot(m, k, r);
    if (snap == nullptr) {
      return absl::DataLossError(absl::StrCat(where, "/MANIFEST: has no snapshot of stage ", k,
                                              r > 0 ? absl::StrCat(" replica ", r) : ""));
    }
    return RestoreStageSnapshot(rare || r == 0 ? &stage : nullptr, k, roots(k, r), *snap,
                                m.fingerprint(), p, r);
  };
  std::unique_ptr<OuterSync> outer;
  if (rare) {
    outer = std::make_unique<OuterSync>(stage, sync.outer_lr(), sync.outer_momentum(), sync.bf16());
  }
  std::vector<float> sum, part;
  bool differ = false;
  for (int r = 0; r < replicas; ++r) {
    EpochProgress p;
    if (absl::Status s = restore(r, &p); !s.ok()) return s;
    progress->head.Add(p.head);
    *seconds = std::max(*seconds, p.train_seconds);
    if (!rare) continue;
    OuterSync::Start(stage);
    part.resize(static_cast<size_t>(outer->size()));
    outer->Pack(part.data());
    if (r == 0) {
      sum = part;
    } else {
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    differ = differ || AwayFromSynchronised(stage);
  }
  if (!rare) return absl::OkStatus();
  EpochProgress again;
  if (absl::Status s = restore(0, &again); !s.ok()) return s;
  if (differ) outer->ApplySum(sum.data(), replicas);
  return absl::OkStatus();
}

}  // namespace

std::string LocalSnapshotDir(const std::string& root, int stage, int replica, int replicas) {
  return replicas > 1 ? absl::StrCat(root, "/stage-", stage, "-replica-", replica)
                      : absl::StrCat(root, "/stage-", stage);
}

absl::StatusOr<v1::Job> CheckpointJob(const v1::CheckpointManifest& m, const std::string& where) {
  v1::Job job;
  if (m.job_spec().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where,
                     " was written before checkpoints recorded their job, so it resumes only with "
                     "the stage split and replica count it was written with (",
                     LayoutName(m.stages_size(), std::max(1, m.replicas())), ")"));
  }
  if (!job.ParseFromString(m.job_spec())) {
    return absl::DataLossError(absl::StrCat(where, "/MANIFEST: its job is unreadable"));
  }
  return job;
}

std::vector<std::string> NetworkDifferences(const v1::Job& checkpoint, const v1::Job& job) {
  const v1::Job a = NetworkOf(checkpoint), b = NetworkOf(job);
  const google::protobuf::Descriptor* d = v1::Job::descriptor();
  const google::protobuf::Reflection* r = v1::Job::GetReflection();
  std::vector<std::string> out;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    v1::Job x = a, y = b;
    for (int j = 0; j < d->field_count(); ++j) {
      if (j == i) continue;
      r->ClearField(&x, d->field(j));
      r->ClearField(&y, d->field(j));
    }
    if (x.SerializeAsString() == y.SerializeAsString()) continue;
    if (f->name() == "stages") {
      const auto& la = a.stages(0).layers();
      const auto& lb = b.stages(0).layers();
      int at = 0;
      while (at < la.size() && at < lb.size() &&
             la[at].SerializeAsString() == lb[at].SerializeAsString()) {
        ++at;
      }
      std::string what = absl::StrCat("the layers (the checkpoint's network has ", la.size(),
                                      ", this job's ", lb.size());
      if (at < la.size() && at < lb.size()) {
        absl::StrAppend(&what, "; layer ", at, " differs: the checkpoint's {",
                        Clip(la[at].ShortDebugString()), "}, this job's {",
                        Clip(lb[at].ShortDebugString()), "}");
      }
      out.push_back(what + ")");
      continue;
    }
    std::string va, vb;
    if (!f->is_repeated() && f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      google::protobuf::TextFormat::PrintFieldValueToString(x, f, -1, &va);
      google::protobuf::TextFormat::PrintFieldValueToString(y, f, -1, &vb);
    } else {
      va = absl::StrCat("{", Clip(x.ShortDebugString()), "}");
      vb = absl::StrCat("{", Clip(y.ShortDebugString()), "}");
    }
    out.push_back(
        absl::StrCat("the ", f->name(), " (the checkpoint's ", va, ", this job's ", vb, ")"));
  }
  return out;
}

std::string LayoutName(int stages, int replicas) {
  return absl::StrCat(stages, stages == 1 ? " stage" : " stages", " x ", replicas,
                      replicas == 1 ? " replica" : " replicas");
}

absl::StatusOr<RegroupPlan> PlanRegroup(const v1::CheckpointManifest& m, const std::string& where,
                                        const v1::Job& job) {
  absl::StatusOr<v1::Job> old = CheckpointJob(m, where);
  if (!old.ok()) return old.status();
  if (std::vector<std::string> diff = NetworkDifferences(*old, job); !diff.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot resume from ", where, " (job ", m.job(), ", step ", m.step(),
        ") with this job: a resume may change the stage split (--stages) and the replica "
        "count (--replicas), and nothing else; these differ: ",
        absl::StrJoin(diff, "; ")));
  }
  RegroupPlan plan;
  plan.from_stages = old->stages_size();
  plan.from_replicas = std::max(1, old->replicas());
  plan.to_stages = job.stages_size();
  plan.to_replicas = std::max(1, job.replicas());
  plan.step = m.step();
  plan.sync_every = old->replica_sync().every() > 1 ? old->replica_sync().every() : 0;
  // The micro-batches and BACKPROP's schedule, where they change (the state does not).
  const bool micro = old->micro_batches() != job.micro_batches();
  const bool schedule = old->pipeline_schedule() != job.pipeline_schedule();
  auto rule = [&](const v1::Job& j) {
    std::string r = v1::UpdateRule_Name(j.rule());
    if (micro) absl::StrAppend(&r, " (", j.micro_batches(), " micro-batches)");
    if (schedule) {
      absl::StrAppend(&r, " (",
                      PipelineScheduleName(static_cast<PipelineSchedule>(j.pipeline_schedule())),
                      " schedule)");
    }
    return r;
  };
  plan.from_rule = rule(*old);
  plan.to_rule = rule(job);
  const std::vector<std::string> from = HeadNames(*old), to = HeadNames(job);
  std::map<std::string, int> from_stage;
  for (size_t k = 0; k < from.size(); ++k) from_stage[from[k]] = static_cast<int>(k);
  for (size_t k = 0; k < to.size(); ++k) {
    auto it = from_stage.find(to[k]);
    if (it == from_stage.end()) {
      plan.fresh_heads.push_back(to[k]);
    } else if (old->stages(it->second).head().SerializeAsString() !=
               job.stages(static_cast<int>(k)).head().SerializeAsString()) {
      plan.fresh_heads.push_back(to[k]);
      plan.head_notes.push_back(absl::StrCat(to[k], " is another head now ({",
                                             old->stages(it->second).head().ShortDebugString(),
                                             "} before)"));
    } else {
      plan.kept_heads.push_back(to[k]);
    }
  }
  const std::set<std::string> have(to.begin(), to.end());
  for (const std::string& h : from) {
    if (!have.count(h)) plan.unused_heads.push_back(h);
  }
  return plan;
}

std::string DescribeRegroup(const RegroupPlan& p) {
  std::string s = absl::StrCat(
      "regrouping the checkpoint at step ", p.step, " from ",
      LayoutName(p.from_stages, p.from_replicas), " to ", LayoutName(p.to_stages, p.to_replicas),
      p.from_rule != p.to_rule
          ? absl::StrCat(", and the rule from ", p.from_rule, " to ", p.to_rule)
          : "",
      p.sync_every > 0
          ? absl::StrCat(": the replicas (synchronising every ", p.sync_every,
                         " steps) are synchronised first, one outer step on their "
                         "pseudo-gradients since the last synchronisation if they differ; then "
                         "every layer's synchronised weights, outer momentum and replica 0's "
                         "optimizer state carry over")
          : std::string(": every layer's parameters and optimizer state carry over"));
  if (!p.kept_heads.empty())
    absl::StrAppend(&s, "; heads kept: ", absl::StrJoin(p.kept_heads, ", "));
  if (!p.fresh_heads.empty()) {
    absl::StrAppend(&s, "; starting fresh (seeded): ", absl::StrJoin(p.fresh_heads, ", "));
  }
  for (const std::string& n : p.head_notes) absl::StrAppend(&s, " (", n, ")");
  if (!p.unused_heads.empty()) {
    absl::StrAppend(&s, "; left out: ", absl::StrJoin(p.unused_heads, ", "));
  }
  absl::StrAppend(&s, "; the data goes on from step ", p.step);
  return s;
}

bool ChangesLayout(const RegroupPlan& p) {
  return p.from_stages != p.to_stages || p.from_replicas != p.to_replicas ||
         p.from_rule != p.to_rule || !p.fresh_heads.empty() || !p.unused_heads.empty();
}

v1::Regroup RegroupRecord(const RegroupPlan& p) {
  v1::Regroup r;
  r.set_step(p.step);
  r.set_from(absl::StrCat(LayoutName(p.from_stages, p.from_replicas), ", ", p.from_rule));
  r.set_to(absl::StrCat(LayoutName(p.to_stages, p.to_replicas), ", ", p.to_rule));
  for (const std::string& h : p.fresh_heads) r.add_fresh_heads(h);
  for (const std::string& h : p.unused_heads) r.add_unused_heads(h);
  return r;
}

absl::Status LoadCheckpointInto(const v1::CheckpointManifest& m, const std::string& where,
                                const SnapshotRoots& roots, const v1::Job& job, Model& model,
                                std::vector<EpochProgress>* progress, bool synchronise) {
  absl::StatusOr<RegroupPlan> plan = PlanRegroup(m, where, job);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<v1::Job> old_job = CheckpointJob(m, where);
  if (!old_job.ok()) return old_job.status();
  const ModelConfig old_config = ToModelConfig(*old_job), config = ToModelConfig(job);
  if (m.stages_size() != static_cast<int>(old_config.stages.size())) {
    return absl::DataLossError(absl::StrCat(where, "/MANIFEST: lists ", m.stages_size(),
                                            " stages, its job has ", old_config.stages.size()));
  }
  const std::vector<ParamInfo> to = DescribeParams(config, model, model.num_stages() - 1);
  std::map<std::string, const ParamInfo*> wanted;
  for (const ParamInfo& p : to) wanted[p.readable] = &p;
  const std::set<std::string> fresh(plan->fresh_heads.begin(), plan->fresh_heads.end());
  // The checkpoint's stages are read one at a time: each is built, restored, copied into
  // `model` tensor by tensor and let go before the next, so this holds `model` and one of
  // the checkpoint's stages, not two models.
  std::vector<EpochProgress> old_progress(old_config.stages.size());
  std::set<std::string> copied;
  double seconds = 0;
  int64_t optimizer_steps = -1;
  int global = 0;
  Shape nchw;
  absl::Status failed;
  CpuBackend cpu{CpuOptions{}};
  ApplyJobToBackend(*old_job, cpu);
  const v1::ReplicaSync sync = synchronise ? old_job->replica_sync() : v1::ReplicaSync();
  auto read_stage = [&](int k, Stage& stage) -> absl::Status {
    for (Param* p : stage.params()) p->grad = Tensor();
    if (absl::Status s = RestoreStage(m, where, roots, k, sync, stage, &old_progress[k], &seconds);
        !s.ok()) {
      return s;
    }
    const int64_t steps = stage.optimizer().steps();
    if (optimizer_steps >= 0 && steps != optimizer_steps) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": its stages took different numbers of optimizer steps (stage ", k, ": ", steps,
          ", the stages before: ", optimizer_steps, "), so they cannot be regrouped"));
    }
    optimizer_steps = steps;
    for (const ParamInfo& from : DescribeStageParams(stage, k, &global, &nchw)) {
      auto it = wanted.find(from.readable);
      if (it == wanted.end()) {
        if (from.head) continue;  // a boundary this layout does not have
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", from.readable, " has no place in this job's network"));
      }
      if (from.head && fresh.count(HeadName(from.readable))) continue;
      Param& dst = *it->second->value;
      const Shape shape = dst.value.shape();
      if (from.value->value.shape() != shape) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", from.readable, " is ",
                                                       ShapeString(from.value->value.shape()),
                                                       ", this job's is ", ShapeString(shape)));
      }
      Backend& be = dst.value.backend();
      CopyState(from.value->value, &dst.value, be, shape);
      CopyState(from.value->state1, &dst.state1, be, shape);
      CopyState(from.value->state2, &dst.state2, be, shape);
      if (from.value->outer.defined()) {
        CopyState(from.value->outer, &dst.outer, be, shape);
        CopyState(from.value->outer_momentum, &dst.outer_momentum, be, shape);
      }
      copied.insert(from.readable);
    }
    return absl::OkStatus();
  };
  std::string error;
  std::unique_ptr<Model> old = Model::Create(cpu, old_config, &error, [&](int k, Stage& stage) {
    if (failed.ok()) failed = read_stage(k, stage);
    for (Param* p : stage.params()) p->value = p->grad = p->state1 = p->state2 = Tensor();
  });
  if (!old) return absl::InvalidArgumentError(absl::StrCat(where, ": its job: ", error));
  if (!failed.ok()) return failed;
  for (const ParamInfo& p : to) {
    if (p.head && fresh.count(HeadName(p.readable))) continue;
    if (!copied.count(p.readable)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": has no tensor ", p.readable, " for this job"));
    }
  }
  for (int k = 0; k < model.num_stages(); ++k) {
    model.stage(k).optimizer().set_steps(std::max<int64_t>(optimizer_steps, 0));
  }
  const std::vector<std::string> old_heads = HeadNames(*old_job), new_heads = HeadNames(job);
  progress->assign(model.num_stages(), EpochProgress());
  for (int k = 0; k < model.num_stages(); ++k) {
    (*progress)[k].train_seconds = seconds;
    if (fresh.count(new_heads[k])) continue;
    auto at = std::find(old_heads.begin(), old_heads.end(), new_heads[k]);
    if (at != old_heads.end()) (*progress)[k].head = old_progress[at - old_heads.begin()].head;
  }
  return absl::OkStatus();
}

absl::StatusOr<FoundCheckpoint> WriteRegroupedCheckpoint(
    const FoundCheckpoint& from, const SnapshotRoots& from_roots, const v1::Job& job,
    const std::string& fingerprint, const std::string& network, const SnapshotRoots& to_roots,
    const std::string& root, uint64_t id) {
  absl::StatusOr<RegroupPlan> plan = PlanRegroup(from.manifest, from.dir, job);
  if (!plan.ok()) return plan.status();
  CpuBackend cpu{CpuOptions{}};
  ApplyJobToBackend(job, cpu);
  std::string error;
  std::unique_ptr<Model> model = Model::Create(cpu, ToModelConfig(job), &error);
  if (!model) return absl::InvalidArgumentError(error);
  DropGradients(*model);
  std::vector<EpochProgress> progress;
  if (absl::Status s =
          LoadCheckpointInto(from.manifest, from.dir, from_roots, job, *model, &progress);
      !s.ok()) {
    return s;
  }
  const v1::CheckpointManifest& old = from.manifest;
  v1::CheckpointManifest m;
  m.set_id(id);
  m.set_job(job.name());
  m.set_step(old.step());
  m.set_epoch(old.epoch());
  m.set_batch_in_epoch(old.batch_in_epoch());
  m.set_seed(old.seed());
  m.set_created_unix_ms(old.created_unix_ms());
  m.set_rule(old.rule());
  m.set_fingerprint(fingerprint);
  m.set_network(network);
  m.set_job_spec(job.SerializeAsString());
  const int replicas = std::max(1, job.replicas());
  m.set_replicas(replicas);
  v1::RunReport history;
  if (!history.ParseFromString(old.report())) history.Clear();
  *history.add_regroups() = RegroupRecord(*plan);
  m.set_report(history.SerializeAsString());
  for (int r = 0; r < replicas; ++r) {
    for (int k = 0; k < model->num_stages(); ++k) {
      // The epoch's figures so far go with replica 0; the others' shares start at zero.
      EpochProgress p;
      p.train_seconds = progress[k].train_seconds;
      if (r == 0) p = progress[k];
      absl::StatusOr<v1::StageSnapshot> saved =
          SaveStageSnapshot(model->stage(k), k, old.step(), p, fingerprint, to_roots(k, r), id, r);
      if (!saved.ok()) return saved.status();
      *(r == 0 ? m.add_stages() : m.add_replica_stages()) = *saved;
    }
  }
  const std::string dir = absl::StrCat(root, "/", CheckpointDirName(id));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  if (absl::Status s = WriteManifest(dir, m); !s.ok()) return s;
  return FoundCheckpoint{dir, std::move(m), {}, 0};
}

absl::StatusOr<FoundCheckpoint> FindCheckpointToResume(const std::string& root,
                                                       const std::string& fingerprint,
                                                       const std::string& network,
                                                       const v1::Job& job, uint64_t only) {
  absl::StatusOr<FoundCheckpoint> found = FindLatestCheckpoint(root, fingerprint, network, only);
  if (found.ok() || !absl::IsNotFound(found.status())) return found;
  if (only != 0) {
    // That one, of another network: say what differs, as for the newest.
    absl::StatusOr<FoundCheckpoint> named = FindLatestCheckpoint(root, "", "", only);
    if (!named.ok()) return named.status();
    absl::StatusOr<RegroupPlan> plan = PlanRegroup(named->manifest, named->dir, job);
    return plan.ok() ? found.status() : plan.status();
  }
  // None fits: say why the newest one does not, when its job is known.
  std::vector<FoundCheckpoint> all = CommittedCheckpoints(root);
  if (all.empty()) return found.status();
  absl::StatusOr<RegroupPlan> plan = PlanRegroup(all.front().manifest, all.front().dir, job);
  if (!plan.ok() && absl::IsInvalidArgument(plan.status())) return plan.status();
  return found.status();
}

}  // namespace localpar
