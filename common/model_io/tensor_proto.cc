// Tensors as localpar.v1.Tensor messages, stage and model weights, weights files.
#include "common/model_io/tensor_proto.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/atomic_file.h"
#include "common/io/regular_file.h"

namespace localpar {
namespace {}  // namespace

v1::DType ToProtoDType(DType t) {
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

namespace {

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

void SetTensorHeader(const Tensor& t, v1::DType dtype, v1::Tensor* out) {
  out->set_dtype(dtype);
  out->clear_shape();
  for (int64_t d : t.shape()) out->add_shape(d);
}

// Widens 16-bit values (BF16, F16) into a float32 tensor: CPU tensors in place, device
// tensors through one staged copy.
void WidenInto(const v1::Tensor& in, Backend& backend, Tensor* out) {
  const size_t n = in.data().size() / 2;
  out->Ensure(backend, Shape(in.shape().begin(), in.shape().end()), DType::kF32);
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

void EncodeTensor(const Tensor& t, v1::Tensor* out) {
  SetTensorHeader(t, ToProtoDType(t.dtype()), out);
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

void DecodeTensorInto(const v1::Tensor& in, Backend& backend, Tensor* out, bool widen_16bit) {
  if (in.dtype() == v1::F16 || (in.dtype() == v1::BF16 && widen_16bit)) {
    WidenInto(in, backend, out);  // no half compute type: float32
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
  if (absl::Status s = CheckRegularFile(path, "weights file"); !s.ok()) return s;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  v1::ModelWeights w;
  if (!w.ParseFromIstream(&in))
    return absl::DataLossError(absl::StrCat(path, ": not a weights file"));
  return w;
}

}  // namespace localpar
