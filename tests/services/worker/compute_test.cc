// The worker's compute layer without sockets: StageCompute (each stage's program over the
// link's queues, with the real framing of activations and gradients) for every stage of a
// job, wired by in-memory queues, ends bitwise equal to the reference trainer, which runs the
// same programs over its own in-memory ports. The reference's rules are checked separately
// against finite differences (tests/common/nn/trainer_test.cc).
#include "services/worker/compute.h"

#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "common/data/dataset.h"
#include "common/job/parse.h"
#include "common/job/spec.h"
#include "common/model_io/tensor_proto.h"
#include "common/nn/trainer.h"
#include "common/run/reference_run.h"
#include "services/common/bounded_queue.h"
#include "services/coordinator/pipeline_link.h"

namespace localpar {
namespace {

template <typename T>
T Parse(grpc::ByteBuffer& bytes) {
  T out;
  EXPECT_TRUE(grpc::SerializationTraits<T>::Deserialize(&bytes, &out).ok());
  return out;
}

// One stage's links: its inbound queue, the gradients returned to it, and its neighbours.
struct MemoryLinks final : ComputeLinks {
  BoundedQueue<v1::DownItem> inbound{1 << 16};
  BoundedQueue<v1::Gradient> grads{1 << 16};
  MemoryLinks* down = nullptr;
  MemoryLinks* up = nullptr;
  std::mutex* mu = nullptr;
  std::vector<v1::UpItem>* to_coordinator = nullptr;

  std::optional<v1::DownItem> NextItem() override { return inbound.Pop(); }
  void SendDown(grpc::ByteBuffer item, std::function<void()> ready) override {
    if (ready) ready();
    down->inbound.Push(Parse<v1::DownItem>(item));
  }
  void OweGradient() override {}
  void SendUp(grpc::ByteBuffer item) override {
    v1::UpItem u = Parse<v1::UpItem>(item);
    if (u.has_gradient()) {
      ASSERT_NE(up, nullptr) << "stage 0 returned a gradient";
      up->grads.Push(std::move(*u.mutable_gradient()));
      return;
    }
    std::lock_guard<std::mutex> lock(*mu);
    to_coordinator->push_back(std::move(u));  // acknowledgements and errors
  }
  PortState NextGradient(bool wait, v1::Gradient* out) override {
    std::optional<v1::Gradient> g = wait ? grads.Pop() : grads.TryPop();
    if (!g) return wait || grads.closed() ? PortState::kGone : PortState::kPending;
    *out = *std::move(g);
    return PortState::kReady;
  }
  void QueueDepths(int64_t* a, int64_t* b, int64_t* c, int64_t* d) override {
    *a = *b = *c = *d = 0;
  }
};

std::string Job(const std::string& rule) {
  return "name: \"inproc\" rule: " + rule + " micro_batches: " + (rule == "BACKPROP" ? "3" : "1") +
         R"(
batch_size: 20 epochs: 2 seed: 9
data { synthetic { train_examples: 130 test_examples: 20 shape: [5, 5, 1] classes: 4 seed: 4 } }
schedule { kind: COSINE lr: 0.01 warmup_steps: 2 }
stages { layers { conv2d { out_channels: 3 padding: 1 } } layers { batch_norm {} } layers { relu {} } head { kind: CONV_POOL_LINEAR channels: 2 } }
stages { layers { linear { out_features: 12 } } layers { dropout { rate: 0.25 } } layers { gelu {} } }
stages { layers { linear { out_features: 10 } } layers { layer_norm {} } head { kind: MLP hidden: 6 } }
)";
}

class WorkerComputeWithoutSockets : public ::testing::TestWithParam<std::string> {};

TEST_P(WorkerComputeWithoutSockets, EveryStageEndsBitwiseEqualToTheReferenceTrainer) {
  absl::StatusOr<v1::Job> job = ParseJob(Job(GetParam()), "inproc");
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<DataSplit> data = LoadJobData(*job);
  ASSERT_TRUE(data.ok()) << data.status();
  const int n = job->stages_size();
  BatchPlan plan(*job, data->train.size(), data->test.size());

  // The reference trainer.
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::string error;
  std::unique_ptr<Model> model = Model::Create(*cpu, ToModelConfig(*job), &error);
  ASSERT_TRUE(model) << error;
  ReferenceTrainer trainer(*model, ToStepSettings(*job, plan.total_steps()));

  // The workers' compute, one thread per stage.
  WorkerOptions options;
  options.config.mutable_compute()->set_device("cpu");
  options.config.mutable_compute()->set_threads(1);
  std::vector<std::unique_ptr<StageHost>> hosts;
  std::vector<std::unique_ptr<WorkerStats>> stats;
  std::vector<MemoryLinks> links(n);
  std::mutex mu;
  std::vector<v1::UpItem> replies;
  for (int k = 0; k < n; ++k) {
    hosts.push_back(std::make_unique<StageHost>(options));
    stats.push_back(std::make_unique<WorkerStats>(nullptr));
    v1::ConfigureRequest req;
    *req.mutable_job() = *job;
    req.set_stage(k);
    if (k + 1 < n) req.set_downstream("in-process:0");  // never dialled
    req.set_total_steps(plan.total_steps());
    absl::StatusOr<v1::ConfigureResponse> r = hosts[k]->Configure(req);
    ASSERT_TRUE(r.ok()) << r.status();
    links[k].down = k + 1 < n ? &links[k + 1] : nullptr;
    links[k].up = k > 0 ? &links[k - 1] : nullptr;
    links[k].mu = &mu;
    links[k].to_coordinator = &replies;
  }
  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k) {
    threads.emplace_back([&, k] {
      StageCompute compute(*hosts[k]->setup(), *hosts[k], *stats[k], 0);
      compute.Run(links[k]);
      if (k + 1 < n) links[k + 1].inbound.Close();  // as the sender's WritesDone would
      if (k > 0) links[k - 1].grads.Close();
    });
  }

  BatchAssembler batch(data->train, job->batch_size());
  Tensor x, y;
  uint64_t seq = 0;
  const int job_micro = job->micro_batches();
  for (PlanItem item; plan.Next(&item);) {
    if (item.kind != PlanItem::kTrain) continue;
    ASSERT_TRUE(batch.Gather(plan.order(), item.begin, item.rows).ok());
    x.Ensure(*cpu, batch.x_shape(), batch.x_dtype());
    y.Ensure(*cpu, batch.y_shape(), DType::kI32);
    cpu->CopyFromHost(x.raw(), batch.x(), batch.x_bytes());
    cpu->CopyFromHost(y.raw(), batch.y(), batch.y_bytes());
    trainer.TrainStep(x, y);
    v1::Batch meta;
    meta.set_epoch(item.epoch);
    meta.set_phase(v1::TRAIN);
    meta.set_step(item.step);
    meta.set_batch_rows(item.rows);
    const int parts = StepMicroBatches(job_micro, item.rows);
    meta.set_micro_batches(parts);
    for (int m = 0; m < parts; ++m) {
      int64_t begin, rows;
      MicroBatchRange(item.rows, parts, m, &begin, &rows);
      meta.set_micro_batch(m);
      meta.set_seq(++seq);
      links[0].inbound.Push(MakeBatchItem(batch, begin, rows, meta));
    }
  }
  v1::DownItem drain;
  drain.mutable_control()->set_seq(++seq);
  drain.mutable_control()->set_kind(v1::Control::DRAIN);
  links[0].inbound.Push(drain);
  links[0].inbound.Close();
  for (std::thread& t : threads) t.join();

  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].has_ack()) << replies[0].DebugString();
  v1::ModelWeights want = SnapshotModel(*model);
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(stats[k]->steps(), plan.total_steps()) << "stage " << k;
    v1::StageWeights got = SnapshotStage(*hosts[k]->setup()->stage_model, k);
    ASSERT_EQ(got.params_size(), want.stages(k).params_size());
    for (int i = 0; i < got.params_size(); ++i) {
      EXPECT_EQ(got.params(i).tensor().data(), want.stages(k).params(i).tensor().data())
          << "stage " << k << " " << got.params(i).name();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, WorkerComputeWithoutSockets,
                         ::testing::Values("GREEDY", "CHUNKED", "OVERLAP", "BACKPROP"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace localpar
