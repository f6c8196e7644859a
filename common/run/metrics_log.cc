// metrics.jsonl.
#include "common/run/metrics_log.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/run/report.h"

namespace localpar {
namespace {

std::string Number(double v) {
  if (!std::isfinite(v)) return "null";  // JSON has no NaN or infinity
  return absl::StrFormat("%.6g", v);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsLog>> MetricsLog::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  const std::string path = dir + "/metrics.jsonl";
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  return std::unique_ptr<MetricsLog>(new MetricsLog(f));
}

MetricsLog::~MetricsLog() { std::fclose(f_); }

std::string MetricsLog::Line(const MetricsPoint& p, int stage, const HeadStats& s, bool bytes) {
  const std::string bits =
      bytes ? absl::StrCat(",\"bits_per_byte\":", Number(BitsPerByte(s.mean_loss()))) : "";
  // A sequence's windows are its examples; its positions (tokens) are what a head scores.
  const std::string tokens =
      p.positions > 1
          ? absl::StrCat(",\"tokens_per_second\":",
                         Number(p.examples_per_second * static_cast<double>(p.positions)))
          : "";
  return absl::StrFormat(
      "{\"kind\":\"%s\",\"step\":%d,\"epoch\":%d,\"stage\":%d,\"loss\":%s%s,\"accuracy\":%s,"
      "\"examples\":%d,\"lr\":%s,\"examples_per_second\":%s%s,\"wall_seconds\":%s}",
      p.kind, p.step, p.epoch, stage, Number(s.mean_loss()), bits, Number(s.accuracy()), s.count,
      Number(p.lr), Number(p.examples_per_second), tokens, Number(p.wall_seconds));
}

void MetricsLog::Write(const MetricsPoint& p, const std::vector<HeadStats>& stages) {
  std::string lines;
  for (size_t k = 0; k < stages.size(); ++k) {
    if (stages[k].count > 0)
      absl::StrAppend(&lines, Line(p, static_cast<int>(k), stages[k], bytes_), "\n");
  }
  if (lines.empty()) return;
  std::fwrite(lines.data(), 1, lines.size(), f_);
  std::fflush(f_);
}

}  // namespace localpar
