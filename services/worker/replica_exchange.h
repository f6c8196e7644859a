// Replicas of a stage (replica_group.h): the exchange of the stage's gradients, group by
// group (common/nn/replica_sync.h's ParamGroups), on a thread of its own. On the CPU a
// group's reduction (the mesh's reduce-scatter and all-gather) starts as soon as the
// backward pass has finished with it, while the compute thread goes on with the layers
// before; the step waits for the rest. Every mesh call is made on that one thread, in the order the
// groups were started, and every replica's program starts them in the same order (a group not
// started early starts at the step, in group order, which is the same order). CUDA workers exchange
// one bucket of the whole stage at the step, on the same thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/core/tensor.h"
#include "common/nn/replica_sync.h"
#include "services/worker/replica_group.h"

namespace localpar {

// DATA_LOSS naming the first replica whose part of a reduced bucket of n floats held a NaN or
// an infinity, and how many (`what` names the bucket); OK when none did.
absl::Status NonFiniteError(const NonFiniteParts& bad, int stage, int64_t n,
                            const std::string& what);

class ReplicaExchange {
 public:
  ReplicaExchange(Stage& stage, ReplicaGroup& group, int replicas, Backend& backend);
  ~ReplicaExchange();  // after the groups in flight (their gathers end or fail)

  // The head's (layer -1) or layer `layer`'s gradients are final for this step.
  void Final(int layer);
  // Starts every group not started yet, waits for all of them, and leaves the sums in the
  // stage. Once an exchange has failed, every later one fails the same way.
  absl::Status Finish();
  // Before a step: waits for anything still in flight from a step that was abandoned.
  void Reset();

 private:
  static constexpr int kWhole = -2;  // the device path's one bucket
  struct Group {
    std::unique_ptr<ReplicaBucket> bucket;
    std::vector<float> send, sum;
    bool started = false;
  };
  void StartLocked(int g);
  void Loop();
  absl::Status Exchange(int g);

  ReplicaGroup& group_;
  const int replicas_;
  Backend& backend_;
  const bool on_device_;  // NCCL in device memory
  const bool overlap_;    // host buckets of a CPU stage: groups start early
  ParamGroups layout_;
  std::vector<Group> groups_;
  std::unique_ptr<ReplicaBucket> whole_;  // CUDA: the stage in one bucket
  std::vector<float> whole_send_, whole_sum_;
  Tensor device_send_, device_gathered_, device_sum_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  int pending_ = 0;
  bool whole_started_ = false;
  bool stop_ = false;
  absl::Status failed_;
  std::thread thread_;
};

}  // namespace localpar
