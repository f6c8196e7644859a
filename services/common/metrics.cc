// Prometheus metrics for the services.
#include "services/common/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/common/process_metrics.h"
#include "services/common/program_config.h"

namespace localpar {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Step phases span ~10 us (a small stage on a GPU) to seconds (a wide stage on a CPU).
const prometheus::Histogram::BucketBoundaries& StepBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1, 3};
  return *b;
}

}  // namespace

namespace {

// Scrapes are small and rare; these bound what a misbehaving client can take.
constexpr unsigned kServerThreads = 4;
constexpr unsigned kMaxConnections = 64;
constexpr unsigned kConnectionTimeoutSeconds = 5;
constexpr size_t kThreadStackBytes = 1 << 20;  // room for CUDA's static TLS

MHD_Result Reply(MHD_Connection* connection, unsigned status, const std::string& body,
                 const char* type) {
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()),
                                                    MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  MHD_Result ok = MHD_queue_response(connection, status, r);
  MHD_destroy_response(r);
  return ok;
}

MHD_Result Handle(void* self, MHD_Connection* connection, const char* url, const char* method,
                  const char*, const char*, size_t* upload_size, void** state) {
  static int first_call;
  if (*state == nullptr) {  // headers only so far; answer on the next call
    *state = &first_call;
    return MHD_YES;
  }
  if (*upload_size != 0) return MHD_NO;  // a scrape has no body
  if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
    return Reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "localpar serves GET /metrics\n",
                 "text/plain");
  }
  if (std::strcmp(url, "/metrics") != 0) {
    return Reply(connection, MHD_HTTP_NOT_FOUND, "localpar serves GET /metrics\n", "text/plain");
  }
  return Reply(connection, MHD_HTTP_OK, static_cast<MetricsServer*>(self)->Render(),
               "text/plain; version=0.0.4");
}

}  // namespace

namespace {

// host:port as an IPv4 socket address; nullopt when it is not one.
std::optional<sockaddr_in> ParseListen(const std::string& listen) {
  size_t colon = listen.rfind(':');
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  int port = -1;
  if (colon != std::string::npos && !absl::SimpleAtoi(listen.substr(colon + 1), &port)) port = -1;
  std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  if (host == "0.0.0.0" || host == "*" || host.empty()) {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (host == "localhost") {
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    port = -1;
  }
  if (port < 0 || port > 65535) return std::nullopt;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

absl::Status CheckMetricsListen(const std::string& listen) {
  std::optional<sockaddr_in> addr = ParseListen(listen);
  if (!addr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen=", listen, ": not IPV4:PORT (e.g. 0.0.0.0:9100)"));
  }
  if (addr->sin_port == 0) return absl::OkStatus();  // any free port will do
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::OkStatus();  // nothing to learn here; Start will say
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) == 0;
  const int error = errno;
  close(fd);
  if (!bound) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen=", listen, ": cannot listen there (", strerror(error), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen) {
  std::optional<sockaddr_in> parsed = ParseListen(listen);
  if (!parsed) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics: ", listen, " is not IPV4:PORT (e.g. 0.0.0.0:9100)"));
  }
  sockaddr_in addr = *parsed;
  const int port = ntohs(addr.sin_port);
  auto m = std::unique_ptr<MetricsServer>(new MetricsServer());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->daemon_ = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0, nullptr, nullptr, &Handle, m.get(),
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&addr), MHD_OPTION_THREAD_POOL_SIZE,
      kServerThreads, MHD_OPTION_CONNECTION_LIMIT, kMaxConnections, MHD_OPTION_CONNECTION_TIMEOUT,
      kConnectionTimeoutSeconds, MHD_OPTION_THREAD_STACK_SIZE, kThreadStackBytes, MHD_OPTION_END);
  if (!m->daemon_) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", listen, " (in use, or not this host's)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(m->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  m->port_ = info ? info->port : port;
  BuildGauge()
      .Name("localpar_build_info")
      .Help("Always 1: the version and source revision of this program")
      .Register(*m->registry_)
      .Add({{"version", BuildVersion()}, {"revision", BuildRevision()}})
      .Set(1);
  return m;
}

MetricsServer::~MetricsServer() {
  if (daemon_) MHD_stop_daemon(daemon_);
}

std::string MetricsServer::Render() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect()) + ProcessMetricsText();
}

WorkerMetrics::WorkerMetrics(prometheus::Registry& r)
    : examples_(BuildCounter()
                    .Name("localpar_examples_total")
                    .Help("Examples processed by a stage, by phase (train, eval)")
                    .Register(r)),
      steps_(BuildCounter()
                 .Name("localpar_steps_total")
                 .Help("Parameter updates applied by a stage")
                 .Register(r)),
      step_seconds_(BuildHistogram()
                        .Name("localpar_step_seconds")
                        .Help("Time per training batch in each phase: receive_wait, forward, "
                              "backward, update, send_wait, allreduce (replicas exchanging "
                              "gradients)")
                        .Register(r)),
      loss_(BuildGauge()
                .Name("localpar_loss")
                .Help("Local (head) loss of the stage's latest training batch")
                .Register(r)),
      accuracy_(BuildGauge()
                    .Name("localpar_head_accuracy_ratio")
                    .Help("Head accuracy: latest training batch (train), last evaluation (eval)")
                    .Register(r)),
      queue_depth_(BuildGauge()
                       .Name("localpar_queue_depth")
                       .Help("Items waiting in a worker queue, by direction (inbound, outbound)")
                       .Register(r)),
      queue_capacity_(BuildGauge()
                          .Name("localpar_queue_capacity")
                          .Help("Capacity of a worker queue, by direction")
                          .Register(r)),
      bytes_(BuildCounter()
                 .Name("localpar_stream_bytes_total")
                 .Help("Bytes of stream items, by direction (received from upstream, sent "
                       "downstream)")
                 .Register(r)),
      rejected_(BuildCounter()
                    .Name("localpar_rejected_total")
                    .Help("Items refused by a worker, by reason")
                    .Register(r)),
      resident_(BuildGauge()
                    .Name("localpar_resident_memory_bytes")
                    .Help("Resident memory of the worker process")
                    .Register(r)),
      device_(BuildGauge()
                  .Name("localpar_device_memory_bytes")
                  .Help("Device (GPU) memory in use by the stage; 0 on the CPU backend")
                  .Register(r)) {}

void WorkerMetrics::Configure(const std::string& job, int stage, int replica) {
  std::lock_guard<std::mutex> lock(mu_);
  base_ = {{labels::kJob, job}, {labels::kStage, std::to_string(stage)}};
  if (replica >= 0) base_[labels::kReplica] = std::to_string(replica);
  auto with = [&](const char* key, const std::string& value) {
    auto l = base_;
    l[key] = value;
    return l;
  };
  train_examples_ = &examples_.Add(with(labels::kPhase, "train"));
  eval_examples_ = &examples_.Add(with(labels::kPhase, "eval"));
  step_ = &steps_.Add(base_);
  phase_.clear();
  for (const char* p :
       {"receive_wait", "forward", "backward", "update", "send_wait", "allreduce"}) {
    phase_[p] = &step_seconds_.Add(with(labels::kPhase, p), StepBuckets());
  }
  train_loss_ = &loss_.Add(base_);
  train_accuracy_ = &accuracy_.Add(with(labels::kPhase, "train"));
  eval_accuracy_ = &accuracy_.Add(with(labels::kPhase, "eval"));
  depth_in_ = &queue_depth_.Add(with(labels::kDirection, "inbound"));
  depth_out_ = &queue_depth_.Add(with(labels::kDirection, "outbound"));
  cap_in_ = &queue_capacity_.Add(with(labels::kDirection, "inbound"));
  cap_out_ = &queue_capacity_.Add(with(labels::kDirection, "outbound"));
  sent_ = &bytes_.Add(with(labels::kDirection, "sent"));
  received_ = &bytes_.Add(with(labels::kDirection, "received"));
  resident_bytes_ = &resident_.Add(base_);
  device_bytes_ = &device_.Add(base_);
  rejected_by_reason_.clear();
  for (const char* reason : kRejectReasons) {
    rejected_by_reason_[reason] = &rejected_.Add(with(labels::kReason, reason));
  }
}

void WorkerMetrics::ObservePhase(const char* phase, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = phase_.find(phase);
  if (it != phase_.end()) it->second->Observe(seconds);
}

void WorkerMetrics::AddExamples(bool train, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  prometheus::Counter* c = train ? train_examples_ : eval_examples_;
  if (c) c->Increment(static_cast<double>(n));
}

void WorkerMetrics::AddStep() {
  std::lock_guard<std::mutex> lock(mu_);
  if (step_) step_->Increment();
}

void WorkerMetrics::SetTrainHead(double loss, double accuracy) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!train_loss_) return;
  train_loss_->Set(loss);
  train_accuracy_->Set(accuracy);
}

void WorkerMetrics::SetEvalAccuracy(double accuracy) {
  std::lock_guard<std::mutex> lock(mu_);
  if (eval_accuracy_) eval_accuracy_->Set(accuracy);
}

void WorkerMetrics::SetQueue(bool inbound, int64_t depth, int64_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!depth_in_) return;
  (inbound ? depth_in_ : depth_out_)->Set(static_cast<double>(depth));
  (inbound ? cap_in_ : cap_out_)->Set(static_cast<double>(capacity));
}

void WorkerMetrics::AddBytes(bool sent, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  prometheus::Counter* c = sent ? sent_ : received_;
  if (c) c->Increment(static_cast<double>(n));
}

void WorkerMetrics::AddRejected(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  prometheus::Counter*& c = rejected_by_reason_[reason];
  if (!c) {
    auto l = base_;
    if (l.empty()) l[labels::kStage] = "unconfigured";
    l[labels::kReason] = reason;
    c = &rejected_.Add(l);
  }
  c->Increment();
}

void WorkerMetrics::SetMemory(int64_t resident_bytes, int64_t device_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!resident_bytes_) return;
  resident_bytes_->Set(static_cast<double>(resident_bytes));
  device_bytes_->Set(static_cast<double>(device_bytes));
}

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& r, const std::string& job)
    : epoch_(BuildGauge()
                 .Name("localpar_epoch")
                 .Help("Epoch the coordinator is feeding (1-based)")
                 .Register(r)
                 .Add({{labels::kJob, job}})),
      progress_(BuildGauge()
                    .Name("localpar_progress_ratio")
                    .Help("Fraction of the job's training steps fed so far")
                    .Register(r)
                    .Add({{labels::kJob, job}})),
      ingested_(BuildCounter()
                    .Name("localpar_ingested_examples_total")
                    .Help("Training examples the coordinator has streamed into the pipeline")
                    .Register(r)
                    .Add({{labels::kJob, job}})),
      errors_(BuildCounter()
                  .Name("localpar_item_errors_total")
                  .Help("In-band item errors that reached the coordinator")
                  .Register(r)
                  .Add({{labels::kJob, job}})),
      checkpoints_(BuildCounter()
                       .Name("localpar_checkpoints_total")
                       .Help("Checkpoints committed (every stage saved, manifest written)")
                       .Register(r)
                       .Add({{labels::kJob, job}})),
      checkpoint_seconds_(BuildHistogram()
                              .Name("localpar_checkpoint_duration_seconds")
                              .Help("From placing a checkpoint marker to its manifest")
                              .Register(r)
                              .Add({{labels::kJob, job}},
                                   prometheus::Histogram::BucketBoundaries{0.01, 0.03, 0.1, 0.3, 1,
                                                                           3, 10, 30, 100})),
      last_checkpoint_(BuildGauge()
                           .Name("localpar_last_checkpoint_timestamp_seconds")
                           .Help("Unix time of the last committed checkpoint (of the start, before "
                                 "the first): time() minus it is the work a failure would lose")
                           .Register(r)
                           .Add({{labels::kJob, job}})) {
  last_checkpoint_.SetToCurrentTime();
}

}  // namespace localpar
