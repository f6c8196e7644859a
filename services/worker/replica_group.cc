// Gloo for the replicas of a stage.
#include "services/worker/replica_group.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/localpar.grpc.pb.h"

#ifdef LOCALPAR_WITH_GLOO
#include <gloo/allgather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace localpar {

#ifdef LOCALPAR_WITH_GLOO
namespace {

// Gloo's store interface over the coordinator's Rendezvous service. Gloo's keys (each
// replica's rank, holding its addresses) go under "GROUP/stage-K/". Gloo reports a failure
// by exception; these carry messages that name the replicas.
class CoordinatorStore final : public gloo::rendezvous::Store {
 public:
  CoordinatorStore(const ReplicaGroupOptions& o, const SecurityOptions& security)
      : options_(o),
        security_(security),
        stub_(v1::Rendezvous::NewStub(MakeChannel(o.rendezvous, security))),
        prefix_(absl::StrCat(o.group, "/stage-", o.stage, "/")) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + options_.timeout);
    ctx.set_wait_for_ready(true);
    AddToken(ctx, security_);
    v1::StoreSetRequest req;
    req.set_key(prefix_ + key);
    req.set_value(data.data(), data.size());
    v1::StoreSetResponse resp;
    grpc::Status st = stub_->Set(&ctx, req, &resp);
    if (!st.ok()) {
      throw std::runtime_error(absl::StrCat("the coordinator's rendezvous at ", options_.rendezvous,
                                            " refused replica ", options_.replica, " of stage ",
                                            options_.stage, ": ", st.error_message()));
    }
  }

  std::vector<char> get(const std::string& key) override {
    v1::StoreGetResponse resp = Get({key}, options_.timeout);
    const std::string& v = resp.values(0);
    return std::vector<char>(v.begin(), v.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, options_.timeout); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Get(keys, timeout);
  }

 private:
  v1::StoreGetResponse Get(const std::vector<std::string>& keys, std::chrono::milliseconds wait) {
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
      // Gloo's keys are the ranks of the replicas still to come.
      throw std::runtime_error(absl::StrCat(
          "replica(s) ", absl::StrJoin(keys, ", "), " of stage ", options_.stage,
          " did not join within ", wait.count() / 1000.0, " s (replica ", options_.replica,
          " waited for them at the coordinator's rendezvous ", options_.rendezvous, ")"));
    }
    if (!st.ok() || resp.values_size() != static_cast<int>(keys.size())) {
      throw std::runtime_error(absl::StrCat("the coordinator's rendezvous at ", options_.rendezvous,
                                            ": ", st.ok() ? "a short answer" : st.error_message()));
    }
    return resp;
  }

  const ReplicaGroupOptions& options_;
  const SecurityOptions& security_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  const std::string prefix_;
};

}  // namespace

class ReplicaGroup::Impl {
 public:
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
};

bool ReplicaGroup::Available() { return true; }

absl::Status ReplicaGroup::Connect() {
  try {
    auto impl = std::make_unique<Impl>();
    gloo::transport::tcp::attr attr;
    attr.hostname = options_.host;
    impl->device = gloo::transport::tcp::CreateDevice(attr);
    impl->context =
        std::make_shared<gloo::rendezvous::Context>(options_.replica, options_.replicas);
    impl->context->setTimeout(options_.timeout);
    CoordinatorStore store(options_, security_);
    impl->context->connectFullMesh(store, impl->device);
    impl_ = std::move(impl);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("replicas of stage ", options_.stage, ": ", e.what()));
  }
}

absl::Status ReplicaGroup::AllGather(const float* in, int64_t n, float* out) {
  if (!failed_.ok()) return failed_;
  const auto start = std::chrono::steady_clock::now();
  if (!impl_) {
    if (absl::Status s = Connect(); !s.ok()) return failed_ = s;
  }
  try {
    gloo::AllgatherOptions opts(impl_->context);
    // Gloo reads the input from where it lies and writes every replica's part into out.
    opts.setInput(const_cast<float*>(in), static_cast<size_t>(n));
    opts.setOutput(out, static_cast<size_t>(n) * static_cast<size_t>(options_.replicas));
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    return failed_ = absl::UnavailableError(
               absl::StrCat("replica ", options_.replica, " of stage ", options_.stage,
                            ": exchanging gradients with the other replicas failed: ", e.what()));
  }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bytes_ += n * static_cast<int64_t>(sizeof(float)) * (options_.replicas - 1);
  return absl::OkStatus();
}

#else  // no Gloo in this build

class ReplicaGroup::Impl {};

bool ReplicaGroup::Available() { return false; }

absl::Status ReplicaGroup::Connect() {
  return absl::FailedPreconditionError("this worker was built without Gloo (libgloo-dev)");
}

absl::Status ReplicaGroup::AllGather(const float*, int64_t, float*) { return Connect(); }

#endif

void ReplicaGroup::Close() {
  impl_.reset();
  if (failed_.ok()) failed_ = absl::CancelledError("the replica's stream has ended");
}

ReplicaGroup::ReplicaGroup(ReplicaGroupOptions options, const SecurityOptions& security)
    : options_(std::move(options)), security_(security) {}

ReplicaGroup::~ReplicaGroup() = default;

}  // namespace localpar
