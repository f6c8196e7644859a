// ONNX export: a trained network up to one stage's head as an ONNX model (opset 17).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model_io/model_file.h"

namespace localpar {

inline constexpr int kOnnxOpset = 17;

// The network from the raw input through stages 0..stage and stage `stage`'s head, as the
// bytes of an .onnx file. The graph's input is "input": the data's raw values, float32
// [N, example shape...] with the training input transform built in, or int64 token ids
// [N, positions] for a network that starts with an embedding. Its output is "logits":
// [N, classes], or [N, positions, classes] for a language model. Tensors stay NHWC as in
// localpar; convolutions and pools are wrapped in transposes to ONNX's NCHW. Dropout is the
// identity and batch norm uses its running statistics, as in localpar's evaluation.
absl::StatusOr<std::string> ExportOnnx(TrainedModel& trained, int stage, const std::string& name);

}  // namespace localpar
