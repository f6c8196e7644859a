// Auto-partitioning: profile every layer of a job on a backend, then cut the layers into K
// stages so that the slowest stage (layers plus its head) is as fast as possible.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/core/backend.h"
#include "proto/job.pb.h"

namespace localpar {

// One top-level layer of the job with the activations (relu, gelu) and dropout that follow
// it: a "unit" that a cut may not split.
struct UnitProfile {
  std::string label;         // "block2.layers[0] linear+relu"
  double seconds = 0;        // forward, backward and update of the layer, per batch
  double head_seconds = -1;  // the head, if a stage ended here; < 0: a head cannot go here
  int layers = 1;            // job layers in the unit
  int stage = 0;             // the job stage its last layer comes from
  // One example's forward FLOPs (StageForwardFlops): the unit's layers, and the head if a
  // stage ended here (0 where a head cannot go).
  double forward_flops = 0;
  double head_forward_flops = 0;
  // What the backward pass adds, per batch, when it also computes the gradient for the
  // unit's input (0 for the first unit, which never passes one on). `seconds` leaves it
  // out: a stage's first unit needs it only under a rule that sends gradients upstream,
  // and a stage's cost adds it for its later units.
  double input_grad_seconds = 0;
};

// Times each unit of `job` on `backend` with batches of `batch` examples: the median of
// `repeats` rounds over all units after one warm-up round. A unit's head is the head of the
// job stage its last layer came from.
absl::StatusOr<std::vector<UnitProfile>> ProfileUnits(const v1::Job& job, Backend& backend,
                                                      int64_t batch, int repeats = 5);

struct Partition {
  std::vector<int> sizes;             // units per stage
  std::vector<double> stage_seconds;  // predicted per-batch time of each stage
  double bottleneck() const;          // the slowest stage: what bounds pipeline throughput
};

// The split into `stages` contiguous groups that minimises the slowest stage (exact, by
// dynamic programming), and the naive split with equal unit counts, for comparison.
absl::StatusOr<Partition> BestPartition(const std::vector<UnitProfile>& units, int stages);
absl::StatusOr<Partition> EqualPartition(const std::vector<UnitProfile>& units, int stages);

// A pipeline's predicted throughput: each stage computes for stage_seconds per batch and
// sends `hop_bytes` to the next over a link of `bytes_per_second` and `latency_seconds`.
// Sending overlaps computing (a separate sender thread and bounded queues), so a batch
// leaves the pipeline every max over stages of max(compute, transfer); when `cores` is
// smaller than the number of stages, the stages also share the cores.
//
// With replicas (Job.replicas = R), every stage runs R times, each on 1/R of the batch:
// stage_seconds and hop_bytes are then one replica's, for its share. After its backward
// pass each replica also sums its exchange bucket with the R - 1 others' (the mesh's
// reduce-scatter then all-gather: services/worker/replica_mesh.h), two rounds that move
// 2 (R - 1) / R x exchange_bytes each way per step, not overlapped with the stage's compute,
// and counted against the cores like compute.
struct LinkModel {
  double bytes_per_second = 0;  // 0: an infinitely fast link
  double latency_seconds = 0;
  int cores = 0;  // 0: one per worker
  int replicas = 1;
  std::vector<double> exchange_bytes;  // per stage, with replicas
};
double PredictExamplesPerSecond(const std::vector<double>& stage_seconds,
                                const std::vector<double>& hop_bytes, int64_t batch,
                                const LinkModel& link);
// The time one replica of each stage spends exchanging its bucket per step (0 without
// replicas or with an infinitely fast link).
std::vector<double> ExchangeSeconds(const LinkModel& link, size_t stages);

// Bytes of each stage's exchange bucket under partition `p`: every parameter, float32.
std::vector<double> ExchangeBytes(const v1::Job& job, const Partition& p);

// Bytes one batch's activations take from each stage to the next under partition `p`.
std::vector<double> HopBytes(const v1::Job& job, const Partition& p, int64_t batch);

// The job with its layers regrouped by `p`; each new stage takes the head of the job stage
// its last unit came from, and the names of the job stages it draws on ("block1+block2").
v1::Job ApplyPartition(const v1::Job& job, const Partition& p);

}  // namespace localpar
