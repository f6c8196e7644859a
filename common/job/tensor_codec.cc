// Tensor wire codec and weight files.
#include "common/job/tensor_codec.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/atomic_file.h"

namespace localpar {
namespace {

v1::DType ToWire(DType t) {
  switch (t) {
    case DType::kF32:
      return v1::F32;
    case DType::kBF16:
      return v1::BF16;
    case DType::kI32:
      return v1::I32;
  }
  return v1::DTYPE_UNSPECIFIED;
}

bool FromWire(v1::DType t, DType* out) {
  switch (t) {
    case v1::F32:
      *out = DType::kF32;
      return true;
    case v1::BF16:
      *out = DType::kBF16;
      return true;
    case v1::I32:
      *out = DType::kI32;
      return true;
    default:
      return false;
  }
}

// Bytes per element of a wire dtype (F16 exists only on the wire).
size_t WireSize(v1::DType t) {
  if (t == v1::F16) return 2;
  DType dt;
  return FromWire(t, &dt) ? DTypeSize(dt) : 0;
}

}  // namespace

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

void SetHeader(const Tensor& t, v1::DType dtype, v1::Tensor* out) {
  out->set_dtype(dtype);
  out->clear_shape();
  for (int64_t d : t.shape()) out->add_shape(d);
}

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
  SetHeader(t, WireDType(format), out);
  std::string* data = out->mutable_data();
  data->resize(static_cast<size_t>(t.numel()) * 2);
  NarrowTo(t, format, reinterpret_cast<uint16_t*>(data->data()));
}

WireBytes PrepareActivations(const Tensor& t, WireFormat format, Backend& host, Tensor* staging,
                             v1::Tensor* header) {
  LP_CHECK(host.device() == DeviceType::kCPU);
  const bool narrow = format != WireFormat::kF32 && t.dtype() == DType::kF32;
  SetHeader(t, narrow ? WireDType(format) : ToWire(t.dtype()), header);
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
  if (in.dtype() == v1::F32) {
    DecodeTensorInto(in, backend, out);
    return;
  }
  const size_t n = in.data().size() / 2;
  out->Ensure(backend, Shape(in.shape().begin(), in.shape().end()), DType::kF32);
  // CPU tensors are widened in place; device tensors through one staged copy.
  thread_local std::vector<float> staged;
  const bool on_cpu = backend.device() == DeviceType::kCPU;
  if (!on_cpu) staged.resize(n);
  float* dst = on_cpu ? out->f32() : staged.data();
  const auto* src = reinterpret_cast<const uint16_t*>(in.data().data());
  if (in.dtype() == v1::BF16) {
    for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = F16ToFloat(src[i]);
  }
  if (!on_cpu && n > 0) backend.CopyFromHost(out->raw(), dst, n * sizeof(float));
}

void TakeActivations(v1::Tensor* in, Backend& backend, Tensor* out) {
  if (in->dtype() != v1::F32 || backend.device() != DeviceType::kCPU) {
    DecodeActivationsInto(*in, backend, out);
    return;
  }
  auto bytes = std::make_shared<std::string>(std::move(*in->mutable_data()));
  in->clear_data();
  void* data = bytes->data();
  *out = Tensor::Wrap(backend, data, Shape(in->shape().begin(), in->shape().end()), DType::kF32,
                      std::move(bytes));
}

void EncodeTensor(const Tensor& t, v1::Tensor* out) {
  SetHeader(t, ToWire(t.dtype()), out);
  std::string* data = out->mutable_data();
  data->resize(t.nbytes());
  if (t.nbytes() > 0) t.backend().CopyToHost(data->data(), t.raw(), t.nbytes());
}

absl::Status CheckWireTensor(const v1::Tensor& in, const std::string& field) {
  size_t elem = WireSize(in.dtype());
  if (elem == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dtype: unsupported value ", static_cast<int>(in.dtype())));
  }
  if (in.shape().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape: empty"));
  }
  // Refuse shapes whose element count would overflow before comparing byte counts.
  int64_t n = 1;
  for (int64_t d : in.shape()) {
    if (d < 0)
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape: negative extent ", d));
    if (d > 0 && n > std::numeric_limits<int64_t>::max() / 8 / d) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape: too many elements"));
    }
    n *= d;
  }
  size_t want = static_cast<size_t>(n) * elem;
  if (in.data().size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".data: ", in.data().size(), " bytes do not match dtype ",
                     v1::DType_Name(in.dtype()), " x shape [", absl::StrJoin(in.shape(), ","),
                     "] = ", want, " bytes"));
  }
  return absl::OkStatus();
}

void DecodeTensorInto(const v1::Tensor& in, Backend& backend, Tensor* out) {
  if (in.dtype() == v1::F16) {  // no half compute type: widen to float32
    DecodeActivationsInto(in, backend, out);
    return;
  }
  DType dt = DType::kF32;
  FromWire(in.dtype(), &dt);
  out->Ensure(backend, Shape(in.shape().begin(), in.shape().end()), dt);
  if (out->nbytes() > 0) backend.CopyFromHost(out->raw(), in.data().data(), out->nbytes());
}

v1::StageWeights SnapshotStage(Stage& stage, int index) {
  v1::StageWeights w;
  w.set_stage(index);
  std::vector<Param*> params = stage.params();
  for (size_t i = 0; i < params.size(); ++i) {
    v1::NamedTensor* nt = w.add_params();
    nt->set_name(absl::StrCat(i, ".", params[i]->name));
    EncodeTensor(params[i]->value, nt->mutable_tensor());
  }
  return w;
}

v1::ModelWeights SnapshotModel(Model& model) {
  v1::ModelWeights w;
  for (int k = 0; k < model.num_stages(); ++k) *w.add_stages() = SnapshotStage(model.stage(k), k);
  return w;
}

absl::Status WriteWeightsFile(const v1::ModelWeights& weights, const std::string& path) {
  return WriteFileAtomically(path, weights.SerializeAsString());
}

absl::StatusOr<v1::ModelWeights> ReadWeightsFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  v1::ModelWeights w;
  if (!w.ParseFromIstream(&in))
    return absl::DataLossError(absl::StrCat(path, ": not a weights file"));
  return w;
}

}  // namespace localpar
