// A real Prometheus server (Debian's `prometheus`, started here on loopback) scrapes a
// local cluster while it trains. PromQL over its HTTP API must show per-stage throughput
// above zero for every stage and a falling loss; and every metric that a Grafana panel
// names must exist in that live scrape.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::ReadFile;
using testing::RunProcess;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string UrlEncode(const std::string& s) {
  std::ostringstream out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '_' || c == '.' || c == '-') {
      out << c;
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out << buf;
    }
  }
  return out.str();
}

// The values of an instant-vector query result, by the value of `label`.
std::map<std::string, double> Values(const std::string& json, const std::string& label) {
  std::map<std::string, double> out;
  std::regex series("\"" + label + "\":\"([^\"]*)\"[^\\]]*\"value\":\\[[0-9.]+,\"([^\"]+)\"\\]");
  for (auto it = std::sregex_iterator(json.begin(), json.end(), series);
       it != std::sregex_iterator(); ++it) {
    out[(*it)[1]] = std::atof((*it)[2].str().c_str());
  }
  return out;
}

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A job that keeps learning for the whole run: noisy data, a modest learning rate.
    std::string job = dir_.Write("job.textproto", R"(
name: "promtest" rule: GREEDY batch_size: 32 epochs: 400 seed: 4
data { synthetic { train_examples: 320 test_examples: 32 shape: [64] classes: 8 seed: 9 noise: 2.5 } }
optimizer { sgd { momentum: 0.5 } }
schedule { lr: 0.002 }
stages { layers { linear { out_features: 64 } } layers { relu {} } }
stages { layers { linear { out_features: 64 } } layers { relu {} } }
stages { layers { linear { out_features: 64 } } layers { relu {} } }
stages { layers { linear { out_features: 64 } } layers { relu {} } }
)");
    targets_ = dir_.path() + "/targets.json";
    cluster_ =
        testing::StartProcess({testing::BinDir() + "/localpar", "run", job, "--quiet",
                               "--slow_stage=3", "--slow_ms=5", "--metrics_targets=" + targets_,
                               // The dashboard's checkpoint panels read metrics that exist
                               // only where checkpoints are written.
                               "--checkpoint_dir=" + dir_.path() + "/ckpt"},
                              dir_.path() + "/cluster.log");
    port_ = FreePort();
    std::string config = dir_.Write("prometheus.yml", R"(
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: localpar
    file_sd_configs:
      - files: [")" + targets_ + R"("]
        refresh_interval: 1s
)");
    prometheus_ = testing::StartProcess(
        {"/usr/bin/prometheus", "--config.file=" + config,
         "--storage.tsdb.path=" + dir_.path() + "/tsdb",
         "--web.listen-address=127.0.0.1:" + std::to_string(port_), "--log.level=warn"},
        dir_.path() + "/prometheus.log");
  }

  void TearDown() override {
    kill(cluster_, SIGINT);
    kill(prometheus_, SIGTERM);
    testing::WaitProcess(cluster_, 30);
    testing::WaitProcess(prometheus_, 30);
  }

  std::string Query(const std::string& promql) {
    auto r = RunProcess(
        {"/usr/bin/curl", "-s", "--max-time", "5",
         "http://127.0.0.1:" + std::to_string(port_) + "/api/v1/query?query=" + UrlEncode(promql)},
        10);
    return r.output;
  }

  // Polls until `ok` accepts the query's result or the deadline passes.
  std::string WaitFor(const std::string& promql, const std::function<bool(const std::string&)>& ok,
                      int seconds) {
    std::string last;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < until) {
      last = Query(promql);
      if (ok(last)) return last;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return last;
  }

  std::string Logs() {
    return "cluster log:\n" + ReadFile(dir_.path() + "/cluster.log") + "\nprometheus log:\n" +
           ReadFile(dir_.path() + "/prometheus.log");
  }

  testing::TempDir dir_;
  std::string targets_;
  pid_t cluster_ = -1, prometheus_ = -1;
  int port_ = 0;
};

TEST_F(PrometheusTest, ScrapesThroughputForEveryStageAFallingLossAndEveryDashboardMetric) {
  const std::string throughput =
      "sum by (stage) "
      "(rate(localpar_examples_total{localpar_job=\"promtest\",phase=\"train\"}[5s]))";
  std::string json = WaitFor(
      throughput,
      [](const std::string& j) {
        auto v = Values(j, "stage");
        if (v.size() != 4) return false;
        for (auto& [stage, rate] : v) {
          if (!(rate > 0)) return false;
        }
        return true;
      },
      60);
  std::map<std::string, double> rates = Values(json, "stage");
  ASSERT_EQ(rates.size(), 4u) << json << "\n" << Logs();
  for (auto& [stage, rate] : rates) EXPECT_GT(rate, 0) << "stage " << stage;

  // The loss falls: the last stage's mean loss over the first seconds of scraping, then the
  // same mean later, polled until it has clearly dropped (slower builds, e.g. under the
  // sanitizers, take longer to get there).
  const std::string loss =
      "avg_over_time(localpar_loss{localpar_job=\"promtest\",stage=\"3\"}[4s])";
  double early = Values(Query(loss), "stage")["3"];
  ASSERT_GT(early, 0) << Logs();
  double late = early;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(45);
  while (late > early - 0.02 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    late = Values(Query(loss), "stage")["3"];
  }
  EXPECT_LT(late, early - 0.02) << "the loss did not fall";

  // Every metric a dashboard panel names exists in this live scrape.
  std::string names =
      RunProcess({"/usr/bin/curl", "-s", "--max-time", "5",
                  "http://127.0.0.1:" + std::to_string(port_) + "/api/v1/label/__name__/values"},
                 10)
          .output;
  std::string dashboard = ReadFile(std::string(LOCALPAR_SOURCE_DIR) + "/dashboards/localpar.json");
  std::regex metric("localpar_[a-z_]+");
  std::set<std::string> used;
  for (auto it = std::sregex_iterator(dashboard.begin(), dashboard.end(), metric);
       it != std::sregex_iterator(); ++it) {
    used.insert(it->str());
  }
  used.erase("localpar_pipeline");  // the dashboard's uid, not a metric
  used.erase("localpar_job");       // the label that holds the job's name
  EXPECT_GE(used.size(), 10u);
  for (const std::string& m : used) {
    EXPECT_NE(names.find("\"" + m + "\""), std::string::npos) << m << " is not scraped";
  }
}

}  // namespace
}  // namespace localpar
