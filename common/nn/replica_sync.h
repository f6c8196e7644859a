// Replicas of a stage (Job.replicas): what they exchange after a training step's backward
// pass so that every replica takes the same update. Each replica packs its contribution
// into float32 buckets (one per parameter group on a worker, one for the whole stage in
// the reference trainer); the buckets of all replicas are gathered side by side (Gloo's
// allgather between workers, plain copies in the reference trainer), and every replica
// unpacks the same sum. The sum is added in replica order, element by element, so that
// every replica, every run and the reference trainer compute it bitwise alike: a ring
// all-reduce adds in an order that depends on the element's chunk, which is why this
// exchange gathers rather than reduces.
#pragma once

#include <cstdint>
#include <vector>

#include "common/core/backend.h"
#include "common/nn/stage.h"

namespace localpar {

class ReplicaBucket {
 public:
  explicit ReplicaBucket(Stage& stage);  // every parameter of the stage
  explicit ReplicaBucket(const std::vector<Param*>& params);

  // Floats in one replica's contribution.
  int64_t size() const { return size_; }
  int64_t bytes() const { return size_ * static_cast<int64_t>(sizeof(float)); }
  // This replica's contribution: every trainable parameter's gradient, then every other
  // parameter's value (batch norm's running statistics), in the stage's params() order.
  void Pack(float* out);
  // `gathered` holds `replicas` contributions one after another, in replica order. Each
  // gradient becomes their sum, added in replica order; each running statistic their mean
  // (each replica updated it from its own share of the batch).
  void Unpack(const float* gathered, int replicas);
  // The same from the contributions' sum (added in replica order), as a reduction gives it.
  void UnpackSum(const float* sum, int replicas);
  // The same on the stage's device, for a collective that gathers in device memory (NCCL):
  // `out`, `gathered` and `scratch` (size() floats) are device buffers. The sum is added in
  // replica order with the backend's Add; the running statistics' mean is taken on the host.
  void PackOnDevice(float* out);
  void UnpackOnDevice(const float* gathered, int replicas, float* scratch);

 private:
  std::vector<Param*> params_;
  int64_t size_ = 0;
  int64_t trainable_ = 0;  // floats of gradients before the running statistics
  std::vector<float> host_, mean_;
};

// Replicas that synchronise every few steps (Job.replica_sync, DiLoCo): the outer step,
// computed on the host. Each trainable parameter keeps in Param::outer the weights at the
// last synchronisation and in Param::outer_momentum the outer momentum. Every replica packs
// its pseudo-gradient, the replicas gather them side by side, and every replica applies the
// same outer step to the same synchronised weights, so that they leave it identical (and
// equal to the reference trainer's, which runs this same code).
//
// With bf16 (ReplicaSync.bf16) the pseudo-gradients cross as bfloat16: each replica rounds
// its own to the nearest bfloat16 (ties to even) before the exchange, the replicas add the
// rounded values in float32 in replica order, and the sum is rounded to bfloat16 again, so
// the bytes of the pseudo-gradients halve in both halves of a reduction. Running statistics
// stay float32. Every replica and the reference trainer round alike.
class OuterSync {
 public:
  OuterSync(Stage& stage, float lr, float momentum, bool bf16 = false);

  // The synchronised weights start as the parameters now (the start of a run, or a restored
  // checkpoint without them) and the momentum at zero; state a checkpoint restored is kept.
  static void Start(Stage& stage);

  int64_t size() const { return size_; }  // floats in one replica's contribution
  // Of those, the pseudo-gradients (first; bfloat16 on the wire with bf16), then the rest.
  int64_t pseudo_gradients() const { return trainable_; }
  bool bf16() const { return bf16_; }
  int64_t bytes() const { return size_ * static_cast<int64_t>(sizeof(float)); }
  // This replica's contribution: each trainable parameter's pseudo-gradient (the weights at
  // the last synchronisation minus its own; rounded to bfloat16 with bf16), then every other
  // parameter's value.
  void Pack(float* out);
  // `gathered` holds `replicas` contributions in replica order. Their mean g (added in
  // replica order, times 1 / replicas) drives one step of SGD with Nesterov momentum from
  // the synchronised weights w: m = momentum * m + g; w = w - lr * (g + momentum * m); the
  // parameters become w. Running statistics become the replicas' mean.
  void Apply(const float* gathered, int replicas);
  // The same from the contributions' sum (added in replica order), as a reduction gives it
  // (with bf16, its pseudo-gradients are rounded to bfloat16 first, as a reduction sends them).
  void ApplySum(const float* sum, int replicas);

 private:
  std::vector<Param*> params_;  // trainable ones first, as ReplicaBucket orders them
  int64_t size_ = 0;
  int64_t trainable_ = 0;
  const float lr_, momentum_;
  const bool bf16_;
  std::vector<float> host_, value_, outer_, momentum_host_;
};

// A stage's parameters in the groups a backward pass completes one after another, so that
// a group's exchange can start while the backward pass goes on: the head's (final after
// the step's last head action), then each layer's that has parameters, the last layer
// first (final as that layer's part of the step's last backward pass ends). Whatever the
// grouping, each element is added in replica order, so buckets of groups sum to exactly
// what one bucket of the whole stage sums to.
struct ParamGroups {
  std::vector<std::vector<Param*>> groups;
  int head = -1;           // the head's group; -1: the head has no parameters
  std::vector<int> layer;  // layer i's group; -1: no parameters
};
ParamGroups GroupParams(Stage& stage);

// out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + ... for `replicas` parts of n
// floats stored one after another.
void SumInReplicaOrder(const float* parts, int replicas, int64_t n, float* out);

// The first replica whose part of a gathered bucket in `backend`'s memory holds a NaN or an
// infinity, or -1: each part's sum of squares, accumulated in double (which no finite float
// part can overflow), is finite exactly when every value is. For buckets gathered in device
// memory (NCCL), where scanning them on the host would cost a copy.
int FirstNonFiniteReplica(Backend& backend, const float* gathered, int replicas, int64_t n);

}  // namespace localpar
