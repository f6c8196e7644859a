// `localpar plan` and `localpar project`: both time every layer of the job first.
#include <algorithm>
#include <ostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common//plan/plan.h"
#include "common/core/device.h"
#include "common/job/parse.h"
#include "common/job/spec.h"
#include "common/run/reference_run.h"
#include "common/run/report.h"
#include "google/protobuf/text_format.h"
#include "services/common/exit_codes.h"
#include "services/localpar/command_flags.h"

namespace localpar {
namespace {

constexpr char kPlanUsage[] =
    "localpar plan JOB_FILE --stages=K [flags]\n"
    "Times every layer and prints the job cut into K stages so that the slowest stage is\n"
    "fastest (--naive: equal layer counts instead); the reasoning goes to stderr.";
constexpr char kProjectUsage[] =
    "localpar project JOB_FILE [flags]\n"
    "Predicts pipeline throughput for several stage counts from measured layer times and\n"
    "activation sizes. With --replicas=R each stage is timed on its 1/R share of a batch and\n"
    "pays for exchanging its gradients with its R - 1 other replicas over the link.";

// Parses the command, loads the job (without the stage regrouping: for plan --stages is
// the target) and times every layer on the backend --device and --threads pick.
// True to go on; false after --help.
absl::StatusOr<bool> Profile(const char* command, const char* usage, const Args& args,
                             const FlagOptions& flags, const Io& io, v1::ProfileCommand* c,
                             v1::Job* job, std::vector<UnitProfile>* units, std::string* device,
                             bool per_replica = false) {
  *c = ProfileDefaults();
  std::string path;
  absl::StatusOr<bool> go = ParseCommand(command, usage, args, c, flags, &path, io.out);
  if (!go.ok() || !*go) return go;
  v1::JobOverrides overrides = c->overrides();
  if (!c->json()) overrides.clear_stages();  // --json describes the job's stages as regrouped
  absl::StatusOr<v1::Job> loaded = LoadJobWithOverrides(path, overrides);
  if (!loaded.ok()) return JobLoadError(loaded.status());
  *job = *std::move(loaded);
  DeviceChoice ro;
  ro.device = c->compute().device();
  ro.threads = std::max(1, c->compute().threads());
  PickedBackend backend = PickBackend(ro);
  if (!backend.backend) return UsageError(backend.error);
  ApplyJobToBackend(*job, *backend.backend);
  *device = backend.backend->Describe();
  // With replicas, what one replica computes: its share of the batch (the largest).
  const int64_t rows =
      per_replica ? ReplicaRows(job->batch_size(), job->replicas(), 0) : job->batch_size();
  io.err << "timing each layer of " << job->name() << " on " << *device << ", batch " << rows
         << (rows != job->batch_size()
                 ? absl::StrCat(" (1/", job->replicas(), " of ", job->batch_size(), ")")
                 : "")
         << "\n";
  absl::StatusOr<std::vector<UnitProfile>> profiled = ProfileUnits(*job, *backend.backend, rows);
  if (!profiled.ok()) return CodedError(kExitBadJob, std::string(profiled.status().message()));
  *units = *std::move(profiled);
  return true;
}

void Describe(const char* what, const Partition& p, const std::vector<UnitProfile>& units,
              std::ostream& err) {
  std::string s;
  size_t u = 0;
  for (size_t k = 0; k < p.sizes.size(); ++k) {
    int layers = 0;  // job layers: a unit is a layer with the activations after it
    for (int i = 0; i < p.sizes[k]; ++i, ++u) layers += units[u].layers;
    absl::StrAppendFormat(&s, "%s%d layers %.3f ms", k ? ", " : "", layers,
                          1e3 * p.stage_seconds[k]);
  }
  err << absl::StrFormat("  %-9s slowest stage %.3f ms: %s\n", what, 1e3 * p.bottleneck(), s);
}

// The job's own stages (consecutive units that come from one job stage) with their
// measured times, FLOPs, parameter bytes and activation bytes per batch of `rows`.
void AddJobStages(const v1::Job& job, const std::vector<UnitProfile>& profile, int64_t rows,
                  v1::ProjectReport* out) {
  Partition own;
  for (size_t u = 0; u < profile.size(); ++u) {
    const bool first = u == 0 || profile[u].stage != profile[u - 1].stage;
    if (first) {
      own.sizes.push_back(0);
      out->add_stages()->set_name(job.stages(profile[u].stage).name());
    }
    ++own.sizes.back();
    v1::StageProfile* sp = out->mutable_stages(out->stages_size() - 1);
    // Inside a stage every unit but the first passes a gradient back to the one before it.
    sp->set_seconds(sp->seconds() + profile[u].seconds +
                    (first ? 0.0 : profile[u].input_grad_seconds));
    if (first) sp->set_input_grad_seconds(profile[u].input_grad_seconds);
    sp->set_forward_flops(sp->forward_flops() + profile[u].forward_flops);
    sp->set_head_seconds(std::max(0.0, profile[u].head_seconds));  // the last unit's
    sp->set_head_forward_flops(profile[u].head_forward_flops);
    sp->set_units(sp->units() + 1);
  }
  const std::vector<double> hops = HopBytes(job, own, rows);
  const std::vector<double> params = ExchangeBytes(job, own);
  for (int k = 0; k < out->stages_size(); ++k) {
    out->mutable_stages(k)->set_hop_bytes(k < static_cast<int>(hops.size()) ? hops[k] : 0);
    out->mutable_stages(k)->set_parameter_bytes(params[k]);
  }
}

}  // namespace

// The proposed job on stdout, the reasoning on stderr.
absl::Status PlanCommand(const Args& args, const Io& io) {
  v1::ProfileCommand c;
  v1::Job job;
  std::vector<UnitProfile> profile;
  std::string device;
  const FlagOptions flags =
      KeepOverrides({"stages", "rule", "batch_size", "data_path"},
                    {"project_stages", "link_gbps", "latency_us", "cores", "json"});
  absl::StatusOr<bool> go =
      Profile("plan", kPlanUsage, args, flags, io, &c, &job, &profile, &device);
  if (!go.ok() || !*go) return go.status();
  const int stages = c.overrides().stages();
  if (stages < 1) return CodedError(kExitUsage, "plan needs --stages=K (K >= 1)");
  absl::StatusOr<Partition> best = BestPartition(profile, stages);
  absl::StatusOr<Partition> equal = EqualPartition(profile, stages);
  if (!best.ok()) return CodedError(kExitBadJob, std::string(best.status().message()));
  if (!equal.ok()) return CodedError(kExitBadJob, std::string(equal.status().message()));
  for (const UnitProfile& u : profile) {
    io.err << absl::StrFormat("  %-40s %8.3f ms  head %s\n", u.label, 1e3 * u.seconds,
                              u.head_seconds < 0
                                  ? std::string("does not fit")
                                  : absl::StrFormat("%.3f ms", 1e3 * u.head_seconds));
  }
  Describe("balanced", *best, profile, io.err);
  Describe("equal", *equal, profile, io.err);
  io.err << absl::StrFormat("plan: predicted pipeline throughput, balanced / equal split: %.2f\n",
                            equal->bottleneck() / best->bottleneck());
  std::string text;
  google::protobuf::TextFormat::PrintToString(ApplyPartition(job, c.naive() ? *equal : *best),
                                              &text);
  io.out << "# localpar plan --stages=" << stages << (c.naive() ? " --naive" : "") << " of job "
         << job.name() << "\n"
         << text;
  return absl::OkStatus();
}

// Predicted examples/s for each stage count, from measured layer times.
absl::Status ProjectCommand(const Args& args, const Io& io) {
  v1::ProfileCommand c;
  v1::Job job;
  std::vector<UnitProfile> profile;
  std::string device;
  const FlagOptions flags =
      KeepOverrides({"stages", "replicas", "rule", "batch_size", "data_path"}, {"naive"});
  absl::StatusOr<bool> go =
      Profile("project", kProjectUsage, args, flags, io, &c, &job, &profile, &device, true);
  if (!go.ok() || !*go) return go.status();
  LinkModel link;
  link.bytes_per_second = c.link_gbps() * 1e9 / 8;
  link.latency_seconds = c.latency_us() * 1e-6;
  link.cores = c.cores();
  link.replicas = job.replicas();
  const int64_t share = ReplicaRows(job.batch_size(), job.replicas(), 0);
  v1::ProjectReport out;
  out.set_job(job.name());
  out.set_device(device);
  out.set_batch(static_cast<int32_t>(share));
  if (c.json()) {
    AddJobStages(job, profile, share, &out);
  } else {
    io.out << absl::StrFormat(
        "project: %s on %s, batch %d%s, link %s, latency %.0f us, cores %s\n", job.name(), device,
        job.batch_size(),
        link.replicas > 1 ? absl::StrFormat(" in %d replicas of %d", link.replicas, share) : "",
        link.bytes_per_second > 0 ? absl::StrFormat("%.1f Gbit/s", c.link_gbps())
                                  : std::string("unlimited"),
        1e6 * link.latency_seconds, link.cores > 0 ? std::to_string(link.cores) : "one per worker");
    io.out << "stages  slowest stage ms  largest hop MiB"
           << (link.replicas > 1 ? "  exchange ms" : "") << "  predicted examples/s\n";
  }
  for (absl::string_view part : absl::StrSplit(c.project_stages(), ',')) {
    int k = 0;
    if (!absl::SimpleAtoi(part, &k) || k < 1) {
      return CodedError(kExitUsage, absl::StrCat("--project_stages: '", part, "' is not a count"));
    }
    absl::StatusOr<Partition> p = BestPartition(profile, k);
    if (!p.ok()) return CodedError(kExitBadJob, std::string(p.status().message()));
    std::vector<double> hops = HopBytes(job, *p, share);
    double largest = hops.empty() ? 0 : *std::max_element(hops.begin(), hops.end());
    link.exchange_bytes = ExchangeBytes(job, *p);
    std::vector<double> exchange = ExchangeSeconds(link, p->stage_seconds.size());
    const double slowest_exchange = *std::max_element(exchange.begin(), exchange.end());
    const double rate = PredictExamplesPerSecond(p->stage_seconds, hops, job.batch_size(), link);
    if (c.json()) {
      v1::StageCountProjection* pr = out.add_projections();
      pr->set_stages(k);
      pr->set_slowest_stage_seconds(p->bottleneck());
      pr->set_largest_hop_bytes(largest);
      pr->set_exchange_seconds(slowest_exchange);
      pr->set_examples_per_second(rate);
      continue;
    }
    io.out << absl::StrFormat(
        "%6d  %16.3f  %15.2f%s  %20.0f\n", k, 1e3 * p->bottleneck(), largest / (1 << 20),
        link.replicas > 1 ? absl::StrFormat("  %11.3f", 1e3 * slowest_exchange) : "", rate);
  }
  if (c.json()) io.out << ToJson(out) << "\n";
  return absl::OkStatus();
}

}  // namespace localpar
