// job.proto's Data and the data-source registry agree: every field of Data's `source` oneof
// is a registered source and every source has its field; the job's data figures come from
// its source.
#include "common/job/data_source.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "google/protobuf/text_format.h"

namespace localpar {
namespace {

TEST(DataSources, EveryDataFieldIsARegisteredSourceAndEverySourceHasItsField) {
  const google::protobuf::OneofDescriptor* oneof =
      v1::Data::descriptor()->FindOneofByName("source");
  ASSERT_NE(oneof, nullptr);
  std::set<std::string> fields;
  for (int i = 0; i < oneof->field_count(); ++i) {
    fields.insert(oneof->field(i)->name());
    EXPECT_NE(FindDataSource(oneof->field(i)->name()), nullptr)
        << oneof->field(i)->name() << " has no source in common/job/sources/registry.cc";
  }
  std::set<std::string> names;
  for (const DataSource* s : AllDataSources()) {
    EXPECT_TRUE(names.insert(s->name()).second) << s->name() << " is registered twice";
    EXPECT_TRUE(fields.count(s->name())) << s->name() << " has no field in job.proto's Data";
  }
}

TEST(DataSources, TheJobsFiguresComeFromItsSource) {
  v1::Data d;
  EXPECT_STREQ(DataSourceOf(d).name(), "fashion_mnist") << "no source set: the default";
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "tokens { train_paths: \"a.bin\" seq_len: 32 vocab: 50 windows: NON_OVERLAPPING }", &d));
  const DataSource& s = DataSourceOf(d);
  EXPECT_STREQ(s.name(), "tokens");
  EXPECT_EQ(s.InputShape(d), Shape({32}));
  EXPECT_EQ(s.Classes(d), 50);
  EXPECT_EQ(s.LabelsPerExample(d), 32);
  EXPECT_TRUE(s.OwnValidation());
  EXPECT_TRUE(s.ShufflesExamples(d));
  EXPECT_FALSE(s.ByteTokens());
  std::vector<std::string> fields;
  s.Paths(&d, [&](const std::string& field, std::string* path) {
    fields.push_back(field + "=" + *path);
    *path = "/abs/" + *path;
  });
  EXPECT_EQ(fields, std::vector<std::string>({"data.tokens.train_paths[0]=a.bin"}));
  EXPECT_EQ(d.tokens().train_paths(0), "/abs/a.bin") << "paths are resolved in place";
  // Only sources with a list of files to train on take --data_path.
  EXPECT_TRUE(s.SetTrainPaths({"x.bin", "y.bin"}, &d).ok());
  EXPECT_EQ(d.tokens().train_paths_size(), 2);
  v1::Data synthetic;
  synthetic.mutable_synthetic();
  absl::Status no = DataSourceOf(synthetic).SetTrainPaths({"x"}, &synthetic);
  EXPECT_NE(no.message().find("data.synthetic"), std::string::npos) << no;
  // A source's own checks name its fields.
  v1::Data bad;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString("numpy { x_train: \"x.npy\" }", &bad));
  EXPECT_EQ(DataSourceOf(bad).Validate(bad).message(),
            "data.numpy: set npz, or x_train and y_train");
}

}  // namespace
}  // namespace localpar
