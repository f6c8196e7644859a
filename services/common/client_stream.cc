// Blocking calls over a callback client stream.
#include "services/common/client_stream.h"

namespace localpar {

ClientStream::ClientStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                           grpc::ClientContext* context)
    : stub_(channel) {
  stub_.PrepareBidiStreamingCall(context, method, grpc::StubOptions(), this);
  // Operations start from our threads, outside reactions: the hold keeps OnDone from
  // running until Finish says no more will come.
  AddHold();
  StartCall();
}

ClientStream::~ClientStream() { Finish(); }

bool ClientStream::Write(const grpc::ByteBuffer& message) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_ || !held_) return false;
  write_pending_ = true;
  ++starting_;
  lock.unlock();
  StartWrite(&message);
  lock.lock();
  if (--starting_ == 0) cv_.notify_all();
  cv_.wait(lock, [&] { return !write_pending_; });
  return write_ok_;
}

bool ClientStream::Read(grpc::ByteBuffer* message) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_ || !held_) return false;
  read_pending_ = true;
  ++starting_;
  lock.unlock();
  StartRead(message);
  lock.lock();
  if (--starting_ == 0) cv_.notify_all();
  cv_.wait(lock, [&] { return !read_pending_; });
  return read_ok_;
}

void ClientStream::WritesDone() {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_ || !held_) return;
  writes_done_pending_ = true;
  ++starting_;
  lock.unlock();
  StartWritesDone();
  lock.lock();
  if (--starting_ == 0) cv_.notify_all();
  cv_.wait(lock, [&] { return !writes_done_pending_; });
}

grpc::Status ClientStream::Finish() {
  std::unique_lock<std::mutex> lock(mu_);
  if (held_) {
    // No operation starts from here on, and none is still being started: once the hold
    // goes, the call may end and gRPC destroy its stream object, which an operation
    // started after that would call into (a crash: "pure virtual method called").
    held_ = false;
    cv_.wait(lock, [&] { return starting_ == 0; });
    lock.unlock();
    RemoveHold();
    lock.lock();
  }
  cv_.wait(lock, [&] { return done_; });
  return status_;
}

void ClientStream::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  write_pending_ = false;
  write_ok_ = ok;
  cv_.notify_all();
}

void ClientStream::OnReadDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  read_pending_ = false;
  read_ok_ = ok;
  cv_.notify_all();
}

void ClientStream::OnWritesDoneDone(bool) {
  std::lock_guard<std::mutex> lock(mu_);
  writes_done_pending_ = false;
  cv_.notify_all();
}

void ClientStream::OnDone(const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = status;
  done_ = true;
  // Anything still waiting learns the stream is over.
  write_pending_ = read_pending_ = writes_done_pending_ = false;
  cv_.notify_all();
}

}  // namespace localpar
