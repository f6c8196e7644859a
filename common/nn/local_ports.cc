// The reference trainer's in-memory links.
#include "common/nn/local_ports.h"

#include "common/nn/trainer.h"

namespace localpar {

class LocalPipeline::Ports final : public StagePorts {
 public:
  Ports(LocalPipeline& pipe, int stage) : pipeline_(pipe), stage_(stage) {}

  PortState Receive(int m, const Tensor** x, const Tensor** labels) override {
    const Message& in = pipeline_.inbox_[stage_][m];
    if (!in.sent) return PortState::kPending;
    *x = &in.tensor;
    *labels = &pipeline_.labels_[m];
    return PortState::kReady;
  }
  void SendActivations(int m, const Tensor& y) override {
    if (stage_ + 1 < static_cast<int>(pipeline_.inbox_.size())) {
      pipeline_.Put(&pipeline_.inbox_[stage_ + 1][m], pipeline_.OverWire(stage_, m, y));
    }
  }
  void SendInputGradient(int m, const Tensor& dx) override {
    if (stage_ > 0) pipeline_.Put(&pipeline_.returned_[stage_ - 1][m], dx);
  }
  PortState AwaitGradient(int m, const Tensor** grad) override {
    const Message& g = pipeline_.returned_[stage_][m];
    if (!g.sent) return PortState::kPending;
    *grad = &g.tensor;
    return PortState::kReady;
  }

 private:
  LocalPipeline& pipeline_;
  const int stage_;
};

LocalPipeline::LocalPipeline(int stages, WireFormat wire)
    : wire_(wire), inbox_(stages), returned_(stages), rounded_(stages) {
  for (int k = 0; k < stages; ++k) ports_.push_back(std::make_unique<Ports>(*this, k));
}

LocalPipeline::~LocalPipeline() = default;

StagePorts& LocalPipeline::ports(int stage) { return *ports_[stage]; }

void LocalPipeline::Put(Message* m, const Tensor& t) {
  m->tensor = t;
  m->pin = t.Pin();
  m->sent = true;
}

void LocalPipeline::Load(const Tensor& x, const Tensor& labels, int micro_batches) {
  for (size_t k = 0; k < inbox_.size(); ++k) {
    inbox_[k].assign(static_cast<size_t>(micro_batches), Message());
    returned_[k].assign(static_cast<size_t>(micro_batches), Message());
    rounded_[k].resize(static_cast<size_t>(micro_batches));
  }
  labels_.resize(static_cast<size_t>(micro_batches));
  for (int m = 0; m < micro_batches; ++m) {
    int64_t begin, count;
    MicroBatchRange(x.rows(), micro_batches, m, &begin, &count);
    Message& in = inbox_[0][m];
    in.tensor = micro_batches == 1 ? x : x.Slice(begin, count);
    in.sent = true;
    labels_[m] = micro_batches == 1 ? labels : labels.Slice(begin, count);
  }
}

void LocalPipeline::Clear() {
  for (auto* links : {&inbox_, &returned_}) {
    for (auto& link : *links) link.clear();
  }
  labels_.clear();
}

const Tensor& LocalPipeline::OverWire(int k, int m, const Tensor& y) {
  if (wire_ == WireFormat::kF32) return y;
  // Through the host, with the same conversion a worker applies when it encodes.
  host_.resize(static_cast<size_t>(y.numel()));
  y.backend().CopyToHost(host_.data(), y.raw(), y.nbytes());
  RoundThroughWire(wire_, host_.data(), host_.size());
  Tensor& out = rounded_[k][m];
  out.Ensure(y.backend(), y.shape());
  y.backend().CopyFromHost(out.raw(), host_.data(), y.nbytes());
  return out;
}

}  // namespace localpar
