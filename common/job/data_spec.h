// What a job's data gives and where its files are, through its data source (data_spec.cc).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/core/shape.h"
#include "proto/job.pb.h"

namespace localpar {

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

}  // namespace localpar
