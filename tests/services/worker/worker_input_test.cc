// A real worker process fed hostile input over gRPC: each bad item is refused in-band with
// the right code and a message naming the field, counted, and the stream keeps serving.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <thread>

#include "common/job/parse.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/grpc_util.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

constexpr char kJob[] = R"(
rule: GREEDY
data { synthetic { shape: [8] classes: 3 } }
stages { layers { linear { out_features: 6 } } }
stages { layers { linear { out_features: 4 } } layers { relu {} } }
)";

class WorkerProcess {
 public:
  WorkerProcess() {
    std::string port_file = dir_.path() + "/port";
    pid_ = testing::StartProcess(
        {testing::BinDir() + "/localpar_worker", "--port_file=" + port_file}, dir_.path() + "/log");
    for (int i = 0; i < 500 && port_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::ifstream(port_file) >> port_;
    }
    stub_ = v1::Worker::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port_)));
  }
  ~WorkerProcess() {
    stub_.reset();
    kill(pid_, SIGTERM);
    testing::WaitProcess(pid_, 10);
  }
  v1::Worker::Stub& stub() { return *stub_; }
  int port() const { return port_; }

  // By default the last stage of kJob: input [6], 3 classes, no downstream.
  grpc::Status Configure(v1::ConfigureRequest::NonFinite policy, const char* job_text = kJob,
                         int stage = 1) {
    v1::ConfigureRequest req;
    absl::StatusOr<v1::Job> job = ParseJob(job_text, "test");
    EXPECT_TRUE(job.ok()) << job.status();
    *req.mutable_job() = *job;
    req.set_stage(stage);
    req.set_total_steps(100);
    req.set_non_finite(policy);
    grpc::ClientContext ctx;
    v1::ConfigureResponse resp;
    return stub_->Configure(&ctx, req, &resp);
  }

  v1::StatsResponse Stats() {
    grpc::ClientContext ctx;
    v1::StatsResponse resp;
    EXPECT_TRUE(stub_->Stats(&ctx, v1::StatsRequest(), &resp).ok());
    return resp;
  }

 private:
  testing::TempDir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

v1::DownItem Batch(uint64_t seq, std::vector<float> x, std::vector<int32_t> y, int64_t rows,
                   int64_t features) {
  v1::DownItem item;
  v1::Batch* b = item.mutable_batch();
  b->set_seq(seq);
  b->set_phase(v1::TRAIN);
  b->set_batch_rows(rows);
  b->set_epoch(1);
  v1::Tensor* a = b->mutable_activations();
  a->set_dtype(v1::F32);
  a->add_shape(rows);
  a->add_shape(features);
  a->set_data(x.data(), x.size() * 4);
  v1::Tensor* l = b->mutable_labels();
  l->set_dtype(v1::I32);
  l->add_shape(static_cast<int64_t>(y.size()));
  l->set_data(y.data(), y.size() * 4);
  return item;
}

v1::DownItem Good(uint64_t seq) { return Batch(seq, std::vector<float>(12, 0.5f), {0, 2}, 2, 6); }

v1::DownItem Control(uint64_t seq, int kind) {
  v1::DownItem item;
  item.mutable_control()->set_seq(seq);
  item.mutable_control()->set_kind(static_cast<v1::Control::Kind>(kind));
  return item;
}

// Sends items, closes the stream, and returns everything that came back.
std::vector<v1::UpItem> Exchange(v1::Worker::Stub& stub, const std::vector<v1::DownItem>& items) {
  grpc::ClientContext ctx;
  auto stream = stub.Stream(&ctx);
  for (const auto& item : items) EXPECT_TRUE(stream->Write(item));
  stream->WritesDone();
  std::vector<v1::UpItem> out;
  v1::UpItem up;
  while (stream->Read(&up)) out.push_back(up);
  EXPECT_TRUE(stream->Finish().ok());
  return out;
}

TEST(WorkerInput, ItemsBeforeConfigureAreRefusedAsFailedPrecondition) {
  WorkerProcess w;
  ASSERT_GT(w.port(), 0);
  std::vector<v1::UpItem> up = Exchange(w.stub(), {Good(1), Good(2)});
  ASSERT_EQ(up.size(), 2u);
  for (const auto& u : up) {
    ASSERT_TRUE(u.has_error());
    EXPECT_EQ(u.error().code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
    EXPECT_NE(u.error().message().find("before Configure"), std::string::npos);
  }
  // Still serving: configure and train.
  ASSERT_TRUE(w.Configure(v1::ConfigureRequest::REJECT).ok());
  up = Exchange(w.stub(), {Good(3), Control(4, v1::Control::DRAIN)});
  ASSERT_EQ(up.size(), 1u);
  EXPECT_TRUE(up[0].has_ack());
  EXPECT_EQ(w.Stats().rejected().at("before_configure"), 2);
}

TEST(WorkerInput, EachBadItemIsRefusedNamingTheFieldAndTheStreamGoesOn) {
  WorkerProcess w;
  ASSERT_TRUE(w.Configure(v1::ConfigureRequest::REJECT).ok());
  v1::DownItem short_bytes = Good(2);
  short_bytes.mutable_batch()->mutable_activations()->mutable_data()->resize(40);
  std::vector<float> nan_x(12, 0.5f);
  nan_x[7] = std::nanf("");
  std::vector<float> inf_x(12, 0.5f);
  inf_x[0] = INFINITY;
  v1::DownItem bf16 = Good(8);  // 16-bit activations, but this job's wire is F32
  bf16.mutable_batch()->mutable_activations()->set_dtype(v1::BF16);
  bf16.mutable_batch()->mutable_activations()->mutable_data()->resize(24);
  std::vector<v1::DownItem> items = {
      Good(1),
      short_bytes,                                           // byte count != dtype x shape
      Batch(3, std::vector<float>(10, 0.5f), {0, 1}, 2, 5),  // 5 features, stage wants 6
      Batch(4, nan_x, {0, 1}, 2, 6),                         // NaN
      Batch(5, inf_x, {0, 1}, 2, 6),                         // Inf
      Batch(6, std::vector<float>(12, 0.5f), {0, 7}, 2, 6),  // label 7, 3 classes
      Control(7, 42),                                        // unknown control kind
      bf16,
      Good(9),
      Control(10, v1::Control::DRAIN),
  };
  std::vector<v1::UpItem> up = Exchange(w.stub(), items);
  struct Want {
    uint64_t seq;
    std::string text;
  };
  std::vector<Want> want = {{2, "batch.activations.data: 40 bytes do not match"},
                            {3, "batch.activations.shape: [2,5] does not fit stage 1's input [6]"},
                            {4, "non-finite value at index 7"},
                            {5, "non-finite value at index 0"},
                            {6, "batch.labels[1] = 7 is outside 0..2"},
                            {7, "control.kind: unknown control item 42"},
                            {8, "this stage takes F32 activations, got BF16"}};
  ASSERT_EQ(up.size(), want.size() + 1);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(up[i].has_error()) << i;
    EXPECT_EQ(up[i].error().seq(), want[i].seq);
    EXPECT_EQ(up[i].error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_NE(up[i].error().message().find(want[i].text), std::string::npos)
        << up[i].error().message();
  }
  ASSERT_TRUE(up.back().has_ack());
  EXPECT_EQ(up.back().ack().seq(), 10u);
  v1::StatsResponse s = w.Stats();
  EXPECT_EQ(s.examples(), 4) << "the two valid batches trained";
  EXPECT_EQ(s.rejected().at("malformed_tensor"), 1);
  EXPECT_EQ(s.rejected().at("wrong_shape"), 1);
  EXPECT_EQ(s.rejected().at("non_finite"), 2);
  EXPECT_EQ(s.rejected().at("label_out_of_range"), 1);
  EXPECT_EQ(s.rejected().at("unknown_control"), 1);
  EXPECT_EQ(s.rejected().at("wrong_dtype"), 1);
}

// A language model's first stage takes int32 token ids below its vocabulary; floats, or an
// id without a row in the table, are refused and the stream goes on.
TEST(WorkerInput, ALanguageModelsFirstStageTakesOnlyTokenIdsInItsVocabulary) {
  constexpr char kLanguageModel[] = R"(
rule: GREEDY
data { text { seq_len: 4 } }
stages { layers { embedding { vocab: 256 dim: 4 } } head { kind: LANGUAGE_MODEL } }
)";
  WorkerProcess w;
  ASSERT_TRUE(w.Configure(v1::ConfigureRequest::REJECT, kLanguageModel, 0).ok());
  auto tokens = [](uint64_t seq, std::vector<int32_t> ids) {
    v1::DownItem item = Batch(seq, {}, std::vector<int32_t>(8, 1), 2, 4);
    v1::Tensor* a = item.mutable_batch()->mutable_activations();
    a->set_dtype(v1::I32);
    a->set_data(ids.data(), ids.size() * 4);
    item.mutable_batch()->mutable_labels()->set_shape(0, 2);
    item.mutable_batch()->mutable_labels()->add_shape(4);
    return item;
  };
  std::vector<v1::UpItem> up =
      Exchange(w.stub(), {tokens(1, {72, 105, 33, 10, 0, 255, 7, 7}),
                          tokens(2, {72, 105, 256, 10, 0, 1, 2, 3}),
                          Batch(3, std::vector<float>(8, 1.0f), std::vector<int32_t>(8, 1), 2, 4),
                          tokens(4, {1, 2, 3, 4, 5, 6, 7, 8}), Control(5, v1::Control::DRAIN)});
  ASSERT_EQ(up.size(), 3u);
  ASSERT_TRUE(up[0].has_error());
  EXPECT_NE(up[0].error().message().find("batch.activations[2] = 256 is not a token id in 0..255"),
            std::string::npos)
      << up[0].error().message();
  ASSERT_TRUE(up[1].has_error());
  EXPECT_NE(up[1].error().message().find("takes I32 token ids, got F32"), std::string::npos)
      << up[1].error().message();
  ASSERT_TRUE(up[2].has_ack());
  v1::StatsResponse s = w.Stats();
  EXPECT_EQ(s.examples(), 4) << "the two batches of ids trained";
  EXPECT_EQ(s.rejected().at("token_out_of_range"), 1);
  EXPECT_EQ(s.rejected().at("wrong_dtype"), 1);
}

TEST(WorkerInput, SkipPolicyDropsNonFiniteBatchesSilentlyButCountsThem) {
  WorkerProcess w;
  ASSERT_TRUE(w.Configure(v1::ConfigureRequest::SKIP).ok());
  std::vector<float> nan_x(12, 0.5f);
  nan_x[3] = std::nanf("");
  std::vector<v1::UpItem> up =
      Exchange(w.stub(), {Batch(1, nan_x, {0, 1}, 2, 6), Good(2), Control(3, v1::Control::DRAIN)});
  ASSERT_EQ(up.size(), 1u);
  EXPECT_TRUE(up[0].has_ack());
  v1::StatsResponse s = w.Stats();
  EXPECT_EQ(s.examples(), 2);
  EXPECT_EQ(s.rejected().at("non_finite_skipped"), 1);
}

TEST(WorkerInput, InvalidConfigurationIsRefusedWithTheField) {
  WorkerProcess w;
  v1::ConfigureRequest req;
  *req.mutable_job() = *ParseJob(kJob, "test");
  req.set_stage(7);
  grpc::ClientContext ctx;
  v1::ConfigureResponse resp;
  grpc::Status st = w.stub().Configure(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("stage: 7"), std::string::npos) << st.error_message();
}

}  // namespace
}  // namespace localpar
