// The coordinator's workers.
#include "services/coordinator/worker_pool.h"

#include <chrono>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/common/exit_codes.h"

namespace localpar {
namespace {

std::chrono::system_clock::time_point Deadline(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

int ExitCodeFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
      return kExitBadJob;
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return kExitFailure;
    default:
      return kExitWorkerLost;
  }
}

}  // namespace

WorkerPool::WorkerPool(std::vector<std::string> addresses, const SecurityOptions& security)
    : addresses_(std::move(addresses)), security_(security) {
  for (const std::string& a : addresses_)
    stubs_.push_back(v1::Worker::NewStub(MakeChannel(a, security)));
}

ConfigureOutcome WorkerPool::ConfigureAll(const v1::Job& job, const StageSettings& s,
                                          int timeout_s) {
  ConfigureOutcome out;
  for (int k = 0; k < size(); ++k) {
    v1::ConfigureRequest req;
    *req.mutable_job() = job;
    req.set_stage(k);
    if (k + 1 < size()) req.set_downstream(addresses_[k + 1]);
    req.set_total_steps(s.total_steps);
    req.set_non_finite(s.non_finite);
    req.set_overlap_max_delay(s.overlap_max_delay);
    req.set_fingerprint(s.fingerprint);
    if (s.restore && k < s.restore->stages_size()) {
      *req.mutable_restore() = s.restore->stages(k);
    } else if (s.initial && k < s.initial->stages_size()) {
      *req.mutable_initial() = s.initial->stages(k);
    }
    v1::ConfigureResponse resp;
    grpc::Status st;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    do {  // ABORTED: the worker is still winding down its previous stream
      grpc::ClientContext ctx;
      ctx.set_wait_for_ready(true);
      ctx.set_deadline(Deadline(timeout_s));
      AddToken(ctx, security_);
      st = stubs_[k]->Configure(&ctx, req, &resp);
      if (st.error_code() != grpc::StatusCode::ABORTED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } while (std::chrono::steady_clock::now() < until);
    if (!st.ok()) {
      std::cerr << "localpar: configuring stage " << k << " at " << addresses_[k]
                << " failed: " << st.error_message() << "\n";
      out.exit_code = ExitCodeFor(st.error_code());
      out.restore_failed = s.restore && st.error_code() == grpc::StatusCode::DATA_LOSS;
      return out;
    }
    out.parameters += resp.parameters();
    if (k == 0) out.backend = resp.backend();
  }
  return out;
}

std::vector<std::optional<v1::StatsResponse>> WorkerPool::PollStats(bool intervals,
                                                                    double deadline_s) {
  std::vector<std::optional<v1::StatsResponse>> out(stubs_.size());
  for (size_t k = 0; k < stubs_.size(); ++k) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(deadline_s));
    AddToken(ctx, security_);
    v1::StatsRequest req;
    req.set_include_intervals(intervals);
    v1::StatsResponse resp;
    if (stubs_[k]->Stats(&ctx, req, &resp).ok()) out[k] = std::move(resp);
  }
  return out;
}

std::string WorkerPool::Describe(const std::vector<std::optional<v1::StatsResponse>>& stats,
                                 const std::vector<std::string>& addresses) {
  std::string lost;
  for (size_t k = 0; k < stats.size(); ++k) {
    if (!stats[k])
      absl::StrAppend(&lost, lost.empty() ? "" : ", ", "stage ", k, " (", addresses[k], ")");
  }
  return lost;
}

std::string WorkerPool::Unreachable(double deadline_s) {
  return Describe(PollStats(false, deadline_s), addresses_);
}

absl::StatusOr<v1::StageWeights> WorkerPool::Weights(int k) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(30));
  AddToken(ctx, security_);
  v1::StageWeights w;
  grpc::Status st = stubs_[k]->GetWeights(&ctx, v1::WeightsRequest(), &w);
  if (!st.ok()) return FromGrpcStatus(st);
  return w;
}

}  // namespace localpar
