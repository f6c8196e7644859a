// The replicas' mesh in a TLS cluster, with real sockets on loopback and certificates made
// here by openssl: the replicas reduce under mutual TLS exactly as in the clear; a stranger
// in the clear, over TLS without a certificate, with a certificate from another CA, or with
// the right certificate and a wrong secret is closed and counted, and nothing it sent is read
// as a hello; a replica whose certificate does not chain or does not name its host is not
// joined; a hand-made replica over TLS that sends a wrong frame or a verdict that does not
// fit is named, as in the clear; and a relay between two replicas records none of the hello,
// the framing or the gradients (while in the clear it records all three, so the check can
// fail). A reduction of bfloat16 pairs adds in float32 in replica order and rounds the sum.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "common/core/dtype.h"
#include "services/worker/replica_mesh.h"
#include "tests/services/worker/mesh_test_util.h"

namespace localpar {
namespace {

using std::chrono::milliseconds;
using namespace mesh_testing;  // NOLINT: the tests' shared wire helpers

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A peer of the test's own, in the clear or over TLS (blocking), with or without a
// client certificate.
class Peer {
 public:
  ~Peer() {
    if (ssl_) SSL_free(ssl_);
    if (ctx_) SSL_CTX_free(ctx_);
    if (fd_ >= 0) close(fd_);
  }
  bool Open(int port, const std::string& dir, const std::string& cert, bool tls) {
    fd_ = Dial(port);
    if (fd_ < 0 || !tls) return fd_ >= 0;
    ctx_ = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(ctx_, (dir + "/ca.pem").c_str(), nullptr);
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
    if (!cert.empty()) {
      SSL_CTX_use_certificate_file(ctx_, (dir + "/" + cert + ".pem").c_str(), SSL_FILETYPE_PEM);
      SSL_CTX_use_PrivateKey_file(ctx_, (dir + "/" + cert + ".key").c_str(), SSL_FILETYPE_PEM);
    }
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    // TLS 1.3: the client's side of the handshake ends before the server has checked the
    // client's certificate, so a refused client still gets to send its hello.
    return SSL_connect(ssl_) == 1;
  }
  bool Send(const std::string& bytes) {
    if (!ssl_) return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size());
    return SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size())) ==
           static_cast<int>(bytes.size());
  }
  std::string Recv(size_t n) {
    std::string got(n, '\0');
    size_t have = 0;
    while (have < n) {
      const int k = ssl_ ? SSL_read(ssl_, got.data() + have, static_cast<int>(n - have))
                         : static_cast<int>(recv(fd_, got.data() + have, n - have, 0));
      if (k <= 0) break;
      have += static_cast<size_t>(k);
    }
    ERR_clear_error();
    got.resize(have);
    return got;
  }

 private:
  int fd_ = -1;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
};

class MeshTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/mesh_tls_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    // node: signed by ca for 127.0.0.1; elsewhere: signed by ca for another host only;
    // rogue: signed by another CA.
    const std::string script = "set -e; cd '" + *dir_ + R"(';
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
ca() { key "$1.key"; openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$1"; }
cert() {  # name, CA, subjectAltName
  key "$1.key"; openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1"
  printf "subjectAltName=%s\n" "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" \
    -days 2 -extfile "$1.ext" 2>/dev/null
}
ca ca; ca other_ca
cert node ca IP:127.0.0.1,DNS:localhost
cert elsewhere ca DNS:elsewhere.invalid
cert rogue other_ca IP:127.0.0.1,DNS:localhost
)";
    std::ofstream(*dir_ + "/make.sh") << script;
    ASSERT_EQ(std::system(("bash '" + *dir_ + "/make.sh' > '" + *dir_ + "/make.log' 2>&1").c_str()),
              0)
        << Slurp(*dir_ + "/make.log");
  }
  static void TearDownTestSuite() {
    std::system(("rm -rf '" + *dir_ + "'").c_str());
    delete dir_;
  }

  // The mesh's TLS from certificate `name` (signed for 127.0.0.1 unless told otherwise).
  static std::shared_ptr<const mesh::Tls> Creds(const std::string& name, bool mutual = true) {
    auto made =
        mesh::Tls::Make({Slurp(*dir_ + "/" + name + ".pem"), Slurp(*dir_ + "/" + name + ".key"),
                         Slurp(*dir_ + "/ca.pem"), mutual});
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? *made : nullptr;
  }

  static std::unique_ptr<ReplicaMesh> Listen(int replica, int replicas,
                                             std::shared_ptr<const mesh::Tls> tls) {
    auto m = ReplicaMesh::Listen("127.0.0.1", replica, replicas, "stage 1", std::move(tls));
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }

  static std::string* dir_;
};

std::string* MeshTls::dir_ = nullptr;

// Every mesh connects to the others with `published`, in threads; returns their statuses.
std::vector<absl::Status> ConnectAll(const std::vector<ReplicaMesh*>& meshes,
                                     const std::vector<std::string>& published, int ms) {
  std::vector<absl::Status> out(meshes.size());
  std::vector<std::thread> t;
  for (size_t r = 0; r < meshes.size(); ++r) {
    t.emplace_back([&, r] { out[r] = meshes[r]->Connect(published, milliseconds(ms)); });
  }
  for (auto& x : t) x.join();
  return out;
}

// Every mesh sums its replica's `in` in replica order; returns each replica's sum.
std::vector<std::vector<float>> ReduceAll(const std::vector<ReplicaMesh*>& meshes,
                                          const std::vector<std::vector<float>>& in) {
  std::vector<std::vector<float>> sums(meshes.size(), std::vector<float>(in[0].size()));
  std::vector<std::thread> t;
  for (size_t r = 0; r < meshes.size(); ++r) {
    t.emplace_back([&, r] {
      NonFiniteParts bad;
      absl::Status s = meshes[r]->AllReduce(in[r].data(), static_cast<int64_t>(in[r].size()),
                                            sums[r].data(), &bad, milliseconds(10000));
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(bad.replica, -1);
    });
  }
  for (auto& x : t) x.join();
  return sums;
}

TEST_F(MeshTls, ThreeReplicasReduceUnderMutualTlsExactlyAsInTheClear) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> in(3, std::vector<float>(10007));
  for (auto& v : in)
    for (float& x : v) x = normal(rng);
  std::vector<std::vector<float>> sums[2];
  int64_t sent[2];
  for (int tls = 0; tls < 2; ++tls) {
    std::vector<std::unique_ptr<ReplicaMesh>> m;
    for (int r = 0; r < 3; ++r) m.push_back(Listen(r, 3, tls ? Creds("node") : nullptr));
    std::vector<ReplicaMesh*> raw = {m[0].get(), m[1].get(), m[2].get()};
    for (const absl::Status& s :
         ConnectAll(raw, {m[0]->published(), m[1]->published(), m[2]->published()}, 15000)) {
      ASSERT_TRUE(s.ok()) << s;
    }
    sums[tls] = ReduceAll(raw, in);
    sums[tls] = ReduceAll(raw, in);  // a second exchange on the same connections
    sent[tls] = m[1]->bytes_sent();
  }
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(0, std::memcmp(sums[0][r].data(), sums[1][r].data(), 10007 * sizeof(float)));
  }
  EXPECT_EQ(sent[0], sent[1]) << "the frames are the same; TLS's own bytes are not counted";
}

// A reduction of bfloat16 pairs (DiLoCo's --sync_bf16), here under TLS: each element is the
// replicas' values added in float32 in replica order and rounded to bfloat16; a NaN in
// replica 2's part is named with its element index.
TEST_F(MeshTls, Bf16PairsAreAddedAsFloatsInReplicaOrderAndTheSumRounded) {
  const int64_t words = 1001, elements = 2 * words;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> values(3, std::vector<float>(elements));
  std::vector<std::vector<float>> in(3, std::vector<float>(words));
  for (int r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < elements; ++i) values[r][i] = normal(rng) * (r + 1);
    for (int64_t i = 0; i < words; ++i) {
      const uint32_t w = FloatToBf16(values[r][2 * i]) |
                         (static_cast<uint32_t>(FloatToBf16(values[r][2 * i + 1])) << 16);
      std::memcpy(&in[r][i], &w, 4);
    }
  }
  std::vector<std::unique_ptr<ReplicaMesh>> m;
  for (int r = 0; r < 3; ++r) m.push_back(Listen(r, 3, Creds("node")));
  std::vector<ReplicaMesh*> raw = {m[0].get(), m[1].get(), m[2].get()};
  for (const absl::Status& s :
       ConnectAll(raw, {m[0]->published(), m[1]->published(), m[2]->published()}, 15000)) {
    ASSERT_TRUE(s.ok()) << s;
  }
  auto reduce = [&](std::vector<NonFiniteParts>* bad) {
    std::vector<std::vector<float>> sums(3, std::vector<float>(words));
    std::vector<std::thread> t;
    for (int r = 0; r < 3; ++r) {
      t.emplace_back([&, r] {
        absl::Status s = raw[r]->AllReduce(in[r].data(), words, sums[r].data(), &(*bad)[r],
                                           milliseconds(10000), ReduceFormat::kBf16Pairs);
        EXPECT_TRUE(s.ok()) << s;
      });
    }
    for (auto& x : t) x.join();
    return sums;
  };
  std::vector<NonFiniteParts> bad(3);
  auto sums = reduce(&bad);
  int rounded = 0;
  for (int64_t i = 0; i < elements; ++i) {
    const float exact =
        (Bf16ToFloat(FloatToBf16(values[0][i])) + Bf16ToFloat(FloatToBf16(values[1][i]))) +
        Bf16ToFloat(FloatToBf16(values[2][i]));
    uint32_t w;
    std::memcpy(&w, &sums[0][i / 2], 4);
    const uint16_t got = static_cast<uint16_t>(i % 2 == 0 ? w & 0xffffu : w >> 16);
    ASSERT_EQ(got, FloatToBf16(exact)) << i;
    rounded += Bf16ToFloat(got) != exact;
  }
  EXPECT_GT(rounded, 0);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(bad[r].replica, -1);
    EXPECT_EQ(std::memcmp(sums[r].data(), sums[0].data(), words * 4), 0) << r;
  }
  // A NaN as replica 2's element 1501 (the high half of word 750).
  uint32_t w;
  std::memcpy(&w, &in[2][750], 4);
  w = (w & 0xffffu) | (uint32_t{0x7fc0} << 16);
  std::memcpy(&in[2][750], &w, 4);
  reduce(&bad);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(bad[r].replica, 2) << r;
    EXPECT_EQ(bad[r].count, 1) << r;
    EXPECT_EQ(bad[r].first, 1501) << r;
  }
}

TEST_F(MeshTls, StrangersWithoutTheClustersCertificateAreRefusedBeforeAnythingTheySendIsRead) {
  auto a = Listen(0, 2, Creds("node")), b = Listen(1, 2, Creds("node"));
  ASSERT_TRUE(a && b);
  const std::vector<std::string> published = {a->published(), b->published()};
  const int port = PortOf(published[0]);
  // Each knows replica 0's secret and sends the hello replica 1 would: in the clear, over
  // TLS without a certificate, with one from another CA. The last has the cluster's
  // certificate but not the secret.
  const std::string right = Hello(1, 0, 2, SecretOf(published[0]));
  Peer clear, bare, rogue, guesser;
  absl::Status sa, sb;
  std::thread ta([&] { sa = a->Connect(published, milliseconds(15000)); });
  // While replica 0 waits for replica 1 (a TLS handshake needs the mesh to answer).
  std::thread strangers([&] {
    EXPECT_TRUE(clear.Open(port, *dir_, "", false));
    EXPECT_TRUE(clear.Send(right));
    bare.Open(port, *dir_, "", true);
    bare.Send(right);
    rogue.Open(port, *dir_, "rogue", true);
    rogue.Send(right);
    EXPECT_TRUE(guesser.Open(port, *dir_, "node", true));
    EXPECT_TRUE(guesser.Send(Hello(1, 0, 2, std::string(32, 'x'))));
  });
  strangers.join();
  std::this_thread::sleep_for(milliseconds(300));  // the strangers are seen first
  std::thread tb([&] { sb = b->Connect(published, milliseconds(15000)); });
  ta.join();
  tb.join();
  ASSERT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.ok()) << sb;
  EXPECT_EQ(a->refused(), 4);
  for (Peer* p : {&clear, &bare, &rogue, &guesser}) {
    EXPECT_EQ(p->Recv(64).find("LPMESHOK"), std::string::npos) << "no stranger is answered";
  }
  std::vector<ReplicaMesh*> raw = {a.get(), b.get()};
  auto sums = ReduceAll(raw, {{1.5f, 2.0f, 3.0f}, {-1.0f, 0.5f, 4.0f}});
  EXPECT_EQ(sums[0], (std::vector<float>{0.5f, 2.5f, 7.0f}));
  EXPECT_EQ(sums[1], sums[0]);
}

TEST_F(MeshTls, AReplicaWhoseCertificateDoesNotChainOrNameItsHostIsNotJoined) {
  for (const char* name : {"rogue", "elsewhere"}) {
    // Replica 0 serves this certificate; replica 1 checks it against ca.pem for 127.0.0.1.
    auto a = Listen(0, 2, Creds(name)), b = Listen(1, 2, Creds("node"));
    ASSERT_TRUE(a && b);
    std::vector<ReplicaMesh*> raw = {a.get(), b.get()};
    auto s = ConnectAll(raw, {a->published(), b->published()}, 1500);
    EXPECT_FALSE(s[1].ok());
    EXPECT_NE(s[1].message().find("replica(s) 0 of stage 1 did not connect to replica 1"),
              std::string::npos)
        << s[1];
    EXPECT_NE(s[1].message().find("certificate verify failed"), std::string::npos) << s[1];
    EXPECT_FALSE(s[0].ok()) << name;
    EXPECT_GE(a->refused(), 1) << name;
  }
}

// Replica 0 of two over mutual TLS, joined by a hand-made replica 1 holding the cluster's
// certificate.
bool JoinByHand(ReplicaMesh& mesh, Peer& peer, const std::string& dir) {
  const std::vector<std::string> published = {mesh.published(),
                                              "127.0.0.1 1 " + std::string(64, 'a')};
  absl::Status joined;
  std::thread t([&] { joined = mesh.Connect(published, milliseconds(10000)); });
  const bool open = peer.Open(PortOf(published[0]), dir, "node", true) &&
                    peer.Send(Hello(1, 0, 2, SecretOf(published[0]))) &&
                    peer.Recv(64).substr(0, 8) == "LPMESHOK";
  t.join();
  EXPECT_TRUE(joined.ok()) << joined;
  return open && joined.ok();
}

TEST_F(MeshTls, AReplicaOverTlsThatSendsAWrongFrameOrVerdictOrClosesIsNamed) {
  auto floats = [](std::initializer_list<float> v) {
    return std::string(reinterpret_cast<const char*>(v.begin()), v.size() * sizeof(float));
  };
  std::vector<float> in(4, 1.0f), sum(4);
  NonFiniteParts bad;
  {
    auto a = Listen(0, 2, Creds("node"));
    Peer p;
    ASSERT_TRUE(JoinByHand(*a, p, *dir_));
    p.Send(std::string("LPBUCKET") + U64(0) + U64(uint64_t{1} << 40));
    absl::Status s = a->AllReduce(in.data(), 4, sum.data(), &bad, milliseconds(5000));
    EXPECT_NE(s.message().find("replica 1 sent a frame that is not this gather's bucket (gather 0 "
                               "of 1099511627776 floats where gather 0 of 2 was due)"),
              std::string::npos)
        << s;
  }
  {
    auto a = Listen(0, 2, Creds("node"));
    Peer p;
    ASSERT_TRUE(JoinByHand(*a, p, *dir_));
    p.Send(std::string("LPBUCKET") + U64(0) + U64(2) + floats({1, 2}));
    p.Send(std::string("LPBUCKET") + U64(1) + U64(2 + 8) + floats({3, 4}) + U64(5) + U64(2) +
           U64(0) + U64(~uint64_t{0}));
    absl::Status s = a->AllReduce(in.data(), 4, sum.data(), &bad, milliseconds(5000));
    EXPECT_NE(s.message().find("replica 1 sent a verdict that does not fit its chunk (5 "
                               "non-finite values of 2)"),
              std::string::npos)
        << s;
  }
  {
    auto a = Listen(0, 2, Creds("node"));
    auto p = std::make_unique<Peer>();
    ASSERT_TRUE(JoinByHand(*a, *p, *dir_));
    p->Send(std::string("LPBUCKET") + U64(0));  // half a header, then gone
    p.reset();
    absl::Status s = a->AllReduce(in.data(), 4, sum.data(), &bad, milliseconds(5000));
    EXPECT_NE(s.message().find("replica 1 closed its connection"), std::string::npos) << s;
  }
}

// Relays one connection from `port` to `to`, recording every byte both ways, until both
// ends close.
class Relay {
 public:
  explicit Relay(int to) {
    lfd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(lfd_, 1);
    getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, to] {
      int c = accept(lfd_, nullptr, nullptr), d = Dial(to);
      pollfd p[2] = {{c, POLLIN, 0}, {d, POLLIN, 0}};
      char buf[1 << 16];
      while (poll(p, 2, 5000) > 0) {
        bool done = false;
        for (int i = 0; i < 2; ++i) {
          if (!p[i].revents) continue;
          ssize_t k = recv(p[i].fd, buf, sizeof(buf), 0);
          if (k <= 0) done = true;
          if (k > 0) {
            seen_.append(buf, static_cast<size_t>(k));
            send(p[1 - i].fd, buf, static_cast<size_t>(k), MSG_NOSIGNAL);
          }
        }
        if (done) break;
      }
      close(c);
      close(d);
    });
  }
  ~Relay() {
    shutdown(lfd_, SHUT_RDWR);
    close(lfd_);
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }
  // What crossed, once both ends closed.
  const std::string& seen() {
    thread_.join();
    return seen_;
  }

 private:
  int lfd_ = -1, port_ = 0;
  std::thread thread_;
  std::string seen_;
};

TEST_F(MeshTls, NothingOfTheHelloTheFramingOrTheGradientsCrossesInTheClear) {
  std::vector<std::vector<float>> in = {std::vector<float>(4096), std::vector<float>(4096)};
  for (size_t i = 0; i < 4096; ++i) {
    in[0][i] = 0.25f * static_cast<float>(i) + 1.0f;
    in[1][i] = -0.5f * static_cast<float>(i) - 3.0f;
  }
  for (int tls = 0; tls < 2; ++tls) {
    auto a = Listen(0, 2, tls ? Creds("node") : nullptr);
    auto b = Listen(1, 2, tls ? Creds("node") : nullptr);
    Relay relay(PortOf(a->published()));
    // Replica 1 reaches replica 0 through the relay.
    std::string via = a->published();
    via.replace(via.find(' ') + 1, std::to_string(PortOf(via)).size(),
                std::to_string(relay.port()));
    absl::Status sa, sb;
    std::thread ta([&] { sa = a->Connect({a->published(), b->published()}, milliseconds(10000)); });
    sb = b->Connect({via, b->published()}, milliseconds(10000));
    ta.join();
    ASSERT_TRUE(sa.ok() && sb.ok()) << sa << " " << sb;
    std::vector<ReplicaMesh*> raw = {a.get(), b.get()};
    auto sums = ReduceAll(raw, in);
    a->Close();
    b->Close();
    const std::string& seen = relay.seen();
    // Replica 0 owns chunk [0, 2048) and sends its part of [2048, 4096); replica 1 the other
    // way round; each chunk's sum goes to the other replica.
    const std::string part0(reinterpret_cast<const char*>(in[0].data() + 3000), 64);
    const std::string part1(reinterpret_cast<const char*>(in[1].data() + 100), 64);
    const std::string sum(reinterpret_cast<const char*>(sums[0].data() + 50), 64);
    const bool clear = tls == 0;
    EXPECT_GT(seen.size(), 4096u * 4) << "the relay carried the exchange";
    for (const std::string& needle :
         {std::string("LPMESH01"), std::string("LPMESHOK"), std::string("LPBUCKET"),
          SecretOf(a->published()), part0, part1, sum}) {
      EXPECT_EQ(seen.find(needle) != std::string::npos, clear)
          << (clear ? "in the clear the relay sees it" : "under TLS the relay must not see it");
    }
  }
}

}  // namespace
}  // namespace localpar
