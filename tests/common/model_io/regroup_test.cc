// Regrouping a checkpoint for another stage split, replica count or rule: every layer's
// parameters and optimizer state carry over exactly, kept heads too, new heads start from
// the job's seeded initialisation, and anything else that changed is refused by name.
#include "common/model_io/regroup.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/core/cpu_backend.h"
#include "common/job/parse.h"
#include "common/job/spec.h"
#include "common/model_io/model_file.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::DataDir;

constexpr char kJob[] = R"(name: "regroup"
rule: GREEDY
batch_size: 10
seed: 3
data { synthetic { train_examples: 40 test_examples: 10 shape: [6, 6, 1] classes: 5 seed: 2 } }
optimizer { adamw { weight_decay: 0.01 } }
stages { layers { conv2d { out_channels: 4 padding: 1 } } layers { batch_norm {} } layers { relu {} } head { kind: CONV_POOL_LINEAR channels: 3 } }
stages { layers { max_pool { kernel: 2 } } layers { linear { out_features: 16 } } layers { gelu {} } layers { dropout { rate: 0.2 } } }
stages { layers { linear { out_features: 16 } } layers { layer_norm {} } layers { relu {} } head { kind: MLP hidden: 8 } }
stages { layers { residual { body { linear { out_features: 16 } } body { relu {} } } } }
)";

v1::Job Job(const DataDir& dir, int stages = 4, int replicas = 1, const std::string& edit = "") {
  std::string text = kJob;
  if (!edit.empty()) text += edit + "\n";
  const std::string path = dir.file("job.textproto");
  std::ofstream(path) << text;
  absl::StatusOr<v1::Job> job = LoadJobFile(path);
  EXPECT_TRUE(job.ok()) << job.status();
  if (stages != job->stages_size()) job = RegroupStages(*job, stages);
  job->set_replicas(replicas);
  return *job;
}

std::unique_ptr<Model> Build(Backend& be, const v1::Job& job) {
  std::string error;
  std::unique_ptr<Model> m = Model::Create(be, ToModelConfig(job), &error);
  EXPECT_TRUE(m) << error;
  return m;
}

// Every parameter, both moments and the step count set to values no initialisation gives.
void Scramble(Model& model, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  for (int k = 0; k < model.num_stages(); ++k) {
    for (Param* p : model.stage(k).params()) {
      for (Tensor* t : {&p->value, &p->state1, &p->state2}) {
        std::vector<float> v(static_cast<size_t>(p->value.numel()));
        for (float& x : v) x = u(rng);
        *t = Tensor::FromHost(p->value.backend(), p->value.shape(), v);
      }
    }
    model.stage(k).optimizer().set_steps(7);
  }
}

struct State {
  std::vector<float> value, state1, state2;
};
std::map<std::string, State> ByName(const v1::Job& job, Model& model) {
  std::map<std::string, State> out;
  for (const ParamInfo& p : DescribeParams(ToModelConfig(job), model, model.num_stages() - 1)) {
    const Param& q = *p.value;
    out[p.readable] = {q.value.ToHost(),
                       q.state1.defined() ? q.state1.ToHost() : std::vector<float>(),
                       q.state2.defined() ? q.state2.ToHost() : std::vector<float>()};
  }
  return out;
}

// A checkpoint of `model` as `localpar run` writes one: each replica's snapshot under its own
// directory, the manifest in root/ckpt-000003. Stage k's replica r kept (k + 1) * 10 + r
// predictions of its epoch so far.
// With `models`, replica r's snapshot is of models[r] (replicas that synchronise rarely).
FoundCheckpoint SaveCheckpoint(const v1::Job& job, Model& model, const std::string& root,
                               const std::vector<Model*>& models = {}) {
  const int replicas = std::max(1, job.replicas());
  v1::CheckpointManifest m;
  m.set_id(3);
  m.set_job(job.name());
  m.set_step(5);
  m.set_batch_in_epoch(1);
  m.set_rule(v1::UpdateRule_Name(job.rule()));
  m.set_fingerprint("old-run");
  m.set_network(NetworkFingerprint(job, ""));
  m.set_job_spec(job.SerializeAsString());
  m.set_replicas(replicas);
  for (int r = 0; r < replicas; ++r) {
    for (int k = 0; k < model.num_stages(); ++k) {
      EpochProgress p;
      p.head.count = (k + 1) * 10 + r;
      p.head.correct = k + r;
      p.train_seconds = 1.5;
      Model& of = models.empty() ? model : *models[static_cast<size_t>(r)];
      absl::StatusOr<v1::StageSnapshot> s = SaveStageSnapshot(
          of.stage(k), k, 5, p, "old-run", LocalSnapshotDir(root, k, r, replicas), 3, r);
      EXPECT_TRUE(s.ok()) << s.status();
      *(r == 0 ? m.add_stages() : m.add_replica_stages()) = *s;
    }
  }
  const std::string dir = root + "/ckpt-000003";
  std::filesystem::create_directories(dir);
  EXPECT_TRUE(WriteManifest(dir, m).ok());
  return FoundCheckpoint{dir, m, {}, 0};
}

SnapshotRoots Roots(const std::string& root, int replicas) {
  return [=](int k, int r) { return LocalSnapshotDir(root, k, r, replicas); };
}

TEST(Regroup, EveryLayerAndItsOptimizerStateCarryOverIntoAnotherStageSplit) {
  DataDir dir;
  CpuBackend cpu{CpuOptions{}};
  const v1::Job four = Job(dir, 4, 2), two = Job(dir, 2, 1);
  std::unique_ptr<Model> old = Build(cpu, four);
  Scramble(*old, 1);
  FoundCheckpoint found = SaveCheckpoint(four, *old, dir.file("ckpt"));

  std::unique_ptr<Model> model = Build(cpu, two), seeded = Build(cpu, two);
  std::vector<EpochProgress> progress;
  absl::Status s = LoadCheckpointInto(found.manifest, found.dir, Roots(dir.file("ckpt"), 2), two,
                                      *model, &progress);
  ASSERT_TRUE(s.ok()) << s;
  const std::map<std::string, State> want = ByName(four, *old), got = ByName(two, *model),
                                     fresh = ByName(two, *seeded);
  int layers = 0, heads = 0;
  for (const auto& [name, state] : got) {
    ASSERT_TRUE(want.count(name)) << name;  // 4 -> 2 keeps heads.6 and heads.10 only
    EXPECT_EQ(state.value, want.at(name).value) << name;
    EXPECT_EQ(state.state1, want.at(name).state1) << name;
    EXPECT_EQ(state.state2, want.at(name).state2) << name;
    (name.rfind("heads.", 0) == 0 ? heads : layers)++;
    EXPECT_NE(state.value, fresh.at(name).value) << name;
  }
  EXPECT_GT(layers, 6);
  EXPECT_GT(heads, 2);
  for (int k = 0; k < 2; ++k) EXPECT_EQ(model->stage(k).optimizer().steps(), 7);
  // Each kept head's figures, summed over the checkpoint's two replicas: old stages 1 and 3.
  ASSERT_EQ(progress.size(), 2u);
  EXPECT_EQ(progress[0].head.count, 20 + 21);
  EXPECT_EQ(progress[1].head.count, 40 + 41);
  EXPECT_EQ(progress[1].train_seconds, 1.5);

  absl::StatusOr<RegroupPlan> plan = PlanRegroup(found.manifest, found.dir, two);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kept_heads, (std::vector<std::string>{"heads.6", "heads.10"}));
  EXPECT_EQ(plan->unused_heads, (std::vector<std::string>{"heads.2", "heads.9"}));
  EXPECT_TRUE(plan->fresh_heads.empty());
}

TEST(Regroup, NewBoundariesHeadsStartSeededAndARoundTripKeepsEveryLayer) {
  DataDir dir;
  CpuBackend cpu{CpuOptions{}};
  const v1::Job two = Job(dir, 2, 1), wide = Job(dir, 2, 3), four = Job(dir, 4, 1);
  std::unique_ptr<Model> old = Build(cpu, two);
  Scramble(*old, 2);
  const std::string root = dir.file("ckpt");
  FoundCheckpoint found = SaveCheckpoint(two, *old, root);

  // 2 x 1 -> 2 x 3: every replica gets the state; the epoch's figures go with replica 0.
  absl::StatusOr<FoundCheckpoint> wider = WriteRegroupedCheckpoint(
      found, Roots(root, 1), wide, "run-b", "net", Roots(root, 3), root, 4);
  ASSERT_TRUE(wider.ok()) << wider.status();
  EXPECT_EQ(wider->manifest.replicas(), 3);
  EXPECT_EQ(wider->manifest.stages_size(), 2);
  EXPECT_EQ(wider->manifest.replica_stages_size(), 4);
  EXPECT_EQ(wider->manifest.step(), 5);
  EXPECT_EQ(wider->manifest.batch_in_epoch(), 1);
  EXPECT_EQ(wider->manifest.fingerprint(), "run-b");
  EXPECT_TRUE(
      std::filesystem::exists(root + "/stage-1-replica-2/ckpt-000004/stage-1-replica-2.ckpt"));
  absl::StatusOr<v1::CheckpointManifest> reread = ReadManifest(wider->dir);
  ASSERT_TRUE(reread.ok()) << reread.status();
  v1::RunReport history;
  ASSERT_TRUE(history.ParseFromString(reread->report()));
  ASSERT_EQ(history.regroups_size(), 1);
  EXPECT_EQ(history.regroups(0).from(), "2 stages x 1 replica, GREEDY");
  EXPECT_EQ(history.regroups(0).to(), "2 stages x 3 replicas, GREEDY");

  // 2 x 3 -> 4 x 1: heads.2 and heads.9 are new boundaries' heads.
  std::unique_ptr<Model> model = Build(cpu, four), seeded = Build(cpu, four);
  std::vector<EpochProgress> progress;
  absl::Status s =
      LoadCheckpointInto(wider->manifest, wider->dir, Roots(root, 3), four, *model, &progress);
  ASSERT_TRUE(s.ok()) << s;
  const std::map<std::string, State> want = ByName(two, *old), got = ByName(four, *model),
                                     fresh = ByName(four, *seeded);
  for (const auto& [name, state] : got) {
    const bool is_new = name.rfind("heads.2.", 0) == 0 || name.rfind("heads.9.", 0) == 0;
    if (is_new) {
      EXPECT_EQ(state.value, fresh.at(name).value) << name;
      EXPECT_TRUE(state.state1.empty() ||
                  state.state1 == std::vector<float>(state.state1.size(), 0.0f))
          << name;
      continue;
    }
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_EQ(state.value, want.at(name).value) << name;
    EXPECT_EQ(state.state1, want.at(name).state1) << name;
    EXPECT_EQ(state.state2, want.at(name).state2) << name;
  }
  EXPECT_EQ(progress[0].head.count, 0);   // heads.2: fresh
  EXPECT_EQ(progress[1].head.count, 10);  // heads.6: replica 0 carried the old stage 0's
}

// Param::outer and Param::outer_momentum of every trainable parameter, by name.
std::map<std::string, std::pair<std::vector<float>, std::vector<float>>> Outer(const v1::Job& job,
                                                                               Model& model) {
  std::map<std::string, std::pair<std::vector<float>, std::vector<float>>> out;
  for (const ParamInfo& p : DescribeParams(ToModelConfig(job), model, model.num_stages() - 1)) {
    if (!p.value->trainable) continue;
    EXPECT_TRUE(p.value->outer.defined() && p.value->outer_momentum.defined()) << p.readable;
    if (!p.value->outer.defined() || !p.value->outer_momentum.defined()) continue;
    out[p.readable] = {p.value->outer.ToHost(), p.value->outer_momentum.ToHost()};
  }
  return out;
}

// Replicas that synchronise every 4 steps, checkpointed between synchronisations (each with
// its own weights, moments and running statistics; the same synchronised weights w and
// outer momentum m): regrouped as 2 stages x 3 replicas, their pseudo-gradients take one
// outer step first, checked against the formula in double: g = mean(w - theta_r),
// m' = mu m + g, w' = w - lr (g + mu m'). The new layout gets w' as weights and as the
// synchronised weights, m', the running statistics' mean and replica 0's moments. A
// checkpoint at a synchronisation (every replica at w) takes no step.
TEST(Regroup, ReplicasThatSynchroniseRarelyAreSynchronisedFirst) {
  DataDir dir;
  CpuBackend cpu{CpuOptions{}};
  const std::string sync =
      "replicas: 2\nreplica_sync { every: 4 outer_lr: 0.5 outer_momentum: 0.8 }";
  const v1::Job four = Job(dir, 4, 2, sync), two = Job(dir, 2, 3, sync);
  for (const bool between : {true, false}) {
    SCOPED_TRACE(between ? "between synchronisations" : "at a synchronisation");
    std::vector<std::unique_ptr<Model>> old;
    for (int r = 0; r < 2; ++r) {
      old.push_back(Build(cpu, four));
      Scramble(*old.back(), 11 + static_cast<uint32_t>(r));
      std::mt19937 rng(5);  // the same synchronised state for both replicas
      std::uniform_real_distribution<float> u(-1, 1);
      for (int k = 0; k < 4; ++k) {
        for (Param* p : old.back()->stage(k).params()) {
          if (!p->trainable) continue;
          std::vector<float> w(static_cast<size_t>(p->value.numel())), m(w.size());
          for (size_t i = 0; i < w.size(); ++i) w[i] = u(rng), m[i] = u(rng);
          p->outer = Tensor::FromHost(cpu, p->value.shape(), w);
          p->outer_momentum = Tensor::FromHost(cpu, p->value.shape(), m);
          if (!between) p->value.CopyFrom(p->outer);
        }
      }
    }
    const std::string root = dir.file(between ? "between" : "at");
    FoundCheckpoint found = SaveCheckpoint(four, *old[0], root, {old[0].get(), old[1].get()});
    absl::StatusOr<RegroupPlan> plan = PlanRegroup(found.manifest, found.dir, two);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->sync_every, 4);
    EXPECT_NE(DescribeRegroup(*plan).find("synchronised first"), std::string::npos);

    std::unique_ptr<Model> model = Build(cpu, two);
    std::vector<EpochProgress> progress;
    absl::Status s =
        LoadCheckpointInto(found.manifest, found.dir, Roots(root, 2), two, *model, &progress);
    ASSERT_TRUE(s.ok()) << s;
    const std::map<std::string, State> a = ByName(four, *old[0]), b = ByName(four, *old[1]),
                                       got = ByName(two, *model);
    const auto before = Outer(four, *old[0]), after = Outer(two, *model);
    std::set<std::string> trainable;
    for (const auto& [name, wm] : before) trainable.insert(name);
    int checked = 0, stats = 0;
    for (const auto& [name, state] : got) {
      if (!a.count(name)) continue;  // a fresh head
      EXPECT_EQ(state.state1, a.at(name).state1) << name;
      EXPECT_EQ(state.state2, a.at(name).state2) << name;
      if (!trainable.count(name)) {  // a running statistic: the replicas' mean, if they synced
        for (size_t i = 0; i < state.value.size(); ++i) {
          const double mean = (double{a.at(name).value[i]} + b.at(name).value[i]) / 2;
          EXPECT_NEAR(state.value[i], between ? mean : a.at(name).value[i], 1e-6) << name;
        }
        ++stats;
        continue;
      }
      ASSERT_TRUE(after.count(name)) << name;
      const auto& [w, m] = before.at(name);
      const auto& [w2, m2] = after.at(name);
      EXPECT_EQ(state.value, w2) << name;  // the weights are the synchronised ones
      for (size_t i = 0; i < w.size(); ++i) {
        const double g =
            between
                ? ((double{w[i]} - a.at(name).value[i]) + (double{w[i]} - b.at(name).value[i])) / 2
                : 0.0;
        const double mom = between ? 0.8 * m[i] + g : m[i];
        const double want = between ? w[i] - 0.5 * (g + 0.8 * mom) : w[i];
        ASSERT_NEAR(m2[i], mom, 1e-5) << name << "[" << i << "]";
        ASSERT_NEAR(w2[i], want, 1e-5) << name << "[" << i << "]";
        if (!between) {
          ASSERT_EQ(w2[i], w[i]) << name << "[" << i << "]";
        }
      }
      ++checked;
    }
    EXPECT_GT(checked, 6);
    EXPECT_GT(stats, 0);  // batch norm's running statistics

    // In the checkpoint's own layout nothing is synchronised: replica 0's state as it is
    // (each replica then reads its own snapshots).
    absl::StatusOr<RegroupPlan> same = PlanRegroup(found.manifest, found.dir, four);
    ASSERT_TRUE(same.ok()) << same.status();
    EXPECT_FALSE(ChangesLayout(*same));
    EXPECT_TRUE(ChangesLayout(*plan));
    std::unique_ptr<Model> own = Build(cpu, four);
    s = LoadCheckpointInto(found.manifest, found.dir, Roots(root, 2), four, *own, &progress,
                           /*synchronise=*/false);
    ASSERT_TRUE(s.ok()) << s;
    const std::map<std::string, State> kept = ByName(four, *own);
    ASSERT_EQ(kept.size(), a.size());
    for (const auto& [name, state] : kept) {
      EXPECT_EQ(state.value, a.at(name).value) << name;
      EXPECT_EQ(state.state1, a.at(name).state1) << name;
    }
    for (const auto& [name, wm] : Outer(four, *own)) {
      EXPECT_EQ(wm.first, before.at(name).first) << name;
      EXPECT_EQ(wm.second, before.at(name).second) << name;
    }
  }
}

TEST(Regroup, ChangesBesidesTheLayoutAreRefusedNamingTheField) {
  DataDir dir;
  const v1::Job job = Job(dir);
  EXPECT_TRUE(NetworkDifferences(job, Job(dir, 2, 3)).empty());
  v1::Job rule = job;
  rule.set_rule(v1::BACKPROP);
  EXPECT_TRUE(NetworkDifferences(job, rule).empty());  // every rule keeps the same state
  v1::Job seed = job;
  seed.set_seed(4);
  std::vector<std::string> d = NetworkDifferences(job, seed);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0], "the seed (the checkpoint's 3, this job's 4)");
  v1::Job wider = job;
  wider.mutable_stages(1)->mutable_layers(1)->mutable_linear()->set_out_features(12);
  d = NetworkDifferences(job, wider);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("layer 4 differs"), std::string::npos) << d[0];

  CpuBackend cpu{CpuOptions{}};
  std::unique_ptr<Model> model = Build(cpu, job);
  FoundCheckpoint found = SaveCheckpoint(job, *model, dir.file("ckpt"));
  absl::StatusOr<RegroupPlan> plan = PlanRegroup(found.manifest, found.dir, wider);
  ASSERT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
  EXPECT_NE(plan.status().message().find("the layers"), std::string::npos);
  // A checkpoint written before manifests recorded the job resumes only as it was.
  v1::CheckpointManifest old = found.manifest;
  old.clear_job_spec();
  plan = PlanRegroup(old, found.dir, Job(dir, 2));
  ASSERT_TRUE(absl::IsFailedPrecondition(plan.status())) << plan.status();
  EXPECT_NE(plan.status().message().find("4 stages x 1 replica"), std::string::npos);
  EXPECT_NE(FindCheckpointToResume(dir.file("ckpt"), "another", "", wider)
                .status()
                .message()
                .find("the layers"),
            std::string::npos);
}

TEST(Regroup, ADamagedSnapshotIsRefusedNamingTheStageAndTheFile) {
  DataDir dir;
  CpuBackend cpu{CpuOptions{}};
  const v1::Job four = Job(dir);
  std::unique_ptr<Model> old = Build(cpu, four);
  FoundCheckpoint found = SaveCheckpoint(four, *old, dir.file("ckpt"));
  const std::string victim = dir.file("ckpt/stage-2/ckpt-000003/stage-2.ckpt");
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  std::unique_ptr<Model> model = Build(cpu, Job(dir, 2));
  std::vector<EpochProgress> progress;
  absl::Status s = LoadCheckpointInto(found.manifest, found.dir, Roots(dir.file("ckpt"), 1),
                                      Job(dir, 2), *model, &progress);
  ASSERT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("stage 2"), std::string::npos) << s;
  EXPECT_NE(s.message().find(victim), std::string::npos) << s;
}

}  // namespace
}  // namespace localpar
