// The `localpar` subcommands. Each takes the arguments after its name, parses its own
// flags (its message in proto/config.proto), writes its results to `io.out` and its
// progress, warnings and reasoning to `io.err`, and returns an error as an absl::Status
// with the exit code as a payload (services/common/exit_codes.h); main.cc prints it.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace localpar {

using Args = std::vector<std::string>;

struct Io {
  std::ostream& out;  // results: tables, JSON, the job, file names written
  std::ostream& err;  // progress, warnings, reasoning
};

absl::Status RunCommand(const Args& args, const Io& io);         // run: a local cluster
absl::Status TrainCommand(const Args& args, const Io& io);       // train: the reference trainer
absl::Status ValidateCommand(const Args& args, const Io& io);    // validate: the effective job
absl::Status DataCommand(const Args& args, const Io& io);        // data: the data's figures
absl::Status PlanCommand(const Args& args, const Io& io);        // plan: a balanced split
absl::Status ProjectCommand(const Args& args, const Io& io);     // project: predicted throughput
absl::Status ProbeCommand(const Args& args, const Io& io);       // probe: a gRPC health check
absl::Status StatusCommand(const Args& args, const Io& io);      // status: a running job
absl::Status CheckpointCommand(const Args& args, const Io& io);  // checkpoint: ask for one now
absl::Status ExportCommand(const Args& args, const Io& io);      // export: safetensors or ONNX
absl::Status PredictCommand(const Args& args, const Io& io);     // predict: probabilities
absl::Status SampleCommand(const Args& args, const Io& io);      // sample: text from an LM

}  // namespace localpar
