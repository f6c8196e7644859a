// The `localpar` subcommands. Each takes the arguments after its name, parses its own
// flags (its message in proto/config.proto) and returns the exit code.
#pragma once

#include <string>
#include <vector>

namespace localpar {

using Args = std::vector<std::string>;

int RunCommandMain(const Args& args);         // run: a local cluster (launcher.h)
int TrainCommandMain(const Args& args);       // train: the reference trainer
int ValidateCommandMain(const Args& args);    // validate: the effective job, and --explain
int DataCommandMain(const Args& args);        // data: the data set's figures as JSON
int PlanCommandMain(const Args& args);        // plan: a balanced split into K stages
int ProjectCommandMain(const Args& args);     // project: predicted pipeline throughput
int ProbeCommandMain(const Args& args);       // probe: a gRPC health check
int StatusCommandMain(const Args& args);      // status: a running job's stages
int CheckpointCommandMain(const Args& args);  // checkpoint: ask for one now
int ExportCommandMain(const Args& args);      // export: safetensors or ONNX
int PredictCommandMain(const Args& args);     // predict: class probabilities for examples

}  // namespace localpar
