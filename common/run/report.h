// Run reports: report.json (and trace.json) through protobuf's JSON printer, and the table
// printed at the end of a run.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/nn/stage.h"
#include "proto/job.pb.h"
#include "proto/report.pb.h"

namespace localpar {

// A message as JSON with its proto field names, indented; with `every_field`, fields at
// their default value too (not for google.protobuf.Struct and its kin, whose JSON form
// that option breaks).
std::string ToJson(const google::protobuf::Message& message, bool every_field = true);
// Writes `message` as JSON to `path`, atomically.
absl::Status WriteJsonFile(const google::protobuf::Message& message, const std::string& path);
// Writes report.json into `dir` (created if missing).
absl::Status WriteReport(const v1::RunReport& report, const std::string& dir);

// An epoch's or an evaluation's held-out figures: its test or its validation figures,
// whichever the run scored (RunReport.eval_split).
template <typename Figures>
const google::protobuf::RepeatedPtrField<v1::HeadFigures>& HeldOut(const Figures& f) {
  return f.test_size() > 0 ? f.test() : f.validation();
}

// A loss in nats per byte as bits per byte (byte-level language models).
inline double BitsPerByte(double nats) { return nats / 0.69314718055994531; }

// Each stage's head figures, numbered from stage 0.
void AddHeadFigures(const std::vector<HeadStats>& stats,
                    google::protobuf::RepeatedPtrField<v1::HeadFigures>* out);
// For a byte-level language model (`job` reads a text corpus): every figure that scored
// something gets its loss in bits per byte too.
void AddBitsPerByte(const v1::Job& job, v1::RunReport* report);

// OK when the run trained: some stage's head scored some training example, and no head's
// loss is NaN or infinite. Otherwise FAILED_PRECONDITION saying which epoch and stage;
// `localpar run` and `localpar train` then exit kExitTrainingFailed.
absl::Status CheckRunTrained(const v1::RunReport& report);

// Records what ran: the normalised job (text format), its seed, and `version`.
void DescribeRun(const v1::Job& job, const std::string& version, v1::RunReport* report);

std::string ReportTable(const v1::RunReport& report);

}  // namespace localpar
