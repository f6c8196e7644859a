// `localpar train`, `localpar validate` and `localpar data`.
#include <filesystem>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/data/dataset.h"
#include "common/io/atomic_file.h"
#include "common/job/data_spec.h"
#include "common/job/parse.h"
#include "common/job/resources.h"
#include "common/job/spec.h"
#include "common/model_io/regroup.h"
#include "common/nn/rule.h"
#include "common/run/batch_plan.h"
#include "common/run/reference_run.h"
#include "common/run/report.h"
#include "google/protobuf/struct.pb.h"
#include "services/common/exit_codes.h"
#include "services/common/interrupt.h"
#include "services/common/program_config.h"
#include "services/localpar/command_flags.h"

namespace localpar {
namespace {

// Every stage's program for one training step of `job`.
void Explain(const v1::Job& job, std::ostream& out) {
  StepSettings t = ToStepSettings(job, 1);
  const RuleSpec& rule = Rule(t.rule);
  out << "\n# " << rule.name << ": " << rule.summary << "\n";
  if (rule.splits_micro_batches) {
    out << "# " << t.micro_batches << " micro-batch" << (t.micro_batches == 1 ? "" : "es") << ", "
        << PipelineScheduleName(t.pipeline) << " schedule\n";
  }
  if (t.replicas > 1) {
    out << "# " << t.replicas << " replicas of every stage, ";
    if (ReplicasStepAlone(t)) {
      out << "each stepping alone; every " << t.sync_every << " steps an outer Nesterov step (lr "
          << t.outer_lr << ", momentum " << t.outer_momentum << ") on their mean pseudo-gradient"
          << (t.sync_bf16 ? " (exchanged as bfloat16)" : "") << "\n";
    } else {
      out << "their gradients added in replica order before every step\n";
    }
  }
  for (int k = 0; k < job.stages_size(); ++k) {
    ProgramSpec spec = StageProgramSpec(t, k, job.stages_size());
    out << "# stage " << k << ": " << ProgramString(TrainProgram(spec));
    if (rule.splits_micro_batches) {
      const int held = MicroBatchesInFlight(spec);
      out << " (holds " << held << " micro-batch" << (held == 1 ? "" : "es") << ")";
    }
    out << "\n";
  }
  out << "# evaluation, every stage: " << ProgramString(EvalProgram()) << "\n";
}

// Parses a job command's flags and loads its job with the overrides: true to go on, false
// after --help.
absl::StatusOr<bool> LoadJobCommand(const char* command, const char* usage, const Args& args,
                                    const FlagOptions& flags, v1::JobCommand* c, v1::Job* job,
                                    std::string* path, std::ostream& out) {
  absl::StatusOr<bool> go = ParseCommand(command, usage, args, c, flags, path, out);
  if (!go.ok() || !*go) return go;
  absl::StatusOr<v1::Job> loaded = LoadJobWithOverrides(*path, c->overrides());
  if (!loaded.ok()) return JobLoadError(loaded.status());
  *job = *std::move(loaded);
  return true;
}

}  // namespace

absl::Status TrainCommand(const Args& args, const Io& io) {
  v1::TrainCommand t = TrainDefaults();
  std::string path;
  absl::StatusOr<bool> go = ParseCommand("train",
                                         "localpar train JOB_FILE [flags]\n"
                                         "Trains JOB_FILE with the in-process reference trainer "
                                         "(every stage in this process).",
                                         args, &t, {}, &path, io.out);
  if (!go.ok() || !*go) return go.status();
  if (t.compute().threads() < 1) return CodedError(kExitUsage, "--threads must be >= 1");
  if (!t.out().empty()) {
    if (absl::Status s = CheckWritableDirectory(t.out(), "--out"); !s.ok()) {
      return CodedError(kExitUsage, std::string(s.message()));
    }
  }
  absl::StatusOr<v1::Job> job = LoadJobWithOverrides(path, t.overrides());
  if (!job.ok()) return JobLoadError(job.status());
  // Every stage runs in this process: the whole job must fit, not only its largest stage.
  if (absl::Status s = CheckJobFits(*job, MemoryLimitBytes(t.overrides().memory_limit_mib()), true);
      !s.ok()) {
    return CodedError(kExitBadJob, absl::StrCat("invalid job file ", path, ": ", s.message()));
  }
  absl::StatusOr<DataSplit> data = LoadJobData(*job);
  if (!data.ok()) return CodedError(kExitBadData, std::string(data.status().message()));
  for (const std::string& w : data->warnings) io.err << "localpar: warning: " << w << "\n";
  if (absl::Status s = CheckReplicasFitData(*job, data->train.size()); !s.ok()) {
    return CodedError(kExitBadJob, absl::StrCat("invalid job file ", path, ": ", s.message()));
  }
  RunOptions options;
  options.device = t.compute().device();
  options.threads = t.compute().threads();
  options.out_dir = t.out();
  options.progress = !t.quiet();
  options.version = VersionString();
  options.init_from = t.init_from();
  options.resume = t.resume();
  if (t.has_weights_pb_limit_mib() && t.weights_pb_limit_mib() < 1) {
    return CodedError(kExitUsage, "--weights_pb_limit_mib must be >= 1");
  }
  options.weights_pb_limit_mib = t.weights_pb_limit_mib();
  InstallInterruptHandler();  // Ctrl-C: stop after the step, write what there is
  options.stop = &InterruptRequested();
  absl::StatusOr<v1::RunReport> report = RunReference(*job, *data, options, io.err, io.out);
  if (!report.ok()) {
    if (!t.resume().empty() &&
        (absl::IsNotFound(report.status()) || absl::IsInvalidArgument(report.status()) ||
         absl::IsFailedPrecondition(report.status()))) {
      // No checkpoint there (2), or one this job cannot continue (2).
      return CodedError(kExitUsage, absl::StrCat("--resume: ", report.status().message()));
    }
    if (!t.init_from().empty() && report.status().message().rfind(t.init_from(), 0) == 0) {
      // The weights do not fit the job (3), or there are none to read (2).
      const bool missing = report.status().code() == absl::StatusCode::kNotFound;
      return CodedError(missing ? kExitUsage : kExitBadJob,
                        absl::StrCat("--init_from: ", report.status().message()));
    }
    const bool usage = report.status().code() == absl::StatusCode::kInvalidArgument &&
                       report.status().message().rfind("--device", 0) == 0;
    return CodedError(usage ? kExitUsage : kExitFailure, std::string(report.status().message()));
  }
  if (report->interrupted()) {
    return CodedError(
        kExitInterrupted,
        absl::StrCat("interrupted after step ", report->steps(), "; ",
                     options.out_dir.empty()
                         ? "no --out, so no weights or report were written"
                         : absl::StrCat("the weights after that step and the report so "
                                        "far are in ",
                                        options.out_dir),
                     "; `localpar train` keeps no checkpoints, so it cannot resume: run "
                     "it again, or `localpar run` with --checkpoint_dir to be able to "
                     "stop and go on",
                     options.out_dir.empty()
                         ? ""
                         : absl::StrCat(" (--init_from=", options.out_dir,
                                        "/weights.pb starts a new run from these weights)")));
  }
  if (absl::Status trained = CheckRunTrained(*report); !trained.ok()) {
    return CodedError(kExitTrainingFailed, std::string(trained.message()));
  }
  return absl::OkStatus();
}

namespace {

// validate --resume=DIR: what a resume of `job` from DIR's newest checkpoint would do.
absl::Status ExplainResume(const std::string& dir, const v1::Job& job, std::ostream& out) {
  const std::pair<std::string, uint64_t> split = SplitResumePath(dir);
  absl::StatusOr<FoundCheckpoint> found = FindLatestCheckpoint(split.first, "", "", split.second);
  if (!found.ok())
    return CodedError(kExitUsage, absl::StrCat("--resume: ", found.status().message()));
  const v1::CheckpointManifest& m = found->manifest;
  absl::StatusOr<RegroupPlan> plan = PlanRegroup(m, found->dir, job);
  if (!plan.ok())
    return CodedError(kExitUsage, absl::StrCat("--resume: ", plan.status().message()));
  out << "# resume from " << found->dir << " (job " << m.job() << ", step " << m.step()
      << ", epoch " << m.epoch() + 1 << "), written as "
      << LayoutName(plan->from_stages, plan->from_replicas) << "; this job is "
      << LayoutName(plan->to_stages, plan->to_replicas) << ":\n";
  if (plan->from_rule != plan->to_rule) {
    out << "#   the rule changes from " << plan->from_rule << " to " << plan->to_rule << "\n";
  }
  out << "#   carries over: every layer's parameters and optimizer state, the optimizer's "
         "step count, the report so far, and the data order from step "
      << m.step() << "\n";
  if (!plan->kept_heads.empty()) {
    out << "#   heads kept: " << absl::StrJoin(plan->kept_heads, ", ") << "\n";
  }
  if (!plan->fresh_heads.empty()) {
    out << "#   heads starting fresh (seeded, zero optimizer state): "
        << absl::StrJoin(plan->fresh_heads, ", ") << "\n";
  }
  for (const std::string& n : plan->head_notes) out << "#     " << n << "\n";
  if (!plan->unused_heads.empty()) {
    out << "#   the checkpoint's heads left out: " << absl::StrJoin(plan->unused_heads, ", ")
        << "\n";
  }
  if (plan->to_replicas > plan->from_replicas) {
    out << "#   new replicas start from the same state (replicas hold identical weights)\n";
  }
  // Where `localpar run` keeps them: found here, or on the workers' own storage elsewhere.
  int listed = 0, here = 0;
  for (int k = 0; k < plan->from_stages; ++k) {
    for (int r = 0; r < plan->from_replicas; ++r) {
      const v1::StageSnapshot* snap = FindSnapshot(m, k, r);
      if (snap == nullptr) continue;
      ++listed;
      std::error_code ec;
      const std::string path =
          absl::StrCat(LocalSnapshotDir(dir, k, r, plan->from_replicas), "/", snap->file());
      if (static_cast<int64_t>(std::filesystem::file_size(path, ec)) == snap->bytes() && !ec) {
        ++here;
      }
    }
  }
  out << "#   snapshots: " << here << " of " << listed << " under " << dir
      << (here == listed ? "" : " (the others must be on their workers' own storage)") << "\n";
  out << "#   cannot change on resume (refused, naming the field): the layers, the data, "
         "the optimizer, the schedule, the batch size, the epochs, the seed\n";
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateCommand(const Args& args, const Io& io) {
  v1::JobCommand c;
  v1::Job job;
  std::string path;
  absl::StatusOr<bool> go = LoadJobCommand("validate",
                                           "localpar validate JOB_FILE [flags]\n"
                                           "Checks JOB_FILE (with any overrides) and prints it "
                                           "with every default filled in.",
                                           args, {}, &c, &job, &path, io.out);
  if (!go.ok() || !*go) return go.status();
  io.out << path << ": ok\n" << job.DebugString();
  // The text format leaves zero values out; name the defaults it cannot show.
  std::vector<std::string> unseen;
  if (job.seed() == 0) unseen.push_back("seed: 0");
  for (int k = 0; k < job.stages_size(); ++k) {
    const v1::Stage& st = job.stages(k);
    if (st.name().empty()) {
      unseen.push_back(absl::StrCat("stages[", k, "].name: none (messages say stages[", k, "])"));
    }
    if (st.head().kind() == v1::Head::LINEAR) {
      unseen.push_back(absl::StrCat("stages[", k, "].head.kind: LINEAR"));
    }
  }
  if (!unseen.empty()) {
    io.out << "# defaults the text above leaves out (zero values):\n";
    for (const std::string& u : unseen) io.out << "#   " << u << "\n";
  }
  const JobNeeds needs = EstimateJobNeeds(job, true);
  io.out << "# memory, estimated from the shapes (limit "
         << ByteString(MemoryLimitBytes(c.overrides().memory_limit_mib())) << "):\n";
  for (const StageNeeds& s : needs.stages) {
    io.out << absl::StrFormat(
        "#   %s: %s (%.4g parameters: %s with gradients and optimizer state; %s of "
        "activations for %s)\n",
        s.label, ByteString(s.total()), s.parameters, ByteString(s.state_bytes),
        ByteString(s.activation_bytes), s.RowsString());
  }
  if (needs.data_bytes > 0) {
    io.out << "#   synthetic data: " << ByteString(needs.data_bytes) << "\n";
  }
  // The run's length needs the training examples, so the data is read.
  absl::StatusOr<DataSplit> data = LoadJobData(job);
  if (!data.ok()) return CodedError(kExitBadData, std::string(data.status().message()));
  io.out << "# length: " << StepsNote(job, data->train.size()) << "\n";
  if (c.explain()) Explain(job, io.out);
  if (!c.resume().empty()) return ExplainResume(c.resume(), job, io.out);
  return absl::OkStatus();
}

absl::Status DataCommand(const Args& args, const Io& io) {
  v1::JobCommand c;
  v1::Job job;
  std::string path;
  absl::StatusOr<bool> go = LoadJobCommand(
      "data",
      "localpar data JOB_FILE [flags]\n"
      "Loads the job's data and prints its figures as JSON "
      "(examples, classes, the unigram baseline in bits).",
      args, KeepOverrides({"data_path"}, {"explain", "resume"}), &c, &job, &path, io.out);
  if (!go.ok() || !*go) return go.status();
  absl::StatusOr<DataSplit> data = LoadJobData(job);
  if (!data.ok()) return CodedError(kExitBadData, std::string(data.status().message()));
  for (const std::string& w : data->warnings) io.err << "localpar: warning: " << w << "\n";
  google::protobuf::Struct figures;
  auto set = [&](const char* key, double v) {
    (*figures.mutable_fields())[key].set_number_value(v);
  };
  set("train_examples", static_cast<double>(data->train.size()));
  // "test_examples", or "validation_examples" where the held-out split comes from training.
  set(absl::StrCat(EvalSplitName(job), "_examples").c_str(),
      static_cast<double>(data->test.size()));
  set("classes", data->train.classes);
  set("labels_per_example", static_cast<double>(data->train.label_size));
  set("unigram_bits_per_label", UnigramBitsPerLabel(*data));
  io.out << ToJson(figures, false);
  return absl::OkStatus();
}

}  // namespace localpar
