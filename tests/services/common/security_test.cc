// TLS, mutual TLS and control-RPC tokens, against a real worker process with certificates
// generated here by openssl: a plaintext client, a client that trusts another CA, a client
// without a certificate and a client with a certificate from another CA are all refused; a
// control RPC without the token is UNAUTHENTICATED; a whole run works encrypted.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/job/parse.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/grpc_util.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::ReadFile;
using testing::RunProcess;

class Security : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    // Two CAs; node.pem (signed by ca) serves and also acts as the client certificate;
    // rogue.pem is signed by the other CA.
    std::string script = R"(set -e
cd ")" + dir_->path() + R"("
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
key ca.key; openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj "/CN=localpar test CA"
key other_ca.key; openssl req -x509 -new -key other_ca.key -out other_ca.pem -days 2 -subj "/CN=other CA"
printf "subjectAltName=IP:127.0.0.1,DNS:localhost\n" > san.ext
key node.key; openssl req -new -key node.key -out node.csr -subj "/CN=localhost"
openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem -days 2 -extfile san.ext 2>/dev/null
key rogue.key; openssl req -new -key rogue.key -out rogue.csr -subj "/CN=localhost"
openssl x509 -req -in rogue.csr -CA other_ca.pem -CAkey other_ca.key -CAcreateserial -out rogue.pem -days 2 -extfile san.ext 2>/dev/null
echo "s3cret-token" > token
)";
    auto r = RunProcess({"/bin/bash", "-c", script}, 60);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    std::string pf = dir_->path() + "/port";
    std::filesystem::remove(pf);
    worker_ = testing::StartProcess(
        {testing::BinDir() + "/localpar_worker", "--port_file=" + pf, "--tls_cert=" + F("node.pem"),
         "--tls_key=" + F("node.key"), "--tls_ca=" + F("ca.pem"), "--mtls",
         "--auth_token_file=" + F("token")},
        dir_->path() + "/worker.log");
    for (int i = 0; i < 500 && port_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::ifstream(pf) >> port_;
    }
    ASSERT_GT(port_, 0) << ReadFile(dir_->path() + "/worker.log");
  }
  void TearDown() override {
    kill(worker_, SIGKILL);
    testing::WaitProcess(worker_, 10);
  }

  static std::string F(const std::string& name) { return dir_->path() + "/" + name; }

  SecurityOptions Client(const std::string& cert, const std::string& key, const std::string& ca,
                         bool token) {
    SecurityOptions s;
    absl::Status st = LoadSecurity(cert.empty() ? "" : F(cert), key.empty() ? "" : F(key),
                                   ca.empty() ? "" : F(ca), false, token ? F("token") : "", &s);
    EXPECT_TRUE(st.ok()) << st;
    return s;
  }

  grpc::Status Stats(const SecurityOptions& s) {
    auto stub = v1::Worker::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port_), s));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    AddToken(ctx, s);
    v1::StatsResponse resp;
    return stub->Stats(&ctx, v1::StatsRequest(), &resp);
  }

  grpc::Status Configure(const SecurityOptions& s) {
    auto stub = v1::Worker::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port_), s));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    AddToken(ctx, s);
    v1::ConfigureRequest req;
    *req.mutable_job() = *ParseJob(
        "rule: GREEDY data { synthetic { shape: [4] classes: 2 } } "
        "stages { layers { linear { out_features: 2 } } }",
        "test");
    req.set_stage(0);
    req.set_total_steps(10);
    v1::ConfigureResponse resp;
    return stub->Configure(&ctx, req, &resp);
  }

  static testing::TempDir* dir_;
  pid_t worker_ = -1;
  int port_ = 0;
};

testing::TempDir* Security::dir_ = nullptr;

TEST_F(Security, AClientWithACertificateFromTheRightCaIsServed) {
  EXPECT_TRUE(Stats(Client("node.pem", "node.key", "ca.pem", true)).ok());
  // Statistics are as private as the weights: the certificate alone is not enough.
  EXPECT_EQ(Stats(Client("node.pem", "node.key", "ca.pem", false)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(Security, PlaintextWrongCaAndMissingOrForeignClientCertificatesAreRefused) {
  EXPECT_FALSE(Stats(SecurityOptions{}).ok()) << "plaintext";
  EXPECT_FALSE(Stats(Client("", "", "other_ca.pem", false)).ok()) << "trusts another CA";
  EXPECT_FALSE(Stats(Client("", "", "ca.pem", false)).ok()) << "no client certificate";
  EXPECT_FALSE(Stats(Client("rogue.pem", "rogue.key", "ca.pem", false)).ok())
      << "client certificate from another CA";
}

TEST_F(Security, ControlRpcsAndTheDataStreamNeedTheToken) {
  grpc::Status st = Configure(Client("node.pem", "node.key", "ca.pem", false));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  st = Configure(Client("node.pem", "node.key", "ca.pem", true));
  EXPECT_TRUE(st.ok()) << st.error_message();
  // Feeding data without the token: the stream is refused before any item is read.
  SecurityOptions no_token = Client("node.pem", "node.key", "ca.pem", false);
  auto stub = v1::Worker::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port_), no_token));
  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  stream->WritesDone();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(Security, BadSecurityFilesAreClearStartupErrors) {
  auto r = RunProcess({testing::BinDir() + "/localpar_worker", "--tls_cert=" + F("token"),
                       "--tls_key=" + F("node.key")},
                      10);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--tls_cert " + F("token") + ": not a PEM file"), std::string::npos)
      << r.output;
  r = RunProcess({testing::BinDir() + "/localpar_worker", "--mtls"}, 10);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--mtls needs"), std::string::npos) << r.output;
}

TEST_F(Security, AWholeRunWorksOverMutualTlsWithTokens) {
  auto r = RunProcess({testing::BinDir() + "/localpar", "run",
                       std::string(LOCALPAR_SOURCE_DIR) + "/deploy/jobs/synthetic_smoke.textproto",
                       "--quiet", "--tls_cert=" + F("node.pem"), "--tls_key=" + F("node.key"),
                       "--tls_ca=" + F("ca.pem"), "--mtls", "--auth_token_file=" + F("token")},
                      120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("synthetic_smoke (GREEDY)"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace localpar
