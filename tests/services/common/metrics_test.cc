// What a Prometheus server scrapes from every process: the localpar job's name under its own
// label (not Prometheus's `job`), the build, and the standard process_* metrics, against
// values read independently here.
#include "services/common/metrics.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>

#include "services/common/grpc_util.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/worker/worker_metrics.h"

namespace localpar {
namespace {

// The value of the first sample line starting with `prefix`, or -1.
double Sample(const std::string& text, const std::string& prefix) {
  std::smatch m;
  std::regex line("(^|\n)" +
                  std::regex_replace(prefix, std::regex(R"([{}()|.*+?^$\[\]\\])"), R"(\$&)") +
                  R"([^\n]* ([0-9.e+-]+)\n)");
  return std::regex_search(text, m, line) ? std::stod(m[2]) : -1;
}

TEST(Metrics, TheJobIsItsOwnLabelAndEveryProcessExportsItsBuildAndProcessMetrics) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  WorkerMetrics worker((*server)->registry());
  worker.Configure("fashion", 2);
  CoordinatorMetrics coordinator((*server)->registry(), "fashion", /*checkpoints=*/true,
                                 /*positions=*/64);
  coordinator.AddIngested(3);
  coordinator.SetLearningRate(0.002);
  const std::string text = (*server)->Render();
  // A sequence model's tokens are counted beside its windows; the rate is exported.
  EXPECT_EQ(Sample(text, "localpar_ingested_examples_total{"), 3);
  EXPECT_EQ(Sample(text, "localpar_ingested_tokens_total{"), 192);
  EXPECT_EQ(Sample(text, "localpar_learning_rate{"), 0.002);
  // Without replicas there is no gradient exchange to time.
  EXPECT_EQ(text.find("phase=\"allreduce\""), std::string::npos);

  EXPECT_NE(text.find("localpar_job=\"fashion\""), std::string::npos) << text;
  EXPECT_EQ(text.find(",job=\""), std::string::npos) << "a `job` label clashes with Prometheus's";
  EXPECT_EQ(text.find("{job=\""), std::string::npos);
  EXPECT_NE(text.find("localpar_stream_bytes_total"), std::string::npos);
  EXPECT_EQ(Sample(text, "localpar_build_info{"), 1);
  EXPECT_NE(text.find("revision=\""), std::string::npos);

  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // Before the first checkpoint: the start, a Unix time, not an age.
  EXPECT_NEAR(Sample(text, "localpar_last_checkpoint_timestamp_seconds{"), now, 60);
  {
    // Without checkpoints no timestamp (an age alert would fire on it); images count no
    // tokens; a replica's worker times its all-reduce.
    absl::StatusOr<std::unique_ptr<MetricsServer>> other = MetricsServer::Start("127.0.0.1:0");
    ASSERT_TRUE(other.ok()) << other.status();
    CoordinatorMetrics plain((*other)->registry(), "fashion", false, 1);
    WorkerMetrics replica((*other)->registry());
    replica.Configure("fashion", 1, 0);
    const std::string t = (*other)->Render();
    EXPECT_EQ(t.find("localpar_last_checkpoint_timestamp_seconds"), std::string::npos) << t;
    EXPECT_EQ(t.find("localpar_ingested_tokens_total"), std::string::npos);
    EXPECT_NE(t.find("phase=\"allreduce\""), std::string::npos);
  }

  const double resident = Sample(text, "process_resident_memory_bytes");
  EXPECT_GT(resident, 0.5 * static_cast<double>(ResidentBytes()));
  EXPECT_LT(resident, 2.0 * static_cast<double>(ResidentBytes()));
  EXPECT_GE(Sample(text, "process_virtual_memory_bytes"), resident);
  EXPECT_GE(Sample(text, "process_cpu_seconds_total"), 0);
  const double start = Sample(text, "process_start_time_seconds");
  EXPECT_LE(start, now + 1);
  EXPECT_GT(start, now - 3600) << "this test process started within the hour";
  EXPECT_GE(Sample(text, "process_open_fds"), 3);  // stdin, stdout, stderr at least
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  EXPECT_EQ(Sample(text, "process_max_fds"), static_cast<double>(limit.rlim_cur));
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter"), std::string::npos);
}

}  // namespace
}  // namespace localpar
