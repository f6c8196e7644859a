// In-memory ports between the stages of one process: what the reference trainer's stage
// programs send and receive. Nothing is copied (a sent tensor is pinned until the step
// ends, so its owner writes elsewhere meanwhile) except activations rounded through a
// 16-bit wire format, exactly as a worker rounds them before sending.
#pragma once

#include <memory>
#include <vector>

#include "common/core/dtype.h"
#include "common/nn/executor.h"

namespace localpar {

class LocalPipeline {
 public:
  LocalPipeline(int stages, WireFormat wire);
  ~LocalPipeline();

  // Starts a step: stage 0 receives rows of x (and every stage the same rows of labels) in
  // `micro_batches` consecutive parts (MicroBatchRange).
  void Load(const Tensor& x, const Tensor& labels, int micro_batches);
  // Drops everything sent during the step, releasing the pins.
  void Clear();
  StagePorts& ports(int stage);

 private:
  class Ports;
  struct Message {
    Tensor tensor;
    std::shared_ptr<const void> pin;
    bool sent = false;
  };
  void Put(Message* m, const Tensor& t);
  const Tensor& OverWire(int stage, int micro_batch, const Tensor& y);

  WireFormat wire_;
  // inbox_[k][m]: micro-batch m's activations for stage k; returned_[k][m]: the gradient
  // stage k+1 returned to stage k for it.
  std::vector<std::vector<Message>> inbox_, returned_;
  std::vector<Tensor> labels_;                // per micro-batch
  std::vector<std::vector<Tensor>> rounded_;  // [k][m]: stage k's output after the trip
  std::vector<float> host_;                   // staging for the rounding
  std::vector<std::unique_ptr<Ports>> ports_;
};

}  // namespace localpar
