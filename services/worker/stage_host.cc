// Building and restoring a worker's stage.
#include "services/worker/stage_host.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/core/device.h"
#include "common/job/data_spec.h"
#include "common/job/defaults.h"
#include "common/job/resources.h"
#include "common/job/spec.h"
#include "common/job/validate.h"
#include "common/model_io/stage_snapshot.h"
#include "services/common/peer_text.h"
#include "services/common/wire_codec.h"

namespace localpar {

absl::Status StageHost::EnsureBackend() {
  if (backend_) return absl::OkStatus();
  DeviceChoice ro;
  ro.device = options_.config.compute().device();
  ro.threads = options_.config.compute().threads();
  PickedBackend picked = PickBackend(ro);
  if (!picked.backend) {
    return picked.bad_name ? absl::InvalidArgumentError(picked.error)
                           : absl::FailedPreconditionError(picked.error);
  }
  backend_ = std::move(picked.backend);
  if (backend_->device() != DeviceType::kCPU) {
    host_backend_ = backend_->MakeStagingHost();  // page-locked: asynchronous copies
  }
  return absl::OkStatus();
}

// A stage whose training state would not fit is refused before anything is allocated.
absl::Status StageHost::CheckStageFits(const v1::Job& job, int index) const {
  // The estimate `validate` prints: parameters, gradients and optimizer moments, and one
  // replica's share of a batch of activations.
  const StageNeeds need = EstimateJobNeeds(job, true).stages[static_cast<size_t>(index)];
  const double allow = MemoryLimitBytes(options_.config.max_stage_mib());
  if (need.total() <= allow) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "stage %d needs about %s (%s for its parameters, gradients and optimizer state, %s of "
      "activations for %s); this worker allows %s (--max_stage_mib)",
      index, ByteString(need.total()), ByteString(need.state_bytes),
      ByteString(need.activation_bytes), need.RowsString(), ByteString(allow)));
}

// The replica fields of a configuration, checked before anything is built.
static absl::Status CheckReplicaRequest(const v1::Job& job, const v1::ConfigureRequest& req) {
  if (req.replica() < 0 || req.replica() >= job.replicas()) {
    return absl::InvalidArgumentError(absl::StrCat("replica: ", req.replica(), " is not in 0..",
                                                   job.replicas() - 1, " (the job's replicas)"));
  }
  if (job.replicas() == 1) return absl::OkStatus();
  if (req.rendezvous().empty() || req.rendezvous_group().empty()) {
    return absl::InvalidArgumentError(
        "rendezvous, rendezvous_group: required with replicas (the coordinator's address)");
  }
  if (req.collective_host().empty()) {
    return absl::InvalidArgumentError("collective_host: required with replicas");
  }
  // Gloo resolves the name itself and does not survive one that does not resolve.
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(req.collective_host().c_str(), nullptr, &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective_host: '", SanitizePeerText(req.collective_host(), 128),
                     "' does not resolve on this worker (", gai_strerror(rc), ")"));
  }
  freeaddrinfo(found);
  if (req.rendezvous_timeout_s() < 0) {
    return absl::InvalidArgumentError("rendezvous_timeout_s: must be >= 0");
  }
  return absl::OkStatus();
}

// The request's own fields, checked against its job before anything is built.
static absl::Status CheckConfigureRequest(const v1::Job& job, const v1::ConfigureRequest& req) {
  if (absl::Status v = ValidateJob(job); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("job: ", v.message()));
  }
  if (req.stage() < 0 || req.stage() >= job.stages_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage: ", req.stage(), " is not in 0..", job.stages_size() - 1));
  }
  const bool last = req.stage() + 1 == job.stages_size();
  if (last != req.downstream().empty()) {
    return absl::InvalidArgumentError(last ? "downstream: the last stage has none"
                                           : "downstream: required for this stage");
  }
  if (req.overlap_max_delay() < 0) {
    return absl::InvalidArgumentError("overlap_max_delay: must be >= 0");
  }
  if (req.total_steps() < 1) return absl::InvalidArgumentError("total_steps: must be >= 1");
  if (req.initial_follows() && (req.has_restore() || req.has_initial())) {
    return absl::InvalidArgumentError(
        "ConfigureRequest.initial_follows: the request also restores a snapshot or carries "
        "the initial parameters");
  }
  if (req.has_initial() && req.initial().stage() != req.stage()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ConfigureRequest.initial.stage: ", req.initial().stage(),
                     ", but this is stage ", req.stage()));
  }
  return CheckReplicaRequest(job, req);
}

// What the compute thread and the item checks read: the settings of a built stage.
static void DescribeStage(const v1::Job& job, const v1::ConfigureRequest& req, ConfiguredStage* s) {
  s->request = req;
  *s->request.mutable_job() = job;
  s->stage = req.stage();
  s->num_stages = job.stages_size();
  s->replica = req.replica();
  s->replicas = job.replicas();
  s->labels_per_example = JobLabelsPerExample(job);
  s->wire = static_cast<WireFormat>(job.wire());
  s->steps = ToStepSettings(job, req.total_steps());
  s->program = StageProgramSpec(s->steps, s->stage, s->num_stages, req.overlap_max_delay());
  ItemLimits& l = s->limits;
  l.stage = s->stage;
  l.input_shape = s->stage_model->input_shape();
  l.wire_dtype = WireDType(s->wire);
  l.token_vocab = s->stage_model->token_vocab();
  l.classes = JobClasses(job);
  l.labels_per_example = s->labels_per_example;
  l.micro_batches = s->program.micro_batches;
  l.replica = s->replica;
  l.replicas = s->replicas;
  l.batch_size = job.batch_size();
  l.eval_batch_size = job.eval_batch_size();
  l.total_steps = req.total_steps();
  // Epochs unset (max_steps sets the length): each epoch has a step at least.
  l.epochs = job.epochs() > 0 ? job.epochs()
                              : static_cast<int32_t>(std::clamp<int64_t>(
                                    req.total_steps(), 1, std::numeric_limits<int32_t>::max()));
  l.non_finite = req.non_finite();
  const int64_t rows = std::max<int64_t>(job.batch_size(), job.eval_batch_size());
  l.max_item_bytes = rows * (NumElements(l.input_shape) + l.labels_per_example) * 4 + (64 << 10);
}

absl::Status StageHost::CreateStage(const v1::ConfigureRequest& req, const ModelConfig& mc,
                                    ConfiguredStage* s, const std::function<void()>& release) {
  const std::string& root = options_.config.checkpoint_dir();
  if (req.has_restore()) {
    if (root.empty()) {
      return absl::DataLossError(absl::StrCat("stage ", req.stage(),
                                              ": this worker has no --checkpoint_dir to restore "
                                              "checkpoint ",
                                              req.restore().checkpoint_id(), " from"));
    }
    // The snapshot is checked whole (size, checksum, run) before the live stage is let go,
    // so a refused restore leaves it serving; a good one replaces it anyway, and letting it
    // go first keeps one stage in memory, not two, while every stage rolls back.
    EpochProgress probe;
    if (absl::Status r = RestoreStageSnapshot(nullptr, req.stage(), root, req.restore(),
                                              req.fingerprint(), &probe, req.replica());
        !r.ok()) {
      return r;
    }
    if (release) release();
  }
  std::string error;
  s->stage_model =
      Stage::Create(*backend_, mc.stages[req.stage()], StageInputShape(mc, req.stage()), mc.classes,
                    mc.optimizer, StageSeed(mc.seed, req.stage()), &error);
  if (!s->stage_model) return absl::InvalidArgumentError(error);
  if (req.has_restore()) {
    return RestoreStageSnapshot(s->stage_model.get(), req.stage(), root, req.restore(),
                                req.fingerprint(), &s->restored, req.replica());
  }
  if (req.has_initial()) {
    // --init_from: parameters only; the optimizer starts fresh, as at step 0.
    v1::StageCheckpoint init;
    init.set_stage(req.stage());
    *init.mutable_params() = req.initial().params();
    return RestoreStageState(*s->stage_model, init,
                             absl::StrCat("ConfigureRequest.initial (stage ", req.stage(), ")"));
  }
  if (req.initial_follows()) s->initial_pending.store(true);
  return absl::OkStatus();
}

absl::Status StageHost::Build(const v1::ConfigureRequest& req, ConfiguredStage* s,
                              const std::function<void()>& release) {
  v1::Job job = req.job();
  ApplyJobDefaults(job);
  if (absl::Status v = CheckConfigureRequest(job, req); !v.ok()) return v;
  if (absl::Status b = EnsureBackend(); !b.ok()) return b;
  ApplyJobToBackend(job, *backend_);
  if (absl::Status fits = CheckStageFits(job, req.stage()); !fits.ok()) return fits;
  if (absl::Status c = CreateStage(req, ToModelConfig(job), s, release); !c.ok()) return c;
  DescribeStage(job, req, s);
  if (s->stage + 1 < s->num_stages)
    s->downstream = MakeChannel(req.downstream(), options_.security);
  if (s->replicas > 1) {
    ReplicaGroupOptions g;
    g.rendezvous = req.rendezvous();
    g.group = req.rendezvous_group();
    g.stage = s->stage;
    g.replica = s->replica;
    g.replicas = s->replicas;
    g.host = req.collective_host();
    g.log = options_.log;
    g.fingerprint = JobFingerprint(
        job,
        absl::StrCat("stage ", s->stage, ", ", s->stage_model->num_parameters(), " parameters"));
    if (req.rendezvous_timeout_s() > 0)
      g.timeout = std::chrono::seconds(req.rendezvous_timeout_s());
    s->group = std::make_shared<ReplicaGroup>(std::move(g), options_.security);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ConfigureResponse> StageHost::Configure(const v1::ConfigureRequest& req) {
  auto built = std::make_shared<ConfiguredStage>();
  auto release = [this] {
    std::lock_guard<std::timed_mutex> compute(compute_mu_);
    std::lock_guard<std::mutex> lock(mu_);
    setup_.reset();  // a stream still running holds its own reference until it ends
  };
  // A job its limits let through that this machine cannot hold is refused; the worker goes
  // on serving.
  try {
    if (absl::Status s = Build(req, built.get(), release); !s.ok()) return s;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("stage ", req.stage(),
                     ": out of memory building the stage (was "
                     "--memory_limit_mib raised past this machine's memory?)"));
  }
  v1::ConfigureResponse resp;
  resp.set_backend(backend_->Describe());
  resp.set_parameters(built->stage_model->num_parameters());
  for (int64_t d : built->stage_model->input_shape()) resp.add_input_shape(d);
  for (int64_t d : built->stage_model->output_shape()) resp.add_output_shape(d);
  std::lock_guard<std::timed_mutex> compute(compute_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  setup_ = std::move(built);
  return resp;
}

std::shared_ptr<const ConfiguredStage> StageHost::setup() const {
  std::lock_guard<std::mutex> lock(mu_);
  return setup_;
}

absl::StatusOr<std::shared_ptr<const ConfiguredStage>> StageHost::HoldStage(
    std::chrono::milliseconds wait, std::unique_lock<std::timed_mutex>* compute) {
  *compute = std::unique_lock<std::timed_mutex>(compute_mu_, wait);
  if (!compute->owns_lock()) {
    return absl::UnavailableError(
        "the stage is busy (its compute thread waits on a peer); try again");
  }
  std::shared_ptr<const ConfiguredStage> s = setup();
  if (!s) return absl::FailedPreconditionError("not configured");
  return s;
}

absl::StatusOr<v1::StageWeights> StageHost::Weights(std::chrono::milliseconds wait) {
  std::unique_lock<std::timed_mutex> compute;
  absl::StatusOr<std::shared_ptr<const ConfiguredStage>> held = HoldStage(wait, &compute);
  if (!held.ok()) return held.status();
  const std::shared_ptr<const ConfiguredStage>& s = *held;
  return SnapshotStage(*s->stage_model, s->stage);
}

absl::Status StageHost::WeightChunks(std::chrono::milliseconds wait, int64_t chunk_bytes,
                                     const std::function<bool(const v1::ParamChunk&)>& send) {
  if (chunk_bytes < 0 || chunk_bytes > (int64_t{64} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("WeightsRequest.chunk_bytes: ", chunk_bytes, " is not in 0..64 MiB"));
  }
  const size_t per_chunk = static_cast<size_t>(chunk_bytes == 0 ? (4 << 20) : chunk_bytes) / 4;
  std::unique_lock<std::timed_mutex> compute;
  absl::StatusOr<std::shared_ptr<const ConfiguredStage>> held = HoldStage(wait, &compute);
  if (!held.ok()) return held.status();
  const std::shared_ptr<const ConfiguredStage>& s = *held;
  std::vector<Param*> params = s->stage_model->params();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> values = params[i]->value.ToHost();
    v1::ParamChunk chunk;
    chunk.set_name(absl::StrCat(i, ".", params[i]->name));
    for (int64_t d : params[i]->value.shape()) chunk.add_shape(d);
    size_t at = 0;
    do {  // an empty tensor still sends one (empty) piece
      const size_t n = std::min(per_chunk, values.size() - at);
      chunk.set_offset(static_cast<int64_t>(at));
      chunk.set_data(values.data() + at, n * sizeof(float));
      if (!send(chunk)) return absl::CancelledError("the reader went away");
      at += n;
    } while (at < values.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::SetInitialResponse> StageHost::SetInitial(
    const std::function<bool(v1::ParamChunk*)>& next) {
  std::unique_lock<std::timed_mutex> compute(compute_mu_);
  std::shared_ptr<const ConfiguredStage> s = setup();
  if (!s) return absl::FailedPreconditionError("SetInitial: not configured");
  if (!s->initial_pending.load()) {
    return absl::FailedPreconditionError(
        "SetInitial: this configuration did not ask for starting parameters "
        "(ConfigureRequest.initial_follows), or has them all already");
  }
  std::vector<Param*> params = s->stage_model->params();
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[absl::StrCat(i, ".", params[i]->name)] = i;
  std::vector<int64_t> arrived(params.size(), 0);
  v1::SetInitialResponse resp;
  v1::ParamChunk chunk;
  while (next(&chunk)) {
    auto it = index.find(chunk.name());
    if (it == index.end()) {
      return absl::InvalidArgumentError(absl::StrCat("ParamChunk.name: stage ", s->stage,
                                                     " has no parameter \"",
                                                     SanitizePeerText(chunk.name()), "\""));
    }
    Param& p = *params[it->second];
    const Shape want = p.value.shape();
    if (!std::equal(want.begin(), want.end(), chunk.shape().begin(), chunk.shape().end())) {
      return absl::InvalidArgumentError(absl::StrCat("ParamChunk.shape: ", chunk.name(), " is [",
                                                     absl::StrJoin(chunk.shape(), ","),
                                                     "], the stage's is ", ShapeString(want)));
    }
    const int64_t numel = p.value.numel();
    int64_t& done = arrived[it->second];
    if (chunk.offset() != done) {
      return absl::InvalidArgumentError(absl::StrCat("ParamChunk.offset: ", chunk.name(), " at ",
                                                     chunk.offset(), ", expected ", done,
                                                     " (pieces come in order, without gaps)"));
    }
    if (chunk.data().size() % sizeof(float) != 0 ||
        static_cast<int64_t>(chunk.data().size() / sizeof(float)) > numel - done) {
      return absl::InvalidArgumentError(
          absl::StrCat("ParamChunk.data: ", chunk.name(), ": ", chunk.data().size(),
                       " bytes at element ", done, " do not fit its ", numel, " float32 values"));
    }
    const int64_t n = static_cast<int64_t>(chunk.data().size() / sizeof(float));
    if (n > 0) {
      backend_->CopyFromHost(p.value.f32() + done, chunk.data().data(), chunk.data().size());
    }
    done += n;
    resp.set_bytes(resp.bytes() + static_cast<int64_t>(chunk.data().size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (arrived[i] != params[i]->value.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SetInitial ended with ", i, ".", params[i]->name, " at ", arrived[i],
                       " of its ", params[i]->value.numel(), " values: the stage stays unstarted"));
    }
  }
  resp.set_params(static_cast<int64_t>(params.size()));
  s->initial_pending.store(false);
  return resp;
}

}  // namespace localpar
