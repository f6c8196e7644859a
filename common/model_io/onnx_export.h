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
//
// With `external`, every initializer of at least external->min_bytes goes to the file
// external->path instead (ONNX external data, offsets aligned to 4096 bytes), written
// before this returns, and the graph records it as external->location: the way past
// protobuf's 2 GiB limit on one file.
struct OnnxExternalData {
  std::string path;         // the data file to write
  std::string location;     // its name as the graph records it, relative to the .onnx file
  size_t min_bytes = 1024;  // smaller initializers stay in the graph
};
absl::StatusOr<std::string> ExportOnnx(TrainedModel& trained, int stage, const std::string& name,
                                       const OnnxExternalData* external = nullptr);

}  // namespace localpar
