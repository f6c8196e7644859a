// gRPC health check client.
#include "services/localpar/probe.h"

#include <chrono>
#include <iostream>

#include "proto/health.grpc.pb.h"
#include "services/common/grpc_util.h"

namespace localpar {

int Probe(const std::string& address, int timeout_ms) {
  auto stub = grpc::health::v1::Health::NewStub(MakeChannel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
  if (!st.ok()) {
    std::cerr << "localpar probe: " << address << ": " << st.error_message() << "\n";
    return 1;
  }
  bool serving = resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  std::cout << address << ": " << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status())
            << "\n";
  return serving ? 0 : 1;
}

}  // namespace localpar
