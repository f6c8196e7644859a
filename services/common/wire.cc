// Zero-copy framing of DownItems (see wire.h).
#include "services/common/wire.h"

#include <google/protobuf/io/coded_stream.h>

#include <string>

#include "common/core/check.h"

namespace localpar {
namespace {

using google::protobuf::io::CodedOutputStream;

// Field tags, wire type 2 (length-delimited): DownItem.batch = 1, Batch.activations = 8,
// Tensor.data = 3. The static_asserts tie them to the generated code.
constexpr uint8_t kDownItemBatchTag = (1 << 3) | 2;
constexpr uint8_t kBatchActivationsTag = (8 << 3) | 2;
constexpr uint8_t kTensorDataTag = (3 << 3) | 2;
static_assert(v1::DownItem::kBatchFieldNumber == 1);
static_assert(v1::Batch::kActivationsFieldNumber == 8);
static_assert(v1::Tensor::kDataFieldNumber == 3);

void AppendTagAndLength(std::string* out, uint8_t tag, uint64_t length) {
  uint8_t buf[1 + 10];
  buf[0] = tag;
  uint8_t* end = CodedOutputStream::WriteVarint64ToArray(length, buf + 1);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(end - buf));
}

void ReleaseHold(void* hold) { delete static_cast<std::shared_ptr<const void>*>(hold); }

}  // namespace

std::unique_ptr<DownStream> OpenDownStream(grpc::Channel& channel, grpc::ClientContext* ctx) {
  static const std::string method = std::string("/") + v1::Worker::service_full_name() + "/Stream";
  grpc::internal::RpcMethod rpc(method.c_str(), grpc::internal::RpcMethod::BIDI_STREAMING);
  return std::unique_ptr<DownStream>(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, v1::UpItem>::Create(&channel, rpc,
                                                                                      ctx));
}

grpc::ByteBuffer FrameItem(const v1::DownItem& item) {
  grpc::ByteBuffer out;
  bool own = false;
  grpc::Status s = grpc::SerializationTraits<v1::DownItem>::Serialize(item, &out, &own);
  LP_CHECK_MSG(s.ok(), "serialising a DownItem: %s", s.error_message().c_str());
  return out;
}

grpc::ByteBuffer FrameBatch(const v1::Batch& batch, const WireBytes& bytes) {
  LP_CHECK(batch.activations().data().empty());
  const uint64_t n = bytes.size;
  const uint64_t tensor_len = 1 + CodedOutputStream::VarintSize64(n) + n;
  const uint64_t batch_len =
      batch.ByteSizeLong() + 1 + CodedOutputStream::VarintSize64(tensor_len) + tensor_len;
  std::string head;
  head.reserve(static_cast<size_t>(batch_len - n) + 12);
  AppendTagAndLength(&head, kDownItemBatchTag, batch_len);
  batch.AppendToString(&head);
  AppendTagAndLength(&head, kBatchActivationsTag, tensor_len);
  AppendTagAndLength(&head, kTensorDataTag, n);
  if (n == 0) {
    grpc::Slice only(head);
    return grpc::ByteBuffer(&only, 1);
  }
  grpc::Slice slices[2] = {grpc::Slice(head),
                           grpc::Slice(const_cast<void*>(bytes.data), static_cast<size_t>(n),
                                       &ReleaseHold, new std::shared_ptr<const void>(bytes.hold))};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace localpar
