// The progress output of `localpar train` and `localpar run`, in one format: a line that
// is rewritten in place on a terminal (printed every few seconds elsewhere), and one line
// per finished epoch with every stage's held-out accuracy (test or validation).
#pragma once

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

#include "common/nn/stage.h"

namespace localpar {

struct ProgressLine {
  int epoch = 0, epochs = 0;          // the epoch the last stage is in
  int64_t step = 0, total_steps = 0;  // steps the last stage has done, of the run's
  double examples_per_second = 0;
  // Each stage's mean training loss since its last epoch boundary; a stage with nothing
  // yet (count 0) shows "-".
  std::vector<HeadStats> recent;
  double elapsed_seconds = -1;  // since the run started (< 0: not shown, nor the ETA)
  bool evaluating = false;      // the last stage is scoring the epoch's held-out split
};

// "42s", "3m07s", "2h05m".
std::string FormatDuration(double seconds);

class ProgressPrinter {
 public:
  // `live`: a terminal (rewrite the line); `enabled`: false prints epoch results only.
  // `width`: the columns a line may take (0: the terminal's when live, unlimited otherwise).
  ProgressPrinter(std::ostream& out, bool live, bool enabled, int width = 0);
  // At most every quarter second on a terminal, every two seconds elsewhere, unless `force`.
  // The ETA extrapolates the steps done since the first line. A line wider than `width`
  // shows the lowest and highest stage loss instead of every stage's, and is then cut.
  void Update(const ProgressLine& line, bool force = false);
  // The line Update would print, without the terminal controls.
  std::string Format(const ProgressLine& line);
  void EpochResult(int epoch, const std::vector<HeadStats>& test, double seconds);
  // An evaluation within an epoch: "step 300 (epoch 1): validation accuracy ...".
  void InterimResult(int64_t step, int epoch, const std::vector<HeadStats>& test);
  // Byte-level language models: losses also in bits per byte.
  void set_bytes(bool bytes) { bytes_ = bytes; }
  // What the results score: "test" (the default) or "validation".
  void set_split(std::string split) { split_ = std::move(split); }
  void Done();  // clears a live line

 private:
  void Result(const std::string& what, const std::vector<HeadStats>& test, double seconds);
  std::ostream& out_;
  const bool live_, enabled_;
  const int width_;
  int64_t first_step_ = -1;  // the step and time of the first line: the ETA's base
  double first_elapsed_ = 0;
  bool pending_ = false;  // a live line is on screen
  bool bytes_ = false;
  std::string split_ = "test";
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace localpar
