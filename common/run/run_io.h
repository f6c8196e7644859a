// A run's start and end, written once for the reference trainer (reference_run.cc) and the
// coordinator: the --init_from weights and what is said of them, the ledger's options, and
// at the end the report's table, report.json and the final weights.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data/dataset.h"
#include "common/model_io/model_file.h"
#include "common/nn/model.h"
#include "common/run/ledger.h"
#include "proto/job.pb.h"
#include "proto/report.pb.h"

namespace localpar {

// --init_from: reads `path` (weights.pb, safetensors or their shards, whatever stage split
// they were trained with) into `model`, built from `config`, and says on `log` how much it
// read and how fast, and which heads it left out or started fresh. An error names `path`.
absl::StatusOr<InitNotes> LoadInitialWeights(const std::string& path, const ModelConfig& config,
                                             Model& model, std::ostream& log);

// The ledger's options every run sets the same way; `log` gets the progress line (rewritten
// in place when stderr is a terminal), `notes` what --init_from changed.
LedgerOptions RunLedgerOptions(const std::string& out_dir, bool progress, std::ostream& log,
                               const InitNotes& notes);

// What the end of a run writes.
struct RunOutputs {
  std::string out_dir;                              // report.json and the weights ("": none)
  int64_t weights_pb_limit = kWeightsPbLimitBytes;  // past it, sharded safetensors
  const DataSplit* data = nullptr;  // its input normalisation and class names go with the weights
  Model* model = nullptr;           // the trained model in this process (a cluster's: null)
  // A cluster's weights came from its workers: how long that took (< 0: not said).
  double collect_seconds = -1;
};

// The end of a run: the report's table on `out`, then (with an out directory) report.json
// and the weights, each named on `out` once written. The weights are described (the job,
// its input normalisation and class names) before they are written.
absl::Status WriteRunOutputs(const v1::Job& job, const v1::RunReport& report,
                             v1::ModelWeights weights, const RunOutputs& outputs,
                             std::ostream& out);

}  // namespace localpar
