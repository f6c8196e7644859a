// The localpar command line: `train` runs a job with the in-process reference trainer;
// `validate` checks a job file without running it.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/job/run.h"

ABSL_FLAG(std::string, device, "cpu",
          "Where to train: cpu, cuda, or auto (cuda when a GPU is present)");
ABSL_FLAG(int, threads, 1,
          "CPU threads for GEMMs (results are bitwise reproducible for a fixed count)");
ABSL_FLAG(std::string, out, "",
          "Directory for report.json (created if missing); empty: no report file");
ABSL_FLAG(std::string, rule, "",
          "Override the job's update rule: BACKPROP, GREEDY, CHUNKED or OVERLAP");
ABSL_FLAG(int, epochs, 0, "Override the job's epoch count (0: keep the job's)");
ABSL_FLAG(int, max_steps, 0, "Stop after this many training steps (0: keep the job's)");
ABSL_FLAG(int64_t, seed, -1, "Override the job's seed (-1: keep the job's)");
ABSL_FLAG(bool, quiet, false, "No per-step progress output");

namespace {

// Exit codes: what went wrong, for scripts and orchestrators.
enum ExitCode { kOk = 0, kFailure = 1, kUsage = 2, kBadJob = 3, kBadData = 4 };

constexpr char kUsageText[] = R"(localpar: parallel training of deep networks with local updates.

Usage:
  localpar train JOB_FILE [flags]     train with the in-process reference trainer
  localpar validate JOB_FILE          check a job file and print its effective settings

Job files are text-format localpar.v1.Job messages; examples live in deploy/jobs/.
Exit codes: 0 ok, 1 failure, 2 usage, 3 invalid job, 4 data set missing or invalid.)";

int Fail(int code, const std::string& message) {
  std::cerr << "localpar: " << message << "\n";
  return code;
}

int Main(const std::vector<char*>& args) {
  if (args.size() != 3) {
    return Fail(kUsage, "expected a command and a job file; see localpar --help");
  }
  std::string command = args[1], path = args[2];
  if (command != "train" && command != "validate") {
    return Fail(kUsage, absl::StrCat("unknown command '", command, "'; see localpar --help"));
  }
  absl::StatusOr<localpar::v1::Job> job = localpar::LoadJobFile(path);
  if (!job.ok()) return Fail(kBadJob, std::string(job.status().message()));
  if (std::string r = absl::GetFlag(FLAGS_rule); !r.empty()) {
    localpar::v1::UpdateRule rule;
    if (!localpar::v1::UpdateRule_Parse(r, &rule) ||
        rule == localpar::v1::UPDATE_RULE_UNSPECIFIED) {
      return Fail(kUsage,
                  absl::StrCat("--rule=", r, ": expected BACKPROP, GREEDY, CHUNKED or OVERLAP"));
    }
    job->set_rule(rule);
  }
  if (int e = absl::GetFlag(FLAGS_epochs); e > 0) job->set_epochs(e);
  if (int m = absl::GetFlag(FLAGS_max_steps); m > 0) job->set_max_steps(m);
  if (int64_t s = absl::GetFlag(FLAGS_seed); s >= 0) job->set_seed(static_cast<uint64_t>(s));
  if (absl::Status s = localpar::ValidateJob(*job); !s.ok()) {
    return Fail(kBadJob, absl::StrCat(path, ": ", s.message()));
  }
  if (command == "validate") {
    std::cout << path << ": ok\n" << job->DebugString();
    return kOk;
  }
  absl::StatusOr<localpar::DataSplit> data = localpar::LoadJobData(*job);
  if (!data.ok()) return Fail(kBadData, std::string(data.status().message()));

  localpar::RunOptions options;
  options.device = absl::GetFlag(FLAGS_device);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.out_dir = absl::GetFlag(FLAGS_out);
  options.progress = !absl::GetFlag(FLAGS_quiet);
  if (options.threads < 1) return Fail(kUsage, "--threads must be >= 1");
  absl::StatusOr<localpar::RunReport> report =
      localpar::RunReference(*job, *data, options, std::cerr);
  if (!report.ok()) return Fail(kFailure, std::string(report.status().message()));
  std::cout << localpar::ReportTable(*report);
  if (!options.out_dir.empty()) std::cout << "report: " << options.out_dir << "/report.json\n";
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsageText);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  return Main(args);
}
