// Layer profiling and the min-max partition of layers into stages.
#include "common/job/plan.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/core/rng.h"
#include "common/job/job.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Where each top-level layer came from: (stage, layer) in the job.
std::vector<std::pair<int, int>> UnitOrigins(const v1::Job& job) {
  std::vector<std::pair<int, int>> out;
  for (int k = 0; k < job.stages_size(); ++k) {
    for (int i = 0; i < job.stages(k).layers_size(); ++i) out.emplace_back(k, i);
  }
  return out;
}

}  // namespace

double Partition::bottleneck() const {
  return stage_seconds.empty() ? 0.0
                               : *std::max_element(stage_seconds.begin(), stage_seconds.end());
}

absl::StatusOr<std::vector<UnitProfile>> ProfileUnits(const v1::Job& job, Backend& backend,
                                                      int64_t batch, int repeats) {
  // One single-layer stage per unit, each with the head of the stage it came from.
  std::vector<std::pair<int, int>> origins = UnitOrigins(job);
  if (origins.empty()) return absl::InvalidArgumentError("the job has no layers to partition");
  v1::Job exploded = job;
  exploded.clear_stages();
  for (auto [k, i] : origins) {
    v1::Stage* s = exploded.add_stages();
    *s->add_layers() = job.stages(k).layers(i);
    if (job.stages(k).has_head()) *s->mutable_head() = job.stages(k).head();
    s->set_name(job.stages(k).name());
  }
  ModelConfig mc = ToModelConfig(exploded);
  const int64_t lpe = JobLabelsPerExample(job);
  Rng rng(7);
  std::vector<int32_t> y(static_cast<size_t>(batch * lpe));
  for (int32_t& v : y) v = static_cast<int32_t>(rng.NextBelow(static_cast<uint64_t>(mc.classes)));
  Tensor labels = Tensor::FromHostI32(backend, lpe == 1 ? Shape{batch} : Shape{batch, lpe}, y);
  std::vector<UnitProfile> out;
  Shape in = mc.input_shape;
  for (size_t u = 0; u < mc.stages.size(); ++u) {
    UnitProfile p;
    const auto [k, i] = origins[u];
    p.label = absl::StrCat(
        "stages[", k, "].layers[", i, "] ",
        mc.stages[u].layers.empty() ? "?" : LayerKindName(mc.stages[u].layers[0].kind));
    std::string error;
    auto stage = Stage::Create(backend, mc.stages[u], in, mc.classes, mc.optimizer, 1, &error);
    bool head_fits = stage != nullptr;
    if (!stage) {  // its job stage's head does not fit here: time the layer, forbid a cut
      StageConfig plain = mc.stages[u];
      plain.head = HeadConfig();
      stage = Stage::Create(backend, plain, in, mc.classes, mc.optimizer, 1, &error);
    }
    if (!stage) return absl::InvalidArgumentError(absl::StrCat(p.label, ": ", error));
    Shape xs{batch};
    xs.insert(xs.end(), in.begin(), in.end());
    std::vector<float> xv(static_cast<size_t>(NumElements(xs)));
    // Small integers are valid token ids for an embedding and ordinary inputs otherwise.
    for (float& v : xv) v = static_cast<float>(rng.NextBelow(8));
    Tensor x = Tensor::FromHost(backend, xs, xv);
    std::vector<double> layer_t, head_t;
    ForwardContext ctx{true, 1};
    for (int r = 0; r <= repeats; ++r) {
      auto t0 = Clock::now();
      stage->Forward(x, 0, ctx);
      backend.Synchronize();
      auto t1 = Clock::now();
      stage->Head(0, labels, HeadMode::kLocal, 1.0f / batch, ctx);
      backend.Synchronize();
      auto t2 = Clock::now();
      stage->Backward(0, stage->head_grad(0), nullptr);
      stage->Step(1e-6f);  // the update is part of every stage's batch
      backend.Synchronize();
      auto t3 = Clock::now();
      if (r == 0) continue;  // warm-up: first-touch allocation
      layer_t.push_back(std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count());
      head_t.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    p.seconds = Median(layer_t);
    p.head_seconds = head_fits ? Median(head_t) : -1.0;
    in = stage->output_shape();
    out.push_back(p);
  }
  return out;
}

namespace {

absl::Status CheckStages(const std::vector<UnitProfile>& units, int stages) {
  if (stages < 1 || stages > static_cast<int>(units.size())) {
    return absl::InvalidArgumentError(absl::StrCat("stages=", stages, ": the job has ",
                                                   units.size(), " layers, so 1..", units.size(),
                                                   " stages"));
  }
  return absl::OkStatus();
}

// Per-batch time of a stage made of units [a, b].
double StageCost(const std::vector<UnitProfile>& units, const std::vector<double>& prefix, int a,
                 int b) {
  if (units[b].head_seconds < 0) return std::numeric_limits<double>::infinity();
  return prefix[b + 1] - prefix[a] + units[b].head_seconds;
}

Partition Costed(const std::vector<UnitProfile>& units, std::vector<int> sizes) {
  std::vector<double> prefix(units.size() + 1, 0.0);
  for (size_t i = 0; i < units.size(); ++i) prefix[i + 1] = prefix[i] + units[i].seconds;
  Partition p;
  int a = 0;
  for (int s : sizes) {
    p.stage_seconds.push_back(StageCost(units, prefix, a, a + s - 1));
    a += s;
  }
  p.sizes = std::move(sizes);
  return p;
}

}  // namespace

absl::StatusOr<Partition> BestPartition(const std::vector<UnitProfile>& units, int stages) {
  if (absl::Status s = CheckStages(units, stages); !s.ok()) return s;
  const int n = static_cast<int>(units.size());
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + units[i].seconds;
  // best[s][i]: the smallest possible slowest stage covering units [0, i) with s stages.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int i = s; i <= n; ++i) {
      for (int j = s - 1; j < i; ++j) {
        double v = std::max(best[s - 1][j], StageCost(units, prefix, j, i - 1));
        if (v < best[s][i]) {
          best[s][i] = v;
          cut[s][i] = j;
        }
      }
    }
  }
  if (best[stages][n] == inf) {
    return absl::InvalidArgumentError(
        absl::StrCat("no split into ", stages, " stages puts every head where it fits"));
  }
  std::vector<int> sizes(stages);
  for (int s = stages, i = n; s > 0; --s) {
    sizes[s - 1] = i - cut[s][i];
    i = cut[s][i];
  }
  return Costed(units, sizes);
}

absl::StatusOr<Partition> EqualPartition(const std::vector<UnitProfile>& units, int stages) {
  if (absl::Status s = CheckStages(units, stages); !s.ok()) return s;
  std::vector<int> sizes;
  const int n = static_cast<int>(units.size());
  for (int s = 0; s < stages; ++s) sizes.push_back(n / stages + (s < n % stages ? 1 : 0));
  return Costed(units, sizes);
}

double PredictExamplesPerSecond(const std::vector<double>& stage_seconds,
                                const std::vector<double>& hop_bytes, int64_t batch,
                                const LinkModel& link) {
  double period = 0, total = 0;
  for (size_t k = 0; k < stage_seconds.size(); ++k) {
    period = std::max(period, stage_seconds[k]);
    total += stage_seconds[k];
    if (k < hop_bytes.size() && link.bytes_per_second > 0) {
      period = std::max(period, link.latency_seconds + hop_bytes[k] / link.bytes_per_second);
    }
  }
  int n = static_cast<int>(stage_seconds.size());
  if (link.cores > 0 && link.cores < n) period = std::max(period, total / link.cores);
  return period > 0 ? static_cast<double>(batch) / period : 0.0;
}

std::vector<double> HopBytes(const v1::Job& job, const Partition& p, int64_t batch) {
  v1::Job regrouped = ApplyPartition(job, p);
  ModelConfig mc = ToModelConfig(regrouped);
  double per = job.wire() == v1::WIRE_F32 ? 4.0 : 2.0;
  std::vector<double> out;
  for (int k = 1; k < static_cast<int>(mc.stages.size()); ++k) {
    out.push_back(per * static_cast<double>(NumElements(StageInputShape(mc, k)) * batch));
  }
  return out;
}

v1::Job ApplyPartition(const v1::Job& job, const Partition& p) {
  std::vector<std::pair<int, int>> origins = UnitOrigins(job);
  v1::Job out = job;
  out.clear_stages();
  size_t u = 0;
  for (size_t s = 0; s < p.sizes.size(); ++s) {
    v1::Stage* st = out.add_stages();
    st->set_name(absl::StrCat("planned", s));
    for (int i = 0; i < p.sizes[s]; ++i, ++u) {
      const auto [k, l] = origins[u];
      *st->add_layers() = job.stages(k).layers(l);
      if (job.stages(k).has_head()) {
        *st->mutable_head() = job.stages(k).head();
      } else {
        st->clear_head();
      }
    }
  }
  return out;
}

}  // namespace localpar
