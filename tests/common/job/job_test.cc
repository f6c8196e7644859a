// Job files: the shipped examples parse; every kind of mistake is refused with a message
// that points at the line and column, or the field and the reason.
#include "common/job/job.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/data/dataset.h"
#include "common/job/metrics_log.h"
#include "common/job/plan.h"
#include "common/job/progress.h"
#include "common/job/report.h"
#include "common/job/suggest.h"

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
  using K = LayerConfig::Kind;
  const std::vector<LayerConfig>& layers = m.stages[0].layers;
  ASSERT_EQ(layers.size(), 4u);
  ASSERT_EQ(layers[2].kind, K::kResidual);
  ASSERT_EQ(layers[2].body.size(), 2u);
  EXPECT_EQ(layers[2].body[1].kind, K::kCausalSelfAttention);
  EXPECT_EQ(layers[2].body[1].heads, 4);
  ASSERT_EQ(layers[3].body.size(), 4u);
  EXPECT_EQ(layers[3].body[0].kind, K::kLayerNorm);
  EXPECT_EQ(layers[3].body[1].out_features, 4 * 32);  // default MLP width
  EXPECT_EQ(layers[3].body[3].out_features, 32);
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

TEST(Plan, TheBalancedSplitIsTheBestOfEveryContiguousSplit) {
  // Unit times and head times (a negative head: no stage may end there).
  std::vector<UnitProfile> units;
  std::vector<std::pair<double, double>> t = {{9, 1}, {1, 1}, {1, -1},  {4, 0.5},
                                              {2, 2}, {7, 1}, {1, 0.1}, {3, 1}};
  // Inside a stage each unit but the first also passes a gradient back: 0.25 x i more.
  for (auto [s, h] : t) units.push_back({"u", s, h});
  for (size_t i = 0; i < units.size(); ++i) units[i].input_grad_seconds = 0.25 * i;
  for (int stages = 1; stages <= 5; ++stages) {
    absl::StatusOr<Partition> best = BestPartition(units, stages);
    ASSERT_TRUE(best.ok()) << best.status();
    // Brute force over every placement of stages-1 cuts among the 7 gaps.
    double want = 1e9;
    for (int mask = 0; mask < (1 << 7); ++mask) {
      if (__builtin_popcount(mask) != stages - 1) continue;
      double worst = 0, cur = 0;
      for (int i = 0; i < 8; ++i) {
        const bool first_of_stage = i == 0 || (mask >> (i - 1) & 1);
        cur += t[i].first + (first_of_stage ? 0.0 : 0.25 * i);
        if (i == 7 || (mask >> i & 1)) {
          worst = std::max(worst, t[i].second < 0 ? 1e18 : cur + t[i].second);
          cur = 0;
        }
      }
      want = std::min(want, worst);
    }
    EXPECT_DOUBLE_EQ(best->bottleneck(), want) << stages << " stages";
    int total = 0;
    for (int s : best->sizes) total += s;
    EXPECT_EQ(total, 8);
  }
  absl::StatusOr<Partition> equal = EqualPartition(units, 3);  // 3, 3, 2 units
  ASSERT_TRUE(equal.ok());
  EXPECT_EQ(equal->sizes, (std::vector<int>{3, 3, 2}));
  EXPECT_TRUE(std::isinf(equal->stage_seconds[0]));  // ends on the unit with no head
  EXPECT_FALSE(BestPartition(units, 9).ok());
}

// The projection with replicas against figures worked by hand: each replica computes its
// share, then receives (R - 1) buckets over the link; the exchange also takes core time.
TEST(Plan, ProjectionWithReplicasAddsTheExchangeToEachStageAndToTheCores) {
  LinkModel link;
  link.bytes_per_second = 1e9;
  link.latency_seconds = 1e-4;
  link.replicas = 3;
  link.exchange_bytes = {4e6, 1e6};
  // Stage 0: 10 ms + 0.1 ms + 2 x 4 ms = 18.1 ms; stage 1: 5 ms + 0.1 + 2 x 1 = 7.1 ms.
  EXPECT_EQ(ExchangeSeconds(link, 2), (std::vector<double>{0.0081, 0.0021}));
  EXPECT_NEAR(PredictExamplesPerSecond({0.010, 0.005}, {1e5}, 96, link), 96 / 0.0181, 1e-6);
  // On 2 cores: 3 replicas x (18.1 + 7.1) ms / 2 = 37.8 ms bounds the period.
  link.cores = 2;
  EXPECT_NEAR(PredictExamplesPerSecond({0.010, 0.005}, {1e5}, 96, link), 96 / 0.0378, 1e-6);
  // Without replicas nothing changes: the slowest stage.
  LinkModel one;
  EXPECT_NEAR(PredictExamplesPerSecond({0.010, 0.005}, {1e5}, 96, one), 96 / 0.010, 1e-9);
  // The bucket of each stage of a regrouped job: its parameters, float32.
  absl::StatusOr<v1::Job> j = ParseJob(R"(
rule: GREEDY
batch_size: 16
data { synthetic { shape: [32] classes: 3 } }
stages { layers { linear { out_features: 8 } } layers { relu {} } head { kind: LINEAR } }
stages { layers { linear { out_features: 4 } } head { kind: LINEAR } }
)",
                                       "t");
  ASSERT_TRUE(j.ok()) << j.status();
  Partition p;
  p.sizes = {1, 1};
  p.stage_seconds = {1, 1};
  EXPECT_EQ(ExchangeBytes(*j, p),
            (std::vector<double>{4.0 * (32 * 8 + 8 + 8 * 3 + 3), 4.0 * (8 * 4 + 4 + 4 * 3 + 3)}));
}

TEST(Plan, ProfilesEveryLayerAndRegroupsTheJob) {
  absl::StatusOr<v1::Job> j = ParseJob(R"(
rule: GREEDY
batch_size: 16
data { synthetic { shape: [32] classes: 3 } }
stages { name: "a" layers { linear { out_features: 256 } } layers { relu {} } head { kind: MLP hidden: 4 } }
stages { name: "b" layers { linear { out_features: 8 } } layers { relu {} } }
)",
                                       "t");
  ASSERT_TRUE(j.ok()) << j.status();
  auto cpu = MakeCpuBackend();
  absl::StatusOr<std::vector<UnitProfile>> units = ProfileUnits(*j, *cpu, 16, 3);
  ASSERT_TRUE(units.ok()) << units.status();
  ASSERT_EQ(units->size(), 2u);  // each linear keeps its relu
  EXPECT_NE((*units)[0].label.find("a.layers[0] linear+relu"), std::string::npos)
      << (*units)[0].label;
  for (const UnitProfile& u : *units) {
    EXPECT_GT(u.seconds, 0);
    EXPECT_GT(u.head_seconds, 0);
    EXPECT_EQ(u.layers, 2);
  }
  Partition p;
  p.sizes = {1, 1};
  v1::Job out = ApplyPartition(*j, p);
  ASSERT_EQ(out.stages_size(), 2);
  EXPECT_EQ(out.stages(0).layers_size(), 2);
  EXPECT_EQ(out.stages(0).head().kind(), v1::Head::MLP);  // from job stage 0
  EXPECT_EQ(out.stages(0).name(), "a");
  EXPECT_EQ(out.stages(1).layers_size(), 2);
  EXPECT_FALSE(out.stages(1).has_head());  // job stage 1 has the default head
  EXPECT_EQ(out.stages(1).name(), "b");
  EXPECT_TRUE(ValidateJob(out).ok());
}

TEST(Plan, NeverCutsAnActivationFromTheLayerItFollows) {
  // The job itself puts b's relu after a's linear: the plan keeps them together, and the
  // stage that holds them is named after both.
  absl::StatusOr<v1::Job> j = ParseJob(R"(
rule: GREEDY
batch_size: 8
data { synthetic { shape: [16] classes: 3 } }
stages { name: "a" layers { linear { out_features: 16 } } }
stages { name: "b" layers { relu {} } layers { dropout { rate: 0.1 } } layers { linear { out_features: 8 } } layers { gelu {} } }
)",
                                       "t");
  ASSERT_TRUE(j.ok()) << j.status();
  auto cpu = MakeCpuBackend();
  absl::StatusOr<std::vector<UnitProfile>> units = ProfileUnits(*j, *cpu, 8, 3);
  ASSERT_TRUE(units.ok()) << units.status();
  ASSERT_EQ(units->size(), 2u);
  EXPECT_EQ((*units)[0].layers, 3);  // linear, relu, dropout
  EXPECT_EQ((*units)[1].layers, 2);  // linear, gelu
  for (int stages : {1, 2}) {
    absl::StatusOr<Partition> best = BestPartition(*units, stages);
    ASSERT_TRUE(best.ok()) << best.status();
    v1::Job out = ApplyPartition(*j, *best);
    for (const v1::Stage& st : out.stages()) {
      EXPECT_FALSE(st.layers(0).has_relu() || st.layers(0).has_gelu() || st.layers(0).has_dropout())
          << "a stage starts with an activation: " << st.ShortDebugString();
    }
  }
  Partition two;
  two.sizes = {1, 1};
  EXPECT_EQ(ApplyPartition(*j, two).stages(0).name(), "a+b");
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
  EXPECT_EQ(m.stages[0].layers[0].kernel, 3);
  EXPECT_FLOAT_EQ(m.stages[0].layers[1].eps, 1e-5f);
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

TEST(MetricsLog, OneJsonObjectALineWithNullForANonFiniteLoss) {
  MetricsPoint p;
  p.kind = "test";
  p.step = 14;
  p.epoch = 2;
  p.wall_seconds = 3.5;
  p.lr = 0.001;
  EXPECT_EQ(MetricsLog::Line(p, 1, HeadStats{2.0, 3.0, 4}),
            "{\"kind\":\"test\",\"step\":14,\"epoch\":2,\"stage\":1,\"loss\":0.5,"
            "\"accuracy\":0.75,\"examples\":4,\"lr\":0.001,\"examples_per_second\":0,"
            "\"wall_seconds\":3.5}");
  EXPECT_NE(MetricsLog::Line(p, 0, HeadStats{std::nan(""), 0, 1}).find("\"loss\":null"),
            std::string::npos);
}

// A run that trained nothing, or diverged, is a failed run.
TEST(RunReport, ARunThatTrainedNothingOrDivergedIsRefused) {
  v1::RunReport r;
  v1::EpochFigures* e = r.add_epochs();
  e->set_epoch(1);
  for (int k = 0; k < 2; ++k) {
    v1::HeadFigures* f = e->add_train();
    f->set_stage(k);
    f->set_loss(0.5);
    f->set_examples(k == 0 ? 0 : 64);  // a stage without a head scores nothing: fine
    *e->add_test() = *f;
  }
  EXPECT_TRUE(CheckRunTrained(r).ok()) << CheckRunTrained(r);
  // A resumed run's epoch whose training came before the restart: fine, as long as the run
  // trained somewhere.
  v1::RunReport resumed = r;
  *resumed.add_epochs() = r.epochs(0);
  resumed.mutable_epochs(1)->set_epoch(2);
  resumed.mutable_epochs(1)->mutable_train(1)->set_examples(0);
  EXPECT_TRUE(CheckRunTrained(resumed).ok()) << CheckRunTrained(resumed);
  v1::RunReport nothing = r;
  nothing.mutable_epochs(0)->mutable_train(1)->set_examples(0);
  EXPECT_EQ(CheckRunTrained(nothing).message(),
            "the run trained on nothing: no stage's head scored a single training example, so "
            "every batch was refused or lost (see the errors above); the weights are untrained");
  v1::RunReport diverged = r;
  diverged.mutable_epochs(0)->mutable_test(1)->set_loss(std::nan(""));
  EXPECT_EQ(CheckRunTrained(diverged).message(),
            "stage 1's test loss is NaN in epoch 1: training diverged (lower the learning rate, "
            "or add warm-up); the weights are not usable");
  diverged.mutable_epochs(0)->mutable_test(1)->set_loss(INFINITY);
  EXPECT_NE(CheckRunTrained(diverged).message().find("is infinite"), std::string::npos);
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

TEST(ProgressPrinter, ShowsElapsedTimeAndAnEtaFromTheStepsSinceTheFirstLine) {
  std::ostringstream out;
  ProgressPrinter printer(out, /*live=*/false, /*enabled=*/true);
  HeadStats s0{/*loss_sum=*/2.0, /*correct=*/0, /*count=*/4}, none;
  ProgressLine line{1, 2, 100, 1000, 512, {s0, none}, 30.0};
  EXPECT_EQ(printer.Format(line),
            "epoch 1/2 [##                  ] step 100/1000 512 ex/s 30s loss s0 0.500 s1 -");
  line.step = 200;
  line.elapsed_seconds = 40.0;  // 100 steps in 10 s: 800 to go take 80 s
  EXPECT_EQ(printer.Format(line),
            "epoch 1/2 [####                ] step 200/1000 512 ex/s 40s ETA 1m20s loss s0 0.500 "
            "s1 -");
  EXPECT_EQ(FormatDuration(7384), "2h03m");
  line.evaluating = true;
  EXPECT_NE(printer.Format(line).find(" ETA 1m20s evaluating; loss s0 0.500 s1 -"),
            std::string::npos)
      << printer.Format(line);
}

TEST(ProgressPrinter, ALineWiderThanTheTerminalNarrowsUntilItFits) {
  std::ostringstream out;
  std::vector<HeadStats> eight;
  for (int k = 0; k < 8; ++k) eight.push_back(HeadStats{1.0 + 0.1 * k, 0, 1});
  eight[5].loss_sum = 0.25;
  ProgressLine line{2, 3, 50, 100, 2000, eight, 754.0};
  ProgressPrinter wide(out, /*live=*/false, /*enabled=*/true, /*width=*/200);
  EXPECT_EQ(wide.Format(line),
            "epoch 2/3 [##########          ] step 50/100 2000 ex/s 12m34s loss s0 1.000 s1 1.100 "
            "s2 1.200 s3 1.300 s4 1.400 s5 0.250 s6 1.600 s7 1.700");
  // 79 columns (an 80-column terminal): the lowest and the highest stage loss instead.
  ProgressPrinter terminal(out, false, true, 79);
  EXPECT_EQ(terminal.Format(line),
            "epoch 2/3 [##########          ] step 50/100 2000 ex/s 12m34s loss 0.250-1.700");
  ProgressPrinter narrower(out, false, true, 70);
  EXPECT_EQ(narrower.Format(line),
            "epoch 2/3 [#####     ] step 50/100 2000 ex/s 12m34s loss 0.250-1.700");
  ProgressPrinter no_bar(out, false, true, 55);
  EXPECT_EQ(no_bar.Format(line), "epoch 2/3 step 50/100 2000 ex/s 12m34s loss 0.250-1.700");
  ProgressPrinter tiny(out, false, true, 20);
  EXPECT_EQ(tiny.Format(line), "epoch 2/3 step 50/10");
}

TEST(ProgressPrinter, EpochResultShowsADashForAStageWithoutFigures) {
  std::ostringstream out;
  ProgressPrinter printer(out, /*live=*/false, /*enabled=*/true);
  HeadStats answered{/*loss_sum=*/1.0, /*correct=*/3.0, /*count=*/4};
  printer.EpochResult(2, {answered, HeadStats{}}, 1.5);
  EXPECT_EQ(out.str(), "epoch 2: test accuracy s0 75.00% s1 - (1.5s)\n");
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
