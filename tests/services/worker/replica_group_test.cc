// The replicas' rendezvous and exchange, real parts only: the coordinator's Rendezvous
// service on a gRPC server on loopback, and the replicas' TCP mesh between ReplicaGroups in
// threads. Gathered buckets arrive in replica order; a replica that never joins is named
// within the timeout; two workers claiming one replica are refused.
#include "services/worker/replica_group.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <limits>
#include <thread>
#include <vector>

#include "common/nn/replica_sync.h"
#include "services/coordinator/rendezvous_service.h"

namespace localpar {
namespace {

class Rendezvous : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_ && port_ > 0);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }
  ReplicaGroupOptions Options(int replica, int replicas, int timeout_ms = 20000) const {
    ReplicaGroupOptions o;
    o.rendezvous = "127.0.0.1:" + std::to_string(port_);
    o.group = "test";
    o.stage = 1;
    o.replica = replica;
    o.replicas = replicas;
    o.host = "127.0.0.1";
    o.timeout = std::chrono::milliseconds(timeout_ms);
    return o;
  }

  SecurityOptions security_;
  RendezvousService service_{security_};
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(Rendezvous, ThreeReplicasGatherEveryBucketInReplicaOrderStepAfterStep) {
  constexpr int kReplicas = 3;
  constexpr int64_t kN = 100000;  // more than a socket buffer
  std::vector<std::vector<float>> got(kReplicas);
  std::vector<absl::Status> status(kReplicas);
  std::vector<std::thread> threads;
  for (int r = 0; r < kReplicas; ++r) {
    threads.emplace_back([&, r] {
      ReplicaGroup g(Options(r, kReplicas), security_);
      std::vector<float> in(kN);
      got[r].assign(kN * kReplicas, -1.0f);
      for (int step = 0; step < 3 && status[r].ok(); ++step) {
        for (int64_t i = 0; i < kN; ++i) in[i] = static_cast<float>(step * 1000 + r * 10) + i;
        status[r] = g.AllGather(in.data(), kN, got[r].data());
      }
      EXPECT_GT(g.seconds(), 0);
      // Each gather sends the bucket and a 24-byte frame header to each other replica.
      EXPECT_EQ(g.bytes_sent(), 3 * (kN * 4 + 24) * (kReplicas - 1));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kReplicas; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    for (int from = 0; from < kReplicas; ++from) {
      for (int64_t i : {int64_t{0}, int64_t{777}, kN - 1}) {
        EXPECT_EQ(got[r][from * kN + i], static_cast<float>(2000 + from * 10) + i)
            << "replica " << r << " reading replica " << from << "'s element " << i;
      }
    }
  }
}

// The reduce-scatter and all-gather: every replica ends with the sum SumInReplicaOrder
// computes over the gathered buckets (bit for bit: the values are chosen so that the order
// of the additions shows), sends 2 (R - 1) / R of the bucket plus headers and verdicts, and
// every replica names the same replica for a NaN or an infinity, with the same count and
// first index.
TEST_F(Rendezvous, ThreeReplicasSumInReplicaOrderSendingTwoThirdsOfTheBucket) {
  constexpr int kReplicas = 3;
  constexpr int64_t kN = 100001;  // chunks of 33334, 33334 and 33333 floats
  std::vector<std::vector<float>> in(kReplicas, std::vector<float>(kN));
  for (int r = 0; r < kReplicas; ++r) {
    for (int64_t i = 0; i < kN; ++i) {
      in[r][i] = (r == 1 ? -1e8f : 1e8f) * static_cast<float>(i % 3) + 0.37f * r + 1e-3f * i;
    }
  }
  std::vector<float> gathered;
  for (int r = 0; r < kReplicas; ++r) gathered.insert(gathered.end(), in[r].begin(), in[r].end());
  std::vector<float> want(kN);
  SumInReplicaOrder(gathered.data(), kReplicas, kN, want.data());
  std::vector<std::vector<float>> got(kReplicas, std::vector<float>(kN, -1.0f));
  std::vector<NonFiniteParts> clean(kReplicas), dirty(kReplicas);
  std::vector<absl::Status> status(kReplicas);
  std::vector<int64_t> bytes(kReplicas);
  std::vector<std::thread> threads;
  for (int r = 0; r < kReplicas; ++r) {
    threads.emplace_back([&, r] {
      ReplicaGroup g(Options(r, kReplicas), security_);
      status[r] = g.AllReduce(in[r].data(), kN, got[r].data(), &clean[r]);
      bytes[r] = g.bytes_sent();
      std::vector<float> bad = in[r];
      if (r == 2) {
        bad[5] = std::numeric_limits<float>::quiet_NaN();
        bad[70000] = std::numeric_limits<float>::infinity();
      }
      if (r == 1) bad[90000] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> ignored(kN);
      if (status[r].ok()) status[r] = g.AllReduce(bad.data(), kN, ignored.data(), &dirty[r]);
    });
  }
  for (auto& t : threads) t.join();
  const int64_t chunk[] = {33334, 33334, 33333};
  for (int r = 0; r < kReplicas; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r], want) << "replica " << r;
    EXPECT_EQ(clean[r].replica, -1);
    // Out: the other two chunks (and a header each), then this chunk's sum and three
    // 16-byte verdicts to each of the two others (and a header each).
    const int64_t others = (kN - chunk[r]) * 4 + 2 * 24;
    const int64_t sums = 2 * (chunk[r] * 4 + 3 * 16 + 24);
    EXPECT_EQ(bytes[r], others + sums) << "replica " << r;
    EXPECT_NEAR(static_cast<double>(bytes[r]) / (kN * 4), 2.0 * (kReplicas - 1) / kReplicas, 1e-3);
    // Replica 1 comes first in replica order: its one NaN, at 90000.
    EXPECT_EQ(dirty[r].replica, 1) << "replica " << r;
    EXPECT_EQ(dirty[r].count, 1);
    EXPECT_EQ(dirty[r].first, 90000);
  }
}

TEST_F(Rendezvous, AReplicaThatNeverJoinsIsNamedWithinTheTimeout) {
  ReplicaGroup g(Options(0, 2, 1500), security_);
  std::vector<float> in(8, 1.0f), out(16);
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = g.AllGather(in.data(), 8, out.data());
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("replica(s) 1 of stage 1 did not join within 1.5 s"),
            std::string::npos)
      << s;
  EXPECT_LT(took, 10.0);
  // Once failed, it stays failed without waiting again.
  EXPECT_EQ(g.AllGather(in.data(), 8, out.data()), s);
}

TEST_F(Rendezvous, TwoWorkersClaimingTheSameReplicaAreRefused) {
  absl::Status first, second;
  std::thread a([&] {
    ReplicaGroup g(Options(0, 2, 3000), security_);
    std::vector<float> in(4), out(8);
    first = g.AllGather(in.data(), 4, out.data());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ReplicaGroup g(Options(0, 2, 3000), security_);
  std::vector<float> in(4), out(8);
  second = g.AllGather(in.data(), 4, out.data());
  a.join();
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.message().find("two workers were configured as the same replica"),
            std::string::npos)
      << second;
  EXPECT_FALSE(first.ok()) << "replica 1 never came";
}

TEST_F(Rendezvous, TheStoreRefusesOversizedKeysValuesAndWaits) {
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                          grpc::InsecureChannelCredentials()));
  auto set = [&](const std::string& key, size_t value_bytes) {
    grpc::ClientContext ctx;
    v1::StoreSetRequest req;
    req.set_key(key);
    req.set_value(std::string(value_bytes, 'v'));
    v1::StoreSetResponse resp;
    return stub->Set(&ctx, req, &resp);
  };
  EXPECT_EQ(set(std::string(300, 'k'), 1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(set("", 1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(set("k", 100 << 10).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(set("k", 10).ok());
  EXPECT_TRUE(set("k", 10).ok()) << "the same value again is a retry";
  EXPECT_EQ(set("k", 11).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  grpc::ClientContext ctx;
  v1::StoreGetRequest req;
  req.add_keys("k");
  req.add_keys("missing");
  req.set_timeout_ms(200);
  v1::StoreGetResponse resp;
  grpc::Status st = stub->Get(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(st.error_message().find("missing"), std::string::npos) << st.error_message();
  grpc::ClientContext ctx2;
  req.set_timeout_ms(-1);
  EXPECT_EQ(stub->Get(&ctx2, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  service_.Clear();
  EXPECT_TRUE(set("k", 11).ok()) << "a new configuration starts from an empty store";
}

}  // namespace
}  // namespace localpar
