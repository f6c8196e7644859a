// metrics.jsonl: what a run appends as it goes, one JSON object per line and stage, for
// plotting (`localpar run --out` and `localpar train --out` write it; a resumed run appends).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/nn/stage.h"

namespace localpar {

struct MetricsPoint {
  // "train": the epoch so far (every few steps, or seconds in a cluster); "epoch": the whole
  // epoch's training figures, at its end; "test": the epoch's evaluation.
  const char* kind = "train";
  int64_t step = 0;                // training steps done (by the last stage, in a cluster)
  int epoch = 0;                   // 1-based
  double wall_seconds = 0;         // since this process started the run
  double lr = 0;                   // the schedule's learning rate at `step`
  double examples_per_second = 0;  // training throughput so far (on "train" lines; else 0)
  int64_t positions = 1;           // labels per example: > 1 adds tokens_per_second
};

class MetricsLog {
 public:
  // Appends to DIR/metrics.jsonl, creating DIR and the file when missing; errors name it.
  static absl::StatusOr<std::unique_ptr<MetricsLog>> Open(const std::string& dir);
  ~MetricsLog();
  // One line per stage with figures (count > 0): stage, loss (null when not finite),
  // accuracy and examples beside the point's fields; flushed at once.
  void Write(const MetricsPoint& point, const std::vector<HeadStats>& stages);
  // The line Write produces for one stage (no newline); `bytes` adds bits_per_byte.
  static std::string Line(const MetricsPoint& point, int stage, const HeadStats& s,
                          bool bytes = false);
  // Byte-level language models: every line also has bits_per_byte.
  void set_bytes(bool bytes) { bytes_ = bytes; }

 private:
  explicit MetricsLog(std::FILE* f) : f_(f) {}
  std::FILE* f_;
  bool bytes_ = false;
};

}  // namespace localpar
