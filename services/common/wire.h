// Tensors sent without copies, both ways on a link: a batch's activations (down) and a
// returned gradient (up) go to gRPC as a slice over the tensor's own memory (or the one
// staging buffer a conversion needs), never through a protobuf string. The receiving side
// parses an ordinary DownItem or UpItem.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "proto/localpar.grpc.pb.h"
#include "services/common/wire_codec.h"

namespace localpar {

// Worker.Stream's full method name: a sender opens it as a ClientStream (client_stream.h)
// and writes pre-framed DownItems.
std::string WorkerStreamMethod();
// An UpItem read from such a stream; false when the bytes are not one.
bool ParseUpItem(grpc::ByteBuffer* bytes, v1::UpItem* item);

// Worker.Stream from the serving side, writing pre-framed UpItems.
using UpStream = grpc::ServerReaderWriter<grpc::ByteBuffer, v1::DownItem>;

// An item serialised the ordinary way (control items, acknowledgements, errors: small).
grpc::ByteBuffer FrameItem(const v1::DownItem& item);
grpc::ByteBuffer FrameItem(const v1::UpItem& item);

// `batch` with its activations' bytes taken from `bytes` instead of activations.data (which
// must be empty). The message is the batch's own serialisation followed by a second
// occurrence of Batch.activations that carries only Tensor.data; a protobuf parser merges
// the two, so the receiver sees one Batch. The bytes are referenced, not copied: `bytes.hold`
// travels with the slice and is released when gRPC is done with it.
grpc::ByteBuffer FrameBatch(const v1::Batch& batch, const WireBytes& bytes);
// The same for an UpItem carrying `gradient`, whose grad bytes come from `bytes`.
grpc::ByteBuffer FrameGradient(const v1::Gradient& gradient, const WireBytes& bytes);

}  // namespace localpar
