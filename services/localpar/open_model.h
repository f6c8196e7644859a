// Opening a trained model for the commands that use one (export, predict, sample).
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "common/model_io/model_file.h"
#include "proto/config.pb.h"

namespace localpar {

// Loads the job and its weights on `device`; says on `err` when the weights' own stage split
// was taken. Errors carry the command's exit code.
absl::Status OpenModel(const std::string& job_path, const v1::JobOverrides& overrides,
                       const std::string& weights_path, const v1::DeviceConfig& device,
                       std::ostream& err, std::unique_ptr<Backend>* backend, TrainedModel* model);

}  // namespace localpar
