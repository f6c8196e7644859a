// A worker's StagePorts (common/nn/executor.h): what the stage's program touches of the
// network, made of parts with one job each.
//  - StepItems: a step's items as they arrive, micro-batch by micro-batch, decoded into the
//    tensors of the stage's activation slots.
//  - OwedGradients: the training batches sent on whose gradients are still to come, and the
//    check of each one returned before the program uses it.
//  - LinkPorts: the executor's view, which frames activations and input gradients for the
//    links without copying them, and hands the replicas' exchange to ReplicaExchange.
// WatchedLinks marks the compute thread as waiting (not stuck) while it waits on a link.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "common/nn/executor.h"
#include "services/worker/compute_links.h"
#include "services/worker/replica_exchange.h"
#include "services/worker/stage_host.h"
#include "services/worker/worker_stats.h"

namespace localpar {

// An ItemError for `seq`, raised at `stage`.
v1::UpItem ErrorItem(uint64_t seq, int stage, const absl::Status& status);

// The session's links, with the compute thread's liveness noted around every call: while it
// waits on a peer (or for input) it is not stuck, whatever the wait.
class WatchedLinks final : public ComputeLinks {
 public:
  WatchedLinks(ComputeLinks& links, WorkerStats& stats) : links_(links), stats_(stats) {}
  std::optional<v1::DownItem> NextItem() override;
  void SendDown(grpc::ByteBuffer item, std::function<void()> ready) override;
  void OweGradient() override { links_.OweGradient(); }
  void SendUp(grpc::ByteBuffer item) override;
  PortState NextGradient(bool wait, v1::Gradient* out) override;
  void QueueDepths(int64_t* a, int64_t* b, int64_t* c, int64_t* d) override {
    links_.QueueDepths(a, b, c, d);
  }

 private:
  ComputeLinks& links_;
  WorkerStats& stats_;
};

class StepItems {
 public:
  StepItems(const ConfiguredStage& setup, StageHost& host, WorkerStats& stats, int slots);
  void Begin(v1::DownItem first, int micro_batches);
  // Micro-batch m's activations and labels in `slot`; false when the stream ended first.
  // Anything else arriving meanwhile is refused in-band: a step's micro-batches travel
  // together.
  bool Receive(ComputeLinks& links, int m, int slot, const Tensor** x, const Tensor** labels);
  v1::Batch& batch(int m) { return *items_[m].mutable_batch(); }
  uint64_t first_seq() const { return items_[0].batch().seq(); }
  int64_t rows() const { return rows_; }
  double receive_wait() const { return receive_wait_; }

 private:
  bool NextMicroBatch(ComputeLinks& links, int m);

  const ConfiguredStage& setup_;
  StageHost& host_;
  WorkerStats& stats_;
  std::vector<v1::DownItem> items_;      // this step's, by micro-batch
  std::vector<Tensor> inputs_, labels_;  // by slot: kept until the slot's backward
  int64_t rows_ = 0;
  double receive_wait_ = 0;
};

class OwedGradients {
 public:
  OwedGradients(const ConfiguredStage& setup, StageHost& host, WorkerStats& stats)
      : setup_(setup), host_(host), stats_(stats) {}
  // A training batch of `rows` rows went on: its gradient is owed.
  void Owe(uint64_t seq, int64_t rows) { owed_.push_back({seq, rows}); }
  // The next gradient owed, checked against the batch it is for; a null *grad when that
  // batch died downstream or its gradient was refused (nothing to apply).
  PortState Take(ComputeLinks& links, bool wait, const Tensor** grad);

 private:
  // A gradient from downstream that is not what this stage is owed: refused, counted and
  // reported upstream; the batch it was for is not updated from it.
  void Refuse(ComputeLinks& links, uint64_t seq, const absl::Status& why);
  struct Owed {
    uint64_t seq;
    int64_t rows;
  };
  const ConfiguredStage& setup_;
  StageHost& host_;
  WorkerStats& stats_;
  std::deque<Owed> owed_;
  Tensor returned_;  // the gradient being applied
};

class LinkPorts final : public StagePorts {
 public:
  LinkPorts(const ConfiguredStage& setup, StageHost& host, WorkerStats& stats,
            StageExecutor& executor);
  void Attach(ComputeLinks* links) { links_ = links; }
  void Begin(v1::DownItem first, int micro_batches);
  const StepItems& items() const { return items_; }
  double send_wait() const { return send_wait_; }
  // Ends the exchange thread (after what it has in flight), before the group is closed.
  void StopExchange() { exchange_.reset(); }

  PortState Receive(int m, const Tensor** x, const Tensor** labels) override;
  void SendActivations(int m, const Tensor& y) override;
  void SendInputGradient(int m, const Tensor& dx) override;
  PortState AwaitGradient(int m, const Tensor** grad) override;
  PortState TakeGradient(bool wait, const Tensor** grad) override;
  PortState ExchangeWithReplicas(Stage& stage) override;
  void GradientsFinal(Stage& stage, int layer) override;
  PortState SyncReplicas(Stage& stage) override;

 private:
  absl::Status ReduceBf16(int64_t pseudo_gradients, NonFiniteParts* bad);
  ReplicaExchange& Exchange(Stage& stage);
  // Tells the coordinator why the replicas can no longer step together, once.
  void ExchangeFailed(const absl::Status& s);

  const ConfiguredStage& setup_;
  StageHost& host_;
  StageExecutor& executor_;
  const bool returns_gradients_;
  ComputeLinks* links_ = nullptr;
  StepItems items_;
  OwedGradients owed_;
  Tensor staging_, grad_staging_;              // host bytes of converted or device tensors
  std::unique_ptr<ReplicaExchange> exchange_;  // replicas, made on first use
  bool exchange_failed_ = false;
  std::unique_ptr<OuterSync> outer_;  // replicas that synchronise every few steps
  std::vector<float> outer_send_, outer_sum_, outer_pairs_;
  double send_wait_ = 0;
};

}  // namespace localpar
