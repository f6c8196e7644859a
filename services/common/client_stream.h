// A bidirectional client stream of pre-framed messages through gRPC's public callback API
// (grpc::GenericStub with a ClientBidiReactor), driven from plain threads as blocking calls:
// one thread writes, one reads, as the synchronous API would have them. gRPC's callback
// threads only hand results over and signal; they never wait on our queues. This is how a
// worker streams to the next stage (its sender and its downstream reader threads), and how
// the transport benchmark drives a worker.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

namespace localpar {

class ClientStream final : private grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Starts the call to `method` ("/package.Service/Method") on `channel` with `context`,
  // which must outlive the stream.
  ClientStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
               grpc::ClientContext* context);
  ~ClientStream() override;
  ClientStream(const ClientStream&) = delete;
  ClientStream& operator=(const ClientStream&) = delete;

  // Each returns once the operation is done: false once the stream is broken or over, or
  // Finish was called (from another thread: nothing starts after it). Write and WritesDone
  // from one thread, Read from one (possibly another) thread.
  bool Write(const grpc::ByteBuffer& message);
  bool Read(grpc::ByteBuffer* message);
  void WritesDone();
  // Once no more operations will be started: waits for the call's end, and its status.
  grpc::Status Finish();

 private:
  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  grpc::GenericStub stub_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool write_pending_ = false, write_ok_ = false;
  bool read_pending_ = false, read_ok_ = false;
  bool writes_done_pending_ = false;
  bool held_ = true, done_ = false;
  int starting_ = 0;  // operations between their check and their Start call
  grpc::Status status_;
};

}  // namespace localpar
