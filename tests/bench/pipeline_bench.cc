// Benchmark: examples/s of a K-worker local cluster (`localpar run`) against the
// in-process reference trainer on the same job, measured in the same run. The model is
// fashion_mlp-sized (4 x Linear 1024 + ReLU), on 1024 synthetic inputs so that every layer
// costs the same and the K = 1, 2 or 4 stages are balanced; synthetic data keeps file
// loading out of the figures.
//
// With --jobs, it runs each job file as a cluster instead and prints where every stage's
// training time went (report.json's phase figures): its own compute, waiting for input,
// waiting to hand its output on, and the bytes each link carried. A link holds its stages
// up only while the sender waits to send *and* the receiver waits to receive, so the
// smaller of the two bounds the time lost to the wire.
//
//   pipeline_bench [--steps=120] [--stages=1,2,4]
//   pipeline_bench --jobs=JOB[,JOB...] [--steps=N] [--stages=K]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/job/parse.h"
#include "common/run/reference_run.h"
#include "google/protobuf/util/json_util.h"
#include "proto/report.pb.h"

namespace localpar {
namespace {

std::string Job(int stages, int steps) {
  std::ostringstream j;
  j << "name: \"bench\" rule: GREEDY batch_size: 128 epochs: 1 seed: 1\n"
    << "data { synthetic { train_examples: " << 128 * steps
    << " test_examples: 128 shape: [1024] classes: 10 } }\n";
  int per = 4 / stages;
  for (int k = 0; k < stages; ++k) {
    j << "stages {";
    for (int l = 0; l < per; ++l)
      j << " layers { linear { out_features: 1024 } } layers { relu {} }";
    j << " }\n";
  }
  return j.str();
}

double ReportNumber(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str(), needle = "\"" + key + "\": ";
  size_t pos = text.find(needle);
  return pos == std::string::npos ? 0 : std::atof(text.c_str() + pos + needle.size());
}

// One cluster run of `job` (its own stages, or regrouped into `stages`); the phase table.
int WireTable(const std::filesystem::path& bin, const std::string& dir, const std::string& job,
              int steps, int stages) {
  static int runs = 0;
  std::string out = dir + "/wire" + std::to_string(runs++);
  std::string cmd = (bin / "localpar").string() + " run " + job + " --quiet --threads=1" +
                    " --max_steps=" + std::to_string(steps) +
                    (stages > 0 ? " --stages=" + std::to_string(stages) : "") + " --out=" + out +
                    " > " + dir + "/log 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "cluster run of %s failed; see %s/log\n", job.c_str(), dir.c_str());
    return 1;
  }
  std::ifstream in(out + "/report.json");
  std::stringstream text;
  text << in.rdbuf();
  v1::RunReport r;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &r).ok()) return 1;
  const double wall = r.wall_seconds();
  std::printf("\n%s: %d stages, %d steps, %.1f s, %.0f ex/s (shares of the wall time)\n",
              r.job().c_str(), r.stages(), r.steps(), wall, r.examples_per_second());
  std::printf("  %-6s %8s %10s %10s %13s %15s\n", "stage", "compute", "recv wait", "send wait",
              "link in MB/s", "wire-bound <=");
  for (int k = 0; k < r.stage_reports_size(); ++k) {
    const v1::PhaseSeconds& p = r.stage_reports(k).phase_seconds();
    const double compute = p.forward() + p.backward() + p.update() + p.allreduce();
    std::string bound = "-";  // the coordinator's link into stage 0 is not a stage's
    if (k > 0) {
      const double held =
          std::min(r.stage_reports(k - 1).phase_seconds().send_wait(), p.receive_wait());
      bound = absl::StrFormat("%.3f", held / wall);
    }
    std::printf("  %-6d %8.3f %10.3f %10.3f %13.1f %15s\n", k, compute / wall,
                p.receive_wait() / wall, p.send_wait() / wall,
                r.stage_reports(k).bytes_received() / wall / 1e6, bound.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace localpar

int main(int argc, char** argv) {
  using namespace localpar;
  int steps = 120;
  std::vector<int> ks = {1, 2, 4};
  std::vector<std::string> jobs;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--steps=", 0) == 0) {
      steps = std::atoi(a.c_str() + 8);
    } else if (a.rfind("--stages=", 0) == 0) {
      ks.clear();
      for (auto s : absl::StrSplit(a.substr(9), ','))
        ks.push_back(std::atoi(std::string(s).c_str()));
    } else if (a.rfind("--jobs=", 0) == 0) {
      jobs = absl::StrSplit(a.substr(7), ',');
    } else {
      std::fprintf(stderr,
                   "usage: pipeline_bench [--steps=N] [--stages=1,2,4]\n"
                   "       pipeline_bench --jobs=JOB[,JOB...] [--steps=N] [--stages=K]\n");
      return 2;
    }
  }
  std::filesystem::path bin =
      std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path();
  char tmpl[] = "/tmp/localpar_bench.XXXXXX";
  std::string dir = mkdtemp(tmpl);
  if (!jobs.empty()) {
    int rc = 0;
    for (const std::string& job : jobs) {
      rc |= WireTable(bin, dir, job, steps, ks.size() == 1 ? ks[0] : 0);
    }
    std::filesystem::remove_all(dir);
    return rc;
  }
  std::printf(
      "pipeline throughput: balanced 4 x Linear 1024 model, batch 128, %d steps, GREEDY, 1 thread "
      "per "
      "process, %ld cores\n",
      steps, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("  %-8s %16s %16s %10s\n", "workers", "reference ex/s", "cluster ex/s", "ratio");
  for (int k : ks) {
    if (k < 1 || 4 % k) continue;
    std::string job_path = dir + "/job" + std::to_string(k) + ".textproto";
    std::ofstream(job_path) << Job(k, steps);
    absl::StatusOr<v1::Job> job = LoadJobFile(job_path);
    absl::StatusOr<DataSplit> data = LoadJobData(*job);
    if (!job.ok() || !data.ok()) return 1;
    RunOptions ro;
    ro.progress = false;
    std::ostringstream log;
    absl::StatusOr<v1::RunReport> ref = RunReference(*job, *data, ro, log, log);
    if (!ref.ok()) return 1;
    std::string out = dir + "/run" + std::to_string(k);
    std::string cmd = (bin / "localpar").string() + " run " + job_path + " --quiet --out=" + out +
                      " > " + dir + "/log 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "cluster run failed; see %s/log\n", dir.c_str());
      return 1;
    }
    double cluster = ReportNumber(out + "/report.json", "examples_per_second");
    std::printf("  %-8d %16.0f %16.0f %10.2f\n", k, ref->examples_per_second(), cluster,
                cluster / ref->examples_per_second());
  }
  std::filesystem::remove_all(dir);
  return 0;
}
