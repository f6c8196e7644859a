// Building and restoring a worker's stage.
#include "services/worker/stage_host.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job/job.h"
#include "common/job/resources.h"
#include "common/model_io/checkpoint.h"
#include "common/run/device.h"
#include "services/common/peer_text.h"
#include "services/common/wire_codec.h"

namespace localpar {

absl::Status StageHost::EnsureBackend() {
  if (backend_) return absl::OkStatus();
  DeviceChoice ro;
  ro.device = options_.config.device();
  ro.threads = options_.config.threads();
  absl::StatusOr<std::unique_ptr<Backend>> b = PickBackend(ro);
  if (!b.ok()) return b.status();
  backend_ = *std::move(b);
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

absl::Status StageHost::Build(const v1::ConfigureRequest& req, ConfiguredStage* s) {
  v1::Job job = req.job();
  ApplyJobDefaults(job);
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
  if (absl::Status r = CheckReplicaRequest(job, req); !r.ok()) return r;
  if (absl::Status b = EnsureBackend(); !b.ok()) return b;
  ApplyJobToBackend(job, *backend_);
  ModelConfig mc = ToModelConfig(job);
  const Shape in = StageInputShape(mc, req.stage());
  if (absl::Status fits = CheckStageFits(job, req.stage()); !fits.ok()) {
    return fits;
  }
  std::string error;
  s->stage_model =
      Stage::Create(*backend_, mc.stages[req.stage()], StageInputShape(mc, req.stage()), mc.classes,
                    mc.optimizer, StageSeed(mc.seed, req.stage()), &error);
  if (!s->stage_model) return absl::InvalidArgumentError(error);
  if (req.has_restore()) {
    const std::string& root = options_.config.checkpoint_dir();
    if (root.empty()) {
      return absl::DataLossError(absl::StrCat("stage ", req.stage(),
                                              ": this worker has no --checkpoint_dir to restore "
                                              "checkpoint ",
                                              req.restore().checkpoint_id(), " from"));
    }
    if (absl::Status r = RestoreStageSnapshot(*s->stage_model, req.stage(), root, req.restore(),
                                              req.fingerprint(), &s->restored, req.replica());
        !r.ok()) {
      return r;
    }
  } else if (req.has_initial()) {
    // --init_from: parameters only; the optimizer starts fresh, as at step 0.
    v1::StageCheckpoint init;
    init.set_stage(req.stage());
    *init.mutable_params() = req.initial().params();
    if (req.initial().stage() != req.stage()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ConfigureRequest.initial.stage: ", req.initial().stage(),
                       ", but this is stage ", req.stage()));
    }
    if (absl::Status r =
            RestoreStageState(*s->stage_model, init,
                              absl::StrCat("ConfigureRequest.initial (stage ", req.stage(), ")"));
        !r.ok()) {
      return r;
    }
  }
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
  l.classes = JobClasses(job);
  l.labels_per_example = s->labels_per_example;
  l.micro_batches = s->program.micro_batches;
  l.replica = s->replica;
  l.replicas = s->replicas;
  l.batch_size = job.batch_size();
  l.eval_batch_size = job.eval_batch_size();
  l.total_steps = req.total_steps();
  l.epochs = job.epochs();
  l.non_finite = req.non_finite();
  const int64_t rows = std::max<int64_t>(job.batch_size(), job.eval_batch_size());
  l.max_item_bytes = rows * (NumElements(l.input_shape) + l.labels_per_example) * 4 + (64 << 10);
  if (!last) s->downstream = MakeChannel(req.downstream(), options_.security);
  if (s->replicas > 1) {
    ReplicaGroupOptions g;
    g.rendezvous = req.rendezvous();
    g.group = req.rendezvous_group();
    g.stage = s->stage;
    g.replica = s->replica;
    g.replicas = s->replicas;
    g.host = req.collective_host();
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
  if (absl::Status s = Build(req, built.get()); !s.ok()) return s;
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

absl::StatusOr<v1::StageWeights> StageHost::Weights(std::chrono::milliseconds wait) {
  std::unique_lock<std::timed_mutex> compute(compute_mu_, wait);
  if (!compute.owns_lock()) {
    return absl::UnavailableError(
        absl::StrCat("the stage is busy (its compute thread waits on a peer); try again"));
  }
  std::shared_ptr<const ConfiguredStage> s = setup();
  if (!s) return absl::FailedPreconditionError("not configured");
  return SnapshotStage(*s->stage_model, s->stage);
}

}  // namespace localpar
