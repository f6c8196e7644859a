// The progress printer.
#include "common/run/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/run/report.h"

namespace localpar {

namespace {

// Columns of the terminal on stderr; COLUMNS, then 80, when it does not say.
int TerminalColumns() {
  winsize ws{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c != nullptr && std::atoi(c) > 0) {
    return std::atoi(c);
  }
  return 80;
}

}  // namespace

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
}

ProgressPrinter::ProgressPrinter(std::ostream& out, bool live, bool enabled, int width)
    : out_(out),
      live_(live),
      enabled_(enabled),
      // A live line stays one column short of the terminal's width, so it never wraps.
      width_(width > 0 ? width : (live ? TerminalColumns() - 1 : 0)) {}

std::string ProgressPrinter::Format(const ProgressLine& l) {
  std::string times;
  if (l.elapsed_seconds >= 0) {
    if (first_step_ < 0) {
      first_step_ = l.step;
      first_elapsed_ = l.elapsed_seconds;
    }
    times = absl::StrCat(" ", FormatDuration(l.elapsed_seconds));
    const int64_t done = l.step - first_step_;
    const double spent = l.elapsed_seconds - first_elapsed_;
    if (done > 0 && spent > 0 && l.total_steps >= l.step) {
      absl::StrAppend(&times, " ETA ",
                      FormatDuration(spent / static_cast<double>(done) *
                                     static_cast<double>(l.total_steps - l.step)));
    }
  }
  std::string every, range = " -";  // every stage's loss; the lowest and the highest
  int lo = -1, hi = -1;
  for (size_t k = 0; k < l.recent.size(); ++k) {
    const HeadStats& r = l.recent[k];
    if (r.count > 0) {
      absl::StrAppendFormat(&every, " s%d %.3f", k, r.mean_loss());
      if (lo < 0 || r.mean_loss() < l.recent[lo].mean_loss()) lo = static_cast<int>(k);
      if (hi < 0 || r.mean_loss() > l.recent[hi].mean_loss()) hi = static_cast<int>(k);
    } else {
      absl::StrAppendFormat(&every, " s%d -", k);
    }
  }
  if (lo >= 0) {
    range = absl::StrFormat(" %.3f-%.3f", l.recent[lo].mean_loss(), l.recent[hi].mean_loss());
    if (bytes_) {  // nats, and the best stage's in bits per byte
      const std::string bits =
          absl::StrFormat(" nats, best %.3f bits/byte", BitsPerByte(l.recent[lo].mean_loss()));
      every += bits;
      range += bits;
    }
  }
  auto compose = [&](int bar, const std::string& losses) {
    std::string bar_text;
    if (bar > 0) {
      const int filled =
          l.total_steps > 0
              ? static_cast<int>(bar * std::min(l.step, l.total_steps) / l.total_steps)
              : 0;
      bar_text = absl::StrCat(" [", std::string(filled, '#'), std::string(bar - filled, ' '), "]");
    }
    return absl::StrFormat("epoch %d/%d%s step %d/%d %.0f ex/s%s %s%s", l.epoch, l.epochs, bar_text,
                           l.step, l.total_steps, l.examples_per_second, times,
                           l.evaluating ? "evaluating; loss" : "loss", losses);
  };
  // Narrower and narrower until it fits: every stage's loss, then the lowest and highest,
  // then a shorter bar, then none; a line that still does not fit is cut.
  std::string line = compose(20, every);
  const auto fits = [&] { return width_ <= 0 || static_cast<int>(line.size()) <= width_; };
  if (!fits()) line = compose(20, range);
  if (!fits()) line = compose(10, range);
  if (!fits()) line = compose(0, range);
  if (!fits()) line.resize(static_cast<size_t>(width_));
  return line;
}

void ProgressPrinter::Update(const ProgressLine& l, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const auto every = live_ ? std::chrono::milliseconds(250) : std::chrono::milliseconds(2000);
  if (!force && now - last_ < every) return;
  last_ = now;
  out_ << (live_ ? "\r\033[K" : "") << Format(l) << (live_ ? "" : "\n");
  out_.flush();
  pending_ = live_;
}

void ProgressPrinter::EpochResult(int epoch, const std::vector<HeadStats>& test, double seconds) {
  Result(absl::StrFormat("epoch %d", epoch), test, seconds);
}

void ProgressPrinter::InterimResult(int64_t step, int epoch, const std::vector<HeadStats>& test) {
  Result(absl::StrFormat("step %d (epoch %d)", step, epoch), test, -1);
}

void ProgressPrinter::Result(const std::string& what, const std::vector<HeadStats>& test,
                             double seconds) {
  std::string accs;
  for (size_t k = 0; k < test.size(); ++k) {
    if (test[k].count > 0) {
      absl::StrAppendFormat(&accs, " s%d %.2f%%", k, 100 * test[k].accuracy());
    } else {
      absl::StrAppendFormat(&accs, " s%d -", k);  // no figures: the stage did not answer
    }
  }
  // The loss beside: bits per byte for a byte corpus, nats otherwise (a token model's
  // accuracy alone says little).
  absl::StrAppend(&accs, bytes_ ? "; bits/byte" : "; loss");
  for (size_t k = 0; k < test.size(); ++k) {
    if (test[k].count > 0) {
      const double loss = test[k].mean_loss();
      if (bytes_) {
        absl::StrAppendFormat(&accs, " s%d %.3f", k, BitsPerByte(loss));
      } else {
        absl::StrAppendFormat(&accs, " s%d %.4f", k, loss);
      }
    } else {
      absl::StrAppendFormat(&accs, " s%d -", k);
    }
  }
  out_ << (pending_ ? "\r\033[K" : "") << what << ": " << split_ << " accuracy" << accs;
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
