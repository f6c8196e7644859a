// Job files: the text format parsed (errors at file:line:column, with "did you mean"),
// defaults filled, overrides applied, then validated once.
#include "common/job/parse.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/io/regular_file.h"
#include "common/job/data_source.h"
#include "common/job/data_spec.h"
#include "common/job/defaults.h"
#include "common/job/limits.h"
#include "common/job/resources.h"
#include "common/job/spec.h"
#include "common/job/suggest.h"
#include "common/job/validate.h"
#include "common/nn/rule.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace localpar {
namespace {

// The text between the first two double quotes after `after` in `message` ("" if none).
std::string Quoted(const std::string& message, const std::string& after) {
  size_t at = message.find(after);
  if (at == std::string::npos) return "";
  size_t begin = message.find('"', at + after.size());
  if (begin == std::string::npos) return "";
  size_t end = message.find('"', begin + 1);
  return end == std::string::npos ? "" : message.substr(begin + 1, end - begin - 1);
}

// Every enum type of the job format with a field named `field`, and its value names.
std::vector<std::string> EnumValuesOfField(const std::string& field) {
  std::vector<std::string> values;
  const google::protobuf::FileDescriptor* file = v1::Job::descriptor()->file();
  std::function<void(const google::protobuf::Descriptor*)> visit =
      [&](const google::protobuf::Descriptor* d) {
        for (int i = 0; i < d->field_count(); ++i) {
          const google::protobuf::FieldDescriptor* f = d->field(i);
          if (f->name() != field || !f->enum_type()) continue;
          for (int v = 0; v < f->enum_type()->value_count(); ++v) {
            const std::string& name = f->enum_type()->value(v)->name();
            if (name.find("UNSPECIFIED") == std::string::npos &&
                std::find(values.begin(), values.end(), name) == values.end()) {
              values.push_back(name);
            }
          }
        }
        for (int i = 0; i < d->nested_type_count(); ++i) visit(d->nested_type(i));
      };
  for (int i = 0; i < file->message_type_count(); ++i) visit(file->message_type(i));
  return values;
}

// What the parser says, with a suggestion for a misspelt field or enum value, and every
// valid value of an enum.
std::string WithSuggestion(const std::string& message) {
  if (message.find("has no field named") != std::string::npos) {
    const std::string type = Quoted(message, "Message type");
    const std::string name = Quoted(message, "has no field named");
    const google::protobuf::Descriptor* d =
        google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(type);
    if (!d) return message;
    std::vector<std::string> fields;
    for (int i = 0; i < d->field_count(); ++i) fields.push_back(d->field(i)->name());
    const std::string best = Closest(name, fields);
    return best.empty() ? absl::StrCat(message, " Its fields: ", absl::StrJoin(fields, ", "), ".")
                        : absl::StrCat(message, " Did you mean \"", best, "\"?");
  }
  if (message.find("Unknown enumeration value") != std::string::npos) {
    const std::string value = Quoted(message, "enumeration value of");
    const std::vector<std::string> values = EnumValuesOfField(Quoted(message, "for field"));
    if (values.empty()) return message;
    const std::string best = Closest(value, values);
    return absl::StrCat(message, best.empty() ? "" : absl::StrCat(" Did you mean ", best, "?"),
                        " Valid values: ", absl::StrJoin(values, ", "), ".");
  }
  return message;
}

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  CollectErrors(std::string source, const std::string& text)
      : source_(std::move(source)), text_(text) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    // The parser reports a bad enum value at the token after it: point at the value.
    const std::string value = Quoted(message, "enumeration value of");
    if (!value.empty()) FindBefore(value, &line, &column);
    // The parser counts from 0; editors count from 1.
    errors_.push_back(
        absl::StrCat(source_, ":", line + 1, ":", column + 1, ": ", WithSuggestion(message)));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    AddError(line, column, message);
  }
  std::string str() const { return absl::StrJoin(errors_, "\n"); }

 private:
  // Moves (line, column) back to the last occurrence of `token` at or before it, if any.
  void FindBefore(const std::string& token, int* line, google::protobuf::io::ColumnNumber* column) {
    size_t at = 0;
    for (int l = 0; l < *line && at != std::string::npos; ++l) {
      at = text_.find('\n', at);
      if (at != std::string::npos) ++at;
    }
    if (at == std::string::npos) return;
    const size_t limit = std::min(text_.size(), at + static_cast<size_t>(*column));
    const size_t found = text_.rfind(token, limit);
    if (found == std::string::npos) return;
    const size_t line_start = text_.rfind('\n', found);
    *line = static_cast<int>(std::count(text_.begin(), text_.begin() + found, '\n'));
    *column = static_cast<int>(found - (line_start == std::string::npos ? 0 : line_start + 1));
  }

  std::string source_;
  const std::string& text_;
  std::vector<std::string> errors_;
};

// The message as written, before any default is filled in.
absl::StatusOr<v1::Job> ParseJobAsWritten(const std::string& text, const std::string& source) {
  v1::Job job;
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors(source, text);
  parser.RecordErrorsTo(&errors);
  parser.SetRecursionLimit(kMaxJobMessageDepth);
  if (!parser.ParseFromString(text, &job)) {
    std::string why = errors.str();
    if (absl::StrContains(why, "too deep")) {
      absl::StrAppend(&why, " (blocks nest at most ", kMaxLayerNesting, " deep)");
    }
    return absl::InvalidArgumentError(absl::StrCat("invalid job file ", why));
  }
  return job;
}

absl::StatusOr<v1::Job> ParseJobText(const std::string& text, const std::string& source) {
  absl::StatusOr<v1::Job> job = ParseJobAsWritten(text, source);
  if (job.ok()) ApplyJobDefaults(*job);
  return job;
}

absl::StatusOr<std::string> ReadJobFile(const std::string& path) {
  if (absl::Status s = CheckRegularFile(path, "job file"); !s.ok()) return s;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("job file ", path, ": cannot open"));
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

absl::Status ApplyOverrides(const v1::JobOverrides& o, v1::Job* job) {
  if (!o.rule().empty()) {
    const RuleSpec* rule = FindRule(o.rule());
    if (!rule) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rule=", o.rule(), ": expected ", RuleNameList()));
    }
    job->set_rule(static_cast<v1::UpdateRule>(rule->rule));
  }
  if (o.epochs() > 0) job->set_epochs(o.epochs());
  if (o.max_steps() > 0) job->set_max_steps(o.max_steps());
  if (o.has_seed()) job->set_seed(static_cast<uint64_t>(o.seed()));
  if (o.replicas() > 0) job->set_replicas(o.replicas());
  if (o.micro_batches() < 0) return absl::InvalidArgumentError("--micro_batches: must be >= 0");
  if (o.micro_batches() > 0) job->set_micro_batches(o.micro_batches());
  if (o.schedule() == "gpipe") {
    job->set_pipeline_schedule(v1::PIPELINE_GPIPE);
  } else if (o.schedule() == "1f1b") {
    job->set_pipeline_schedule(v1::PIPELINE_1F1B);
  } else if (o.schedule() == "zb") {
    job->set_pipeline_schedule(v1::PIPELINE_ZB);
  } else if (!o.schedule().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule=", o.schedule(), ": expected gpipe, 1f1b or zb"));
  }
  if (o.batch_size() < 0) return absl::InvalidArgumentError("--batch_size: must be >= 0");
  if (o.batch_size() > 0) job->set_batch_size(o.batch_size());
  if (!(o.lr() >= 0) || !std::isfinite(o.lr())) {
    return absl::InvalidArgumentError("--lr: must be a finite number >= 0");
  }
  if (o.lr() > 0) {
    v1::Schedule* s = job->mutable_schedule();
    const double old_lr = s->lr() > 0 ? s->lr() : 1e-3;  // the schedule's default
    s->set_min_lr(static_cast<float>(s->min_lr() * o.lr() / old_lr));
    s->set_lr(static_cast<float>(o.lr()));
  }
  if (o.memory_limit_mib() < 0) {
    return absl::InvalidArgumentError("--memory_limit_mib: must be >= 0 (0: this machine's)");
  }
  if (o.sync_every() < 0) return absl::InvalidArgumentError("--sync_every: must be >= 0");
  if (o.sync_every() > 0) job->mutable_replica_sync()->set_every(o.sync_every());
  if (o.has_outer_lr()) job->mutable_replica_sync()->set_outer_lr(static_cast<float>(o.outer_lr()));
  if (o.has_outer_momentum()) {
    job->mutable_replica_sync()->set_outer_momentum(static_cast<float>(o.outer_momentum()));
  }
  if (o.sync_bf16()) job->mutable_replica_sync()->set_bf16(true);
  ApplyReplicaSyncDefaults(*job);
  if (o.eval_every_steps() < 0)
    return absl::InvalidArgumentError("--eval_every_steps: must be >= 0");
  if (o.eval_every_steps() > 0) job->set_eval_every_steps(o.eval_every_steps());
  if (!o.data_path().empty()) {
    std::vector<std::string> paths = absl::StrSplit(o.data_path(), ',', absl::SkipEmpty());
    for (std::string& p : paths) p = std::filesystem::absolute(p).string();  // a flag: from here
    v1::Data* d = job->mutable_data();
    if (absl::Status s = DataSourceOf(*d).SetTrainPaths(paths, d); !s.ok()) return s;
  }
  if (o.stages() > 0) {
    absl::StatusOr<v1::Job> regrouped = RegroupStages(*job, o.stages());
    if (!regrouped.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", regrouped.status().message()));
    }
    *job = *std::move(regrouped);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Job> ParseJob(const std::string& text, const std::string& source) {
  absl::StatusOr<v1::Job> job = ParseJobText(text, source);
  if (!job.ok()) return job.status();
  absl::Status s = ValidateJob(*job);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid job file ", source, ": ", s.message()));
  }
  return job;
}

absl::StatusOr<v1::Job> LoadJobFile(const std::string& path) {
  return LoadJobWithOverrides(path, v1::JobOverrides());
}

absl::StatusOr<v1::Job> LoadJobWithOverrides(const std::string& path,
                                             const v1::JobOverrides& overrides) {
  absl::StatusOr<std::string> text = ReadJobFile(path);
  if (!text.ok()) return text.status();
  // Nothing but blanks and comments: say so, not which field comes first.
  bool empty = true;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty() && line[0] != '#') {
      empty = false;
      break;
    }
  }
  if (empty) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid job file ", path,
        ": empty file (no settings); deploy/jobs/ has examples, docs/jobs.md every field"));
  }
  absl::StatusOr<v1::Job> job = ParseJobAsWritten(*text, path);
  if (!job.ok()) return job.status();
  // max_steps alone, in the file or by --max_steps, sets the run's length: epochs stay unset
  // (as many as it takes) unless the file or --epochs names them.
  const bool epochs_named = job->epochs() != 0 || overrides.epochs() > 0;
  ApplyJobDefaults(*job);
  ResolveDataPaths(std::filesystem::absolute(path).parent_path().string(), &*job);
  if (absl::Status s = ApplyOverrides(overrides, &*job); !s.ok()) return s;
  if (!epochs_named && job->max_steps() > 0) job->set_epochs(0);
  auto invalid = [&](const absl::Status& s) {
    return absl::InvalidArgumentError(absl::StrCat("invalid job file ", path, ": ", s.message()));
  };
  if (absl::Status s = ValidateJobFields(*job); !s.ok()) return invalid(s);
  // The data's own shape and class count, before anything is checked against them.
  if (absl::Status s = ResolveDataShape(&*job); !s.ok()) return s;
  if (absl::Status s = ValidateJob(*job); !s.ok()) return invalid(s);
  if (absl::Status s = CheckJobFits(*job, MemoryLimitBytes(overrides.memory_limit_mib()), false);
      !s.ok()) {
    return invalid(s);
  }
  return job;
}

}  // namespace localpar
