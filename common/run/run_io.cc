// A run's start and end (run_io.h).
#include "common/run/run_io.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job/spec.h"
#include "common/run/report.h"

namespace localpar {

absl::StatusOr<InitNotes> LoadInitialWeights(const std::string& path, const ModelConfig& config,
                                             Model& model, std::ostream& log) {
  InitNotes notes;
  const absl::Time read_start = absl::Now();
  absl::StatusOr<v1::ModelWeights> init = ReadAnyWeightsFile(path, config, model, &notes);
  if (!init.ok()) return init.status();
  if (absl::Status s = LoadWeights(*init, path, config, model); !s.ok()) return s;
  log << "--init_from: " << path << ": "
      << TransferFigures(WeightsBytes(*init), absl::ToDoubleSeconds(absl::Now() - read_start))
      << "\n";
  if (std::string said = DescribeInitNotes(notes, model.num_stages()); !said.empty()) {
    log << "--init_from: " << said << "\n";
  }
  return notes;
}

LedgerOptions RunLedgerOptions(const std::string& out_dir, bool progress, std::ostream& log,
                               const InitNotes& notes) {
  LedgerOptions lo;
  lo.out_dir = out_dir;
  lo.progress = progress;
  lo.live = isatty(STDERR_FILENO);
  lo.log = &log;
  lo.init_fresh_heads = notes.fresh_heads;
  lo.init_unused_heads = notes.unused_heads;
  return lo;
}

absl::Status WriteRunOutputs(const v1::Job& job, const v1::RunReport& report,
                             v1::ModelWeights weights, const RunOutputs& o, std::ostream& out) {
  out << ReportTable(report);
  if (o.out_dir.empty()) return absl::OkStatus();
  if (absl::Status st = WriteReport(report, o.out_dir); !st.ok()) return st;
  if (o.data != nullptr) {
    DescribeWeights(job, o.data->normalization, o.data->class_names, &weights);
  }
  const absl::Time write_start = absl::Now();
  absl::StatusOr<std::string> written =
      WriteRunWeights(weights, ToModelConfig(job), o.model, o.out_dir, o.weights_pb_limit);
  if (!written.ok()) return written.status();
  const int64_t bytes = WeightsBytes(weights);
  out << "weights: " << *written << " ("
      << TransferFigures(bytes, absl::ToDoubleSeconds(absl::Now() - write_start));
  if (o.collect_seconds >= 0) {
    out << ", after " << TransferFigures(bytes, o.collect_seconds) << " from the workers";
  }
  out << ")\nreport: " << o.out_dir << "/report.json\n";
  return absl::OkStatus();
}

}  // namespace localpar
