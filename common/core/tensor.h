// Tensor: a typed, shaped view of contiguous memory owned by one Backend.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/core/backend.h"
#include "common/core/check.h"
#include "common/core/dtype.h"
#include "common/core/shape.h"

namespace localpar {

// Storage is shared between a tensor and its views (Slice, Reshaped); copying a Tensor
// copies the handle, never the data. The tensor that allocated the storage owns it: only
// the owner's Ensure() reuses the storage, and it may do so while borrowed handles still
// see it (that is how per-layer buffers are recycled every step without allocating).
// Data moves between devices only through CopyTo or CopyFrom. The Backend must outlive
// every tensor allocated on it.
//
// Pin() hands a reader on another thread (a zero-copy network send) a hold on the storage:
// while a pin is alive, the owner's Ensure() does not write into that storage but switches
// to another buffer it keeps for the purpose, so in the steady state it cycles through as
// many buffers as are held at once and allocates nothing.
class Tensor {
 public:
  Tensor() = default;
  // Copies are borrowed handles; moves carry ownership.
  Tensor(const Tensor& o)
      : buffer_(o.buffer_), offset_(o.offset_), shape_(o.shape_), dtype_(o.dtype_) {}
  Tensor& operator=(const Tensor& o) {
    buffer_ = o.buffer_;
    offset_ = o.offset_;
    shape_ = o.shape_;
    dtype_ = o.dtype_;
    owner_ = false;
    spares_.clear();
    return *this;
  }
  Tensor(Tensor&& o) noexcept = default;
  Tensor& operator=(Tensor&& o) noexcept = default;

  static Tensor Empty(Backend& backend, Shape shape, DType dtype = DType::kF32);
  static Tensor Zeros(Backend& backend, Shape shape);
  static Tensor FromHost(Backend& backend, Shape shape, const float* data);
  static Tensor FromHost(Backend& backend, Shape shape, const std::vector<float>& data);
  static Tensor FromHostI32(Backend& backend, Shape shape, const std::vector<int32_t>& data);
  // A borrowed tensor over memory someone else owns (a received message's bytes), kept
  // alive by `keepalive`; nothing is copied. Its Ensure() never writes into that memory.
  static Tensor Wrap(Backend& backend, void* data, Shape shape, DType dtype,
                     std::shared_ptr<const void> keepalive);

  bool defined() const { return buffer_ != nullptr; }
  Backend& backend() const { return *buffer_->backend; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_[i]; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return NumElements(shape_); }
  int64_t rows() const { return shape_.empty() ? 1 : shape_[0]; }
  int64_t row_size() const { return RowSize(shape_); }
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  size_t capacity_bytes() const { return buffer_ ? buffer_->bytes - offset_ : 0; }

  void* raw() const { return static_cast<char*>(buffer_->ptr) + offset_; }
  float* f32() const {
    LP_CHECK(dtype_ == DType::kF32);
    return static_cast<float*>(raw());
  }
  int32_t* i32() const {
    LP_CHECK(dtype_ == DType::kI32);
    return static_cast<int32_t*>(raw());
  }
  uint16_t* bf16() const {
    LP_CHECK(dtype_ == DType::kBF16);
    return static_cast<uint16_t*>(raw());
  }

  // Same storage, new shape with the same element count.
  Tensor Reshaped(Shape shape) const;
  // Rows [begin, begin+count) of the outermost dimension, sharing storage.
  Tensor Slice(int64_t begin, int64_t count) const;

  // Makes this tensor hold `shape`, reusing its storage when this tensor owns it and it is
  // large enough. Contents are unspecified afterwards.
  void Ensure(Backend& backend, const Shape& shape, DType dtype = DType::kF32);

  // Keeps the storage alive and unchanged by the owner's Ensure() until the returned handle
  // (which points at raw()) is released, on any thread.
  std::shared_ptr<const void> Pin() const;

  // Deep copy onto `backend` (possibly another device).
  Tensor CopyTo(Backend& backend) const;
  Tensor Clone() const { return CopyTo(backend()); }
  // Copies src's elements into this tensor; shapes must have equal element counts.
  void CopyFrom(const Tensor& src);

  std::vector<float> ToHost() const;
  std::vector<int32_t> ToHostI32() const;

 private:
  struct Buffer {
    Backend* backend = nullptr;
    void* ptr = nullptr;
    size_t bytes = 0;
    std::atomic<int> pins{0};
    std::shared_ptr<const void> external;  // set for Wrap(): the memory is not ours to free
    ~Buffer() {
      if (ptr && !external) backend->Free(ptr);
    }
  };

  std::shared_ptr<Buffer> buffer_;
  // The owner's other buffers, used while buffer_ is pinned: those still held (a queue's
  // capacity plus one in flight, for a network send) and at most one free one; at most
  // kMaxSpares in all, past which a released buffer is freed.
  static constexpr size_t kMaxSpares = 16;
  std::vector<std::shared_ptr<Buffer>> spares_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
  bool owner_ = false;
};

}  // namespace localpar
