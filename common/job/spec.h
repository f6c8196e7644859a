// A job in the core's terms: the model and step settings, the stages regrouped, the
// fingerprints checkpoints keep, the backend settings (spec.cc).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/core/backend.h"
#include "common/nn/model.h"
#include "common/nn/step.h"
#include "proto/job.pb.h"

namespace localpar {

// The same network cut into `stages` stages instead: consecutive stages merge into groups
// as even in size as possible (earlier groups take the extra stage), each keeping the head
// of its last member. This is how CHUNKED with k chunks, or a different pipeline depth, is
// made from one job file.
absl::StatusOr<v1::Job> RegroupStages(const v1::Job& job, int stages);

// A fingerprint of what determines a run's weights: the normalised job (defaults, overrides
// and seed included) and `settings` (the run's options that change the arithmetic). Hex.
std::string JobFingerprint(const v1::Job& job, const std::string& settings);
// The job with its layout taken out: every stage's layers in one list, without heads, stage
// names, declared input shapes, the replica count, the rule, micro-batches or the job's
// name. Two jobs with the same network (the same layers in the same order, trained the same
// way) but another stage split, replica count, rule or length give the same.
v1::Job NetworkOf(const v1::Job& job);
// JobFingerprint of NetworkOf(job): what a resume with another layout must keep. Neither
// fingerprint counts the run's length (epochs, max_steps): a resume may extend a run.
std::string NetworkFingerprint(const v1::Job& job, const std::string& settings);

ModelConfig ToModelConfig(const v1::Job& job);
StepSettings ToStepSettings(const v1::Job& job, int64_t total_steps);

// INVALID_ARGUMENT naming `replicas` when an epoch's short last batch cannot give every
// replica (and each of its micro-batches) a row.
absl::Status CheckReplicasFitData(const v1::Job& job, int64_t train_examples);
// Backend settings a job carries (its GEMM precision); every program that builds a job's
// stages on a backend calls this first, so they all compute alike.
void ApplyJobToBackend(const v1::Job& job, Backend& backend);
UpdateRule ToUpdateRule(v1::UpdateRule rule);

}  // namespace localpar
