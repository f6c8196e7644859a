// Job files: the shipped examples parse; every kind of mistake is refused with a message
// that points at the line and column, or the field and the reason.
#include "common/job/job.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace localpar {
namespace {

const char kValid[] = R"(
name: "t"
rule: GREEDY
data { synthetic { shape: [8] classes: 3 } }
stages { layers { linear { out_features: 16 } } layers { relu {} } }
stages { layers { linear { in_features: 16 out_features: 4 } } }
)";

std::string Error(const std::string& text) {
  absl::StatusOr<v1::Job> j = ParseJob(text, "job.textproto");
  EXPECT_FALSE(j.ok()) << "accepted:\n" << text;
  return j.ok() ? "" : std::string(j.status().message());
}

TEST(JobFiles, EveryShippedExampleIsValid) {
  int found = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(LOCALPAR_SOURCE_DIR) + "/deploy/jobs")) {
    if (e.path().extension() != ".textproto") continue;
    ++found;
    absl::StatusOr<v1::Job> j = LoadJobFile(e.path().string());
    EXPECT_TRUE(j.ok()) << e.path() << ": " << j.status();
  }
  EXPECT_GE(found, 3);
}

TEST(JobFiles, DefaultsAreFilledIn) {
  absl::StatusOr<v1::Job> j = ParseJob(kValid, "t");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->batch_size(), 128);
  EXPECT_EQ(j->epochs(), 1);
  EXPECT_TRUE(j->optimizer().has_adamw());
  EXPECT_FLOAT_EQ(j->optimizer().adamw().beta2(), 0.999f);
  EXPECT_FLOAT_EQ(j->schedule().lr(), 1e-3f);
  ModelConfig m = ToModelConfig(*j);
  EXPECT_EQ(m.input_shape, (Shape{8}));
  EXPECT_EQ(m.classes, 3);
}

TEST(JobFiles, SyntaxErrorsNameFileLineAndColumn) {
  std::string e =
      Error("name: \"x\"\nrule: GREEDY\nstages { layers { linear { out_features: } } }\n");
  EXPECT_NE(e.find("job.textproto:3:"), std::string::npos) << e;
  e = Error("rule: GREEDY\nbatch_sise: 3\n");
  EXPECT_NE(e.find("job.textproto:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("batch_sise"), std::string::npos) << e;
  // Protobuf places an unknown enum value's error at the token after it.
  e = Error("rule: SIDEWAYS\n");
  EXPECT_NE(e.find("job.textproto:"), std::string::npos) << e;
  EXPECT_NE(e.find("\"SIDEWAYS\" for field \"rule\""), std::string::npos) << e;
}

TEST(JobFiles, FieldErrorsNameTheFieldAndWhy) {
  struct Case {
    std::string text, expect;
  };
  std::string stages = "stages { layers { linear { out_features: 4 } } }\n";
  std::vector<Case> cases = {
      {"batch_size: 4\n" + stages, "rule: required"},
      {"rule: GREEDY batch_size: -1\n" + stages, "batch_size: must be > 0"},
      {"rule: GREEDY micro_batches: 4\n" + stages, "micro_batches: only BACKPROP"},
      {"rule: BACKPROP batch_size: 2 micro_batches: 4\n" + stages, "exceeds batch_size"},
      {"rule: GREEDY\n", "stages: a job needs at least one stage"},
      {"rule: GREEDY stages { layers { } }\n", "stages[0].layers[0]: no layer kind"},
      {"rule: GREEDY stages { layers { linear { } } }\n",
       "stages[0].layers[0].linear.out_features: must be > 0"},
      {"rule: GREEDY stages { layers { dropout { rate: 1.5 } } }\n", "dropout.rate"},
      {"rule: GREEDY schedule { lr: -1 }\n" + stages, "schedule.lr"},
      {"rule: GREEDY optimizer { sgd { momentum: 1 } }\n" + stages, "optimizer.sgd.momentum"},
      {"rule: GREEDY data { synthetic { classes: 1 } }\n" + stages, "data.synthetic.classes"},
  };
  for (const Case& c : cases) {
    std::string e = Error(c.text);
    EXPECT_NE(e.find(c.expect), std::string::npos) << "for:\n" << c.text << "got: " << e;
    EXPECT_NE(e.find("job.textproto"), std::string::npos) << e;
  }
}

TEST(JobFiles, ShapeMismatchesNameTheStageLayerAndShapes) {
  std::string e = Error(R"(
rule: GREEDY
stages { name: "a" layers { linear { out_features: 1024 } } }
stages { name: "b" layers { linear { in_features: 512 out_features: 10 } } }
)");
  EXPECT_NE(e.find("stages[1] (b).layers[0]"), std::string::npos) << e;
  EXPECT_NE(e.find("in_features 512"), std::string::npos) << e;
  EXPECT_NE(e.find("[1024]"), std::string::npos) << e;

  e = Error(R"(
rule: GREEDY
stages { layers { linear { out_features: 64 } } }
stages { layers { conv2d { out_channels: 8 } } }
)");
  EXPECT_NE(e.find("stages[1].layers[0] conv2d"), std::string::npos) << e;
  EXPECT_NE(e.find("[64]"), std::string::npos) << e;

  e = Error(R"(
rule: GREEDY
stages { layers { flatten {} } head { kind: CONV_POOL_LINEAR } }
)");
  EXPECT_NE(e.find("stages[0].head"), std::string::npos) << e;
}

TEST(JobFiles, MissingFileIsNotFound) {
  absl::StatusOr<v1::Job> j = LoadJobFile("/nonexistent/job.textproto");
  ASSERT_FALSE(j.ok());
  EXPECT_TRUE(absl::IsNotFound(j.status()));
  EXPECT_NE(j.status().message().find("/nonexistent/job.textproto"), std::string::npos);
}

}  // namespace
}  // namespace localpar
