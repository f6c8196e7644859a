// What a job's data gives: the example shape, the class count and labels per example, its
// paths and the files' own figures, each from the job's data source (data_source.h); data
// errors marked as such.
#include "common/job/data_spec.h"

#include <filesystem>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/job/data_source.h"

namespace localpar {

Shape JobInputShape(const v1::Job& job) { return DataSourceOf(job.data()).InputShape(job.data()); }

int32_t JobClasses(const v1::Job& job) { return DataSourceOf(job.data()).Classes(job.data()); }

int64_t JobLabelsPerExample(const v1::Job& job) {
  return DataSourceOf(job.data()).LabelsPerExample(job.data());
}

bool JobShufflesExamples(const v1::Job& job) {
  return DataSourceOf(job.data()).ShufflesExamples(job.data());
}

bool JobReadsBytes(const v1::Job& job) { return DataSourceOf(job.data()).ByteTokens(); }

const char* EvalSplitName(const v1::Job& job) {
  const bool held_out =
      DataSourceOf(job.data()).OwnValidation() || job.data().holdout_fraction() > 0;
  return held_out ? "validation" : "test";
}

void ResolveDataPaths(const std::string& dir, v1::Job* job) {
  v1::Data* d = job->mutable_data();
  DataSourceOf(*d).Paths(d, [&](const std::string&, std::string* p) {
    if (p->empty() || dir.empty() || std::filesystem::path(*p).is_absolute()) return;
    *p = std::filesystem::absolute(std::filesystem::path(dir) / *p).lexically_normal().string();
  });
}

namespace {

// Every file or folder the data source names exists: the error names the field and the
// resolved path, so a wrong relative path shows where it was looked for.
absl::Status CheckDataPathsExist(const v1::Data& data) {
  const DataSource& source = DataSourceOf(data);
  v1::Data copy = data;
  absl::Status missing;
  source.Paths(&copy, [&](const std::string& field, std::string* path) {
    std::error_code ec;
    if (!missing.ok() || path->empty() || std::filesystem::exists(*path, ec)) return;
    missing = absl::NotFoundError(absl::StrCat(field, ": ", *path, ": no such file or folder",
                                               source.MissingPathHint(*path)));
  });
  return missing;
}

}  // namespace

absl::Status ResolveDataShape(v1::Job* job) {
  v1::Data* d = job->mutable_data();
  if (absl::Status s = CheckDataPathsExist(*d); !s.ok()) return MarkDataError(s);
  return MarkDataError(DataSourceOf(*d).ResolveShape(*job, d));
}

namespace {
constexpr char kDataErrorPayload[] = "type.localpar/data-error";
}  // namespace

absl::Status MarkDataError(absl::Status s) {
  if (!s.ok()) s.SetPayload(kDataErrorPayload, absl::Cord("1"));
  return s;
}

bool IsDataError(const absl::Status& s) { return s.GetPayload(kDataErrorPayload).has_value(); }

}  // namespace localpar
