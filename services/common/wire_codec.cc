// Activations on the wire: float32 tensors encoded as F32, BF16 or F16 (token ids as I32),
// sent from their own memory where they can be, and taken over without a copy on the CPU.
#include "services/common/wire_codec.h"

#include <vector>

#include "common/core/check.h"

namespace localpar {

v1::DType WireDType(WireFormat format) {
  switch (format) {
    case WireFormat::kBF16:
      return v1::BF16;
    case WireFormat::kF16:
      return v1::F16;
    case WireFormat::kF32:
      break;
  }
  return v1::F32;
}

namespace {

// Rounds a float32 tensor's elements to 16-bit `format` into dst: straight from CPU memory,
// or through one staged host copy for a device tensor.
void NarrowTo(const Tensor& t, WireFormat format, uint16_t* dst) {
  const size_t n = static_cast<size_t>(t.numel());
  const float* src = nullptr;
  thread_local std::vector<float> staged;
  if (t.backend().device() == DeviceType::kCPU) {
    src = t.f32();
  } else {
    staged.resize(n);
    if (n > 0) t.backend().CopyToHost(staged.data(), t.raw(), t.nbytes());
    src = staged.data();
  }
  if (format == WireFormat::kBF16) {
    for (size_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = FloatToF16(src[i]);
  }
}

}  // namespace

void EncodeActivations(const Tensor& t, WireFormat format, v1::Tensor* out) {
  if (format == WireFormat::kF32 || t.dtype() != DType::kF32) {
    EncodeTensor(t, out);
    return;
  }
  SetTensorHeader(t, WireDType(format), out);
  std::string* data = out->mutable_data();
  data->resize(static_cast<size_t>(t.numel()) * 2);
  NarrowTo(t, format, reinterpret_cast<uint16_t*>(data->data()));
}

WireBytes PrepareActivations(const Tensor& t, WireFormat format, Backend& host, Tensor* staging,
                             v1::Tensor* header) {
  LP_CHECK(host.device() == DeviceType::kCPU);
  const bool narrow = format != WireFormat::kF32 && t.dtype() == DType::kF32;
  SetTensorHeader(t, narrow ? WireDType(format) : ToProtoDType(t.dtype()), header);
  header->clear_data();
  const bool on_cpu = t.backend().device() == DeviceType::kCPU;
  if (!narrow && on_cpu) return WireBytes{t.raw(), t.nbytes(), t.Pin(), nullptr};
  const size_t bytes = narrow ? static_cast<size_t>(t.numel()) * 2 : t.nbytes();
  // Staged as 16-bit words: only the byte count matters.
  staging->Ensure(host, {static_cast<int64_t>((bytes + 1) / 2)}, DType::kBF16);
  void* dst = staging->raw();
  if (!narrow) {
    // A device tensor sent as is: copied on the backend's copy stream while the stage goes on
    // computing. Both ends stay pinned until the transport is done: the staging bytes, and
    // the device tensor, which the next step's forward must not overwrite mid-copy.
    WireBytes out{dst, bytes, nullptr, nullptr};
    if (bytes > 0) out.ready = t.backend().CopyToHostAsync(dst, t.raw(), bytes);
    auto pins =
        std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<const void>>>(
            staging->Pin(), t.Pin());
    out.hold = std::shared_ptr<const void>(pins, dst);
    return out;
  }
  NarrowTo(t, format, static_cast<uint16_t*>(dst));
  return WireBytes{dst, bytes, staging->Pin(), nullptr};
}

void DecodeActivationsInto(const v1::Tensor& in, Backend& backend, Tensor* out) {
  DecodeTensorInto(in, backend, out, /*widen_16bit=*/true);
}

void TakeActivations(v1::Tensor* in, Backend& backend, Tensor* out) {
  const bool whole = in->dtype() == v1::F32 || in->dtype() == v1::I32;  // token ids
  if (!whole || backend.device() != DeviceType::kCPU) {
    DecodeActivationsInto(*in, backend, out);
    return;
  }
  auto bytes = std::make_shared<std::string>(std::move(*in->mutable_data()));
  in->clear_data();
  void* data = bytes->data();
  *out = Tensor::Wrap(backend, data, Shape(in->shape().begin(), in->shape().end()),
                      in->dtype() == v1::I32 ? DType::kI32 : DType::kF32, std::move(bytes));
}

}  // namespace localpar
