// Tensors as localpar.v1.Tensor messages (raw little-endian bytes plus dtype and shape), a
// stage's or a model's parameters as weights messages, and weights files.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/nn/model.h"
#include "proto/tensor.pb.h"

namespace localpar {

v1::DType ToProtoDType(DType t);
// Sets dtype and shape from `t`; leaves the data alone.
void SetTensorHeader(const Tensor& t, v1::DType dtype, v1::Tensor* out);

// Copies the tensor's bytes (from the device if need be) into `out`.
void EncodeTensor(const Tensor& t, v1::Tensor* out);

// Checks dtype, extents and that the byte count equals dtype size x shape, before anything
// is allocated; `field` names the tensor in the error.
absl::Status CheckWireTensor(const v1::Tensor& in, const std::string& field);
// Decodes into `out` (reusing its storage when it can); CheckWireTensor must pass first.
// F16 always becomes float32 (there is no half compute type); BF16 too with `widen_16bit`,
// and otherwise stays a bf16 tensor.
void DecodeTensorInto(const v1::Tensor& in, Backend& backend, Tensor* out,
                      bool widen_16bit = false);

v1::StageWeights SnapshotStage(Stage& stage, int index);
v1::ModelWeights SnapshotModel(Model& model);

// Atomic: written to a temporary file, then renamed.
absl::Status WriteWeightsFile(const v1::ModelWeights& weights, const std::string& path);
absl::StatusOr<v1::ModelWeights> ReadWeightsFile(const std::string& path);

}  // namespace localpar
