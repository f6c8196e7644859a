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
  CoordinatorMetrics coordinator((*server)->registry(), "fashion");
  const std::string text = (*server)->Render();

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
