// The localpar command line: `run` trains a job on a local cluster (one worker process per
// stage plus the coordinator, on loopback); `train` runs the in-process reference trainer;
// `validate` checks a job file.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/job/plan.h"
#include "common/job/run.h"
#include "google/protobuf/text_format.h"
#include "services/common/job_flags.h"
#include "services/common/security_flags.h"
#include "services/localpar/launcher.h"
#include "services/localpar/probe.h"

ABSL_FLAG(std::string, device, "cpu",
          "Where to train: cpu, cuda, or auto (cuda when a GPU is present)");
ABSL_FLAG(
    int, threads, 1,
    "CPU threads for GEMMs, per process (results are bitwise reproducible for a fixed count)");
ABSL_FLAG(std::string, out, "",
          "Directory for report.json and weights.pb (created if missing); empty: none");
ABSL_FLAG(bool, quiet, false, "No progress output");
ABSL_FLAG(bool, naive, false, "plan: split into equal layer counts instead of by measured time");
ABSL_FLAG(std::string, project_stages, "1,2,4",
          "project: the stage counts to predict, comma-separated");
ABSL_FLAG(double, link_gbps, 0, "project: link bandwidth in Gbit/s (0: infinitely fast)");
ABSL_FLAG(double, latency_us, 0, "project: link latency per hop in microseconds");
ABSL_FLAG(int, cores, 0, "project: cores the stages share (0: one per stage)");
ABSL_FLAG(bool, trace, false,
          "run: write each stage's per-batch compute intervals to OUT/trace.json");
ABSL_FLAG(std::string, non_finite, "reject",
          "run: NaN/Inf activations are refused (reject) or dropped (skip)");
ABSL_FLAG(int, overlap_max_delay, 0,
          "run, OVERLAP: apply returned gradients asynchronously, at most this many steps late (0: "
          "synchronous and exact)");
ABSL_FLAG(int, queue_capacity, 4, "run: items each worker buffers per direction");
ABSL_FLAG(int, slow_stage, -1, "run, testing: slow this stage down by --slow_ms per batch");
ABSL_FLAG(int, slow_ms, 0, "run, testing: see --slow_stage");
ABSL_FLAG(int, timeout_ms, 2000, "probe: deadline for the health check");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "run: directory for checkpoints (ckpt-NNNNNN/); empty: none");
ABSL_FLAG(int64_t, checkpoint_every_steps, 0, "run: checkpoint every N training steps (0: off)");
ABSL_FLAG(double, checkpoint_every_seconds, 0, "run: checkpoint every T seconds (0: off)");
ABSL_FLAG(int, keep_checkpoints, 3, "run: committed checkpoints to keep");
ABSL_FLAG(std::string, resume, "",
          "run: continue from the newest complete checkpoint in this directory");
ABSL_FLAG(int64_t, stop_after_steps, 0, "run: checkpoint and stop after this many steps");
ABSL_FLAG(std::string, metrics_targets, "",
          "run: write every process's /metrics endpoint to this file (Prometheus file_sd JSON)");

namespace {

using localpar::kExitBadData;
using localpar::kExitBadJob;
using localpar::kExitFailure;
using localpar::kExitOk;
using localpar::kExitUsage;

constexpr char kUsageText[] = R"(localpar: parallel training of deep networks with local updates.

Usage:
  localpar run JOB_FILE [flags]       train on a local cluster: one worker process per stage
                                      and a coordinator, over gRPC on loopback
  localpar train JOB_FILE [flags]     train with the in-process reference trainer
  localpar validate JOB_FILE          check a job file and print its effective settings
  localpar plan JOB_FILE --stages=K   profile every layer and print the job cut into K stages
                                      so that the slowest stage is fastest (--naive: equal
                                      layer counts instead)
  localpar project JOB_FILE           predict pipeline throughput for several stage counts from
                                      measured layer times and activation sizes
                                      (--project_stages, --link_gbps, --latency_us, --cores)
  localpar data JOB_FILE              load the job's data and print its figures as JSON
                                      (examples, classes, the unigram baseline in bits)
  localpar probe HOST:PORT            gRPC health check of a worker (exit 0 when serving)
  localpar status HOST:PORT           a running job's stages: throughput, loss, queues
                                      (`localpar run` prints the coordinator's address)
  localpar checkpoint HOST:PORT       checkpoint a running job after its next step

Job files are text-format localpar.v1.Job messages; examples live in deploy/jobs/.
Exit codes: 0 ok, 1 failure, 2 usage, 3 invalid job, 4 data set missing or invalid,
5 a worker was lost, 130 interrupted.)";

int Fail(int code, const std::string& message) {
  std::cerr << "localpar: " << message << "\n";
  return code;
}

std::string BinDir() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

localpar::CoordinatorOptions CoordinatorFlags(const std::string& path) {
  localpar::CoordinatorOptions o;
  o.job_path = path;
  o.out_dir = absl::GetFlag(FLAGS_out);
  o.progress = !absl::GetFlag(FLAGS_quiet);
  o.trace = absl::GetFlag(FLAGS_trace);
  o.non_finite = absl::GetFlag(FLAGS_non_finite) == "skip" ? localpar::v1::ConfigureRequest::SKIP
                                                           : localpar::v1::ConfigureRequest::REJECT;
  o.overlap_max_delay = absl::GetFlag(FLAGS_overlap_max_delay);
  localpar::JobOverridesFromFlags(&o);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
  o.checkpoint_every_seconds = absl::GetFlag(FLAGS_checkpoint_every_seconds);
  o.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  if (std::string r = absl::GetFlag(FLAGS_resume); !r.empty()) {
    o.resume = true;
    if (o.checkpoint_dir.empty()) o.checkpoint_dir = r;  // keep checkpointing there
  }
  o.stop_after_steps = absl::GetFlag(FLAGS_stop_after_steps);
  return o;
}

// Times every layer of `job` on the backend --device and --threads pick (plan, project).
int ProfileLayers(const localpar::v1::Job& job, std::vector<localpar::UnitProfile>* units,
                  std::string* device) {
  localpar::RunOptions ro;
  ro.device = absl::GetFlag(FLAGS_device);
  ro.threads = absl::GetFlag(FLAGS_threads);
  absl::StatusOr<std::unique_ptr<localpar::Backend>> backend = localpar::PickBackend(ro);
  if (!backend.ok()) return Fail(kExitUsage, std::string(backend.status().message()));
  localpar::ApplyJobToBackend(job, **backend);
  *device = (*backend)->Describe();
  std::cerr << "timing each layer of " << job.name() << " on " << *device << ", batch "
            << job.batch_size() << "\n";
  auto profiled = localpar::ProfileUnits(job, **backend, job.batch_size());
  if (!profiled.ok()) return Fail(kExitBadJob, std::string(profiled.status().message()));
  *units = *std::move(profiled);
  return kExitOk;
}

// `localpar plan`: the proposed job on stdout, the reasoning on stderr.
int Plan(const localpar::v1::Job& job, int stages, bool naive) {
  if (stages < 1) return Fail(kExitUsage, "plan needs --stages=K (K >= 1)");
  std::vector<localpar::UnitProfile> profile;
  std::string device;
  if (int rc = ProfileLayers(job, &profile, &device); rc != kExitOk) return rc;
  auto best = localpar::BestPartition(profile, stages);
  auto equal = localpar::EqualPartition(profile, stages);
  if (!best.ok()) return Fail(kExitBadJob, std::string(best.status().message()));
  if (!equal.ok()) return Fail(kExitBadJob, std::string(equal.status().message()));
  for (const auto& u : profile) {
    std::cerr << absl::StrFormat("  %-40s %8.3f ms  head %s\n", u.label, 1e3 * u.seconds,
                                 u.head_seconds < 0
                                     ? std::string("does not fit")
                                     : absl::StrFormat("%.3f ms", 1e3 * u.head_seconds));
  }
  auto describe = [](const char* what, const localpar::Partition& p) {
    std::string s;
    for (size_t k = 0; k < p.sizes.size(); ++k) {
      absl::StrAppendFormat(&s, "%s%d layers %.3f ms", k ? ", " : "", p.sizes[k],
                            1e3 * p.stage_seconds[k]);
    }
    std::cerr << absl::StrFormat("  %-9s slowest stage %.3f ms: %s\n", what, 1e3 * p.bottleneck(),
                                 s);
  };
  describe("balanced", *best);
  describe("equal", *equal);
  std::cerr << absl::StrFormat(
      "plan: predicted pipeline throughput, balanced / equal split: %.2f\n",
      equal->bottleneck() / best->bottleneck());
  std::string text;
  google::protobuf::TextFormat::PrintToString(localpar::ApplyPartition(job, naive ? *equal : *best),
                                              &text);
  std::cout << "# localpar plan --stages=" << stages << (naive ? " --naive" : "") << " of job "
            << job.name() << "\n"
            << text;
  return kExitOk;
}

// `localpar project`: predicted examples/s for each stage count, from measured layer times.
int Project(const localpar::v1::Job& job) {
  std::vector<localpar::UnitProfile> profile;
  std::string device;
  if (int rc = ProfileLayers(job, &profile, &device); rc != kExitOk) return rc;
  localpar::LinkModel link;
  link.bytes_per_second = absl::GetFlag(FLAGS_link_gbps) * 1e9 / 8;
  link.latency_seconds = absl::GetFlag(FLAGS_latency_us) * 1e-6;
  link.cores = absl::GetFlag(FLAGS_cores);
  std::cout << absl::StrFormat(
      "project: %s on %s, batch %d, link %s, latency %.0f us, cores %s\n", job.name(), device,
      job.batch_size(),
      link.bytes_per_second > 0 ? absl::StrFormat("%.1f Gbit/s", absl::GetFlag(FLAGS_link_gbps))
                                : std::string("unlimited"),
      1e6 * link.latency_seconds, link.cores > 0 ? std::to_string(link.cores) : "one per stage");
  std::cout << "stages  slowest stage ms  largest hop MiB  predicted examples/s\n";
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_project_stages), ',')) {
    int k = 0;
    if (!absl::SimpleAtoi(part, &k) || k < 1) {
      return Fail(kExitUsage, absl::StrCat("--project_stages: '", part, "' is not a count"));
    }
    auto p = localpar::BestPartition(profile, k);
    if (!p.ok()) return Fail(kExitBadJob, std::string(p.status().message()));
    std::vector<double> hops = localpar::HopBytes(job, *p, job.batch_size());
    double largest = hops.empty() ? 0 : *std::max_element(hops.begin(), hops.end());
    std::cout << absl::StrFormat(
        "%6d  %16.3f  %15.2f  %20.0f\n", k, 1e3 * p->bottleneck(), largest / (1 << 20),
        localpar::PredictExamplesPerSecond(p->stage_seconds, hops, job.batch_size(), link));
  }
  return kExitOk;
}

int Main(const std::vector<char*>& args) {
  if (args.size() != 3) {
    return Fail(kExitUsage, "expected a command and a job file; see localpar --help");
  }
  std::string command = args[1], path = args[2];
  localpar::SecurityOptions security;
  if (absl::Status s = localpar::SecurityFromFlags(&security); !s.ok()) {
    std::cerr << "localpar: " << s.message() << "\n";
    return kExitUsage;
  }
  if (command == "probe") return localpar::Probe(path, absl::GetFlag(FLAGS_timeout_ms), security);
  if (command == "status") return localpar::Status(path, 1000, security);
  if (command == "checkpoint") return localpar::RequestCheckpoint(path, security);
  if (command != "run" && command != "train" && command != "validate" && command != "data" &&
      command != "plan" && command != "project") {
    return Fail(kExitUsage, absl::StrCat("unknown command '", command, "'; see localpar --help"));
  }
  if (absl::GetFlag(FLAGS_threads) < 1) return Fail(kExitUsage, "--threads must be >= 1");
  std::string nf = absl::GetFlag(FLAGS_non_finite);
  if (nf != "reject" && nf != "skip")
    return Fail(kExitUsage, "--non_finite must be reject or skip");
  localpar::CoordinatorOptions co = CoordinatorFlags(path);

  if (command == "run") {
    localpar::LaunchOptions lo;
    lo.coordinator = co;
    lo.device = absl::GetFlag(FLAGS_device);
    lo.threads = absl::GetFlag(FLAGS_threads);
    lo.queue_capacity = absl::GetFlag(FLAGS_queue_capacity);
    lo.slow_stage = absl::GetFlag(FLAGS_slow_stage);
    lo.slow_ms = absl::GetFlag(FLAGS_slow_ms);
    lo.metrics_targets = absl::GetFlag(FLAGS_metrics_targets);
    lo.security_flags = localpar::SecurityFlagArgs();
    lo.bin_dir = BinDir();
    if (lo.queue_capacity < 1) return Fail(kExitUsage, "--queue_capacity must be >= 1");
    return localpar::Launch(lo);
  }

  if (command == "plan" || command == "project") {
    const int plan_stages = co.stages;  // the plan's target, not a regrouping of the input
    co.stages = 0;
    absl::StatusOr<localpar::v1::Job> job = localpar::LoadJobWithOverrides(co);
    if (!job.ok()) return Fail(kExitBadJob, std::string(job.status().message()));
    if (command == "project") return Project(*job);
    return Plan(*job, plan_stages, absl::GetFlag(FLAGS_naive));
  }
  absl::StatusOr<localpar::v1::Job> job = localpar::LoadJobWithOverrides(co);
  if (!job.ok()) return Fail(kExitBadJob, std::string(job.status().message()));
  if (command == "validate") {
    std::cout << path << ": ok\n" << job->DebugString();
    return kExitOk;
  }
  absl::StatusOr<localpar::DataSplit> data = localpar::LoadJobData(*job);
  if (!data.ok()) return Fail(kExitBadData, std::string(data.status().message()));
  if (command == "data") {
    std::cout << absl::StrFormat(
        "{\"train_examples\": %d, \"test_examples\": %d, \"classes\": %d, "
        "\"labels_per_example\": %d, \"unigram_bits_per_label\": %.6f}\n",
        data->train.size(), data->test.size(), data->train.classes, data->train.label_size,
        localpar::UnigramBitsPerLabel(*data));
    return kExitOk;
  }
  localpar::RunOptions options;
  options.device = absl::GetFlag(FLAGS_device);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.out_dir = co.out_dir;
  options.progress = co.progress;
  absl::StatusOr<localpar::RunReport> report =
      localpar::RunReference(*job, *data, options, std::cerr);
  if (!report.ok()) return Fail(kExitFailure, std::string(report.status().message()));
  std::cout << localpar::ReportTable(*report);
  if (!options.out_dir.empty()) std::cout << "report: " << options.out_dir << "/report.json\n";
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  localpar::ListSharedFlagsInHelp();
  absl::SetProgramUsageMessage(kUsageText);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  return Main(args);
}
