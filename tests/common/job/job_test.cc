// Job files: the shipped examples parse; every kind of mistake is refused with a message
// that points at the line and column, or the field and the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/data/dataset.h"
#include "common/job/data_spec.h"
#include "common/job/parse.h"
#include "common/job/spec.h"
#include "common/job/suggest.h"
#include "common/job/validate.h"
#include "common/nn/rule.h"
#include "common/plan/plan.h"
#include "common/run/batch_plan.h"
#include "common/run/metrics_log.h"
#include "common/run/progress.h"
#include "common/run/report.h"

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
      {"rule: GREEDY gemm_precision: 7\n" + stages, "gemm_precision: expected GEMM_F32"},
      {"rule: GREEDY wire: 9\n" + stages, "wire: expected WIRE_F32"},
      {"rule: GREEDY stages { layers { } }\n", "stages[0].layers[0]: no layer kind"},
      {"rule: GREEDY stages { layers { linear { } } }\n",
       "stages[0].layers[0].linear.out_features: must be > 0"},
      {"rule: GREEDY stages { layers { dropout { rate: 1.5 } } }\n", "dropout.rate"},
      {"rule: GREEDY schedule { lr: -1 }\n" + stages, "schedule.lr"},
      {"rule: GREEDY optimizer { sgd { momentum: 1 } }\n" + stages, "optimizer.sgd.momentum"},
      {"rule: GREEDY data { synthetic { classes: 1 } }\n" + stages, "data.synthetic.classes"},
      {"rule: GREEDY data { text { seq_len: -3 } }\n" + stages, "data.text.seq_len"},
      {"rule: GREEDY data { text { holdout_fraction: 1.5 } }\n" + stages,
       "data.text.holdout_fraction"},
      {"rule: GREEDY data { cifar10 { } }\n" + stages, "data.cifar10.dir: required"},
      {"rule: GREEDY stages { layers { batch_norm { momentum: 2 } } }\n",
       "stages[0].layers[0].batch_norm.momentum"},
      {"rule: GREEDY data { text {} } stages { layers { embedding { vocab: 256 dim: 6 } } "
       "layers { causal_self_attention { heads: 4 } } }\n",
       "heads (4) must divide dim 6"},
      {"rule: GREEDY stages { layers { conv2d { out_channels: 4 } } "
       "head { kind: LANGUAGE_MODEL } }\n",
       "language_model needs a sequence-shaped stage output"},
      // Token ids travel as integers: an embedding reads them, and nothing else does.
      {"rule: GREEDY data { text {} } stages { layers { linear { out_features: 4 } } }\n",
       "stages[0].layers[0]: data.text gives token ids, which only an embedding reads"},
      {"rule: GREEDY stages { layers { embedding { vocab: 10 dim: 4 } } }\n",
       "stages[0].layers[0]: an embedding reads token ids, which data.fashion_mnist does not "
       "give (data.text and data.tokens do)"},
      {"rule: GREEDY data { text {} } stages { layers { embedding { vocab: 256 dim: 8 } } } "
       "stages { layers { residual { body { embedding { vocab: 256 dim: 8 } } } } }\n",
       "stages[1].layers[0]: an embedding reads token ids, so it can only be the model's first"},
      {"rule: GREEDY data { text {} } stages { layers { embedding { vocab: 100 dim: 8 } } }\n",
       "stages[0].layers[0].embedding.vocab: 100 rows, but data.text has 256 token ids"},
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
  EXPECT_NE(e.find("the output of stages[0] (a)"), std::string::npos) << e;

  // A declared input shape is checked against the previous stage's output.
  e = Error(R"(
rule: GREEDY
data { synthetic { shape: [8] } }
stages { name: "a" layers { linear { out_features: 32 } } }
stages { name: "b" input_shape: [4, 8] layers { linear { out_features: 10 } } }
)");
  EXPECT_NE(e.find("stages[1] (b).input_shape [4,8]"), std::string::npos) << e;
  EXPECT_NE(e.find("[32], the output of stages[0] (a)"), std::string::npos) << e;

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

TEST(JobFiles, ATransformerBlockExpandsToTwoPreNormResidualBlocks) {
  absl::StatusOr<v1::Job> j = ParseJob(R"(
rule: GREEDY
data { text { seq_len: 16 } }
stages {
  layers { embedding { vocab: 256 dim: 32 } }
  layers { positional_encoding {} }
  layers { transformer_block { heads: 4 } }
  head { kind: LANGUAGE_MODEL }
}
)",
                                       "t");
  ASSERT_TRUE(j.ok()) << j.status();
  ModelConfig m = ToModelConfig(*j);
  EXPECT_EQ(m.input_shape, (Shape{16}));
  EXPECT_EQ(m.classes, 256);
  EXPECT_EQ(JobLabelsPerExample(*j), 16);
  const std::vector<LayerConfig>& layers = m.stages[0].layers;
  ASSERT_EQ(layers.size(), 4u);
  ASSERT_EQ(layers[2].kind, "residual");
  ASSERT_EQ(layers[2].body.size(), 2u);
  EXPECT_EQ(layers[2].body[1].kind, "causal_self_attention");
  EXPECT_EQ(layers[2].body[1].Int("heads"), 4);
  ASSERT_EQ(layers[3].body.size(), 4u);
  EXPECT_EQ(layers[3].body[0].kind, "layer_norm");
  EXPECT_EQ(layers[3].body[1].Int("out_features"), 4 * 32);  // default MLP width
  EXPECT_EQ(layers[3].body[3].Int("out_features"), 32);
  EXPECT_EQ(m.stages[0].head.kind, HeadConfig::Kind::kLanguageModel);
}

TEST(JobFiles, RegroupingMergesConsecutiveStagesAndKeepsTheLastHead) {
  absl::StatusOr<v1::Job> j = ParseJob(R"(
rule: CHUNKED
data { synthetic { shape: [8] } }
stages { name: "a" layers { linear { out_features: 8 } } head { kind: MLP hidden: 5 } }
stages { name: "b" layers { relu {} } }
stages { name: "c" layers { linear { out_features: 6 } } }
stages { name: "d" layers { gelu {} } head { kind: MLP hidden: 7 } }
)",
                                       "t");
  ASSERT_TRUE(j.ok()) << j.status();
  absl::StatusOr<v1::Job> three = RegroupStages(*j, 3);
  ASSERT_TRUE(three.ok()) << three.status();
  ASSERT_EQ(three->stages_size(), 3);
  EXPECT_EQ(three->stages(0).name(), "a+b");
  EXPECT_EQ(three->stages(0).layers_size(), 2);
  EXPECT_EQ(three->stages(0).head().kind(), v1::Head::LINEAR);  // b's head
  EXPECT_EQ(three->stages(2).name(), "d");
  EXPECT_EQ(three->stages(2).head().hidden(), 7);
  EXPECT_TRUE(ValidateJob(*three).ok());
  absl::StatusOr<v1::Job> one = RegroupStages(*j, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->stages(0).layers_size(), 4);
  // The same network: regrouping into 4 gives back the job.
  absl::StatusOr<v1::Job> same = RegroupStages(*j, 4);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->SerializeAsString(), j->SerializeAsString());
  absl::StatusOr<v1::Job> bad = RegroupStages(*j, 5);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("regroups into 1..4"), std::string::npos);
}

// Heads with layers of their own (a transformer block before a language-model head) and a
// learning rate per stage: parsed into the model's configuration, checked naming the field,
// and stages with different rates never merge into one.
TEST(JobFiles, HeadLayersAndStageLearningRates) {
  const std::string lm = R"(
rule: GREEDY
data { synthetic { shape: [8] classes: 5 } }
stages { layers { linear { out_features: 12 } } layers { relu {} } lr_scale: 2
         head { kind: MLP hidden: 6 layers { linear { out_features: 10 } } layers { gelu {} } } }
stages { layers { linear { out_features: 12 } } lr_scale: 2 }
stages { layers { relu {} } lr_scale: 0.5 }
)";
  absl::StatusOr<v1::Job> j = ParseJob(lm, "t");
  ASSERT_TRUE(j.ok()) << j.status();
  ModelConfig m = ToModelConfig(*j);
  ASSERT_EQ(m.stages.size(), 3u);
  ASSERT_EQ(m.stages[0].head.layers.size(), 2u);
  EXPECT_EQ(m.stages[0].lr_scale, 2.0f);
  EXPECT_EQ(m.stages[2].lr_scale, 0.5f);
  std::vector<LayerConfig> head;
  std::string e;
  ASSERT_TRUE(HeadLayers(m.stages[0].head, {12}, 5, &head, &e)) << e;
  ASSERT_EQ(head.size(), 5u);  // its two layers, then the MLP's linear, relu and linear
  EXPECT_EQ(head[0].kind, m.stages[0].head.layers[0].kind);
  std::string why;
  EXPECT_TRUE(ValidateModel(m, &why)) << why;
  // Into 2, stages 0 and 1 merge (they share a rate); into 1, stage 2's rate differs.
  absl::StatusOr<v1::Job> two = RegroupStages(*j, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->stages(0).lr_scale(), 2.0f);
  absl::StatusOr<v1::Job> one = RegroupStages(*j, 1);
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.status().message().find("stages[2].lr_scale (0.5) differs from stages[0]"),
            std::string::npos)
      << one.status();
  EXPECT_NE(Error(R"(rule: GREEDY data { synthetic { shape: [8] } }
stages { layers { relu {} } lr_scale: -1 })")
                .find("stages[0].lr_scale"),
            std::string::npos);
  EXPECT_NE(Error(R"(rule: GREEDY data { synthetic { shape: [8] } }
stages { layers { relu {} } head { layers { linear { out_features: -3 } } } })")
                .find("stages[0].head.layers[0]"),
            std::string::npos);
}

TEST(JobFiles, MissingFileIsNotFound) {
  absl::StatusOr<v1::Job> j = LoadJobFile("/nonexistent/job.textproto");
  ASSERT_FALSE(j.ok());
  EXPECT_TRUE(absl::IsNotFound(j.status()));
  EXPECT_NE(j.status().message().find("/nonexistent/job.textproto"), std::string::npos);
}

}  // namespace
}  // namespace localpar

namespace localpar {
namespace {

// Relative data paths are relative to the job file's folder, whatever the current
// directory; a missing file or folder of any source is a data error naming the field and
// the path as resolved.
TEST(JobFiles, EveryDataSourceResolvesAndChecksItsPathsNamingTheField) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "jobs-relative" / "sub";
  std::filesystem::remove_all(dir.parent_path());  // files a previous run left beside the job
  std::filesystem::create_directories(dir);
  const std::string job = (dir / "job.textproto").string();
  const std::vector<std::pair<std::string, std::string>> sources = {
      {"numpy { npz: \"blobs.npz\" }", "data.numpy.npz"},
      {"numpy { x_train: \"x.npy\" y_train: \"y.npy\" } holdout_fraction: 0.1",
       "data.numpy.x_train"},
      {"image_folder { train_dir: \"pics\" } holdout_fraction: 0.1", "data.image_folder.train_dir"},
      {"fashion_mnist { dir: \"idx\" }", "data.fashion_mnist.dir"},
      {"cifar10 { dir: \"cifar\" }", "data.cifar10.dir"},
      {"text { paths: \"corpus.txt\" seq_len: 8 }", "data.text.paths[0]"},
      {"tokens { train_paths: \"t.bin\" validation_paths: \"v.bin\" seq_len: 8 vocab: 9 }",
       "data.tokens.train_paths[0]"},
      {"tokens { train_paths: \"t.bin\" validation_paths: \"v.bin\" seq_len: 8 }",
       "data.tokens.train_paths[0]"},
  };
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path("/");  // not the job's folder
  for (const auto& [source, field] : sources) {
    std::ofstream(job) << "rule: GREEDY data { " << source
                       << " } stages { layers { linear { out_features: 4 } } }\n";
    absl::StatusOr<v1::Job> j = LoadJobFile(job);
    ASSERT_FALSE(j.ok()) << source;
    EXPECT_TRUE(IsDataError(j.status())) << j.status();
    const std::string m(j.status().message());
    EXPECT_EQ(m.rfind(field + ": " + dir.string() + "/", 0), 0u) << m;
    EXPECT_NE(m.find("no such file or folder"), std::string::npos) << m;
  }
  // Once the file is there, beside the job, it is found from anywhere.
  std::ofstream(dir / "corpus.txt") << std::string(4096, 'a');
  std::ofstream(job) << "rule: GREEDY data { text { paths: \"corpus.txt\" seq_len: 8 } } "
                        "stages { layers { embedding { vocab: 256 dim: 4 } } head { kind: "
                        "LANGUAGE_MODEL } }\n";
  absl::StatusOr<v1::Job> j = LoadJobFile(job);
  std::filesystem::current_path(cwd);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->data().text().paths(0), (dir / "corpus.txt").string());
}

TEST(JobFiles, EveryJobRuleIsARuleOfTheCoreUnderTheSameName) {
  const auto* e = v1::UpdateRule_descriptor();
  int rules = 0;
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() == v1::UPDATE_RULE_UNSPECIFIED) continue;
    const RuleSpec* r = FindRule(e->value(i)->name());
    ASSERT_NE(r, nullptr) << e->value(i)->name();
    EXPECT_EQ(ToUpdateRule(static_cast<v1::UpdateRule>(e->value(i)->number())), r->rule);
    ++rules;
  }
  EXPECT_EQ(rules, static_cast<int>(AllRules().size()));
}

TEST(JobFiles, LayerDefaultsAreFilledInOnePass) {
  absl::StatusOr<v1::Job> j = ParseJob(R"(rule: GREEDY
data { synthetic { shape: [6, 6, 2] } }
stages { layers { conv2d { out_channels: 2 } } layers { batch_norm {} } layers { max_pool {} }
         layers { residual { body { layer_norm {} } } } })",
                                       "t");
  ASSERT_TRUE(j.ok()) << j.status();
  const auto& l = j->stages(0).layers();
  EXPECT_EQ(l[0].conv2d().kernel(), 3);
  EXPECT_EQ(l[0].conv2d().stride(), 1);
  EXPECT_FLOAT_EQ(l[1].batch_norm().eps(), 1e-5f);
  EXPECT_FLOAT_EQ(l[1].batch_norm().momentum(), 0.1f);
  EXPECT_EQ(l[2].max_pool().kernel(), 2);
  EXPECT_EQ(l[2].max_pool().stride(), 2);
  EXPECT_FLOAT_EQ(l[3].residual().body(0).layer_norm().eps(), 1e-5f);
  // What the core builds is what the job file now says, with no second set of defaults.
  ModelConfig m = ToModelConfig(*j);
  EXPECT_EQ(m.stages[0].layers[0].Int("kernel"), 3);
  EXPECT_FLOAT_EQ(static_cast<float>(m.stages[0].layers[1].Number("eps")), 1e-5f);
  // A negative value is refused by the job check, naming the field.
  absl::StatusOr<v1::Job> bad =
      ParseJob("rule: GREEDY stages { layers { batch_norm { eps: -1 } } }", "bad.textproto");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("stages[0].layers[0].batch_norm.eps: must be a finite "
                                        "number > 0"),
            std::string::npos)
      << bad.status();
}

// The data's own shape and class count reach the job (and so every worker) when it is
// loaded; a value the job file sets is checked against the files.
TEST(JobFiles, AnIdxDataSetsShapeAndClassesComeFromItsFiles) {
  std::string path = ::testing::TempDir() + "/idx.textproto";
  std::ofstream(path) << "rule: GREEDY data { fashion_mnist {} }\n"
                         "stages { layers { linear { out_features: 4 } } }\n";
  absl::StatusOr<v1::Job> j = LoadJobWithOverrides(path, {});
  ASSERT_TRUE(j.ok()) << j.status() << " (deploy/install-deps.sh installs the data set)";
  EXPECT_EQ(JobInputShape(*j), (Shape{28, 28, 1}));
  EXPECT_EQ(JobClasses(*j), 10);
  EXPECT_EQ(j->data().fashion_mnist().classes(), 10);

  std::ofstream(path) << "rule: GREEDY data { fashion_mnist { classes: 5 } }\n"
                         "stages { layers { linear { out_features: 4 } } }\n";
  absl::StatusOr<v1::Job> wrong = LoadJobWithOverrides(path, {});
  ASSERT_FALSE(wrong.ok());
  EXPECT_TRUE(IsDataError(wrong.status()));
  EXPECT_EQ(wrong.status().message(),
            absl::StrCat("data.fashion_mnist.classes: 5, but the IDX files in ",
                         kDefaultFashionMnistDir, " have labels 0..9"));

  std::ofstream(path) << "rule: GREEDY data { fashion_mnist { dir: \"/nonexistent\" } }\n"
                         "stages { layers { linear { out_features: 4 } } }\n";
  absl::StatusOr<v1::Job> missing = LoadJobWithOverrides(path, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(IsDataError(missing.status())) << missing.status();
  EXPECT_FALSE(IsDataError(LoadJobWithOverrides("/nonexistent.textproto", {}).status()));
}

TEST(JobFiles, OverridesApplyBeforeTheJobIsChecked) {
  std::string path = ::testing::TempDir() + "/micro.textproto";
  std::ofstream(path) << "rule: GREEDY micro_batches: 2 data { synthetic { shape: [4] } }\n"
                         "stages { layers { linear { out_features: 4 } } }\n";
  v1::JobOverrides o;
  EXPECT_FALSE(LoadJobWithOverrides(path, o).ok()) << "GREEDY takes no micro-batches";
  o.set_rule("BACKPROP");
  absl::StatusOr<v1::Job> j = LoadJobWithOverrides(path, o);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->rule(), v1::BACKPROP);
  o.set_rule("SIDEWAYS");
  EXPECT_EQ(LoadJobWithOverrides(path, o).status().message(),
            "--rule=SIDEWAYS: expected BACKPROP, GREEDY, CHUNKED or OVERLAP");
  o.clear_rule();
  o.set_seed(0);
  o.set_epochs(4);
  o.set_rule("BACKPROP");
  j = LoadJobWithOverrides(path, o);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->epochs(), 4);
  EXPECT_EQ(j->seed(), 0u);
}

// max_steps alone sets a run's length, in the file or by --max_steps; named epochs cap it.
TEST(JobFiles, MaxStepsAloneLeavesTheEpochsToIt) {
  const std::string body =
      "rule: GREEDY batch_size: 10 data { synthetic { shape: [4] } }\n"
      "stages { layers { linear { out_features: 4 } } }\n";
  auto load = [&](const std::string& text, const v1::JobOverrides& o) {
    const std::string path = ::testing::TempDir() + "/steps.textproto";
    std::ofstream(path) << text << body;
    absl::StatusOr<v1::Job> j = LoadJobWithOverrides(path, o);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? *j : v1::Job();
  };
  v1::JobOverrides none, steps, both;
  steps.set_max_steps(25);
  both.set_max_steps(25);
  both.set_epochs(1);
  EXPECT_EQ(load("max_steps: 25\n", none).epochs(), 0);
  EXPECT_EQ(TotalSteps(load("max_steps: 25\n", none), 100), 25);
  EXPECT_EQ(EpochsOf(load("max_steps: 25\n", none), 100), 3);
  EXPECT_EQ(TotalSteps(load("", steps), 100), 25);
  EXPECT_EQ(TotalSteps(load("", none), 100), 10);  // one epoch by default
  EXPECT_EQ(TotalSteps(load("", both), 100), 10);  // --epochs=1 named: the smaller wins
  EXPECT_EQ(TotalSteps(load("epochs: 2\n", steps), 100), 20);
  EXPECT_EQ(TotalSteps(load("epochs: 5\n", steps), 100), 25);
  EXPECT_EQ(StepsNote(load("max_steps: 25\n", none), 100),
            "25 steps (max_steps; epochs unset, so as many as that takes: 3 epochs of 10)");
  EXPECT_EQ(StepsNote(load("epochs: 5\n", steps), 100),
            "25 steps (max_steps; the job's 5 epochs of 10 would take 50)");
  EXPECT_EQ(StepsNote(load("epochs: 2\n", steps), 100),
            "20 steps (2 epochs of 10; max_steps 25 is more)");
  EXPECT_EQ(StepsNote(load("", none), 100), "10 steps (1 epoch of 10)");
}

TEST(JobFiles, BatchSizeLearningRateAndEvaluationOverrides) {
  std::string path = ::testing::TempDir() + "/sweep.textproto";
  std::ofstream(path) << "rule: GREEDY batch_size: 32 data { synthetic { shape: [4] } }\n"
                         "schedule { kind: COSINE lr: 0.002 min_lr: 0.0002 }\n"
                         "stages { layers { linear { out_features: 4 } } }\n";
  v1::JobOverrides o;
  o.set_batch_size(256);
  o.set_lr(0.008);
  o.set_eval_every_steps(50);
  absl::StatusOr<v1::Job> j = LoadJobWithOverrides(path, o);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->batch_size(), 256);
  EXPECT_FLOAT_EQ(j->schedule().lr(), 0.008f);
  EXPECT_FLOAT_EQ(j->schedule().min_lr(), 0.0008f);  // scaled with the peak
  EXPECT_EQ(j->eval_every_steps(), 50);
  // Without them the job's own values stay.
  j = LoadJobWithOverrides(path, {});
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->batch_size(), 32);
  EXPECT_FLOAT_EQ(j->schedule().lr(), 0.002f);
  EXPECT_EQ(j->eval_every_steps(), 0);
  o.set_lr(NAN);
  EXPECT_EQ(LoadJobWithOverrides(path, o).status().message(), "--lr: must be a finite number >= 0");
}

}  // namespace
}  // namespace localpar

namespace localpar {
namespace {

TEST(JobFiles, MisspeltFieldsAndEnumValuesGetSuggestions) {
  absl::StatusOr<v1::Job> field = ParseJob("rule: GREEDY\nbatchsize: 3\n", "t");
  ASSERT_FALSE(field.ok());
  EXPECT_NE(field.status().message().find("Did you mean \"batch_size\"?"), std::string::npos)
      << field.status();
  absl::StatusOr<v1::Job> nested = ParseJob("rule: GREEDY\nstages { layers { linaer {} } }\n", "t");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("Did you mean \"linear\"?"), std::string::npos)
      << nested.status();
  absl::StatusOr<v1::Job> value = ParseJob("name: \"x\"\nrule: GREDY\n", "t");
  ASSERT_FALSE(value.ok());
  // At the bad value itself (the parser notices it at the next token).
  EXPECT_NE(value.status().message().find("t:2:7: Unknown enumeration value"), std::string::npos)
      << value.status();
  EXPECT_NE(value.status().message().find("Did you mean GREEDY? Valid values: BACKPROP, GREEDY, "
                                          "CHUNKED, OVERLAP."),
            std::string::npos)
      << value.status();
  absl::StatusOr<v1::Job> far = ParseJob("rule: GREEDY\nwhatever_this_is: 3\n", "t");
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.status().message().find("Its fields: name, data,"), std::string::npos)
      << far.status();
}

TEST(Suggest, ClosestWithinAThirdOfTheLength) {
  EXPECT_EQ(Closest("stage", {"stages", "seed"}), "stages");
  EXPECT_EQ(Closest("xyzzy", {"stages", "seed"}), "");
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace localpar
