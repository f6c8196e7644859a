// Run reports.
#include "common/run/report.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/atomic_file.h"
#include "common/job/data_spec.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace localpar {

std::string ToJson(const google::protobuf::Message& message, bool every_field) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.always_print_primitive_fields = every_field;
  o.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, o);  // cannot fail for these
  return out;
}

absl::Status WriteJsonFile(const google::protobuf::Message& message, const std::string& path) {
  return WriteFileAtomically(path, ToJson(message));
}

absl::Status WriteReport(const v1::RunReport& report, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  return WriteJsonFile(report, dir + "/report.json");
}

void AddHeadFigures(const std::vector<HeadStats>& stats,
                    google::protobuf::RepeatedPtrField<v1::HeadFigures>* out) {
  for (size_t k = 0; k < stats.size(); ++k) {
    v1::HeadFigures* f = out->Add();
    f->set_stage(static_cast<int>(k));
    f->set_loss(stats[k].mean_loss());
    f->set_accuracy(stats[k].accuracy());
    f->set_examples(static_cast<double>(stats[k].count));
  }
}

void AddBitsPerByte(const v1::Job& job, v1::RunReport* report) {
  if (!JobReadsBytes(job)) return;
  auto add = [](google::protobuf::RepeatedPtrField<v1::HeadFigures>* list) {
    for (v1::HeadFigures& f : *list) {
      if (f.examples() > 0) f.set_bits_per_byte(BitsPerByte(f.loss()));
    }
  };
  for (v1::EpochFigures& e : *report->mutable_epochs()) {
    add(e.mutable_train());
    add(e.mutable_test());
    add(e.mutable_validation());
  }
  for (v1::Evaluation& e : *report->mutable_evaluations()) {
    add(e.mutable_test());
    add(e.mutable_validation());
  }
}

absl::Status CheckRunTrained(const v1::RunReport& r) {
  // Over the whole run, not epoch by epoch: after a resume, an epoch whose training was done
  // before the restart rightly shows none in this process.
  double trained = 0;
  for (const v1::EpochFigures& e : r.epochs()) {
    for (const v1::HeadFigures& f : e.train()) trained += f.examples();
  }
  if (!r.epochs().empty() && trained == 0) {
    return absl::FailedPreconditionError(
        "the run trained on nothing: no stage's head scored a single training example, so "
        "every batch was refused or lost (see the errors above); the weights are untrained");
  }
  for (const v1::EpochFigures& e : r.epochs()) {
    for (const auto* heads : {&e.train(), &HeldOut(e)}) {
      for (const v1::HeadFigures& f : *heads) {
        if (f.examples() > 0 && !std::isfinite(f.loss())) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "stage %d's %s loss is %s in epoch %d: training diverged (lower the learning "
              "rate, or add warm-up); the weights are not usable",
              f.stage(),
              heads == &e.train()              ? "training"
              : r.eval_split() == "validation" ? "validation"
                                               : "test",
              std::isnan(f.loss()) ? "NaN" : "infinite", e.epoch()));
        }
      }
    }
  }
  return absl::OkStatus();
}

void DescribeRun(const v1::Job& job, const std::string& version, v1::RunReport* report) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(job, &text);
  report->set_job_text(text);
  report->set_seed(static_cast<double>(job.seed()));
  report->set_version(version);
  report->set_replicas(std::max(1, job.replicas()));
  if (job.replica_sync().every() > 1) {
    report->set_replica_sync_every(job.replica_sync().every());
    report->set_replica_sync_bf16(job.replica_sync().bf16());
  }
}

std::string ReportTable(const v1::RunReport& r) {
  std::string out = absl::StrFormat(
      "\n%s (%s%s), %d steps, %.1f s, %.0f examples/s\n", r.job(), r.rule(),
      r.replicas() > 1
          ? absl::StrFormat(
                ", %d replicas of each stage%s", r.replicas(),
                r.replica_sync_every() > 1
                    ? absl::StrFormat(" synchronising every %d steps%s", r.replica_sync_every(),
                                      r.replica_sync_bf16() ? " in bfloat16" : "")
                    : "")
          : "",
      r.steps(), r.wall_seconds(), r.examples_per_second());
  if (r.epochs().empty()) return out;
  const v1::EpochFigures& last = *r.epochs().rbegin();
  const auto& held_out = HeldOut(last);
  bool bytes = false;  // a byte-level language model: bits per byte beside the nats
  for (const v1::HeadFigures& f : held_out) bytes = bytes || f.bits_per_byte() > 0;
  // "test" or "valid": both 4 or 5 letters, so the columns keep their widths.
  const char* split = last.test_size() > 0 ? "test" : "valid";
  out += absl::StrFormat("stage  train loss  train acc %5s loss", split);
  if (bytes) absl::StrAppendFormat(&out, " %5s bits/byte", split);
  absl::StrAppendFormat(&out, " %5s acc\n", split);
  for (int k = 0; k < r.stages() && k < last.train_size() && k < held_out.size(); ++k) {
    absl::StrAppendFormat(&out, "%5d  %10.4f  %8.2f%%  %9.4f", k, last.train(k).loss(),
                          100 * last.train(k).accuracy(), held_out[k].loss());
    if (bytes) absl::StrAppendFormat(&out, "  %14.3f", held_out[k].bits_per_byte());
    absl::StrAppendFormat(&out, "  %7.2f%%", 100 * held_out[k].accuracy());
    if (k < r.stage_reports_size()) {
      absl::StrAppendFormat(&out, "  %8.0f ex/s", r.stage_reports(k).examples_per_second());
    }
    out += "\n";
  }
  return out;
}

}  // namespace localpar
