// Zero-copy framing of the link's items (see wire.h).
#include "services/common/wire.h"

#include <google/protobuf/io/coded_stream.h>

#include <string>

#include "common/core/check.h"

namespace localpar {
namespace {

using google::protobuf::io::CodedOutputStream;

// The tag of a length-delimited field (wire type 2); field numbers come from the generated
// code's k...FieldNumber constants.
constexpr uint8_t LengthDelimited(int field) { return static_cast<uint8_t>((field << 3) | 2); }

void AppendTagAndLength(std::string* out, uint8_t tag, uint64_t length) {
  uint8_t buf[1 + 10];
  buf[0] = tag;
  uint8_t* end = CodedOutputStream::WriteVarint64ToArray(length, buf + 1);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(end - buf));
}

void ReleaseHold(void* hold) { delete static_cast<std::shared_ptr<const void>*>(hold); }

template <typename Message>
grpc::ByteBuffer SerializeItem(const Message& item) {
  grpc::ByteBuffer out;
  bool own = false;
  grpc::Status s = grpc::SerializationTraits<Message>::Serialize(item, &out, &own);
  LP_CHECK_MSG(s.ok(), "serialising an item: %s", s.error_message().c_str());
  return out;
}

// An item whose field `item_field` is `inner`, with the bytes of inner's tensor field
// `tensor_field` (left empty in `inner`) taken from `bytes`: inner's own serialisation, then
// a second occurrence of the tensor field carrying only Tensor.data. A protobuf parser
// merges the two occurrences.
grpc::ByteBuffer FrameWithTensorBytes(int item_field, const google::protobuf::MessageLite& inner,
                                      int tensor_field, const WireBytes& bytes) {
  const uint64_t n = bytes.size;
  const uint64_t tensor_len = 1 + CodedOutputStream::VarintSize64(n) + n;
  const uint64_t inner_len =
      inner.ByteSizeLong() + 1 + CodedOutputStream::VarintSize64(tensor_len) + tensor_len;
  std::string head;
  head.reserve(static_cast<size_t>(inner_len - n) + 12);
  AppendTagAndLength(&head, LengthDelimited(item_field), inner_len);
  inner.AppendToString(&head);
  AppendTagAndLength(&head, LengthDelimited(tensor_field), tensor_len);
  AppendTagAndLength(&head, LengthDelimited(v1::Tensor::kDataFieldNumber), n);
  if (n == 0) {
    grpc::Slice only(head);
    return grpc::ByteBuffer(&only, 1);
  }
  grpc::Slice slices[2] = {grpc::Slice(head),
                           grpc::Slice(const_cast<void*>(bytes.data), static_cast<size_t>(n),
                                       &ReleaseHold, new std::shared_ptr<const void>(bytes.hold))};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace

std::string WorkerStreamMethod() {
  return std::string("/") + v1::Worker::service_full_name() + "/Stream";
}

bool ParseUpItem(grpc::ByteBuffer* bytes, v1::UpItem* item) {
  return grpc::SerializationTraits<v1::UpItem>::Deserialize(bytes, item).ok();
}

grpc::ByteBuffer FrameItem(const v1::DownItem& item) { return SerializeItem(item); }
grpc::ByteBuffer FrameItem(const v1::UpItem& item) { return SerializeItem(item); }

grpc::ByteBuffer FrameBatch(const v1::Batch& batch, const WireBytes& bytes) {
  LP_CHECK(batch.activations().data().empty());
  return FrameWithTensorBytes(v1::DownItem::kBatchFieldNumber, batch,
                              v1::Batch::kActivationsFieldNumber, bytes);
}

grpc::ByteBuffer FrameGradient(const v1::Gradient& gradient, const WireBytes& bytes) {
  LP_CHECK(gradient.grad().data().empty());
  return FrameWithTensorBytes(v1::UpItem::kGradientFieldNumber, gradient,
                              v1::Gradient::kGradFieldNumber, bytes);
}

}  // namespace localpar
