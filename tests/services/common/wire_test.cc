// Zero-copy framing of the downstream link: a framed batch parses as exactly the DownItem
// the ordinary encoding gives, its activation bytes are the tensor's own memory (not a
// copy), and the tensor's owner cannot overwrite them while gRPC holds them.
#include "services//common/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "services/common/wire_codec.h"

namespace localpar {
namespace {

std::string Flatten(const grpc::ByteBuffer& bb, std::vector<grpc::Slice>* slices) {
  EXPECT_TRUE(bb.Dump(slices).ok());
  std::string out;
  for (const grpc::Slice& s : *slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

v1::Batch Header(int64_t rows) {
  v1::Batch b;
  b.set_seq(41);
  b.set_epoch(2);
  b.set_phase(v1::TRAIN);
  b.set_step(7);
  b.set_micro_batch(1);
  b.set_micro_batches(3);
  b.set_batch_rows(rows * 3);
  v1::Tensor* labels = b.mutable_labels();
  labels->set_dtype(v1::I32);
  labels->add_shape(rows);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) ids[i] = static_cast<int32_t>(i % 10);
  labels->set_data(ids.data(), ids.size() * 4);
  return b;
}

// The ordinary encoding of the same batch, for comparison.
std::string Ordinary(v1::Batch b, const Tensor& y, WireFormat format) {
  EncodeActivations(y, format, b.mutable_activations());
  v1::DownItem item;
  *item.mutable_batch() = std::move(b);
  return item.SerializeAsString();
}

Tensor Activations(Backend& cpu, int64_t rows, int64_t cols) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.37f * static_cast<float>(i) - 11.0f;
  return Tensor::FromHost(cpu, {rows, cols}, v);
}

TEST(Wire, FramedBatchParsesAsTheOrdinaryEncodingForEveryFormat) {
  auto cpu = MakeCpuBackend();
  for (WireFormat f : {WireFormat::kF32, WireFormat::kBF16, WireFormat::kF16}) {
    for (int64_t rows : {5, 0, 300}) {
      SCOPED_TRACE(::testing::Message() << "format " << static_cast<int>(f) << " rows " << rows);
      Tensor y = Activations(*cpu, rows, 33);
      Tensor staging;
      v1::Batch b = Header(rows);
      WireBytes bytes = PrepareActivations(y, f, *cpu, &staging, b.mutable_activations());
      std::vector<grpc::Slice> slices;
      std::string framed = Flatten(FrameBatch(b, bytes), &slices);
      v1::DownItem parsed;
      ASSERT_TRUE(parsed.ParseFromString(framed));
      v1::DownItem want;
      ASSERT_TRUE(want.ParseFromString(Ordinary(Header(rows), y, f)));
      EXPECT_EQ(parsed.SerializeAsString(), want.SerializeAsString());
      EXPECT_EQ(parsed.batch().activations().dtype(), WireDType(f));
      EXPECT_EQ(parsed.batch().activations().shape_size(), 2);
      EXPECT_EQ(parsed.batch().labels().data(), Header(rows).labels().data());
    }
  }
}

TEST(Wire, FramedGradientParsesAsTheOrdinaryEncoding) {
  auto cpu = MakeCpuBackend();
  for (int64_t rows : {7, 0}) {
    Tensor dx = Activations(*cpu, rows, 19);
    v1::Gradient g;
    g.set_seq(12);
    g.set_step(3);
    g.set_micro_batch(2);
    Tensor staging;
    WireBytes bytes = PrepareActivations(dx, WireFormat::kF32, *cpu, &staging, g.mutable_grad());
    std::vector<grpc::Slice> slices;
    v1::UpItem parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(FrameGradient(g, bytes), &slices)));
    v1::UpItem want;
    *want.mutable_gradient() = g;
    EncodeTensor(dx, want.mutable_gradient()->mutable_grad());
    EXPECT_EQ(parsed.SerializeAsString(), want.SerializeAsString()) << "rows " << rows;
    EXPECT_EQ(parsed.gradient().grad().data().size(), dx.nbytes());
  }
  // Small items go whole, and parse back as themselves.
  v1::UpItem ack;
  ack.mutable_ack()->set_seq(5);
  std::vector<grpc::Slice> slices;
  v1::UpItem back;
  ASSERT_TRUE(back.ParseFromString(Flatten(FrameItem(ack), &slices)));
  EXPECT_EQ(back.ack().seq(), 5u);
}

TEST(Wire, F32BytesAreTheTensorsOwnMemoryAndStayPinnedUntilReleased) {
  auto cpu = MakeCpuBackend();
  Tensor y = Activations(*cpu, 64, 128);
  const void* memory = y.raw();
  Tensor staging;
  v1::Batch b = Header(64);
  WireBytes bytes =
      PrepareActivations(y, WireFormat::kF32, *cpu, &staging, b.mutable_activations());
  grpc::ByteBuffer framed = FrameBatch(b, bytes);
  bytes = WireBytes();              // only the framed message holds the tensor now
  EXPECT_FALSE(staging.defined());  // no staging copy was made
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(framed.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(static_cast<const void*>(slices[1].begin()), memory);  // the tensor itself
  EXPECT_EQ(slices[1].size(), y.nbytes());
  // The next step's forward reuses the output buffer: while the message is alive it must go
  // to another buffer and leave the bytes on the wire intact.
  std::vector<float> sent = y.ToHost();
  y.Ensure(*cpu, {64, 128});
  EXPECT_NE(y.raw(), memory);
  cpu->Fill(y.f32(), -1.0f, y.numel());
  EXPECT_EQ(std::memcmp(slices[1].begin(), sent.data(), y.nbytes()), 0);
  // Once gRPC lets go of the first buffer, the owner goes back to it while the second is
  // on the wire: two buffers in turn, nothing new allocated.
  slices.clear();
  framed.Clear();
  const void* second = y.raw();
  WireBytes next = PrepareActivations(y, WireFormat::kF32, *cpu, &staging, b.mutable_activations());
  grpc::ByteBuffer framed_next = FrameBatch(b, next);
  next = WireBytes();
  y.Ensure(*cpu, {64, 128});
  EXPECT_EQ(y.raw(), memory);
  framed_next.Clear();
  y.Ensure(*cpu, {64, 128});
  EXPECT_EQ(y.raw(), memory);  // nothing held: reused in place
  EXPECT_NE(second, memory);
}

TEST(Wire, ConvertedBytesComeFromTheStagingBufferWhichAlsoAlternates) {
  auto cpu = MakeCpuBackend();
  Tensor y = Activations(*cpu, 8, 16);
  Tensor staging;
  v1::Batch b = Header(8);
  WireBytes first =
      PrepareActivations(y, WireFormat::kBF16, *cpu, &staging, b.mutable_activations());
  EXPECT_EQ(first.data, staging.raw());
  EXPECT_EQ(first.size, y.nbytes() / 2);
  WireBytes second =
      PrepareActivations(y, WireFormat::kBF16, *cpu, &staging, b.mutable_activations());
  EXPECT_NE(second.data, first.data);  // the first is still held
  EXPECT_EQ(std::memcmp(first.data, second.data, first.size), 0);
  const void* a = first.data;
  first = WireBytes();
  second = WireBytes();
  WireBytes third =
      PrepareActivations(y, WireFormat::kBF16, *cpu, &staging, b.mutable_activations());
  EXPECT_TRUE(third.data == a || third.data == staging.raw());
}

TEST(WireCodec, CompressedActivationsRoundLikeTheReferenceAndLabelsStayExact) {
  auto cpu = MakeCpuBackend();
  std::vector<float> x = {1.0f / 3, -2.5e-3f, 1e5f, 0.0f, 3.14159f, -7e-8f};
  Tensor t = Tensor::FromHost(*cpu, {2, 3}, x);
  for (WireFormat f : {WireFormat::kBF16, WireFormat::kF16, WireFormat::kF32}) {
    v1::Tensor wire;
    EncodeActivations(t, f, &wire);
    EXPECT_EQ(wire.dtype(), WireDType(f));
    EXPECT_EQ(wire.data().size(), x.size() * (f == WireFormat::kF32 ? 4 : 2));
    ASSERT_TRUE(CheckWireTensor(wire, "a").ok());
    Tensor back;
    DecodeActivationsInto(wire, *cpu, &back);
    std::vector<float> want = x;
    RoundThroughWire(f, want.data(), want.size());
    EXPECT_EQ(back.ToHost(), want);
    EXPECT_EQ(back.shape(), (Shape{2, 3}));
  }
  // Integer tensors (labels) are never compressed.
  Tensor labels = Tensor::FromHostI32(*cpu, {4}, {3, 70000, -1, 9});
  v1::Tensor wire, plain;
  EncodeActivations(labels, WireFormat::kBF16, &wire);
  EncodeTensor(labels, &plain);
  EXPECT_EQ(wire.SerializeAsString(), plain.SerializeAsString());
}

}  // namespace
}  // namespace localpar
