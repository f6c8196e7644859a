// The replicas' TCP mesh against strangers and malformed peers, with real sockets on
// loopback. A stranger on the collective port while the replicas join (Gloo's 48-byte
// preamble, a hello with a wrong secret, a silent connection) is closed and counted and the
// replicas still connect; once joined, the port refuses connections. A peer that proves
// itself and then sends a wrong frame, closes, or says nothing ends the gather with an error
// naming it, and the process goes on.
#include "services/worker/replica_mesh.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "tests/services/worker/mesh_test_util.h"

namespace localpar {
namespace {

using std::chrono::milliseconds;
using namespace mesh_testing;  // NOLINT: the tests' shared wire helpers

void SendAll(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

std::string RecvN(int fd, size_t n) {
  std::string got(n, '\0');
  size_t have = 0;
  while (have < n) {
    ssize_t k = recv(fd, got.data() + have, n - have, 0);
    if (k <= 0) break;
    have += static_cast<size_t>(k);
  }
  got.resize(have);
  return got;
}

std::unique_ptr<ReplicaMesh> Listen(int replica, int replicas) {
  absl::StatusOr<std::unique_ptr<ReplicaMesh>> m =
      ReplicaMesh::Listen("127.0.0.1", replica, replicas, "stage 1");
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

TEST(ReplicaMesh, StrangersWhileJoiningAreClosedAndTheReplicasStillGather) {
  auto a = Listen(0, 2), b = Listen(1, 2);
  ASSERT_TRUE(a && b);
  const std::vector<std::string> published = {a->published(), b->published()};
  const int port = PortOf(published[0]);
  // Before replica 1 connects: a Gloo preamble (48 bytes, an unknown slot), a hello with
  // a wrong secret, a hello claiming replica 0 itself, and a connection that says nothing.
  std::vector<int> strangers;
  strangers.push_back(Dial(port));
  SendAll(strangers.back(), std::string(48, '\x07'));
  strangers.push_back(Dial(port));
  SendAll(strangers.back(), Hello(1, 0, 2, std::string(32, 'x')));
  strangers.push_back(Dial(port));
  SendAll(strangers.back(), Hello(0, 0, 2, SecretOf(published[0])));
  strangers.push_back(Dial(port));
  for (int fd : strangers) ASSERT_GE(fd, 0);

  absl::Status sa, sb;
  std::thread ta([&] { sa = a->Connect(published, milliseconds(15000)); });
  std::this_thread::sleep_for(milliseconds(200));  // the strangers are seen first
  std::thread tb([&] { sb = b->Connect(published, milliseconds(15000)); });
  ta.join();
  tb.join();
  ASSERT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.ok()) << sb;
  // The three that spoke were refused at once; the silent one when joining ended.
  EXPECT_EQ(a->refused(), 4);
  for (int fd : strangers) {
    char c;
    EXPECT_LE(recv(fd, &c, 1, 0), 0) << "a stranger's connection is closed";
    close(fd);
  }
  EXPECT_EQ(Dial(port), -1) << "once joined, the collective port takes no connections";

  std::vector<float> ia(1000, 1.5f), ib(1000, -2.0f), oa(2000), ob(2000);
  std::thread ga([&] { sa = a->AllGather(ia.data(), 1000, oa.data(), milliseconds(10000)); });
  sb = b->AllGather(ib.data(), 1000, ob.data(), milliseconds(10000));
  ga.join();
  ASSERT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.ok()) << sb;
  EXPECT_EQ(oa, ob);
  EXPECT_EQ(oa[0], 1.5f);
  EXPECT_EQ(oa[1999], -2.0f);
}

// Replica 0 of two, joined by a hand-made replica 1 on a plain socket; returns its fd, or
// -1 (with a test failure) if joining failed.
int JoinByHand(ReplicaMesh& mesh) {
  const std::string mine = "127.0.0.1 1 " + std::string(64, 'a');  // replica 1 never listens
  const std::vector<std::string> published = {mesh.published(), mine};
  absl::Status joined;
  std::thread t([&] { joined = mesh.Connect(published, milliseconds(10000)); });
  int fd = Dial(PortOf(published[0]));
  SendAll(fd, Hello(1, 0, 2, SecretOf(published[0])));
  const std::string answer = RecvN(fd, 64);
  EXPECT_EQ(answer.substr(0, 8), "LPMESHOK");
  EXPECT_EQ(answer.substr(24, 32), std::string(32, '\xaa')) << "the answer proves replica 0";
  t.join();
  EXPECT_TRUE(joined.ok()) << joined;
  if (!joined.ok()) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(ReplicaMesh, AFrameThatIsNotTheBucketEndsTheGatherNamingTheReplica) {
  auto a = Listen(0, 2);
  int fd = JoinByHand(*a);
  ASSERT_GE(fd, 0);
  // Gather 0 is due with 4 floats; replica 1 announces 1 << 40 floats instead.
  SendAll(fd, std::string("LPBUCKET") + U64(0) + U64(uint64_t{1} << 40));
  std::vector<float> in(4, 1.0f), out(8);
  absl::Status s = a->AllGather(in.data(), 4, out.data(), milliseconds(5000));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("replica 1 sent a frame that is not this gather's bucket (gather 0 "
                             "of 1099511627776 floats where gather 0 of 4 was due)"),
            std::string::npos)
      << s;
  // The mesh stays failed, and says so at once.
  EXPECT_EQ(a->AllGather(in.data(), 4, out.data(), milliseconds(5000)), s);
  close(fd);
}

// The reduction trusts no verdict a peer sends on its chunk: one claiming more non-finite
// values than the chunk holds ends the reduction naming that replica, and the mesh stays
// failed. A first frame of the wrong size is refused as in a gather.
TEST(ReplicaMesh, AReductionRefusesAVerdictThatDoesNotFitTheChunkOrAFrameOfTheWrongSize) {
  auto floats = [](std::initializer_list<float> v) {
    return std::string(reinterpret_cast<const char*>(v.begin()), v.size() * sizeof(float));
  };
  {
    auto a = Listen(0, 2);
    int fd = JoinByHand(*a);
    ASSERT_GE(fd, 0);
    // 4 floats: replica 0 owns [0, 2), replica 1 [2, 4). Replica 1's part of chunk 0, then
    // chunk 1's sum with two verdicts, the first claiming 5 non-finite values of 2.
    SendAll(fd, std::string("LPBUCKET") + U64(0) + U64(2) + floats({1, 2}));
    SendAll(fd, std::string("LPBUCKET") + U64(1) + U64(2 + 8) + floats({3, 4}) + U64(5) + U64(2) +
                    U64(0) + U64(~uint64_t{0}));
    std::vector<float> in(4, 1.0f), sum(4);
    NonFiniteParts bad;
    absl::Status s = a->AllReduce(in.data(), 4, sum.data(), &bad, milliseconds(5000));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("replica 1 sent a verdict that does not fit its chunk (5 "
                               "non-finite values of 2)"),
              std::string::npos)
        << s;
    EXPECT_EQ(a->AllReduce(in.data(), 4, sum.data(), &bad, milliseconds(5000)), s);
    close(fd);
  }
  {
    auto a = Listen(0, 2);
    int fd = JoinByHand(*a);
    ASSERT_GE(fd, 0);
    SendAll(fd, std::string("LPBUCKET") + U64(0) + U64(4) + floats({1, 2, 3, 4}));
    std::vector<float> in(4, 1.0f), sum(4);
    NonFiniteParts bad;
    absl::Status s = a->AllReduce(in.data(), 4, sum.data(), &bad, milliseconds(5000));
    EXPECT_NE(s.message().find("replica 1 sent a frame that is not this gather's bucket (gather 0 "
                               "of 4 floats where gather 0 of 2 was due)"),
              std::string::npos)
        << s;
    close(fd);
  }
}

TEST(ReplicaMesh, APeerThatClosesOrSaysNothingIsNamed) {
  {
    auto a = Listen(0, 2);
    int fd = JoinByHand(*a);
    ASSERT_GE(fd, 0);
    SendAll(fd, std::string("LPBUCKET") + U64(0));  // half a header, then gone
    close(fd);
    std::vector<float> in(4, 1.0f), out(8);
    absl::Status s = a->AllGather(in.data(), 4, out.data(), milliseconds(5000));
    EXPECT_NE(s.message().find("replica 1 closed its connection"), std::string::npos) << s;
  }
  {
    auto a = Listen(0, 2);
    int fd = JoinByHand(*a);
    ASSERT_GE(fd, 0);
    std::vector<float> in(4, 1.0f), out(8);
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = a->AllGather(in.data(), 4, out.data(), milliseconds(500));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_NE(s.message().find("replica(s) 1 did not complete the gather within 0.5 s"),
              std::string::npos)
        << s;
    close(fd);
  }
}

TEST(ReplicaMesh, AnAddressThatAnswersAsSomeoneElseIsNotAReplica) {
  // Replica 1 connects to "replica 0", which is a socket answering with the wrong secret.
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(lfd, 8), 0);
  ASSERT_EQ(getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::thread fake([lfd] {
    for (int i = 0; i < 100; ++i) {
      int c = accept(lfd, nullptr, nullptr);
      if (c < 0) return;
      RecvN(c, 64);
      const std::string wrong = Hello(0, 1, 2, std::string(32, 'z'), "LPMESHOK");
      send(c, wrong.data(), wrong.size(), MSG_NOSIGNAL);
      close(c);
    }
  });
  auto b = Listen(1, 2);
  const std::vector<std::string> published = {
      "127.0.0.1 " + std::to_string(ntohs(addr.sin_port)) + " " + std::string(64, 'b'),
      b->published()};
  absl::Status s = b->Connect(published, milliseconds(1000));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("replica(s) 0 of stage 1 did not connect to replica 1 within 1 s"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("answered the hello, but not as replica 0 of this configuration"),
            std::string::npos)
      << s;
  shutdown(lfd, SHUT_RDWR);
  close(lfd);
  fake.join();
}

TEST(ReplicaMesh, APublishedAddressIsCheckedBeforeUse) {
  auto a = Listen(0, 2);
  absl::Status s = a->Connect({a->published(), "host\x1b[2J 99999 zz"}, milliseconds(1000));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("replica 1 of stage 1 published a collective address"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.message().find('\x1b'), std::string::npos) << "peer text is sanitized";
}

}  // namespace
}  // namespace localpar
