// The progress printer.
#include "common/job/progress.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace localpar {

ProgressPrinter::ProgressPrinter(std::ostream& out, bool live, bool enabled)
    : out_(out), live_(live), enabled_(enabled) {}

void ProgressPrinter::Update(const ProgressLine& l, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const auto every = live_ ? std::chrono::milliseconds(250) : std::chrono::milliseconds(2000);
  if (!force && now - last_ < every) return;
  last_ = now;
  constexpr int kWidth = 20;
  const int filled =
      l.total_steps > 0 ? static_cast<int>(kWidth * std::min(l.step, l.total_steps) / l.total_steps)
                        : 0;
  std::string losses;
  for (size_t k = 0; k < l.recent.size(); ++k) {
    if (l.recent[k].count > 0) {
      absl::StrAppendFormat(&losses, " s%d %.3f", k, l.recent[k].mean_loss());
    } else {
      absl::StrAppendFormat(&losses, " s%d -", k);
    }
  }
  out_ << absl::StrFormat("%sepoch %d/%d [%s%s] step %d/%d %.0f ex/s loss%s%s",
                          live_ ? "\r\033[K" : "", l.epoch, l.epochs, std::string(filled, '#'),
                          std::string(kWidth - filled, ' '), l.step, l.total_steps,
                          l.examples_per_second, losses, live_ ? "" : "\n");
  out_.flush();
  pending_ = live_;
}

void ProgressPrinter::EpochResult(int epoch, const std::vector<HeadStats>& test, double seconds) {
  std::string accs;
  for (size_t k = 0; k < test.size(); ++k) {
    if (test[k].count > 0) {
      absl::StrAppendFormat(&accs, " s%d %.2f%%", k, 100 * test[k].accuracy());
    } else {
      absl::StrAppendFormat(&accs, " s%d -", k);  // no figures: the stage did not answer
    }
  }
  out_ << (pending_ ? "\r\033[K" : "") << absl::StrFormat("epoch %d: test accuracy%s", epoch, accs);
  if (seconds >= 0) out_ << absl::StrFormat(" (%.1fs)", seconds);
  out_ << "\n";
  out_.flush();
  pending_ = false;
}

void ProgressPrinter::Done() {
  if (pending_) out_ << "\r\033[K";
  out_.flush();
  pending_ = false;
}

}  // namespace localpar
