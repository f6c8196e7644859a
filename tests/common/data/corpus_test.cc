// The CIFAR-10 binary reader on generated files (nothing is downloaded), the byte-level
// text corpus (windows, next-byte labels, held-out split, refusals), the unigram baseline,
// and batches with per-position labels.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/data/dataset.h"
#include "common/run/reference_run.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::DataDir;

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// One CIFAR record: label, then red, green, blue planes; pixel (i) of plane c is
// (label * 7 + c * 3 + i) mod 256.
std::string CifarRecord(uint8_t label) {
  std::string r(1 + 3 * 1024, '\0');
  r[0] = static_cast<char>(label);
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 1024; ++i)
      r[1 + c * 1024 + i] = static_cast<char>((label * 7 + c * 3 + i) % 256);
  }
  return r;
}

void WriteCifar(const DataDir& dir, int per_file) {
  for (int f = 1; f <= 5; ++f) {
    std::string data;
    for (int r = 0; r < per_file; ++r) data += CifarRecord(static_cast<uint8_t>((f + r) % 10));
    WriteBytes(dir.file("data_batch_" + std::to_string(f) + ".bin"), data);
  }
  WriteBytes(dir.file("test_batch.bin"), CifarRecord(3) + CifarRecord(9));
}

TEST(Cifar10, ReadsRecordsAsInterleavedNhwcScaledToOne) {
  DataDir dir;
  WriteCifar(dir, 2);
  absl::StatusOr<DataSplit> s = LoadCifar10(dir.path_string());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size(), 10);
  EXPECT_EQ(s->test.size(), 2);
  EXPECT_EQ(s->train.example_shape, (Shape{32, 32, 3}));
  EXPECT_EQ(s->train.y[0], 1);  // file 1, record 0
  EXPECT_EQ(s->test.y[1], 9);
  // Test record 0 (label 3): pixel i=5, channel c sits at x[5 * 3 + c].
  for (int c = 0; c < 3; ++c) {
    EXPECT_FLOAT_EQ(s->test.x[5 * 3 + c], ((3 * 7 + c * 3 + 5) % 256) / 255.0f) << c;
  }
  absl::StatusOr<DataSplit> limited = LoadCifar10(dir.path_string(), 3, 1);
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ(limited->train.size(), 3);
  EXPECT_EQ(limited->test.size(), 1);
}

TEST(Cifar10, RefusesMissingTruncatedAndMislabelledFilesNamingThem) {
  DataDir dir;
  WriteCifar(dir, 1);
  std::filesystem::remove(dir.file("data_batch_4.bin"));
  absl::StatusOr<DataSplit> s = LoadCifar10(dir.path_string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("data_batch_4.bin"), std::string::npos) << s.status();

  WriteCifar(dir, 1);
  WriteBytes(dir.file("data_batch_2.bin"), CifarRecord(1).substr(0, 3000));
  s = LoadCifar10(dir.path_string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("data_batch_2.bin"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("truncated"), std::string::npos) << s.status();

  WriteCifar(dir, 1);
  std::string bad = CifarRecord(1);
  bad[0] = 12;
  WriteBytes(dir.file("test_batch.bin"), bad);
  s = LoadCifar10(dir.path_string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("test_batch.bin: record 0 has label 12"), std::string::npos)
      << s.status();
}

TEST(TextCorpus, WindowsPredictTheNextByteAndBlocksAlternateBetweenSplits) {
  DataDir dir;
  // 2 files, read in name order; index files (.dat) and symbolic links are skipped.
  std::string a, b;
  for (int i = 0; i < 700; ++i) a += static_cast<char>('a' + i % 26);
  for (int i = 0; i < 700; ++i) b += static_cast<char>('A' + i % 26);
  WriteBytes(dir.file("a"), a);
  WriteBytes(dir.file("b"), b);
  WriteBytes(dir.file("a.dat"), std::string(100, '\x01'));
  std::filesystem::create_symlink(dir.file("a"), dir.file("a.u8"));
  TextCorpusOptions o;
  o.paths = {dir.path_string()};
  o.seq_len = 4;
  o.holdout_fraction = 0.25f;  // one block of 16 windows in every 4
  o.interleaved = true;
  absl::StatusOr<DataSplit> s = LoadTextCorpus(o);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string text = a + b;
  const int64_t windows = (1400 - 1) / 4;  // 349
  EXPECT_EQ(s->train.size() + s->test.size(), windows);
  EXPECT_EQ(s->test.size(), 16 * 5);  // blocks 3, 7, 11, 15 and 19 of 0..21
  EXPECT_EQ(s->train.example_shape, (Shape{4}));
  EXPECT_EQ(s->train.label_size, 4);
  EXPECT_EQ(s->train.classes, 256);
  // Train window 0 is bytes 0..3; its labels are bytes 1..4. The first held-out window is
  // window 48 (block 3).
  BatchAssembler first_train(s->train, 1), first_test(s->test, 1);
  ASSERT_TRUE(first_train.Gather({}, 0, 1).ok());
  ASSERT_TRUE(first_test.Gather({}, 0, 1).ok());
  EXPECT_EQ(first_train.x_dtype(), DType::kI32);  // token ids travel as integers
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(first_train.ids()[i], static_cast<uint8_t>(text[i]));
    EXPECT_EQ(first_train.y()[i], static_cast<uint8_t>(text[i + 1]));
    EXPECT_EQ(first_test.ids()[i], static_cast<uint8_t>(text[48 * 4 + i]));
    EXPECT_EQ(first_test.y()[i], static_cast<uint8_t>(text[48 * 4 + i + 1]));
  }
  // A batch carries seq_len labels per example, in the examples' order.
  BatchAssembler batch(s->train, 3);
  std::vector<int64_t> order = {2, 0, 1};
  ASSERT_TRUE(batch.Gather(order, 0, 3).ok());
  EXPECT_EQ(batch.y_shape(), (Shape{3, 4}));
  EXPECT_EQ(batch.y_bytes(), 3u * 4 * 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(batch.y()[i], static_cast<uint8_t>(text[2 * 4 + i + 1]));
}

TEST(TextCorpus, MissingEmptyOrTooSmallCorporaAreClearErrors) {
  DataDir dir;
  TextCorpusOptions o;
  o.paths = {dir.file("nope")};
  absl::StatusOr<DataSplit> s = LoadTextCorpus(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find(dir.file("nope")), std::string::npos) << s.status();

  o.paths = {std::string(kDefaultTextCorpusDir) + "-missing"};
  s = LoadTextCorpus(o);
  ASSERT_FALSE(s.ok());

  std::filesystem::create_directories(dir.file("empty"));
  WriteBytes(dir.file("empty/zero"), "");
  o.paths = {dir.file("empty")};
  s = LoadTextCorpus(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("is empty"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find(dir.file("empty")), std::string::npos) << s.status();

  WriteBytes(dir.file("tiny"), "hello, world");
  o.paths = {dir.file("tiny")};
  o.interleaved = true;
  s = LoadTextCorpus(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("too few"), std::string::npos) << s.status();
  o.interleaved = false;  // the tail of 12 bytes is too short for a window of 64
  s = LoadTextCorpus(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no training window"), std::string::npos) << s.status();
}

TEST(TextCorpus, TheDefaultSplitHoldsOutTheTailAndValidationFilesReplaceIt) {
  DataDir dir;
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>('a' + (i * 7) % 26);
  WriteBytes(dir.file("t"), text);
  TextCorpusOptions o;
  o.paths = {dir.file("t")};
  o.seq_len = 8;
  o.holdout_fraction = 0.1f;
  absl::StatusOr<DataSplit> s = LoadTextCorpus(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size(), (900 - 1) / 8);  // consecutive windows of the first 900 bytes
  EXPECT_EQ(s->test.size(), (100 - 1) / 8);   // and of the last 100
  BatchAssembler held(s->test, 2);
  ASSERT_TRUE(held.Gather({}, 1, 1).ok());  // the second held-out window starts at byte 908
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(held.ids()[i], static_cast<uint8_t>(text[908 + i]));
    EXPECT_EQ(held.y()[i], static_cast<uint8_t>(text[909 + i]));
  }
  // Random training windows: a pure function of (seed, epoch, index), within the first 900
  // bytes, different in another epoch.
  o.random_windows = true;
  o.seed = 5;
  s = LoadTextCorpus(o);
  ASSERT_TRUE(s.ok()) << s.status();
  std::set<int64_t> starts, next_epoch;
  for (int64_t i = 0; i < s->train.size(); ++i) {
    const int64_t at = s->train.windows->Start(0, i);
    EXPECT_GE(at, 0);
    EXPECT_LE(at + 8 + 1, 900);
    EXPECT_EQ(at, s->train.windows->Start(0, i));
    starts.insert(at);
    next_epoch.insert(s->train.windows->Start(1, i));
  }
  EXPECT_GT(starts.size(), 50u);
  EXPECT_NE(starts, next_epoch);
  WriteBytes(dir.file("v"), text.substr(0, 300));
  o.validation_paths = {dir.file("v")};
  s = LoadTextCorpus(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->test.size(), (300 - 1) / 8);
}

TEST(TextCorpus, UnigramBaselineIsTheCrossEntropyOfSmoothedTrainingCounts) {
  DataSplit s;
  s.train.classes = s.test.classes = 4;
  s.train.y = {0, 0, 0, 1};  // counts + 1: 4, 2, 1, 1 of 8
  s.test.y = {0, 1};
  double want = -(std::log2(4.0 / 8) + std::log2(2.0 / 8)) / 2;  // 1.5 bits
  EXPECT_NEAR(UnigramBitsPerLabel(s), want, 1e-12);
}

TEST(TextCorpus, TheDebianFortunesCorpusLoadsWhenInstalled) {
  if (!std::filesystem::exists(kDefaultTextCorpusDir)) GTEST_SKIP() << "fortunes not installed";
  TextCorpusOptions o;
  o.paths = {kDefaultTextCorpusDir};
  absl::StatusOr<DataSplit> s = LoadTextCorpus(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(s->train.size(), 10000);
  double ratio = static_cast<double>(s->test.size()) / (s->train.size() + s->test.size());
  EXPECT_NEAR(ratio, 0.1, 0.01);  // the tail tenth
  // English text: far below 8 bits per byte even without context, far above 0.
  double bits = UnigramBitsPerLabel(*s);
  EXPECT_GT(bits, 3.5);
  EXPECT_LT(bits, 6.0);
}

}  // namespace
}  // namespace localpar
