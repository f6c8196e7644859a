// What several data sources share.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job/data_source.h"

namespace localpar {

namespace sources {

inline absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// A list of paths, each non-empty.
absl::Status CheckPathList(const std::string& field,
                           const google::protobuf::RepeatedPtrField<std::string>& paths);
void VisitPathList(const std::string& field, google::protobuf::RepeatedPtrField<std::string>* paths,
                   const std::function<void(const std::string&, std::string*)>& visit);

// Fills a user data source's shape and classes from the examples the files hold, or checks
// the ones the job sets (`field`: "data.numpy"; `what`: the files, for messages).
template <typename Source>
absl::Status ResolveFrom(const DataSplit& split, const std::string& field, const std::string& what,
                         Source* src) {
  const Shape& got = split.train.example_shape;
  if (!src->shape().empty() &&
      !std::equal(src->shape().begin(), src->shape().end(), got.begin(), got.end())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: [", absl::StrJoin(src->shape(), ","), "], but ", what,
                     " hold examples of shape ", ShapeString(got)));
  }
  if (src->classes() > 0 && src->classes() != split.train.classes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".classes: ", src->classes(), ", but ",
                                                   what, " have labels 0..",
                                                   split.train.classes - 1));
  }
  src->clear_shape();
  for (int64_t d : got) src->add_shape(d);
  src->set_classes(split.train.classes);
  return absl::OkStatus();
}

}  // namespace sources
}  // namespace localpar
