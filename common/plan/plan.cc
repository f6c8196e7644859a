// Layer profiling and the min-max partition of layers into stages.
#include "common/plan/plan.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/rng.h"
#include "common/job/data_spec.h"
#include "common/job/spec.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Layers that belong with the layer before them: a cut between a linear and its ReLU would
// hand the next stage's head pre-activation values.
bool FollowsItsLayer(const v1::Layer& l) { return l.has_relu() || l.has_gelu() || l.has_dropout(); }

// The units a cut may fall between: each top-level layer of the job with the activations
// (and dropout) that follow it, as (stage, layer) pairs in job order.
using Unit = std::vector<std::pair<int, int>>;
std::vector<Unit> Units(const v1::Job& job) {
  std::vector<Unit> out;
  for (int k = 0; k < job.stages_size(); ++k) {
    for (int i = 0; i < job.stages(k).layers_size(); ++i) {
      if (out.empty() || !FollowsItsLayer(job.stages(k).layers(i))) out.emplace_back();
      out.back().emplace_back(k, i);
    }
  }
  return out;
}

std::string StageLabel(const v1::Job& job, int k) {
  return job.stages(k).name().empty() ? absl::StrCat("stage", k) : job.stages(k).name();
}

}  // namespace

double Partition::bottleneck() const {
  return stage_seconds.empty() ? 0.0
                               : *std::max_element(stage_seconds.begin(), stage_seconds.end());
}

absl::StatusOr<std::vector<UnitProfile>> ProfileUnits(const v1::Job& job, Backend& backend,
                                                      int64_t batch, int repeats) {
  // One stage per unit, each with the head of the job stage its last layer came from.
  std::vector<Unit> units = Units(job);
  if (units.empty()) return absl::InvalidArgumentError("the job has no layers to partition");
  v1::Job exploded = job;
  exploded.clear_stages();
  for (const Unit& unit : units) {
    v1::Stage* s = exploded.add_stages();
    for (auto [k, i] : unit) *s->add_layers() = job.stages(k).layers(i);
    const int last = unit.back().first;
    if (job.stages(last).has_head()) *s->mutable_head() = job.stages(last).head();
    s->set_name(job.stages(last).name());
  }
  ModelConfig mc = ToModelConfig(exploded);
  const int64_t lpe = JobLabelsPerExample(job);
  Rng rng(7);
  std::vector<int32_t> y(static_cast<size_t>(batch * lpe));
  for (int32_t& v : y) v = static_cast<int32_t>(rng.NextBelow(static_cast<uint64_t>(mc.classes)));
  Tensor labels = Tensor::FromHostI32(backend, lpe == 1 ? Shape{batch} : Shape{batch, lpe}, y);
  struct Timed {
    std::unique_ptr<Stage> stage;
    Tensor x;
    bool head_fits = true;
    std::vector<double> layer_t, head_t, backward_t, backward_dx_t;
    Tensor dx;
  };
  std::vector<Timed> timed(units.size());
  std::vector<UnitProfile> out(units.size());
  Shape in = mc.input_shape;
  for (size_t u = 0; u < units.size(); ++u) {
    UnitProfile& p = out[u];
    const auto [k, i] = units[u].front();
    std::string kinds;
    for (size_t j = 0; j < mc.stages[u].layers.size(); ++j) {
      absl::StrAppend(&kinds, j ? "+" : "", mc.stages[u].layers[j].kind);
    }
    p.label = absl::StrCat(StageLabel(job, k), ".layers[", i, "] ", kinds.empty() ? "?" : kinds);
    std::string error;
    Timed& t = timed[u];
    t.stage = Stage::Create(backend, mc.stages[u], in, mc.classes, mc.optimizer, 1, &error);
    if (!t.stage) {  // its job stage's head does not fit here: time the layer, forbid a cut
      t.head_fits = false;
      StageConfig plain = mc.stages[u];
      plain.head = HeadConfig();
      t.stage = Stage::Create(backend, plain, in, mc.classes, mc.optimizer, 1, &error);
    }
    if (!t.stage) return absl::InvalidArgumentError(absl::StrCat(p.label, ": ", error));
    p.stage = units[u].back().first;
    StageConfig counted = mc.stages[u];
    if (!t.head_fits) counted.head = HeadConfig();
    const StageFlops flops = StageForwardFlops(counted, in, mc.classes);
    p.forward_flops = flops.layers;
    p.head_forward_flops = t.head_fits ? flops.head : 0.0;
    Shape xs{batch};
    xs.insert(xs.end(), in.begin(), in.end());
    std::vector<int32_t> xv(static_cast<size_t>(NumElements(xs)));
    // Small integers: valid token ids for an embedding, and ordinary inputs otherwise.
    for (int32_t& v : xv) v = static_cast<int32_t>(rng.NextBelow(8));
    if (t.stage->input_dtype() == DType::kI32) {
      t.x = Tensor::FromHostI32(backend, xs, xv);
    } else {
      t.x = Tensor::FromHost(backend, xs, std::vector<float>(xv.begin(), xv.end()));
    }
    in = t.stage->output_shape();
  }
  // Round-robin over the units, `repeats` rounds after a warm-up one, and the median of
  // each: a slow moment of the machine touches every unit once instead of one unit
  // `repeats` times, so the proposed split stays put from run to run.
  ForwardContext ctx{true, 1};
  for (int r = 0; r <= repeats; ++r) {
    for (size_t u = 0; u < timed.size(); ++u) {
      Timed& t = timed[u];
      Stage& stage = *t.stage;
      auto t0 = Clock::now();
      stage.Forward(t.x, 0, ctx);
      backend.Synchronize();
      auto t1 = Clock::now();
      stage.Head(0, labels, HeadMode::kLocal, 1.0f / batch, ctx);
      backend.Synchronize();
      auto t2 = Clock::now();
      stage.Backward(0, stage.head_grad(0), nullptr);
      backend.Synchronize();
      auto t2b = Clock::now();
      stage.Step(1e-6f);  // the update is part of every stage's batch
      backend.Synchronize();
      auto t3 = Clock::now();
      // The same backward pass with the gradient for the input as well, which a unit needs
      // when a unit before it takes its gradient (the first unit of all never does).
      Clock::duration with_dx{};
      if (u > 0) {
        auto t4 = Clock::now();
        stage.Backward(0, stage.head_grad(0), &t.dx);
        backend.Synchronize();
        with_dx = Clock::now() - t4;
      }
      if (r == 0) continue;  // warm-up: first-touch allocation
      t.layer_t.push_back(std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count());
      t.head_t.push_back(std::chrono::duration<double>(t2 - t1).count());
      t.backward_t.push_back(std::chrono::duration<double>(t2b - t2).count());
      t.backward_dx_t.push_back(std::chrono::duration<double>(with_dx).count());
    }
  }
  for (size_t u = 0; u < units.size(); ++u) {
    out[u].seconds = Median(timed[u].layer_t);
    out[u].head_seconds = timed[u].head_fits ? Median(timed[u].head_t) : -1.0;
    out[u].layers = static_cast<int>(units[u].size());
    out[u].input_grad_seconds =
        u == 0 ? 0.0 : std::max(0.0, Median(timed[u].backward_dx_t) - Median(timed[u].backward_t));
  }
  return out;
}

namespace {

absl::Status CheckStages(const std::vector<UnitProfile>& units, int stages) {
  if (stages < 1 || stages > static_cast<int>(units.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages=", stages, ": the job has ", units.size(),
                     " layers with their activations, so 1..", units.size(), " stages"));
  }
  return absl::OkStatus();
}

// Running sums of each unit's time with the gradient it passes to the unit before it.
std::vector<double> Prefix(const std::vector<UnitProfile>& units) {
  std::vector<double> prefix(units.size() + 1, 0.0);
  for (size_t i = 0; i < units.size(); ++i) {
    prefix[i + 1] = prefix[i] + units[i].seconds + units[i].input_grad_seconds;
  }
  return prefix;
}

// Per-batch time of a stage made of units [a, b]: inside it every unit but the first passes
// a gradient back.
double StageCost(const std::vector<UnitProfile>& units, const std::vector<double>& prefix, int a,
                 int b) {
  if (units[b].head_seconds < 0) return std::numeric_limits<double>::infinity();
  return prefix[b + 1] - prefix[a] - units[a].input_grad_seconds + units[b].head_seconds;
}

Partition Costed(const std::vector<UnitProfile>& units, std::vector<int> sizes) {
  const std::vector<double> prefix = Prefix(units);
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
  const std::vector<double> prefix = Prefix(units);
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

std::vector<double> ExchangeSeconds(const LinkModel& link, size_t stages) {
  std::vector<double> out(stages, 0.0);
  if (link.replicas <= 1 || link.bytes_per_second <= 0) return out;
  for (size_t k = 0; k < stages && k < link.exchange_bytes.size(); ++k) {
    // The mesh's reduce-scatter and all-gather: two rounds, 2 (R - 1) / R of the bucket.
    const double r = link.replicas;
    out[k] =
        2 * link.latency_seconds + 2 * (r - 1) / r * link.exchange_bytes[k] / link.bytes_per_second;
  }
  return out;
}

double PredictExamplesPerSecond(const std::vector<double>& stage_seconds,
                                const std::vector<double>& hop_bytes, int64_t batch,
                                const LinkModel& link) {
  const std::vector<double> exchange = ExchangeSeconds(link, stage_seconds.size());
  double period = 0, total = 0;
  for (size_t k = 0; k < stage_seconds.size(); ++k) {
    period = std::max(period, stage_seconds[k] + exchange[k]);
    // Moving bytes over loopback or a NIC costs CPU time too: the exchange shares the cores.
    total += stage_seconds[k] + exchange[k];
    if (k < hop_bytes.size() && link.bytes_per_second > 0) {
      period = std::max(period, link.latency_seconds + hop_bytes[k] / link.bytes_per_second);
    }
  }
  const int replicas = std::max(1, link.replicas);
  const int workers = static_cast<int>(stage_seconds.size()) * replicas;
  if (link.cores > 0 && link.cores < workers) {
    period = std::max(period, total * replicas / link.cores);
  }
  return period > 0 ? static_cast<double>(batch) / period : 0.0;
}

std::vector<double> ExchangeBytes(const v1::Job& job, const Partition& p) {
  ModelConfig mc = ToModelConfig(ApplyPartition(job, p));
  std::vector<double> out;
  for (int k = 0; k < static_cast<int>(mc.stages.size()); ++k) {
    out.push_back(4.0 * static_cast<double>(
                            StageParameterCount(mc.stages[k], StageInputShape(mc, k), mc.classes)));
  }
  return out;
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
  std::vector<Unit> units = Units(job);
  v1::Job out = job;
  out.clear_stages();
  size_t u = 0;
  for (size_t s = 0; s < p.sizes.size(); ++s) {
    v1::Stage* st = out.add_stages();
    std::vector<std::string> names;  // the job stages it draws on, in order
    for (int i = 0; i < p.sizes[s]; ++i, ++u) {
      for (auto [k, l] : units[u]) {
        *st->add_layers() = job.stages(k).layers(l);
        if (names.empty() || names.back() != StageLabel(job, k))
          names.push_back(StageLabel(job, k));
        if (job.stages(k).has_head()) {
          *st->mutable_head() = job.stages(k).head();
        } else {
          st->clear_head();
        }
      }
    }
    st->set_name(absl::StrJoin(names, "+"));
  }
  return out;
}

}  // namespace localpar
