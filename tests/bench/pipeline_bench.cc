// Benchmark: examples/s of a K-worker local cluster (`localpar run`) against the
// in-process reference trainer on the same job, measured in the same run. The model is
// fashion_mlp-sized (4 x Linear 1024 + ReLU), on 1024 synthetic inputs so that every layer
// costs the same and the K = 1, 2 or 4 stages are balanced; synthetic data keeps file
// loading out of the figures.
//
//   pipeline_bench [--steps=120] [--stages=1,2,4]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/job/run.h"

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

}  // namespace
}  // namespace localpar

int main(int argc, char** argv) {
  using namespace localpar;
  int steps = 120;
  std::vector<int> ks = {1, 2, 4};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--steps=", 0) == 0) {
      steps = std::atoi(a.c_str() + 8);
    } else if (a.rfind("--stages=", 0) == 0) {
      ks.clear();
      for (auto s : absl::StrSplit(a.substr(9), ','))
        ks.push_back(std::atoi(std::string(s).c_str()));
    } else {
      std::fprintf(stderr, "usage: pipeline_bench [--steps=N] [--stages=1,2,4]\n");
      return 2;
    }
  }
  std::filesystem::path bin =
      std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path();
  char tmpl[] = "/tmp/localpar_bench.XXXXXX";
  std::string dir = mkdtemp(tmpl);
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
    absl::StatusOr<v1::RunReport> ref = RunReference(*job, *data, ro, log);
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
