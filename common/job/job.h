// Job files: parsing (protobuf text format), defaults, validation, and conversion into the
// core's plain config structs.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data/dataset.h"
#include "common/data/user_data.h"
#include "common/nn/model.h"
#include "common/nn/step.h"
#include "proto/job.pb.h"

namespace localpar {

// How deep layers may nest (a residual in a residual's body is 2). One limit serves both
// parsers: the text parser stops at kMaxJobMessageDepth messages, which a job within the
// nesting limit never reaches, and a Job within it stays far inside the limit of 100 that
// protobuf's binary parser (and so gRPC) applies to a Configure. `validate` names the layer.
constexpr int kMaxLayerNesting = 16;
constexpr int kMaxJobMessageDepth = 2 * kMaxLayerNesting + 8;
// The most stages a job may have: each is a worker process.
constexpr int kMaxStages = 1024;

// Parses text-format `text`; syntax errors name source:line:column. Applies defaults and
// validates (see ValidateJob).
absl::StatusOr<v1::Job> ParseJob(const std::string& text, const std::string& source);
// LoadJobWithOverrides without overrides.
absl::StatusOr<v1::Job> LoadJobFile(const std::string& path);
// Parses the file, applies defaults, then `overrides` (so a --rule that changes what is
// valid counts), reads the data's shape and class count (ResolveDataShape), then validates
// once. Errors name the file, or the flag that was wrong; data errors are marked
// (IsDataError).
absl::StatusOr<v1::Job> LoadJobWithOverrides(const std::string& path,
                                             const v1::JobOverrides& overrides);

// Fills documented defaults for zero-valued fields, in place.
void ApplyJobDefaults(v1::Job& job);

// Field-level checks (naming the field path and the reason), then shape inference through
// every stage and head (naming the stage, the layer and both shapes).
absl::Status ValidateJob(const v1::Job& job);
// The field-level checks alone (before the data's shape is known).
absl::Status ValidateJobFields(const v1::Job& job);

// Every relative data path of the job (corpus and token files, NumPy arrays, image folders,
// IDX and CIFAR-10 directories) made relative to `dir`, the job file's folder.
void ResolveDataPaths(const std::string& dir, v1::Job* job);

// Fills data.fashion_mnist's shape and classes from the IDX files' headers and labels (and
// checks them where the job file set them). Errors name the file or the field and are
// marked as data errors. Other sources need nothing read.
absl::Status ResolveDataShape(v1::Job* job);
// Whether an epoch's examples are a shuffled order of a fixed set (most sources), or drawn
// afresh from (seed, epoch, index) (sequence sources with RANDOM_OFFSETS windows).
bool JobShufflesExamples(const v1::Job& job);
// What the job's held-out figures score: "validation" when that split comes from the
// training data (data.holdout_fraction, a corpus's tail or validation files), "test" when it
// is a data set's own test split. Progress lines, tables, metrics.jsonl and report.json use
// the name.
const char* EvalSplitName(const v1::Job& job);
// A byte-level language model (data.text): losses are per byte, shown in bits per byte too.
bool JobReadsBytes(const v1::Job& job);
// A data error (a missing or unreadable data set) rather than a wrong job: callers exit 4,
// not 3.
absl::Status MarkDataError(absl::Status s);
bool IsDataError(const absl::Status& s);

// Per-example input shape and class count the job's data source produces.
Shape JobInputShape(const v1::Job& job);
int32_t JobClasses(const v1::Job& job);
// Labels per example: 1 for classification, seq_len for language modelling.
int64_t JobLabelsPerExample(const v1::Job& job);

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
// way) but another stage split, replica count or rule give the same.
v1::Job NetworkOf(const v1::Job& job);
// JobFingerprint of NetworkOf(job): what a resume with another layout must keep.
std::string NetworkFingerprint(const v1::Job& job, const std::string& settings);

ModelConfig ToModelConfig(const v1::Job& job);
StepSettings ToStepSettings(const v1::Job& job, int64_t total_steps);

// The most replicas of a stage a job may ask for (Job.replicas).
constexpr int kMaxReplicas = 64;
// INVALID_ARGUMENT naming `replicas` when an epoch's short last batch cannot give every
// replica (and each of its micro-batches) a row.
absl::Status CheckReplicasFitData(const v1::Job& job, int64_t train_examples);
// Backend settings a job carries (its GEMM precision); every program that builds a job's
// stages on a backend calls this first, so they all compute alike.
void ApplyJobToBackend(const v1::Job& job, Backend& backend);
UpdateRule ToUpdateRule(v1::UpdateRule rule);

}  // namespace localpar
