// Benchmark: activation transport over loopback gRPC (the worker's message types, channel
// and server settings, and its zero-copy send path), against memcpy bandwidth and against
// the copying send path, measured in the same run. A sink service stands in for the next
// stage so that only transport is timed; it parses and lands the bytes as a stage would.
//
//   transport_bench [--mib=4] [--seconds=2] [--profile]   (--profile: the zero-copy path only)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/model_io/tensor_proto.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/client_stream.h"
#include "services/common/grpc_util.h"
#include "services/common/wire.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

class Sink final : public v1::Worker::Service {
 public:
  grpc::Status Stream(grpc::ServerContext*,
                      grpc::ServerReaderWriter<v1::UpItem, v1::DownItem>* stream) override {
    v1::DownItem item;
    while (stream->Read(&item)) {
      // Touch the payload as a stage's decode would (one copy into tensor memory).
      const std::string& d = item.batch().activations().data();
      landing_.resize(d.size());
      std::memcpy(landing_.data(), d.data(), d.size());
    }
    return grpc::Status::OK;
  }

 private:
  std::vector<char> landing_;
};

double MemcpyGBps(size_t bytes, double seconds) {
  std::vector<char> a(bytes, 1), b(bytes);
  int64_t n = 0;
  auto start = Clock::now();
  double el = 0;
  do {
    std::memcpy(b.data(), a.data(), bytes);
    a[n % bytes] = b[(n * 7) % bytes];  // keep the copies observable
    ++n;
    el = std::chrono::duration<double>(Clock::now() - start).count();
  } while (el < seconds);
  return static_cast<double>(bytes) * n / el / 1e9;
}

}  // namespace
}  // namespace localpar

int main(int argc, char** argv) {
  using namespace localpar;
  double mib = 4, seconds = 2;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--mib=", 0) == 0)
      mib = std::atof(a.c_str() + 6);
    else if (a == "--profile")
      profile = true;
    else if (a.rfind("--seconds=", 0) == 0)
      seconds = std::atof(a.c_str() + 10);
    else {
      std::fprintf(stderr, "usage: transport_bench [--mib=4] [--seconds=2] [--profile]\n");
      return 2;
    }
  }
  ConfigureAllocatorForMessages();  // as the worker and coordinator do
  Sink sink;
  grpc::ServerBuilder builder;
  ConfigureServer(builder);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&sink);
  auto server = builder.BuildAndStart();
  std::shared_ptr<grpc::Channel> channel = MakeChannel("127.0.0.1:" + std::to_string(port));
  auto stub = v1::Worker::NewStub(channel);

  auto cpu = MakeCpuBackend();
  int64_t floats = static_cast<int64_t>(mib * (1 << 20) / 4);
  Tensor act = Tensor::Zeros(*cpu, {floats / 1024, 1024});
  v1::Batch header;
  header.mutable_labels()->set_dtype(v1::I32);
  header.mutable_labels()->add_shape(0);

  // The worker's send path: the batch framed around the tensor's own memory (wire.h).
  // Writes for about `seconds`, then closes the stream; GB/s of activation bytes delivered.
  double window = seconds;
  auto timed = [&](auto& stream, auto write) {
    int64_t sent = 0;
    auto start = Clock::now();
    double el = 0;
    do {
      if (!write(sent)) break;
      ++sent;
      el = std::chrono::duration<double>(Clock::now() - start).count();
    } while (el < window);
    stream->WritesDone();
    stream->Finish();
    el = std::chrono::duration<double>(Clock::now() - start).count();
    return static_cast<double>(act.nbytes()) * sent / el / 1e9;
  };
  auto zero_copy = [&] {
    grpc::ClientContext ctx;
    auto stream = std::make_unique<ClientStream>(channel, WorkerStreamMethod(), &ctx);
    Tensor staging;
    return timed(stream, [&](int64_t seq) {
      act.Ensure(*cpu, act.shape());  // as the next forward does: switches buffer if held
      header.set_seq(static_cast<uint64_t>(seq));
      WireBytes bytes =
          PrepareActivations(act, WireFormat::kF32, *cpu, &staging, header.mutable_activations());
      return stream->Write(FrameBatch(header, bytes));
    });
  };
  // For comparison: the tensor copied into the message's bytes field, then serialised.
  auto copying = [&] {
    grpc::ClientContext ctx;
    auto stream = stub->Stream(&ctx);
    v1::DownItem item;
    *item.mutable_batch() = header;
    return timed(stream, [&](int64_t seq) {
      EncodeTensor(act, item.mutable_batch()->mutable_activations());
      item.mutable_batch()->set_seq(static_cast<uint64_t>(seq));
      return stream->Write(item);
    });
  };
  if (profile) {  // only the worker's path, for a profiler
    std::printf("zero-copy send: %.2f GB/s\n", zero_copy());
    server->Shutdown();
    return 0;
  }
  // Warm up the connection (TCP windows, gRPC's flow control) before either measurement,
  // then alternate the two paths and keep each one's better run.
  window = std::min(0.3, seconds);
  zero_copy();
  window = seconds / 2;
  double zc = zero_copy(), cp = copying();
  zc = std::max(zc, zero_copy());
  cp = std::max(cp, copying());
  double mem = MemcpyGBps(act.nbytes(), seconds);
  std::printf("activation transport over loopback gRPC, %.1f MiB messages, one stream\n", mib);
  std::printf("  zero-copy send (the worker's path): %.2f GB/s\n", zc);
  std::printf("  copy into the message, then send:   %.2f GB/s\n", cp);
  std::printf("  memcpy, same buffer size, same run: %.2f GB/s\n", mem);
  std::printf("  zero-copy / memcpy: %.3f   zero-copy / copying: %.2f\n", zc / mem, zc / cp);
  server->Shutdown();
  return 0;
}
