// Local clusters against the reference trainer: every rule bitwise, language models,
// compressed wires, reduced-precision GEMMs, asynchronous OVERLAP and accuracy.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/job/parse.h"
#include "common/job/spec.h"
#include "common/model_io/checkpoint.h"
#include "common/model_io/tensor_proto.h"
#include "common/run/reference_run.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "proto/localpar.pb.h"
#include "proto/report.pb.h"
#include "tests/services/cluster_util.h"

namespace localpar {
namespace {

using testing::ExpectClusterEqualsReference;
using testing::ExpectWeightsFileEquals;
using testing::JsonNumbers;
using testing::ReadFile;
using testing::ReferenceWeights;
using testing::RunProcess;
using testing::SmallJob;
using testing::TempDir;

class ClusterMatchesReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ClusterMatchesReference, FourWorkersEndWithBitwiseIdenticalWeights) {
  const std::string rule = GetParam();
  TempDir dir;
  std::string job = dir.Write("job.textproto", SmallJob(rule, rule == "BACKPROP" ? 3 : 1));
  ExpectClusterEqualsReference(dir, job);
  if (HasFailure()) return;
  // The two reports agree on every stage's test accuracy too.
  EXPECT_EQ(JsonNumbers(ReadFile(dir.path() + "/cluster/report.json"), "accuracy"),
            JsonNumbers(ReadFile(dir.path() + "/ref/report.json"), "accuracy"));
}

INSTANTIATE_TEST_SUITE_P(Rules, ClusterMatchesReference,
                         ::testing::Values("GREEDY", "CHUNKED", "OVERLAP", "BACKPROP"),
                         [](const auto& info) { return info.param; });

// A byte-level transformer language model on a generated corpus: per-position labels
// travel with the batches, every stage predicts the next byte, and the cluster still ends
// bitwise equal to the reference trainer. The 3 job stages are regrouped into 2.
std::string LanguageModelJob(const std::string& corpus, const std::string& rule) {
  std::ostringstream j;
  j << "name: \"lm\"\nrule: " << rule << "\nmicro_batches: " << (rule == "BACKPROP" ? 2 : 1)
    << "\ndata { text { paths: \"" << corpus
    << "\" seq_len: 8 holdout_fraction: 0.2 holdout: INTERLEAVED_BLOCKS } }\n"
    << R"(batch_size: 12
epochs: 1
seed: 3
eval_batch_size: 40
optimizer { adamw {} }
schedule { lr: 0.003 }
stages { layers { embedding { vocab: 256 dim: 16 } } layers { positional_encoding {} }
         layers { transformer_block { heads: 2 } } head { kind: LANGUAGE_MODEL } }
stages { layers { transformer_block { heads: 4 mlp_hidden: 24 } } head { kind: LANGUAGE_MODEL } }
stages { layers { transformer_block { heads: 1 } } head { kind: LANGUAGE_MODEL } }
)";
  return j.str();
}

class LanguageModelCluster : public ::testing::TestWithParam<std::string> {};

TEST_P(LanguageModelCluster, EndsBitwiseEqualToTheReference) {
  const std::string rule = GetParam();
  TempDir dir;
  std::string corpus;
  for (int i = 0; corpus.size() < 3000; ++i) {
    corpus += "fortune " + std::to_string(i * 7919 % 1000) + ": the quick brown fox.\n%\n";
  }
  std::string corpus_path = dir.Write("corpus.txt", corpus);
  std::string job = dir.Write("job.textproto", LanguageModelJob(corpus_path, rule));
  absl::StatusOr<v1::Job> parsed = LoadJobFile(job);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<v1::Job> two = RegroupStages(*parsed, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  absl::StatusOr<DataSplit> data = LoadJobData(*two);
  ASSERT_TRUE(data.ok()) << data.status();
  RunOptions o;
  o.progress = false;
  o.out_dir = dir.path() + "/ref";
  std::ostringstream log;
  absl::StatusOr<v1::RunReport> ref = RunReference(*two, *data, o, log, log);
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(o.out_dir + "/weights.pb");
  ASSERT_TRUE(want.ok()) << want.status();
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job, "--quiet", "--stages=2",
                       "--out=" + dir.path() + "/cluster"},
                      120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectWeightsFileEquals(dir.path() + "/cluster/weights.pb", *want);
  std::vector<double> losses = JsonNumbers(ReadFile(dir.path() + "/cluster/report.json"), "loss");
  EXPECT_EQ(losses, JsonNumbers(ReadFile(dir.path() + "/ref/report.json"), "loss"));
  // Per-token losses, and the model learned something: below the uniform 8 bits per byte.
  ASSERT_EQ(losses.size(), 4u);  // (train, test) x 2 stages
  EXPECT_LT(losses.back(), std::log(256.0));
}

INSTANTIATE_TEST_SUITE_P(Rules, LanguageModelCluster,
                         ::testing::Values("GREEDY", "OVERLAP", "BACKPROP"),
                         [](const auto& info) { return info.param; });

// Heads with more capacity (a transformer block before the language-model head) and a
// learning rate per stage, as the language-model gap's arms use them: a cluster ends
// bitwise equal to the reference, and lr_scale is exactly a scaled learning rate.
TEST(LanguageModelCluster, TransformerBlockHeadsAndStageLearningRatesMatchTheReference) {
  TempDir dir;
  std::string corpus;
  for (int i = 0; corpus.size() < 3000; ++i) {
    corpus += "fortune " + std::to_string(i * 7919 % 1000) + ": the quick brown fox.\n%\n";
  }
  const std::string corpus_path = dir.Write("corpus.txt", corpus);
  auto job_text = [&](const std::string& lr, const std::string& stages) {
    return "name: \"lm\"\nrule: CHUNKED\ndata { text { paths: \"" + corpus_path +
           "\" seq_len: 8 holdout_fraction: 0.2 holdout: INTERLEAVED_BLOCKS } }\n"
           "batch_size: 12\nepochs: 1\nseed: 3\neval_batch_size: 40\n"
           "optimizer { adamw {} }\nschedule { kind: COSINE lr: " +
           lr + " warmup_steps: 4 }\n" + stages;
  };
  const std::string stages = R"(
stages { layers { embedding { vocab: 256 dim: 16 } } layers { positional_encoding {} }
         layers { transformer_block { heads: 2 } } lr_scale: 2
         head { kind: LANGUAGE_MODEL layers { transformer_block { heads: 2 mlp_hidden: 32 } } } }
stages { layers { transformer_block { heads: 4 mlp_hidden: 24 } } lr_scale: 0.5
         head { kind: LANGUAGE_MODEL } }
)";
  const std::string job = dir.Write("job.textproto", job_text("0.003", stages));
  v1::ModelWeights want = ExpectClusterEqualsReference(dir, job);
  // Stage 0 has an embedding and stage 1 does not, and the blocks are alike: stage 0's head
  // block adds its dozen tensors (two pre-norm residual blocks' norms, weights and biases).
  ASSERT_EQ(want.stages_size(), 2);
  EXPECT_GE(want.stages(0).params_size(), want.stages(1).params_size() + 12);

  // A single stage at lr 0.006 x lr_scale 0.5 trains exactly as at lr 0.003, and not as
  // at 0.006.
  const std::string one = R"(
stages { layers { embedding { vocab: 256 dim: 16 } } layers { positional_encoding {} }
         layers { transformer_block { heads: 2 } } lr_scale: 0.5 head { kind: LANGUAGE_MODEL } }
)";
  std::string plain = one;
  plain.replace(plain.find(" lr_scale: 0.5"), 14, "");
  v1::ModelWeights scaled =
      ReferenceWeights(dir.Write("scaled.textproto", job_text("0.006", one)), dir.path() + "/s");
  v1::ModelWeights half =
      ReferenceWeights(dir.Write("half.textproto", job_text("0.003", plain)), dir.path() + "/h");
  v1::ModelWeights full =
      ReferenceWeights(dir.Write("full.textproto", job_text("0.006", plain)), dir.path() + "/f");
  // (The files also carry the job that trained them, which differs: compare the stages.)
  ASSERT_EQ(scaled.stages_size(), 1);
  EXPECT_EQ(scaled.stages(0).SerializeAsString(), half.stages(0).SerializeAsString());
  EXPECT_NE(scaled.stages(0).SerializeAsString(), full.stages(0).SerializeAsString());
}

// Token files made here (an llm.c shard to train on, a nanoGPT .bin to validate on) train
// under `localpar run` bitwise equal to `localpar train`: windows at random offsets that
// both draw alike, a learned position embedding, a tied output projection, clipping. The
// job file names its data relative to itself.
TEST(LanguageModelCluster, TokenFilesTrainUnderRunBitwiseEqualToTrain) {
  TempDir dir;
  std::vector<uint16_t> ids(6000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * i + 7 * i) % 50);
  ids[17] = 49;  // the largest id, so the vocabulary read from the files is 50
  {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = 5000;
    std::ofstream shard(dir.path() + "/train_000.bin", std::ios::binary);
    shard.write(reinterpret_cast<const char*>(header.data()), 1024);
    shard.write(reinterpret_cast<const char*>(ids.data()), 5000 * 2);
    std::ofstream val(dir.path() + "/val.bin", std::ios::binary);
    val.write(reinterpret_cast<const char*>(ids.data() + 5000), 1000 * 2);
  }
  const std::string job = dir.Write("job.textproto", R"(name: "tokens" rule: GREEDY seed: 4
batch_size: 8 epochs: 1 max_steps: 12 eval_batch_size: 32
data { tokens { train_paths: "train_000.bin" validation_paths: "val.bin" seq_len: 16 } }
optimizer { adamw { decay_matrices_only: true weight_decay: 0.1 } clip_norm: 0.5 }
schedule { lr: 0.003 }
stages { layers { embedding { vocab: 50 dim: 16 } } layers { position_embedding {} }
         layers { transformer_block { heads: 2 } }
         head { kind: LANGUAGE_MODEL tie_embedding: true } }
stages { layers { transformer_block { heads: 4 } } head { kind: LANGUAGE_MODEL } }
)");
  v1::ModelWeights want = ExpectClusterEqualsReference(dir, job);
  EXPECT_EQ(want.classes(), 50);  // the vocabulary, from the files
  const std::vector<double> losses =
      JsonNumbers(ReadFile(dir.path() + "/cluster/report.json"), "loss");
  EXPECT_EQ(losses, JsonNumbers(ReadFile(dir.path() + "/ref/report.json"), "loss"));
}

// The shipped nanoGPT job, a few steps of it: `localpar run` is bitwise equal to `localpar
// train` (GREEDY and BACKPROP over its 4 one-block stages), and --data_path points it at the
// corpus wherever it is.
TEST(LanguageModelCluster, ShakespeareCharRunIsBitwiseEqualToTrain) {
  const std::string corpus =
      std::string(LOCALPAR_SOURCE_DIR) + "/../shared/data/tinyshakespeare.txt";
  if (!std::filesystem::exists(corpus)) GTEST_SKIP() << corpus << " is not here";
  for (const char* rule : {"GREEDY", "BACKPROP"}) {
    TempDir dir;
    std::string text =
        ReadFile(std::string(LOCALPAR_SOURCE_DIR) + "/deploy/jobs/shakespeare_char.textproto");
    const std::string job = dir.Write("job.textproto", text + "\neval_limit: 48\n");
    const std::vector<std::string> flags = {"--max_steps=6", "--rule=" + std::string(rule),
                                            "--data_path=" + corpus, "--quiet"};
    auto run = [&](const std::string& command, const std::string& out) {
      std::vector<std::string> argv = {testing::BinDir() + "/localpar", command, job,
                                       "--out=" + dir.path() + "/" + out};
      argv.insert(argv.end(), flags.begin(), flags.end());
      return RunProcess(argv, 300);
    };
    auto train = run("train", "train");
    ASSERT_EQ(train.exit_code, 0) << train.output;
    auto cluster = run("run", "cluster");
    ASSERT_EQ(cluster.exit_code, 0) << cluster.output;
    absl::StatusOr<v1::ModelWeights> want = ReadWeightsFile(dir.path() + "/train/weights.pb");
    ASSERT_TRUE(want.ok()) << want.status();
    ExpectWeightsFileEquals(dir.path() + "/cluster/weights.pb", *want);
    EXPECT_EQ(JsonNumbers(ReadFile(dir.path() + "/cluster/report.json"), "loss"),
              JsonNumbers(ReadFile(dir.path() + "/train/report.json"), "loss"))
        << rule;
  }
}

// Activations compressed on the wire: the cluster still equals the reference trainer (which
// rounds the same way) bit for bit, labels arrive intact (every stage's test accuracy
// matches), and the compression is real (the weights differ from an uncompressed run).
TEST(WireCompression, Bf16AndF16RunsEqualTheReferenceAndDifferFromF32) {
  for (auto [wire, rule] : {std::pair{"WIRE_BF16", "GREEDY"}, std::pair{"WIRE_F16", "BACKPROP"}}) {
    TempDir dir;
    const int micro = std::string(rule) == "BACKPROP" ? 3 : 1;
    std::string job =
        dir.Write("job.textproto", SmallJob(rule, micro) + "wire: " + std::string(wire) + "\n");
    std::string plain = dir.Write("plain.textproto", SmallJob(rule, micro));
    v1::ModelWeights want = ExpectClusterEqualsReference(dir, job);
    v1::ModelWeights exact = ReferenceWeights(plain, dir.path() + "/ref_f32");
    if (HasFailure()) return;
    EXPECT_EQ(JsonNumbers(ReadFile(dir.path() + "/cluster/report.json"), "accuracy"),
              JsonNumbers(ReadFile(dir.path() + "/ref/report.json"), "accuracy"))
        << wire;
    // GREEDY's stage 0 sees the same (uncompressed) data either way; later stages do not.
    ASSERT_EQ(want.stages_size(), exact.stages_size());
    if (std::string(rule) == "GREEDY") {
      EXPECT_EQ(want.stages(0).SerializeAsString(), exact.stages(0).SerializeAsString());
    }
    EXPECT_NE(want.stages(1).SerializeAsString(), exact.stages(1).SerializeAsString()) << wire;
  }
}

// Reduced-precision GEMMs (bf16 inputs, float32 accumulation and master weights): workers
// and the reference trainer round alike, so the cluster is still bitwise equal to it, and
// every stage's weights differ from a float32 run (every GEMM really rounds).
TEST(GemmPrecision, Bf16GemmClusterEqualsTheReferenceAndDiffersFromF32) {
  TempDir dir;
  std::string job =
      dir.Write("job.textproto", SmallJob("GREEDY", 1) + "gemm_precision: GEMM_BF16\n");
  std::string plain = dir.Write("plain.textproto", SmallJob("GREEDY", 1));
  v1::ModelWeights want = ExpectClusterEqualsReference(dir, job);
  v1::ModelWeights exact = ReferenceWeights(plain, dir.path() + "/ref_f32");
  if (HasFailure()) return;
  ASSERT_EQ(want.stages_size(), exact.stages_size());
  for (int k = 0; k < want.stages_size(); ++k) {
    EXPECT_NE(want.stages(k).SerializeAsString(), exact.stages(k).SerializeAsString())
        << "stage " << k;
  }
  EXPECT_NE(ReadFile(dir.path() + "/ref/report.json").find("bf16 GEMMs"), std::string::npos);
}

TEST(AsyncOverlap, TrainsAndKeepsTheMeasuredDelayWithinItsBound) {
  TempDir dir;
  std::string job = dir.Write("job.textproto", SmallJob("OVERLAP", 1));
  auto r = RunProcess({testing::BinDir() + "/localpar", "run", job, "--quiet",
                       "--overlap_max_delay=2", "--epochs=6", "--out=" + dir.path()},
                      120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string report = ReadFile(dir.path() + "/report.json");
  std::vector<double> max_delay = JsonNumbers(report, "overlap_max_delay");
  std::vector<double> mean_delay = JsonNumbers(report, "overlap_mean_delay");
  ASSERT_EQ(max_delay.size(), 4u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_LE(max_delay[k], 2) << "stage " << k;
    EXPECT_GT(mean_delay[k], 0) << "stage " << k << ": gradients were applied late at least once";
  }
  // It learns: every stage's training loss falls from epoch 1 to epoch 6, and the last
  // stage beats chance (0.2) by a wide margin. (Asynchronous runs are not reproducible, so
  // no exact figures.)
  std::vector<double> loss = JsonNumbers(report, "loss");  // per epoch: 4 train, 4 test
  std::vector<double> acc = JsonNumbers(report, "accuracy");
  ASSERT_EQ(loss.size(), 6u * 8);
  for (int k = 0; k < 4; ++k) EXPECT_LT(loss[5 * 8 + k], loss[k]) << "stage " << k;
  EXPECT_GE(acc.back(), 0.4);
}

TEST(Cluster, FashionMlpGreedyOnFourWorkersReachesTheReferenceAccuracy) {
  TempDir dir;
  auto r = RunProcess({testing::BinDir() + "/localpar", "run",
                       std::string(LOCALPAR_SOURCE_DIR) + "/deploy/jobs/fashion_mlp.textproto",
                       "--quiet", "--out=" + dir.path()},
                      600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::cout << r.output;
  std::vector<double> acc = JsonNumbers(ReadFile(dir.path() + "/report.json"), "accuracy");
  ASSERT_EQ(acc.size(), 3u * 8);  // 3 epochs x (train, test) x 4 stages
  // Bitwise equal to the reference trainer, so the same bar as accuracy_test.cc.
  EXPECT_GE(acc.back(), 0.855);
  for (int k = 0; k < 4; ++k) EXPECT_GE(acc[acc.size() - 4 + k], 0.84) << "stage " << k;
}

}  // namespace
}  // namespace localpar
