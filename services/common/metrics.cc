// Prometheus metrics for the services.
#include "services/common/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <prometheus/gauge.h>
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

using prometheus::BuildGauge;
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

}  // namespace localpar
