// Tensor allocation, views and cross-device copies.
#include "common/core/tensor.h"

#include <algorithm>
#include <cstring>

namespace localpar {

Tensor Tensor::Empty(Backend& backend, Shape shape, DType dtype) {
  Tensor t;
  t.Ensure(backend, shape, dtype);
  return t;
}

Tensor Tensor::Zeros(Backend& backend, Shape shape) {
  Tensor t = Empty(backend, std::move(shape));
  if (t.numel() > 0) backend.Fill(t.f32(), 0.0f, t.numel());
  return t;
}

Tensor Tensor::FromHost(Backend& backend, Shape shape, const float* data) {
  Tensor t = Empty(backend, std::move(shape));
  if (t.nbytes() > 0) backend.CopyFromHost(t.raw(), data, t.nbytes());
  return t;
}

Tensor Tensor::FromHost(Backend& backend, Shape shape, const std::vector<float>& data) {
  LP_CHECK(static_cast<int64_t>(data.size()) == NumElements(shape));
  return FromHost(backend, std::move(shape), data.data());
}

Tensor Tensor::FromHostI32(Backend& backend, Shape shape, const std::vector<int32_t>& data) {
  LP_CHECK(static_cast<int64_t>(data.size()) == NumElements(shape));
  Tensor t = Empty(backend, std::move(shape), DType::kI32);
  if (t.nbytes() > 0) backend.CopyFromHost(t.raw(), data.data(), t.nbytes());
  return t;
}

Tensor Tensor::Wrap(Backend& backend, void* data, Shape shape, DType dtype,
                    std::shared_ptr<const void> keepalive) {
  LP_CHECK(keepalive != nullptr);
  auto buf = std::make_shared<Buffer>();
  buf->backend = &backend;
  buf->ptr = data;
  buf->bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  buf->external = std::move(keepalive);
  Tensor t;
  t.buffer_ = std::move(buf);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;  // not the owner: Ensure() allocates rather than write into the memory
}

Tensor Tensor::Reshaped(Shape shape) const {
  LP_CHECK_MSG(NumElements(shape) == numel(), "reshape %s -> %s", ShapeString(shape_).c_str(),
               ShapeString(shape).c_str());
  Tensor t = *this;  // a borrowed view
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::Slice(int64_t begin, int64_t count) const {
  LP_CHECK(!shape_.empty() && begin >= 0 && count >= 0 && begin + count <= shape_[0]);
  Tensor t = *this;
  t.offset_ = offset_ + static_cast<size_t>(begin * row_size()) * DTypeSize(dtype_);
  t.shape_[0] = count;
  return t;
}

void Tensor::Ensure(Backend& backend, const Shape& shape, DType dtype) {
  size_t need = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  auto fits = [&](const std::shared_ptr<Buffer>& b) {
    return b && b->backend == &backend && b->bytes >= need;
  };
  bool reusable = owner_ && fits(buffer_);
  if (reusable && buffer_->pins.load(std::memory_order_acquire) > 0) {
    // A reader outside (a transfer in flight) still holds the storage: switch to a spare
    // nobody holds, or allocate one. The held storage becomes a spare for a later call.
    auto free_spare = std::find_if(spares_.begin(), spares_.end(), [&](const auto& b) {
      return fits(b) && b->pins.load(std::memory_order_acquire) == 0;
    });
    if (free_spare != spares_.end()) {
      std::swap(buffer_, *free_spare);
    } else {
      if (spares_.size() < kMaxSpares) spares_.push_back(std::move(buffer_));
      reusable = false;
    }
  }
  if (!spares_.empty()) {
    // Keep the buffers still held plus one free one: enough to cycle through without
    // allocating, and a burst of held buffers (a run of large evaluation batches) is
    // returned once it is over.
    bool kept_free = false;
    spares_.erase(std::remove_if(spares_.begin(), spares_.end(),
                                 [&](const std::shared_ptr<Buffer>& b) {
                                   if (b->pins.load(std::memory_order_acquire) > 0) return false;
                                   if (!kept_free) {
                                     kept_free = true;
                                     return false;
                                   }
                                   return true;
                                 }),
                  spares_.end());
  }
  if (!reusable) {
    auto buf = std::make_shared<Buffer>();
    buf->backend = &backend;
    buf->bytes = need;
    // Zero-size tensors still get a distinct (tiny) allocation so raw() is valid.
    buf->ptr = backend.Allocate(need > 0 ? need : 4);
    buffer_ = std::move(buf);
    offset_ = 0;
    owner_ = true;
  }
  shape_ = shape;
  dtype_ = dtype;
}

std::shared_ptr<const void> Tensor::Pin() const {
  LP_CHECK(buffer_ != nullptr);
  buffer_->pins.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<Buffer> held = buffer_;
  return std::shared_ptr<const void>(
      raw(), [held](const void*) { held->pins.fetch_sub(1, std::memory_order_release); });
}

Tensor Tensor::CopyTo(Backend& dst) const {
  Tensor t = Empty(dst, shape_, dtype_);
  size_t bytes = nbytes();
  if (bytes == 0) return t;
  if (&dst == &backend()) {
    dst.CopyWithin(t.raw(), raw(), bytes);
  } else if (backend().device() == DeviceType::kCPU) {
    dst.CopyFromHost(t.raw(), raw(), bytes);
  } else if (dst.device() == DeviceType::kCPU) {
    backend().CopyToHost(t.raw(), raw(), bytes);
  } else {
    std::vector<char> staging(bytes);
    backend().CopyToHost(staging.data(), raw(), bytes);
    dst.CopyFromHost(t.raw(), staging.data(), bytes);
  }
  return t;
}

void Tensor::CopyFrom(const Tensor& src) {
  LP_CHECK(src.numel() == numel() && src.dtype() == dtype_);
  size_t bytes = nbytes();
  if (bytes == 0) return;
  if (&src.backend() == &backend()) {
    backend().CopyWithin(raw(), src.raw(), bytes);
  } else if (src.backend().device() == DeviceType::kCPU) {
    backend().CopyFromHost(raw(), src.raw(), bytes);
  } else if (backend().device() == DeviceType::kCPU) {
    src.backend().CopyToHost(raw(), src.raw(), bytes);
  } else {
    CopyFrom(src.CopyTo(*MakeCpuBackend()));  // rare: device to another device
  }
}

std::vector<float> Tensor::ToHost() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  if (dtype_ == DType::kBF16) {
    std::vector<uint16_t> tmp(out.size());
    if (!tmp.empty()) backend().CopyToHost(tmp.data(), raw(), nbytes());
    for (size_t i = 0; i < tmp.size(); ++i) out[i] = Bf16ToFloat(tmp[i]);
    return out;
  }
  LP_CHECK(dtype_ == DType::kF32);
  if (!out.empty()) backend().CopyToHost(out.data(), raw(), nbytes());
  return out;
}

std::vector<int32_t> Tensor::ToHostI32() const {
  LP_CHECK(dtype_ == DType::kI32);
  std::vector<int32_t> out(static_cast<size_t>(numel()));
  if (!out.empty()) backend().CopyToHost(out.data(), raw(), nbytes());
  return out;
}

}  // namespace localpar
