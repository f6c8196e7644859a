// What a job needs in memory, from its shapes alone, so that a job too large for the
// machine is refused by `validate`, `train`, `run` and the worker before anything is
// allocated. Arithmetic is in double: no setting within the validated bounds overflows it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/job.pb.h"

namespace localpar {

struct StageNeeds {
  std::string label;       // "stages[2] (block3)"
  double parameters = 0;   // values, the head's included
  double state_bytes = 0;  // parameters, gradients and optimizer moments, float32
  double rows = 0;         // the batch rows one worker of the stage trains on
  double eval_rows = 0;    // and evaluates
  // The larger of a training batch (every layer's output and its gradient) and an
  // evaluation batch (the outputs alone).
  double activation_bytes = 0;
  bool eval_dominates() const { return eval_rows > 2 * rows; }
  // "32 training rows" or "1000 evaluation rows (eval_batch_size)".
  std::string RowsString() const;
  double total() const { return state_bytes + activation_bytes; }
};

struct JobNeeds {
  std::vector<StageNeeds> stages;
  double data_bytes = 0;  // a synthetic data set, generated in memory
  std::string data_field;
  const StageNeeds* largest() const;
  // Every stage and the data in one process (`localpar train`).
  double whole() const;
};

// For a job that passed ValidateJob. `per_replica`: each stage's rows are one replica's
// share of the batch (a worker); otherwise the whole batch (the reference trainer).
JobNeeds EstimateJobNeeds(const v1::Job& job, bool per_replica);

// This machine's memory: physical memory, or the cgroup's limit where that is smaller.
double MachineMemoryBytes();

// The limit a --memory_limit_mib flag gives: the machine's memory for 0.
double MemoryLimitBytes(int64_t memory_limit_mib);

// OK, or RESOURCE_EXHAUSTED naming what does not fit within `limit_bytes`: the largest
// stage (what one worker holds), or with `in_one_process` the whole job, its bytes split
// into state and activations, and the field that drives them.
absl::Status CheckJobFits(const v1::Job& job, double limit_bytes, bool in_one_process);

// "3.2 GiB".
std::string ByteString(double bytes);

}  // namespace localpar
