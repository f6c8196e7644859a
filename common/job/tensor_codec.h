// Tensors to and from their wire form (raw little-endian bytes plus dtype and shape), and
// weight snapshots in files.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/nn/model.h"
#include "proto/tensor.pb.h"

namespace localpar {

// Copies the tensor's bytes (from the device if need be) into `out`.
void EncodeTensor(const Tensor& t, v1::Tensor* out);

// Encodes a float32 tensor as `format` on the wire (F32, or BF16 / F16 rounded to nearest
// even, the same rounding as RoundThroughWire).
void EncodeActivations(const Tensor& t, WireFormat format, v1::Tensor* out);
// Activations as they go on the wire without being copied into a message: `header` gets the
// dtype and shape (its data left empty), and the returned bytes follow it on the wire (see
// services/common/wire.h). A CPU tensor sent at its own precision goes straight from its
// memory, pinned (Tensor::Pin); a 16-bit conversion or a device tensor is written once into
// `staging`, a tensor on the CPU backend `host` that the caller keeps between calls, and
// pinned there. `hold` keeps the bytes valid and unchanged until the transport lets go.
struct WireBytes {
  const void* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> hold;
  // Waits until `data` is filled: a device tensor is copied to the staging buffer on a
  // copy stream, overlapping the compute that follows; null when the bytes are ready.
  std::function<void()> ready;
};
WireBytes PrepareActivations(const Tensor& t, WireFormat format, Backend& host, Tensor* staging,
                             v1::Tensor* header);

// Decodes F32, BF16 or F16 wire activations into a float32 tensor; CheckWireTensor first.
void DecodeActivationsInto(const v1::Tensor& in, Backend& backend, Tensor* out);
v1::DType WireDType(WireFormat format);

// Like DecodeActivationsInto, but float32 activations for a CPU backend are taken over
// without a copy: `out` becomes a view of the message's bytes, which move out of `in` and
// live as long as the tensor (or its views) do.
void TakeActivations(v1::Tensor* in, Backend& backend, Tensor* out);

// Checks dtype, extents and that the byte count equals dtype size x shape, before anything
// is allocated; `field` names the tensor in the error.
absl::Status CheckWireTensor(const v1::Tensor& in, const std::string& field);
// Decodes into `out` (reusing its storage when it can); CheckWireTensor must pass first.
void DecodeTensorInto(const v1::Tensor& in, Backend& backend, Tensor* out);

v1::StageWeights SnapshotStage(Stage& stage, int index);
v1::ModelWeights SnapshotModel(Model& model);

// Atomic: written to a temporary file, then renamed.
absl::Status WriteWeightsFile(const v1::ModelWeights& weights, const std::string& path);
absl::StatusOr<v1::ModelWeights> ReadWeightsFile(const std::string& path);

}  // namespace localpar
