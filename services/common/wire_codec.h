// Activations and returned gradients on the wire: float32 tensors encoded as F32, or BF16 /
// F16 rounded to nearest even (the rounding RoundThroughWire applies in the reference
// trainer), and decoded back; wire.h frames them without copying.
#pragma once

#include <functional>
#include <memory>

#include "common/model_io/tensor_proto.h"

namespace localpar {

v1::DType WireDType(WireFormat format);

// Encodes a float32 tensor as `format` into a message (tests and small items).
void EncodeActivations(const Tensor& t, WireFormat format, v1::Tensor* out);

// Activations as they go on the wire without being copied into a message: `header` gets the
// dtype and shape (its data left empty), and the returned bytes follow it on the wire (see
// wire.h). A CPU tensor sent at its own precision goes straight from its memory, pinned
// (Tensor::Pin); a 16-bit conversion or a device tensor is written once into `staging`, a
// tensor on the CPU backend `host` that the caller keeps between calls, and pinned there.
// `hold` keeps the bytes valid and unchanged until the transport lets go.
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

// Decodes F32, BF16 or F16 wire activations into a float32 tensor (I32 token ids into an
// int32 one); CheckWireTensor first.
void DecodeActivationsInto(const v1::Tensor& in, Backend& backend, Tensor* out);

// Like DecodeActivationsInto, but F32 activations or I32 ids for a CPU backend are taken over
// without a copy: `out` becomes a view of the message's bytes, which move out of `in` and
// live as long as the tensor (or its views) do.
void TakeActivations(v1::Tensor* in, Backend& backend, Tensor* out);

}  // namespace localpar
