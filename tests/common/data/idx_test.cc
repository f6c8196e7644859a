// IDX reading (gzip and plain), its refusals of bad files, IDX data sets of any image shape
// and class count, the real Fashion-MNIST files,
// synthetic data, standardisation and epoch shuffling.
#include "common/data/idx.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "common/data/dataset.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::DataDir;

std::vector<uint8_t> IdxBytes(std::vector<uint32_t> dims, const std::vector<uint8_t>& payload,
                              uint8_t type = 0x08) {
  std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
  }
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

void WritePlain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void WriteGz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
  gzclose(f);
}

TEST(Idx, ReadsGzipAndPlainFilesAlike) {
  DataDir dir;
  std::vector<uint8_t> payload = {1, 2, 3, 4, 5, 6};
  auto bytes = IdxBytes({2, 3}, payload);
  WritePlain(dir.file("a.idx"), bytes);
  WriteGz(dir.file("a.idx.gz"), bytes);
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    absl::StatusOr<IdxArray> a = ReadIdxFile(dir.file(name));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->dims, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a->data, payload);
  }
}

struct BadFile {
  std::string name;
  std::vector<uint8_t> bytes;
  std::string expect;
};

TEST(Idx, RefusesBadFilesNamingTheFileAndTheProblem) {
  DataDir dir;
  std::vector<BadFile> cases = {
      {"truncated.gz", IdxBytes({10, 10}, std::vector<uint8_t>(50)), "truncated"},
      {"magic.gz", {0x1f, 0x00, 0x08, 0x01, 0, 0, 0, 1, 7}, "bad magic"},
      {"type.gz", IdxBytes({4}, {1, 2, 3, 4}, 0x0d), "not supported"},
      {"trailing.gz", IdxBytes({2}, {1, 2, 3}), "unexpected bytes"},
      {"header.gz", {0, 0, 8, 3, 0, 0}, "truncated header"},
      {"huge.gz", IdxBytes({0x7fffffff, 0x7fffffff}, {}), "more than"},
      {"zero.gz", IdxBytes({3, 0}, {}), "dimension 1 is 0"},
  };
  for (const BadFile& c : cases) {
    WriteGz(dir.file(c.name), c.bytes);
    absl::StatusOr<IdxArray> a = ReadIdxFile(dir.file(c.name));
    ASSERT_FALSE(a.ok()) << c.name;
    std::string msg(a.status().message());
    EXPECT_NE(msg.find(dir.file(c.name)), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
  }
  absl::StatusOr<IdxArray> missing = ReadIdxFile(dir.file("nope.gz"));
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
}

// A directory of the user's own names the files looked for; the Debian package is named
// only for the default directory.
TEST(FashionMnist, AMissingDirectoryNamesTheFilesLookedFor) {
  absl::StatusOr<DataSplit> d = LoadFashionMnist("/nonexistent/fashion");
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::IsNotFound(d.status()));
  EXPECT_NE(d.status().message().find("/nonexistent/fashion/train-images-idx3-ubyte.gz (or "
                                      "/nonexistent/fashion/train-images-idx3-ubyte)"),
            std::string::npos)
      << d.status();
  EXPECT_EQ(d.status().message().find("dataset-fashion-mnist"), std::string::npos);
}

// Writes a split of `n` examples of `dims` (after the count) with labels i % classes.
void WriteSplit(const DataDir& dir, const std::string& prefix, uint32_t n,
                std::vector<uint32_t> dims, int classes, bool gz) {
  uint32_t per = 1;
  for (uint32_t d : dims) per *= d;
  std::vector<uint8_t> pixels(n * per), labels(n);
  for (uint32_t i = 0; i < n * per; ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  for (uint32_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % classes);
  dims.insert(dims.begin(), n);
  auto write = gz ? WriteGz : WritePlain;
  const std::string ext = gz ? ".gz" : "";
  write(dir.file(prefix + "-images-idx3-ubyte" + ext), IdxBytes(dims, pixels));
  write(dir.file(prefix + "-labels-idx1-ubyte" + ext), IdxBytes({n}, labels));
}

TEST(FashionMnist, AnyImageShapeAndClassCountGzippedOrPlain) {
  DataDir dir;
  WriteSplit(dir, "train", 30, {12, 12}, 3, /*gz=*/true);
  WriteSplit(dir, "t10k", 9, {12, 12}, 3, /*gz=*/false);
  absl::StatusOr<DataSplit> d = LoadFashionMnist(dir.path_string());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.example_shape, (Shape{12, 12, 1}));
  EXPECT_EQ(d->test.example_shape, (Shape{12, 12, 1}));
  EXPECT_EQ(d->train.classes, 3);
  EXPECT_EQ(d->test.classes, 3);
  EXPECT_EQ(d->train.size(), 30);
  EXPECT_FLOAT_EQ(d->train.x[1], 7.0f / 255.0f);
  absl::StatusOr<IdxDataShape> header = ReadFashionMnistShape(dir.path_string());
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->example_shape, (Shape{12, 12, 1}));
  EXPECT_EQ(header->classes, 3);

  DataDir colour;  // [count, rows, cols, channels]
  WriteSplit(colour, "train", 8, {4, 4, 3}, 5, true);
  WriteSplit(colour, "t10k", 5, {4, 4, 3}, 5, true);
  absl::StatusOr<DataSplit> c = LoadFashionMnist(colour.path_string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.example_shape, (Shape{4, 4, 3}));
  EXPECT_EQ(c->train.classes, 5);
}

TEST(FashionMnist, SplitsOfDifferentShapesAreRefusedNamingTheFile) {
  DataDir dir;
  WriteSplit(dir, "train", 4, {12, 12}, 2, true);
  WriteSplit(dir, "t10k", 4, {10, 10}, 2, true);
  absl::StatusOr<DataSplit> d = LoadFashionMnist(dir.path_string());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(dir.file("t10k-images-idx3-ubyte.gz") +
                                      ": examples of shape [10,10]"),
            std::string::npos)
      << d.status();
}

TEST(FashionMnist, LabelCountMismatchIsRefused) {
  DataDir dir;
  WriteGz(dir.file("train-images-idx3-ubyte.gz"), IdxBytes({3, 2, 2}, std::vector<uint8_t>(12)));
  WriteGz(dir.file("train-labels-idx1-ubyte.gz"), IdxBytes({2}, {1, 2}));
  absl::StatusOr<DataSplit> d = LoadFashionMnist(dir.path_string());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("3 images but"), std::string::npos) << d.status();
}

TEST(FashionMnist, DebianFilesHaveTheKnownShapeAndBalancedClasses) {
  absl::StatusOr<DataSplit> d = LoadFashionMnist(kDefaultFashionMnistDir);
  ASSERT_TRUE(d.ok()) << d.status() << " (deploy/install-deps.sh installs the data set)";
  EXPECT_EQ(d->train.size(), 60000);
  EXPECT_EQ(d->test.size(), 10000);
  EXPECT_EQ(d->train.example_shape, (Shape{28, 28, 1}));
  EXPECT_EQ(d->train.classes, 10);
  absl::StatusOr<IdxDataShape> header = ReadFashionMnistShape(kDefaultFashionMnistDir);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->example_shape, (Shape{28, 28, 1}));
  EXPECT_EQ(header->classes, 10);
  std::map<int32_t, int> counts;
  for (int32_t y : d->test.y) ++counts[y];
  ASSERT_EQ(counts.size(), 10u);
  for (auto [label, n] : counts) EXPECT_EQ(n, 1000) << "class " << label;
  for (float v : d->train.x) ASSERT_TRUE(v >= 0.0f && v <= 1.0f);
}

TEST(Datasets, SyntheticIsDeterministicAndStandardizeUsesTrainStatistics) {
  SyntheticOptions o;
  o.shape = {5};
  o.classes = 3;
  o.seed = 9;
  DataSplit a = MakeSynthetic(o), b = MakeSynthetic(o);
  EXPECT_EQ(a.train.x, b.train.x);
  EXPECT_EQ(a.test.y, b.test.y);
  Standardize(a);
  double sum = 0, sq = 0;
  for (float v : a.train.x) sum += v, sq += static_cast<double>(v) * v;
  double n = static_cast<double>(a.train.x.size());
  EXPECT_NEAR(sum / n, 0.0, 1e-4);
  EXPECT_NEAR(sq / n, 1.0, 1e-3);
}

TEST(Datasets, EpochOrderIsAPermutationThatChangesPerEpochAndRepeatsPerSeed) {
  std::vector<int64_t> e0 = EpochOrder(1000, 5, 0), e1 = EpochOrder(1000, 5, 1);
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 1000u);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, EpochOrder(1000, 5, 0));
  EXPECT_NE(e0, EpochOrder(1000, 6, 0));
}

}  // namespace
}  // namespace localpar
