// Choosing tokens from logits, and reading vocabularies (nanoGPT's pickled meta.pkl and plain
// files) for `localpar sample`.
#include "common/model_io/sample.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "common/data/vocabulary.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

TEST(ChooseToken, TemperatureZeroAndTopOneTakeTheLikeliest) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f};
  EXPECT_EQ(ChooseToken(logits, 0.0, 0, 0.99), 1);
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(ChooseToken(logits, 1.0, 1, u), 1);
}

TEST(ChooseToken, DrawsFollowTheTemperedSoftmaxOverTheTopK) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -3.0f, 1.5f};
  // softmax(logits / 2) over the top 3 (ids 2, 4, 1).
  std::map<int, double> want;
  double sum = 0;
  for (int id : {1, 2, 4}) sum += std::exp(logits[id] / 2.0);
  for (int id : {1, 2, 4}) want[id] = std::exp(logits[id] / 2.0) / sum;
  std::map<int, int> seen;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ++seen[ChooseToken(logits, 2.0, 3, (i + 0.5) / draws)];
  EXPECT_EQ(seen.size(), 3u);
  for (const auto& [id, p] : want) EXPECT_NEAR(seen[id] / double(draws), p, 1e-3) << id;
}

TEST(Vocabulary, ReadsNanoGptsPickledMetaWithoutRunningAnything) {
  testing::DataDir dir;
  const std::string pickled(
      "\x80\x04\x95\x5d\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x0a\x76\x6f\x63\x61\x62\x5f\x73"
      "\x69\x7a\x65\x94\x4b\x05\x8c\x04\x69\x74\x6f\x73\x94\x7d\x94\x28\x4b\x00\x8c\x01\x0a\x94\x4b"
      "\x01\x8c\x01\x20\x94\x4b\x02\x8c\x01\x41\x94\x4b\x03\x8c\x01\x62\x94\x4b\x04\x8c\x02\xc3\xa9"
      "\x94\x75\x8c\x04\x73\x74\x6f\x69\x94\x7d\x94\x28\x68\x04\x4b\x00\x68\x05\x4b\x01\x68\x06\x4b"
      "\x02\x68\x07\x4b\x03\x68\x08\x4b\x04\x75\x75\x2e",
      104);
  { std::ofstream(dir.file("meta.pkl"), std::ios::binary) << pickled; }
  absl::StatusOr<std::vector<std::string>> v = ReadVocabulary(dir.file("meta.pkl"));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, (std::vector<std::string>{"\n", " ", "A", "b", "\xc3\xa9"}));
  absl::StatusOr<std::vector<int32_t>> ids = EncodeText(*v, "Ab \xc3\xa9\n");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{2, 3, 1, 4, 0}));
  absl::StatusOr<std::vector<int32_t>> bad = EncodeText(*v, "AbZ");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("byte 2 (0x5a)"), std::string::npos) << bad.status();
  // A pickle that would call a function (GLOBAL os.system, REDUCE) is refused by opcode.
  {
    std::ofstream(dir.file("evil.pkl"), std::ios::binary) << std::string(
        "\x80\x02"
        "cos\nsystem\n"
        "X\x02\x00\x00\x00ls"
        "\x85R.",
        23);
  }
  absl::StatusOr<std::vector<std::string>> evil = ReadVocabulary(dir.file("evil.pkl"));
  ASSERT_FALSE(evil.ok());
  EXPECT_NE(evil.status().message().find("opcode 0x63"), std::string::npos) << evil.status();
  // Cut short.
  { std::ofstream(dir.file("cut.pkl"), std::ios::binary) << pickled.substr(0, 60); }
  EXPECT_FALSE(ReadVocabulary(dir.file("cut.pkl")).ok());
}

TEST(Vocabulary, PlainFilesHaveATokenPerLineWithEscapes) {
  testing::DataDir dir;
  { std::ofstream(dir.file("vocab.txt"), std::ios::binary) << "\\n\nhe\nhello\n\\t\n"; }
  absl::StatusOr<std::vector<std::string>> v = ReadVocabulary(dir.file("vocab.txt"));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, (std::vector<std::string>{"\n", "he", "hello", "\t"}));
  // The longest match wins: "hello" is one token, "he" another.
  EXPECT_EQ(*EncodeText(*v, "hellohe\n"), (std::vector<int32_t>{2, 1, 0}));
  { std::ofstream(dir.file("bad.txt"), std::ios::binary) << "a\n\\q\n"; }
  absl::StatusOr<std::vector<std::string>> bad = ReadVocabulary(dir.file("bad.txt"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status();
  EXPECT_FALSE(ReadVocabulary(dir.file("missing.txt")).ok());
}

}  // namespace
}  // namespace localpar
