// safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length, a JSON header, then raw little-endian float32 data. Names are ParamInfo::readable
// and layouts are PyTorch's (each layer's TorchLayout): linear and dense weights [out, in],
// conv weights [out_channels, in_channels, kh, kw], attention's qkv_weight [3*dim, dim] (q,
// k, v rows, heads contiguous) and out_weight [dim, dim]; vectors and tables as they are.
// __metadata__ holds the job as text, the input transform, the input shape and the classes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_io/model_file.h"

namespace localpar {

// A file's first bytes say whether it is one: the header length, then '{'.
bool LooksLikeSafetensors(const std::string& bytes);

// The parameters `model` (built from `config`) has, read from the file's bytes by their
// readable names and converted to localpar's layouts, as a weights message.
absl::StatusOr<v1::ModelWeights> ReadSafetensors(const std::string& path, const std::string& bytes,
                                                 const ModelConfig& config, Model& model);

// The class names as a JSON list of strings ("[]" when the weights have none): the
// metadata value safetensors and ONNX files carry them in.
std::string ClassNamesJson(const v1::ModelWeights& weights);

absl::Status WriteSafetensors(const std::vector<ParamInfo>& params, const v1::ModelWeights& weights,
                              const std::string& path);

}  // namespace localpar
