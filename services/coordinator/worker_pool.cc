// The coordinator's workers.
#include "services/coordinator/worker_pool.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_io/stage_snapshot.h"
#include "services/common/exit_codes.h"
#include "services/common/peer_text.h"
#include "services/common/stall_timer.h"
#include "services/coordinator/replica_stats.h"

namespace localpar {
namespace {

std::chrono::system_clock::time_point Deadline(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

ExitCode ExitCodeFor(grpc::StatusCode code) {
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

std::string HostOf(const std::string& address) {
  if (!address.empty() && address[0] == '[') {
    size_t end = address.find(']');
    return end == std::string::npos ? address : address.substr(1, end - 1);
  }
  size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

WorkerPool::WorkerPool(std::vector<std::string> addresses, int replicas,
                       const SecurityOptions& security, int64_t chunk_bytes)
    : addresses_(std::move(addresses)),
      replicas_(std::max(1, replicas)),
      security_(security),
      chunk_bytes_(chunk_bytes) {
  for (const std::string& a : addresses_)
    stubs_.push_back(v1::Worker::NewStub(MakeChannel(a, security)));
}

std::string WorkerPool::Name(int k, int r) const {
  return replicas_ > 1 ? absl::StrCat("stage ", k, " replica ", r) : absl::StrCat("stage ", k);
}

absl::StatusOr<ConfigureOutcome> WorkerPool::ConfigureAll(const v1::Job& job,
                                                          const StageSettings& s, int timeout_s) {
  ConfigureOutcome out;
  for (int k = 0; k < size(); ++k) {
    for (int r = 0; r < replicas_; ++r) {
      v1::ConfigureRequest req;
      *req.mutable_job() = job;
      req.set_stage(k);
      if (k + 1 < size()) req.set_downstream(address(k + 1, r));
      req.set_total_steps(s.total_steps);
      req.set_non_finite(s.non_finite);
      req.set_overlap_max_delay(s.overlap_max_delay);
      req.set_fingerprint(s.fingerprint);
      if (const v1::StageSnapshot* snap = s.restore ? FindSnapshot(*s.restore, k, r) : nullptr) {
        *req.mutable_restore() = *snap;
      } else if (s.initial && k < s.initial->stages_size()) {
        req.set_initial_follows(true);  // SendInitial, below: any size, in pieces
      }
      if (replicas_ > 1) {
        req.set_replica(r);
        req.set_rendezvous(s.rendezvous);
        req.set_rendezvous_group(s.rendezvous_group);
        req.set_rendezvous_timeout_s(s.rendezvous_timeout_s);
        req.set_collective_host(HostOf(address(k, r)));
      }
      v1::ConfigureResponse resp;
      grpc::Status st;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
      do {  // ABORTED: the worker is still winding down its previous stream
        grpc::ClientContext ctx;
        ctx.set_wait_for_ready(true);
        ctx.set_deadline(Deadline(timeout_s));
        AddToken(ctx, security_);
        st = stub(k, r).Configure(&ctx, req, &resp);
        if (st.error_code() != grpc::StatusCode::ABORTED) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      } while (std::chrono::steady_clock::now() < until);
      if (!st.ok()) {
        absl::Status failed = FromGrpcStatus(st);
        return WithExitCode(
            absl::Status(failed.code(),
                         absl::StrCat("configuring ", Name(k, r), " at ", address(k, r),
                                      " failed: ", SanitizePeerText(st.error_message()))),
            ExitCodeFor(st.error_code()));
      }
      if (req.initial_follows()) {
        if (absl::Status sent = SendInitial(k, r, s.initial->stages(k), timeout_s); !sent.ok()) {
          return WithExitCode(
              absl::Status(sent.code(),
                           absl::StrCat("sending ", Name(k, r), " at ", address(k, r),
                                        " its --init_from parameters failed: ", sent.message())),
              ExitCodeFor(static_cast<grpc::StatusCode>(sent.code())));
        }
      }
      if (r == 0) out.parameters += resp.parameters();
      if (k == 0 && r == 0) out.backend = resp.backend();
    }
  }
  return out;
}

std::vector<std::optional<v1::StatsResponse>> WorkerPool::PollStats(
    bool intervals, double deadline_s, std::vector<std::optional<v1::StatsResponse>>* workers) {
  std::vector<std::optional<v1::StatsResponse>> each(stubs_.size());
  for (size_t i = 0; i < stubs_.size(); ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(deadline_s));
    AddToken(ctx, security_);
    v1::StatsRequest req;
    req.set_include_intervals(intervals);
    v1::StatsResponse resp;
    if (stubs_[i]->Stats(&ctx, req, &resp).ok()) each[i] = std::move(resp);
  }
  std::vector<std::optional<v1::StatsResponse>> out(static_cast<size_t>(size()));
  for (int k = 0; k < size(); ++k) {
    std::vector<const v1::StatsResponse*> parts;
    for (int r = 0; r < replicas_; ++r) {
      if (each[Index(k, r)]) parts.push_back(&*each[Index(k, r)]);
    }
    if (static_cast<int>(parts.size()) != replicas_) continue;
    out[k] = MergeReplicaStats(parts);
  }
  if (workers) *workers = std::move(each);
  return out;
}

std::string WorkerPool::Unreachable(double deadline_s) {
  std::vector<std::optional<v1::StatsResponse>> each;
  PollStats(false, deadline_s, &each);
  std::string lost;
  for (int k = 0; k < size(); ++k) {
    for (int r = 0; r < replicas_; ++r) {
      if (each[Index(k, r)]) continue;
      absl::StrAppend(&lost, lost.empty() ? "" : ", ", Name(k, r), " (", address(k, r), ")");
    }
  }
  return lost;
}

absl::Status WorkerPool::SendInitial(int k, int r, const v1::StageWeights& weights, int timeout_s) {
  grpc::ClientContext ctx;
  // Time to move the bytes at 10 MB/s or better, on top of the usual wait.
  int64_t bytes = 0;
  for (const v1::NamedTensor& p : weights.params()) bytes += p.tensor().data().size();
  ctx.set_deadline(Deadline(timeout_s + static_cast<double>(bytes) / 1e7));
  AddToken(ctx, security_);
  v1::SetInitialResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::ParamChunk>> writer = stub(k, r).SetInitial(&ctx, &resp);
  const size_t step = static_cast<size_t>(std::max<int64_t>(4, chunk_bytes_ / 4 * 4));
  v1::ParamChunk chunk;
  bool open = true;
  for (const v1::NamedTensor& p : weights.params()) {
    chunk.set_name(p.name());
    *chunk.mutable_shape() = p.tensor().shape();
    const std::string& data = p.tensor().data();
    size_t at = 0;
    do {
      const size_t n = std::min(step, data.size() - at);
      chunk.set_offset(static_cast<int64_t>(at / sizeof(float)));
      chunk.set_data(data.data() + at, n);
      open = writer->Write(chunk);
      at += n;
    } while (open && at < data.size());
    if (!open) break;
  }
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  if (!st.ok()) {
    return absl::Status(FromGrpcStatus(st).code(), SanitizePeerText(st.error_message()));
  }
  if (!open) return absl::UnavailableError("the worker stopped reading");
  return absl::OkStatus();
}

void WorkerPool::ExpectWeights(std::vector<std::vector<TensorSpec>> specs, int stall_s) {
  expected_ = std::move(specs);
  stall_s_ = stall_s;
}

absl::StatusOr<v1::StageWeights> WorkerPool::Weights(int k, int r, std::string* non_finite) {
  if (k < 0 || k >= static_cast<int>(expected_.size())) {
    return absl::InternalError(absl::StrCat("no tensors are expected of stage ", k));
  }
  const std::vector<TensorSpec>& expected = expected_[k];
  std::map<std::string, int> index;
  for (size_t i = 0; i < expected.size(); ++i) index[expected[i].name] = static_cast<int>(i);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(600));
  AddToken(ctx, security_);
  StallTimer stall(std::chrono::seconds(stall_s_), [&ctx] { ctx.TryCancel(); });
  v1::WeightsRequest req;
  req.set_chunk_bytes(std::min<int64_t>(chunk_bytes_, int64_t{64} << 20));
  std::unique_ptr<grpc::ClientReader<v1::ParamChunk>> reader = stub(k, r).StreamWeights(&ctx, req);
  // Filled in the job's order, whatever order the pieces come in.
  std::vector<std::optional<v1::NamedTensor>> got(expected.size());
  v1::ParamChunk chunk;
  std::string* data = nullptr;  // of the tensor the pieces continue
  int64_t want = 0;             // its bytes
  std::string current;          // its name
  bool finished = false;
  auto bad = [&](const std::string& what) {
    if (!finished) {
      ctx.TryCancel();
      reader->Finish();
    }
    return absl::DataLossError(absl::StrCat(Name(k, r), " sent weights that do not match the job (",
                                            SanitizePeerText(what), "); nothing was written"));
  };
  while (reader->Read(&chunk)) {
    stall.Touch();
    if (!data || chunk.offset() == 0) {  // a new tensor starts
      if (data && static_cast<int64_t>(data->size()) != want) {
        return bad(absl::StrCat(current, " ended at ", data->size(), " of ", want, " bytes"));
      }
      auto it = index.find(chunk.name());
      if (it == index.end()) return bad(absl::StrCat("the stage has no tensor ", chunk.name()));
      const TensorSpec& spec = expected[it->second];
      if (got[it->second]) return bad(absl::StrCat(chunk.name(), " came twice"));
      if (!std::equal(spec.shape.begin(), spec.shape.end(), chunk.shape().begin(),
                      chunk.shape().end())) {
        return bad(absl::StrCat(chunk.name(), " is [", absl::StrJoin(chunk.shape(), ","),
                                "], the job's is ", ShapeString(spec.shape)));
      }
      v1::NamedTensor& t = got[it->second].emplace();
      t.set_name(spec.name);
      current = spec.name;
      t.mutable_tensor()->set_dtype(v1::F32);
      *t.mutable_tensor()->mutable_shape() = chunk.shape();
      want = NumElements(spec.shape) * static_cast<int64_t>(sizeof(float));
      data = t.mutable_tensor()->mutable_data();
      data->reserve(static_cast<size_t>(want));
    }
    const std::string& piece = chunk.data();
    if (chunk.offset() * 4 != static_cast<int64_t>(data->size()) || piece.size() % 4 != 0 ||
        static_cast<int64_t>(data->size() + piece.size()) > want) {
      return bad(absl::StrCat(chunk.name(), ": a piece of ", piece.size(), " bytes at element ",
                              chunk.offset(), " after ", data->size(), " of ", want, " bytes"));
    }
    for (size_t at = 0; at < piece.size(); at += 4) {
      float v;
      std::memcpy(&v, piece.data() + at, 4);
      if (!std::isfinite(v)) {
        const std::string what = absl::StrCat(chunk.name(), " holds ", v, " at element ",
                                              chunk.offset() + static_cast<int64_t>(at / 4));
        if (!non_finite) return bad(what);
        if (non_finite->empty()) *non_finite = absl::StrCat(Name(k, r), ": ", what);
        break;
      }
    }
    data->append(piece);
  }
  const bool stalled = stall.fired();
  grpc::Status st = reader->Finish();
  finished = true;
  if (stalled) {
    return absl::DeadlineExceededError(absl::StrCat(Name(k, r), " sent nothing for ", stall_s_,
                                                    " s while its weights were collected"));
  }
  if (!st.ok()) return FromGrpcStatus(st);
  v1::StageWeights w;
  w.set_stage(k);
  for (size_t i = 0; i < expected.size(); ++i) {
    const int64_t size = got[i] ? static_cast<int64_t>(got[i]->tensor().data().size()) : -1;
    const int64_t full = NumElements(expected[i].shape) * static_cast<int64_t>(sizeof(float));
    if (size != full) {
      return bad(size < 0
                     ? absl::StrCat(expected[i].name, " never came")
                     : absl::StrCat(expected[i].name, " ended at ", size, " of ", full, " bytes"));
    }
    *w.add_params() = *std::move(got[i]);
  }
  return w;
}

}  // namespace localpar
