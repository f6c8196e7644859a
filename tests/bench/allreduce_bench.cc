// Benchmark: the replicas' gradient exchange (ReplicaGroup: the gather over the replicas'
// own TCP mesh, after a rendezvous through the coordinator's Rendezvous service on loopback)
// against raw TCP on loopback moving the same bytes, measured in the same run. With R
// replicas each one sends its bucket to the R - 1 others and receives theirs; the raw TCP
// baseline has every pair of threads exchange the bucket over one socket each way. The
// reduction runs twice, in the clear and under mutual TLS (certificates made by openssl).
//
//   allreduce_bench [--mib=16] [--replicas=2] [--rounds=10]
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/nn/replica_sync.h"
#include "services/coordinator/rendezvous_service.h"
#include "services/worker/replica_group.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Seconds per round for R replicas gathering `floats` each through their mesh, or (reduce)
// summing them in replica order with the mesh's reduce-scatter and all-gather, as workers do.
double MeshSeconds(int port, int replicas, int64_t floats, int rounds, int round_base, bool reduce,
                   const SecurityOptions& security) {
  std::vector<double> took(static_cast<size_t>(replicas));
  std::vector<std::thread> threads;
  for (int r = 0; r < replicas; ++r) {
    threads.emplace_back([&, r] {
      ReplicaGroupOptions o;
      o.rendezvous = "127.0.0.1:" + std::to_string(port);
      o.group = "bench-" + std::to_string(round_base);
      o.replica = r;
      o.replicas = replicas;
      o.host = "127.0.0.1";
      ReplicaGroup g(o, security);
      std::vector<float> in(static_cast<size_t>(floats), 1.0f + r);
      std::vector<float> out(static_cast<size_t>(floats * replicas));
      NonFiniteParts bad;
      auto once = [&] {
        return reduce ? g.AllReduce(in.data(), floats, out.data(), &bad)
                      : g.AllGather(in.data(), floats, out.data());
      };
      if (!once().ok()) std::exit(1);  // connect, warm up
      auto start = Clock::now();
      for (int i = 0; i < rounds; ++i) {
        absl::Status s = once();
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
          std::exit(1);
        }
      }
      took[r] = Since(start) / rounds;
    });
  }
  for (auto& t : threads) t.join();
  double worst = 0;
  for (double t : took) worst = std::max(worst, t);
  return worst;
}

void SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, 0);
    if (k <= 0) std::exit(1);
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t k = recv(fd, p, n, 0);
    if (k <= 0) std::exit(1);
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// A Rendezvous service on loopback with `security`'s credentials; its port in *port.
std::unique_ptr<grpc::Server> Rendezvous(RendezvousService& service,
                                         const SecurityOptions& security, int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", ServerCredentials(security), port);
  b.RegisterService(&service);
  return b.BuildAndStart();
}

// Mutual TLS credentials for 127.0.0.1 from a CA made here with openssl, in `dir`.
SecurityOptions MutualTls(const std::string& dir) {
  const std::string script = "set -e; cd '" + dir + R"(';
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
key ca.key; openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj "/CN=bench CA"
printf "subjectAltName=IP:127.0.0.1\n" > san.ext
key node.key; openssl req -new -key node.key -out node.csr -subj "/CN=127.0.0.1"
openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem -days 2 \
  -extfile san.ext 2>/dev/null
)";
  std::ofstream(dir + "/make.sh") << script;
  SecurityOptions s;
  if (std::system(("bash '" + dir + "/make.sh' > /dev/null 2>&1").c_str()) != 0 ||
      !LoadSecurity(dir + "/node.pem", dir + "/node.key", dir + "/ca.pem", true, "", &s).ok()) {
    std::fprintf(stderr, "cannot make certificates with openssl in %s\n", dir.c_str());
    std::exit(1);
  }
  return s;
}

// Two threads exchanging `bytes` each way over one loopback TCP connection, per round.
double TcpSeconds(size_t bytes, int rounds) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(lfd, 1) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::exit(1);
  }
  int cfd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(cfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) std::exit(1);
  int sfd = accept(lfd, nullptr, nullptr);
  int one = 1;
  for (int fd : {cfd, sfd}) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<double> took(2);
  auto side = [&](int fd, int i) {
    std::vector<char> out(bytes, static_cast<char>(i)), in(bytes);
    auto start = Clock::now();
    for (int r = 0; r < rounds; ++r) {
      std::thread sender([&] { SendAll(fd, out.data(), bytes); });
      RecvAll(fd, in.data(), bytes);
      sender.join();
    }
    took[i] = Since(start) / rounds;
  };
  std::thread t([&] { side(cfd, 0); });
  side(sfd, 1);
  t.join();
  for (int fd : {cfd, sfd, lfd}) close(fd);
  return std::max(took[0], took[1]);
}

}  // namespace
}  // namespace localpar

int main(int argc, char** argv) {
  double mib = 16;
  int replicas = 2, rounds = 10;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--mib=", 0) == 0)
      mib = std::atof(a.c_str() + 6);
    else if (a.rfind("--replicas=", 0) == 0)
      replicas = std::atoi(a.c_str() + 11);
    else if (a.rfind("--rounds=", 0) == 0)
      rounds = std::atoi(a.c_str() + 9);
    else {
      std::fprintf(stderr, "usage: allreduce_bench [--mib=16] [--replicas=2] [--rounds=10]\n");
      return 2;
    }
  }
  const int64_t floats = static_cast<int64_t>(mib * (1 << 20) / 4);
  const size_t bytes = static_cast<size_t>(floats) * 4;
  const localpar::SecurityOptions clear;
  localpar::RendezvousService service(clear);
  int port = 0;
  std::unique_ptr<grpc::Server> server = localpar::Rendezvous(service, clear, &port);
  const double mesh = localpar::MeshSeconds(port, replicas, floats, rounds, 0, false, clear);
  const double reduced = localpar::MeshSeconds(port, replicas, floats, rounds, 1, true, clear);
  // The same reduction as in a cluster run with --tls_cert --tls_key --tls_ca --mtls.
  char dir[] = "/tmp/allreduce_bench_XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  const localpar::SecurityOptions tls = localpar::MutualTls(dir);
  localpar::RendezvousService tls_service(tls);
  int tls_port = 0;
  std::unique_ptr<grpc::Server> tls_server = localpar::Rendezvous(tls_service, tls, &tls_port);
  const double secured = localpar::MeshSeconds(tls_port, replicas, floats, rounds, 2, true, tls);
  std::system(("rm -rf '" + std::string(dir) + "'").c_str());
  const double tcp = localpar::TcpSeconds(bytes, rounds);
  // The adding after the gather, on one core, as a worker does it.
  std::vector<float> gathered(static_cast<size_t>(floats * replicas), 1.0f), sum(floats);
  auto start = localpar::Clock::now();
  for (int i = 0; i < rounds; ++i) {
    localpar::SumInReplicaOrder(gathered.data(), replicas, floats, sum.data());
  }
  const double add = localpar::Since(start) / rounds;
  // Bytes each replica receives per exchange: the other replicas' buckets.
  const double moved = static_cast<double>(bytes) * (replicas - 1);
  std::printf("bucket %.1f MiB, %d replicas (threads on loopback), %d rounds\n", mib, replicas,
              rounds);
  std::printf("mesh allgather:   %8.3f ms  %6.2f GB/s received per replica\n", 1e3 * mesh,
              moved / mesh / 1e9);
  std::printf("raw TCP exchange: %8.3f ms  %6.2f GB/s each way (one pair)\n", 1e3 * tcp,
              static_cast<double>(bytes) / tcp / 1e9);
  std::printf("sum in replica order: %8.3f ms\n", 1e3 * add);
  // What workers run: each replica sends 2 (R - 1) / R of the bucket, the sum included.
  std::printf(
      "mesh allreduce (reduce-scatter, all-gather, summed): %8.3f ms  %6.2f GB/s sent "
      "per replica\n",
      1e3 * reduced, 2.0 * (replicas - 1) / replicas * static_cast<double>(bytes) / reduced / 1e9);
  std::printf("mesh allreduce under mutual TLS: %8.3f ms  %6.2f GB/s sent per replica\n",
              1e3 * secured,
              2.0 * (replicas - 1) / replicas * static_cast<double>(bytes) / secured / 1e9);
  std::printf("mesh / raw TCP (bandwidth per replica): %.2f\n",
              (moved / mesh) / (static_cast<double>(bytes) / tcp));
  std::printf("allreduce under TLS / in the clear (time): %.2f\n", secured / reduced);
  server->Shutdown();
  tls_server->Shutdown();
  return 0;
}
