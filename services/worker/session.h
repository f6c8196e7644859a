// One upstream stream of a worker (Worker.Stream, served through the callback API): a
// reactor that reads and checks items and writes replies, plus the threads and queues
// behind it. The compute thread runs StageCompute; a sender thread writes activations to
// the next stage; a reader thread takes gradients, acknowledgements and errors coming back.
// Backpressure: the next read starts only when the inbound queue has room (and replies are
// not piling up), so gRPC flow control slows the peer instead of memory growing.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "services/common/bounded_queue.h"
#include "services/common/client_stream.h"
#include "services/common/wire.h"
#include "services/worker/compute.h"

namespace localpar {

class StreamSession final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                            private ComputeLinks {
 public:
  // `setup` null: the worker is not configured, and every item is refused. `on_finish` runs
  // just before the RPC is finished (the stage is no longer in use: the worker may take a
  // new stream or configuration); `on_done` once it is over and the session has deleted
  // itself, with whether a SHUTDOWN item passed through.
  StreamSession(grpc::CallbackServerContext* context, std::shared_ptr<const ConfiguredStage> setup,
                StageHost& host, WorkerStats& stats, const WorkerOptions& options,
                std::function<void()> on_finish, std::function<void(bool shutdown)> on_done);
  ~StreamSession() override;
  void Start();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Outgoing {
    grpc::ByteBuffer bytes;
    std::function<void()> ready;  // waits for the bytes (see WireBytes)
  };

  // ComputeLinks, for the compute thread.
  std::optional<v1::DownItem> NextItem() override;
  void SendDown(grpc::ByteBuffer item, std::function<void()> ready) override;
  void SendUp(grpc::ByteBuffer item) override { Write(std::move(item), true); }
  void OweGradient() override { ++gradients_owed_; }
  PortState NextGradient(bool wait, v1::Gradient* out) override;
  void QueueDepths(int64_t* inbound, int64_t* inbound_capacity, int64_t* outbound,
                   int64_t* outbound_capacity) override;

  void HandleItem();  // the item just read
  void Write(grpc::ByteBuffer item, bool wait_for_room);
  // One line about the stream's peers on the worker's log (WorkerOptions::log).
  void Say(const std::string& line) const;
  bool ReadWantedLocked();  // also moves a parked item into the inbound queue
  void ResumeReading();
  void FinishWhenWritten(const grpc::Status& status);
  void FinishNow(const grpc::Status& status);
  void ComputeLoop();
  void SenderLoop();
  void DownReaderLoop();

  grpc::CallbackServerContext* const context_;
  const std::shared_ptr<const ConfiguredStage> setup_;
  StageHost& host_;
  WorkerStats& stats_;
  const WorkerOptions& options_;
  const std::function<void()> on_finish_;
  const std::function<void(bool)> on_done_;
  const int stage_;
  const size_t max_queued_writes_;

  std::mutex mu_;  // the reactor's state below
  std::condition_variable write_room_;
  grpc::ByteBuffer read_buffer_;
  bool reading_ = false, reads_done_ = false;
  std::optional<v1::DownItem> parked_;   // accepted, waiting for room in the inbound queue
  uint64_t last_seq_ = 0;                // the reader's alone
  std::deque<grpc::ByteBuffer> writes_;  // front: the write in flight
  bool writing_ = false, upstream_gone_ = false;
  bool finishing_ = false, finished_ = false;
  grpc::Status finish_status_;

  BoundedQueue<v1::DownItem> inbound_;
  BoundedQueue<Outgoing> outbound_;   // framed items for the next stage
  BoundedQueue<v1::Gradient> grads_;  // returned from the next stage
  // Training batches sent down whose gradient (or error) has not come back. A gradient
  // beyond them is refused by the reader, so it never waits on a full grads_.
  std::atomic<int64_t> gradients_owed_{0};
  grpc::ClientContext down_ctx_;
  std::unique_ptr<ClientStream> down_;
  std::thread compute_, sender_, down_reader_;
  std::atomic<bool> downstream_failed_{false};
  std::atomic<bool> shutdown_requested_{false};
};

}  // namespace localpar
