// The progress output of `localpar train` and `localpar run`, in one format: a line that
// is rewritten in place on a terminal (printed every few seconds elsewhere), and one line
// per finished epoch with every stage's test accuracy.
#pragma once

#include <chrono>
#include <ostream>
#include <vector>

#include "common/nn/stage.h"

namespace localpar {

struct ProgressLine {
  int epoch = 0, epochs = 0;  // the epoch the last stage is in
  int64_t step = 0, total_steps = 0;
  double examples_per_second = 0;
  // Each stage's mean training loss since its last epoch boundary; a stage with nothing
  // yet (count 0) shows "-".
  std::vector<HeadStats> recent;
};

class ProgressPrinter {
 public:
  // `live`: a terminal (rewrite the line); `enabled`: false prints epoch results only.
  ProgressPrinter(std::ostream& out, bool live, bool enabled);
  // At most every quarter second on a terminal, every two seconds elsewhere, unless `force`.
  void Update(const ProgressLine& line, bool force = false);
  void EpochResult(int epoch, const std::vector<HeadStats>& test, double seconds);
  void Done();  // clears a live line

 private:
  std::ostream& out_;
  const bool live_, enabled_;
  bool pending_ = false;  // a live line is on screen
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace localpar
