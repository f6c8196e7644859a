// The replicas of a stage: their own TCP mesh for host buckets, NCCL for device buckets.
#include "services/worker/replica_group.h"

#include <cstring>
#include <exception>
#include <ostream>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/localpar.grpc.pb.h"
#include "services/common/peer_text.h"
#include "services/worker/replica_mesh.h"
#ifdef LOCALPAR_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/core/cuda_backend.h"
#endif

namespace localpar {
namespace {

// The coordinator's Rendezvous service, under "GROUP/stage-K/". Failures throw, with
// messages that name the replicas.
class RendezvousClient {
 public:
  RendezvousClient(const ReplicaGroupOptions& o, const SecurityOptions& security)
      : options_(o),
        security_(security),
        stub_(v1::Rendezvous::NewStub(MakeChannel(o.rendezvous, security))),
        prefix_(absl::StrCat(o.group, "/stage-", o.stage, "/")) {}

  void Set(const std::string& key, const std::string& value) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + options_.timeout);
    ctx.set_wait_for_ready(true);
    AddToken(ctx, security_);
    v1::StoreSetRequest req;
    req.set_key(prefix_ + key);
    req.set_value(value);
    v1::StoreSetResponse resp;
    grpc::Status st = stub_->Set(&ctx, req, &resp);
    if (!st.ok()) {
      throw std::runtime_error(absl::StrCat("the coordinator's rendezvous at ", options_.rendezvous,
                                            " refused replica ", options_.replica, " of stage ",
                                            options_.stage, ": ", st.error_message()));
    }
  }

  // Waits for every key; `what` names them for the message (Gloo's keys are the ranks of
  // the replicas still to come).
  std::vector<std::string> Get(const std::vector<std::string>& keys, std::chrono::milliseconds wait,
                               const std::string& what) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(5));
    ctx.set_wait_for_ready(true);
    AddToken(ctx, security_);
    v1::StoreGetRequest req;
    for (const std::string& k : keys) req.add_keys(prefix_ + k);
    req.set_timeout_ms(static_cast<int32_t>(wait.count()));
    v1::StoreGetResponse resp;
    grpc::Status st = stub_->Get(&ctx, req, &resp);
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      throw std::runtime_error(absl::StrCat(
          "replica(s) ", what, " of stage ", options_.stage, " did not join within ",
          wait.count() / 1000.0, " s (replica ", options_.replica,
          " waited for them at the coordinator's rendezvous ", options_.rendezvous, ")"));
    }
    if (!st.ok() || resp.values_size() != static_cast<int>(keys.size())) {
      throw std::runtime_error(absl::StrCat("the coordinator's rendezvous at ", options_.rendezvous,
                                            ": ", st.ok() ? "a short answer" : st.error_message()));
    }
    return {resp.values().begin(), resp.values().end()};
  }

  // Publishes this replica's `value` under PREFIX-REPLICA and returns every replica's, in
  // replica order, once all have published (naming the others while it waits).
  std::vector<std::string> Share(const std::string& prefix, const std::string& value) {
    Set(absl::StrCat(prefix, options_.replica), value);
    std::vector<std::string> keys, others;
    for (int r = 0; r < options_.replicas; ++r) {
      keys.push_back(absl::StrCat(prefix, r));
      if (r != options_.replica) others.push_back(std::to_string(r));
    }
    return Get(keys, options_.timeout, absl::StrJoin(others, ", "));
  }

 private:
  const ReplicaGroupOptions& options_;
  const SecurityOptions& security_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  const std::string prefix_;
};

// Every replica publishes what it runs and reads the others'; throws naming the first that
// differs.
void CheckSameStage(RendezvousClient& client, const ReplicaGroupOptions& o) {
  // "FINGERPRINT NONCE": the nonce makes a second worker claiming the same replica a
  // different value, which the rendezvous refuses, rather than a retry of the first.
  std::random_device random;
  const std::vector<std::string> values =
      client.Share("fingerprint-", absl::StrCat(o.fingerprint, " ", random(), random()));
  for (int r = 0; r < o.replicas; ++r) {
    const std::string& v = values[static_cast<size_t>(r)];
    const std::string theirs = v.substr(0, v.find(' '));
    if (theirs == o.fingerprint) continue;
    throw std::runtime_error(absl::StrCat(
        "replica ", r, " of stage ", o.stage, " runs another job or stage than replica ", o.replica,
        " (fingerprints ", SanitizePeerText(theirs, 64), " and ", o.fingerprint,
        "); every replica of a stage must be configured from the same job, so no gradients "
        "were exchanged"));
  }
}

}  // namespace

class ReplicaGroup::Impl {
 public:
  std::unique_ptr<ReplicaMesh> mesh;
#ifdef LOCALPAR_WITH_NCCL
  ncclComm_t comm = nullptr;
  ~Impl() {
    if (comm) ncclCommAbort(comm);  // nothing of ours is in flight by then
  }
#endif
};

bool ReplicaGroup::DeviceAvailable() {
#ifdef LOCALPAR_WITH_NCCL
  return true;
#else
  return false;
#endif
}

// Every replica listens, publishes its address and secret, reads the others', and the mesh
// connects them (replica_mesh.h).
absl::Status ReplicaGroup::Connect() {
  const std::string stage = absl::StrCat("stage ", options_.stage);
  std::shared_ptr<const mesh::Tls> tls;  // in a TLS cluster, the mesh is TLS too
  if (security_.tls()) {
    absl::StatusOr<std::shared_ptr<const mesh::Tls>> made = mesh::Tls::Make(
        {security_.cert_pem, security_.key_pem, security_.ca_pem, security_.mutual_tls});
    if (!made.ok()) {
      return absl::UnavailableError(
          absl::StrCat("replicas of ", stage, ": ", made.status().message()));
    }
    tls = *std::move(made);
  }
  absl::StatusOr<std::unique_ptr<ReplicaMesh>> mesh = ReplicaMesh::Listen(
      options_.host, options_.replica, options_.replicas, stage, std::move(tls));
  if (!mesh.ok()) {
    return absl::UnavailableError(
        absl::StrCat("replicas of ", stage, ": ", mesh.status().message()));
  }
  std::vector<std::string> published;
  try {
    RendezvousClient client(options_, security_);
    CheckSameStage(client, options_);
    published = client.Share("mesh-", (*mesh)->published());
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("replicas of ", stage, ": ", e.what()));
  }
  if (absl::Status s = (*mesh)->Connect(published, options_.timeout); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("replicas of ", stage, ": ", s.message()));
  }
  if ((*mesh)->refused() > 0 && options_.log != nullptr) {
    *options_.log << "worker " << options_.stage << ": replica " << options_.replica << " closed "
                  << (*mesh)->refused()
                  << " connection(s) to its collective port that did not prove to be a replica of "
                     "this configuration\n";
  }
  impl_ = std::make_unique<Impl>();
  impl_->mesh = *std::move(mesh);
  return absl::OkStatus();
}

absl::Status ReplicaGroup::AllGather(const float* in, int64_t n, float* out) {
  if (!failed_.ok()) return failed_;
  const auto start = std::chrono::steady_clock::now();
  if (!impl_) {
    if (absl::Status s = Connect(); !s.ok()) return failed_ = s;
  }
  if (absl::Status s = impl_->mesh->AllGather(in, n, out, options_.timeout); !s.ok()) {
    impl_.reset();
    return failed_ = absl::UnavailableError(
               absl::StrCat("exchanging gradients with the other replicas failed: ", s.message()));
  }
  Count(start, n);
  return absl::OkStatus();
}

absl::Status ReplicaGroup::AllReduce(const float* in, int64_t n, float* sum, NonFiniteParts* bad,
                                     ReduceFormat format) {
  if (!failed_.ok()) return failed_;
  const auto start = std::chrono::steady_clock::now();
  if (!impl_) {
    if (absl::Status s = Connect(); !s.ok()) return failed_ = s;
  }
  if (absl::Status s = impl_->mesh->AllReduce(in, n, sum, bad, options_.timeout, format); !s.ok()) {
    impl_.reset();
    return failed_ = absl::UnavailableError(
               absl::StrCat("exchanging gradients with the other replicas failed: ", s.message()));
  }
  Count(start, n);
  return absl::OkStatus();
}

#ifdef LOCALPAR_WITH_NCCL
namespace {

std::string NcclError(ncclResult_t r) { return ncclGetErrorString(r); }

}  // namespace

// Every replica announces itself through the rendezvous first, so that a missing one is
// named within the timeout (NCCL's own initialisation would wait for it forever); then
// replica 0's NCCL id reaches the others the same way.
absl::Status ReplicaGroup::ConnectDevice() {
  try {
    RendezvousClient client(options_, security_);
    CheckSameStage(client, options_);
    client.Share("nccl-joined-", "1");
    ncclUniqueId id;
    if (options_.replica == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
        return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", NcclError(r)));
      }
      client.Set("nccl-id", std::string(id.internal, sizeof(id.internal)));
    } else {
      const std::string v = client.Get({"nccl-id"}, options_.timeout, "0")[0];
      if (v.size() != sizeof(id.internal)) {
        return absl::UnavailableError("the NCCL id in the rendezvous has the wrong size");
      }
      std::memcpy(id.internal, v.data(), v.size());
    }
    auto impl = std::make_unique<Impl>();
    if (ncclResult_t r = ncclCommInitRank(&impl->comm, options_.replicas, id, options_.replica);
        r != ncclSuccess) {
      impl->comm = nullptr;
      return absl::UnavailableError(absl::StrCat("ncclCommInitRank: ", NcclError(r)));
    }
    impl_ = std::move(impl);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("replicas of stage ", options_.stage, ": ", e.what()));
  }
}

absl::Status ReplicaGroup::AllGatherOnDevice(const float* in, int64_t n, float* out,
                                             Backend& backend) {
  if (!failed_.ok()) return failed_;
  const auto start = std::chrono::steady_clock::now();
  if (!impl_) {
    if (absl::Status s = ConnectDevice(); !s.ok()) return failed_ = s;
  }
  auto stream = static_cast<cudaStream_t>(static_cast<CudaBackend&>(backend).stream());
  if (ncclResult_t r =
          ncclAllGather(in, out, static_cast<size_t>(n), ncclFloat, impl_->comm, stream);
      r != ncclSuccess) {
    impl_.reset();
    return failed_ = absl::UnavailableError(absl::StrCat("replica ", options_.replica, " of stage ",
                                                         options_.stage,
                                                         ": ncclAllGather: ", NcclError(r)));
  }
  // NCCL would wait for a lost peer forever: poll, and abort the communicator at the timeout.
  const auto deadline = start + options_.timeout;
  while (true) {
    cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) break;
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(impl_->comm, &async);
    if ((q != cudaErrorNotReady) || async != ncclSuccess ||
        std::chrono::steady_clock::now() > deadline) {
      impl_.reset();  // aborts the communicator, which ends the collective
      return failed_ = absl::UnavailableError(absl::StrCat(
                 "replica ", options_.replica, " of stage ", options_.stage,
                 ": exchanging gradients with the other replicas failed: ",
                 async != ncclSuccess ? NcclError(async)
                 : q != cudaErrorNotReady
                     ? std::string(cudaGetErrorString(q))
                     : absl::StrCat("no answer within ", options_.timeout.count() / 1000.0, " s")));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  Count(start, n);
  return absl::OkStatus();
}
#else
absl::Status ReplicaGroup::ConnectDevice() {
  return absl::FailedPreconditionError("this worker was built without NCCL");
}

absl::Status ReplicaGroup::AllGatherOnDevice(const float*, int64_t, float*, Backend&) {
  return ConnectDevice();
}
#endif

void ReplicaGroup::Count(std::chrono::steady_clock::time_point start, int64_t n) {
  seconds_ =
      seconds_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (impl_ && impl_->mesh) {
    bytes_ = impl_->mesh->bytes_sent();  // a group's one mesh, for its lifetime
  } else {
    bytes_ += n * static_cast<int64_t>(sizeof(float)) * (options_.replicas - 1);
  }
}

void ReplicaGroup::Close() {
  impl_.reset();
  if (failed_.ok()) failed_ = absl::CancelledError("the replica's stream has ended");
}

ReplicaGroup::ReplicaGroup(ReplicaGroupOptions options, const SecurityOptions& security)
    : options_(std::move(options)), security_(security) {}

ReplicaGroup::~ReplicaGroup() = default;

}  // namespace localpar
