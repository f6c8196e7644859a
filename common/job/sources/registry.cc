// Every data source, one line each: the function its file in this folder defines. Adding a
// source is its file plus a line here, and its field in job.proto's Data `source` oneof
// (docs/architecture.md, "Adding a data source").
#include <algorithm>

#include "common/job/sources/sources.h"

namespace localpar {

#define LOCALPAR_DATA_SOURCES(X) \
  X(FashionMnistDataSource)      \
  X(SyntheticDataSource)         \
  X(Cifar10DataSource)           \
  X(TextDataSource)              \
  X(NumpyDataSource)             \
  X(ImageFolderDataSource)       \
  X(TokensDataSource)

#define LOCALPAR_DECLARE_SOURCE(f) const DataSource& f();
LOCALPAR_DATA_SOURCES(LOCALPAR_DECLARE_SOURCE)
#undef LOCALPAR_DECLARE_SOURCE

const std::vector<const DataSource*>& AllDataSources() {
#define LOCALPAR_LIST_SOURCE(f) &f(),
  static const std::vector<const DataSource*> sources = {
      LOCALPAR_DATA_SOURCES(LOCALPAR_LIST_SOURCE)};
#undef LOCALPAR_LIST_SOURCE
  return sources;
}

const DataSource* FindDataSource(const std::string& name) {
  const std::vector<const DataSource*>& all = AllDataSources();
  auto it =
      std::find_if(all.begin(), all.end(), [&](const DataSource* s) { return s->name() == name; });
  return it == all.end() ? nullptr : *it;
}

const DataSource& DataSourceOf(const v1::Data& data) {
  const google::protobuf::FieldDescriptor* set = data.GetReflection()->GetOneofFieldDescriptor(
      data, v1::Data::descriptor()->FindOneofByName("source"));
  const DataSource* source = set == nullptr ? nullptr : FindDataSource(set->name());
  return source != nullptr ? *source : FashionMnistDataSource();
}

absl::Status DataSource::SetTrainPaths(const std::vector<std::string>&, v1::Data*) const {
  return absl::InvalidArgumentError(
      absl::StrCat("--data_path: the job's data (data.", name(),
                   ") takes no list of files to train on (data.text and data.tokens do)"));
}

namespace sources {

absl::Status CheckPathList(const std::string& field,
                           const google::protobuf::RepeatedPtrField<std::string>& paths) {
  for (int i = 0; i < paths.size(); ++i) {
    if (paths[i].empty()) return Invalid(absl::StrCat(field, "[", i, "]"), "is empty");
  }
  return absl::OkStatus();
}

void VisitPathList(const std::string& field, google::protobuf::RepeatedPtrField<std::string>* paths,
                   const std::function<void(const std::string&, std::string*)>& visit) {
  for (int i = 0; i < paths->size(); ++i)
    visit(absl::StrCat(field, "[", i, "]"), paths->Mutable(i));
}

}  // namespace sources
}  // namespace localpar
