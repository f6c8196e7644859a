// Benchmark: activation transport over loopback gRPC (the worker's message types, channel
// and server settings, and tensor encoding), against memcpy bandwidth measured in the same
// run. A sink service stands in for the next stage so that only transport is timed.
//
//   transport_bench [--mib=4] [--seconds=2]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/job/tensor_codec.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/grpc_util.h"

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
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--mib=", 0) == 0)
      mib = std::atof(a.c_str() + 6);
    else if (a.rfind("--seconds=", 0) == 0)
      seconds = std::atof(a.c_str() + 10);
    else {
      std::fprintf(stderr, "usage: transport_bench [--mib=4] [--seconds=2]\n");
      return 2;
    }
  }
  Sink sink;
  grpc::ServerBuilder builder;
  ConfigureServer(builder);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&sink);
  auto server = builder.BuildAndStart();
  auto stub = v1::Worker::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port)));

  auto cpu = MakeCpuBackend();
  int64_t floats = static_cast<int64_t>(mib * (1 << 20) / 4);
  Tensor act = Tensor::Zeros(*cpu, {floats / 1024, 1024});
  v1::DownItem item;
  v1::Batch* b = item.mutable_batch();
  b->mutable_labels()->set_dtype(v1::I32);
  b->mutable_labels()->add_shape(0);

  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  int64_t sent = 0;
  auto start = Clock::now();
  double el = 0;
  do {
    EncodeTensor(act, b->mutable_activations());  // the send path's copy, as a worker does
    b->set_seq(static_cast<uint64_t>(sent));
    if (!stream->Write(item)) break;
    ++sent;
    el = std::chrono::duration<double>(Clock::now() - start).count();
  } while (el < seconds);
  stream->WritesDone();
  stream->Finish();
  el = std::chrono::duration<double>(Clock::now() - start).count();
  double wire = static_cast<double>(act.nbytes()) * sent / el / 1e9;
  double mem = MemcpyGBps(act.nbytes(), seconds);
  std::printf("activation transport over loopback gRPC, %.1f MiB messages, one stream\n", mib);
  std::printf("  transport: %.2f GB/s (%lld messages)\n", wire, static_cast<long long>(sent));
  std::printf("  memcpy, same buffer size, same run: %.2f GB/s\n", mem);
  std::printf("  transport / memcpy: %.3f\n", wire / mem);
  server->Shutdown();
  return 0;
}
