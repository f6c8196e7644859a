// Whole-model weight files: sharded safetensors with Hugging Face's index round-trip exactly,
// through the directory or the index; a file of another stage split of the same network
// fits (layers exactly, kept heads exactly, new heads at their seeded values, left-out heads
// said); weights.pb does the same; a hostile index or header is refused naming the field.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_format.h"
#include "common/core/cpu_backend.h"
#include "common/data/dataset.h"
#include "common/io/atomic_file.h"
#include "common/job/parse.h"
#include "common/job/spec.h"
#include "common/model_io/model_file.h"
#include "common/model_io/safetensors.h"
#include "common/model_io/tensor_proto.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::DataDir;

// Four stages of linear + relu, with a head after each.
const char kJob[] = R"(
name: "w"
rule: GREEDY
seed: 7
data { synthetic { shape: [6] classes: 3 } }
stages { layers { linear { out_features: 10 } } layers { relu {} } }
stages { layers { linear { out_features: 9 } } layers { relu {} } }
stages { layers { linear { out_features: 8 } } layers { relu {} } }
stages { layers { linear { out_features: 7 } } layers { relu {} } }
)";

struct Net {
  v1::Job job;
  ModelConfig config;
  std::unique_ptr<Model> model;
};

Net Build(Backend& be, int stages, uint64_t seed) {
  absl::StatusOr<v1::Job> job = ParseJob(kJob, "w");
  EXPECT_TRUE(job.ok()) << job.status();
  if (stages != job->stages_size()) {
    job = RegroupStages(*job, stages);
    EXPECT_TRUE(job.ok()) << job.status();
  }
  job->set_seed(seed);
  Net n;
  n.job = *job;
  n.config = ToModelConfig(n.job);
  std::string error;
  n.model = Model::Create(be, n.config, &error);
  EXPECT_TRUE(n.model) << error;
  return n;
}

std::map<std::string, std::vector<float>> ByName(Net& n) {
  std::map<std::string, std::vector<float>> out;
  for (const ParamInfo& p : DescribeParams(n.config, *n.model, n.model->num_stages() - 1)) {
    out[p.readable] = p.value->value.ToHost();
  }
  return out;
}

v1::ModelWeights Described(Net& n) {
  v1::ModelWeights w = SnapshotModel(*n.model);
  DescribeWeights(n.job, InputNormalization{}, {}, &w);
  return w;
}

// Reads `path` into `into` (replacing its values), returning what was said.
InitNotes Load(const std::string& path, Net& into) {
  InitNotes notes;
  absl::StatusOr<v1::ModelWeights> w = ReadAnyWeightsFile(path, into.config, *into.model, &notes);
  EXPECT_TRUE(w.ok()) << w.status();
  if (w.ok()) {
    absl::Status s = LoadWeights(*w, path, into.config, *into.model);
    EXPECT_TRUE(s.ok()) << s;
  }
  return notes;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(ShardedSafetensors, RoundTripExactlyThroughTheDirectoryAndTheIndex) {
  auto cpu = MakeCpuBackend();
  DataDir dir;
  Net a = Build(*cpu, 4, 1);
  const std::vector<ParamInfo> params = DescribeParams(a.config, *a.model, 3);
  // A limit below any tensor: every tensor gets a shard of its own.
  absl::StatusOr<std::vector<std::string>> shards =
      WriteShardedSafetensors(params, Described(a), dir.file("sharded"), 1);
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ(shards->size(), params.size());
  EXPECT_EQ(shards->front(), absl::StrFormat("model-00001-of-%05d.safetensors", params.size()));
  const std::string index = Slurp(dir.file("sharded/model.safetensors.index.json"));
  EXPECT_NE(index.find("\"weight_map\""), std::string::npos) << index;
  EXPECT_NE(index.find("\"layers.0.weight\": \"model-00001-of-"), std::string::npos) << index;
  // Per stage (no limit): 4 shards.
  shards = WriteShardedSafetensors(params, Described(a), dir.file("per_stage"), 0);
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ(shards->size(), 4u);

  const auto want = ByName(a);
  for (const std::string& path :
       {dir.file("sharded"), dir.file("sharded/model.safetensors.index.json"),
        dir.file("per_stage")}) {
    Net b = Build(*cpu, 4, 2);
    ASSERT_NE(ByName(b), want);
    InitNotes notes = Load(path, b);
    EXPECT_EQ(ByName(b), want) << path;
    EXPECT_TRUE(notes.fresh_heads.empty() && notes.unused_heads.empty()) << path;
  }
}

TEST(ShardedSafetensors, AnotherStageSplitCarriesTheLayersAndSaysWhichHeadsStartFresh) {
  auto cpu = MakeCpuBackend();
  DataDir dir;
  Net four = Build(*cpu, 4, 1);
  ASSERT_TRUE(WriteShardedSafetensors(DescribeParams(four.config, *four.model, 3), Described(four),
                                      dir.file("four"), 0)
                  .ok());
  // 4 -> 2: every layer and the heads after layers 3 and 7 carry over; those after 1 and 5
  // have no boundary any more.
  Net two = Build(*cpu, 2, 3);
  InitNotes notes = Load(dir.file("four"), two);
  EXPECT_TRUE(notes.fresh_heads.empty());
  EXPECT_EQ(notes.unused_heads, (std::vector<std::string>{"heads.1", "heads.5"}));
  EXPECT_EQ(notes.file_stages, 4);
  const auto from_four = ByName(four);
  for (const auto& [name, values] : ByName(two)) EXPECT_EQ(values, from_four.at(name)) << name;

  // 2 -> 4: the new boundaries' heads keep the job's seeded initialisation.
  ASSERT_TRUE(WriteShardedSafetensors(DescribeParams(two.config, *two.model, 1), Described(two),
                                      dir.file("two"), 0)
                  .ok());
  Net back = Build(*cpu, 4, 5);
  const auto seeded = ByName(back);
  notes = Load(dir.file("two"), back);
  EXPECT_EQ(notes.fresh_heads, (std::vector<std::string>{"heads.1", "heads.5"}));
  EXPECT_TRUE(notes.unused_heads.empty());
  EXPECT_NE(DescribeInitNotes(notes, 4).find("starting fresh (seeded): heads.1, heads.5"),
            std::string::npos)
      << DescribeInitNotes(notes, 4);
  for (const auto& [name, values] : ByName(back)) {
    if (name.rfind("heads.1.", 0) == 0 || name.rfind("heads.5.", 0) == 0) {
      EXPECT_EQ(values, seeded.at(name)) << name;
    } else {
      EXPECT_EQ(values, from_four.at(name)) << name;
    }
  }

  // weights.pb, which stores parameters per stage, fits another split the same way.
  const std::string pb = dir.file("weights.pb");
  ASSERT_TRUE(WriteFileAtomically(pb, Described(four).SerializeAsString()).ok());
  Net two_pb = Build(*cpu, 2, 9);
  notes = Load(pb, two_pb);
  EXPECT_EQ(notes.unused_heads, (std::vector<std::string>{"heads.1", "heads.5"}));
  EXPECT_EQ(ByName(two_pb), ByName(two));
}

// `a` as shards (a stage each) in dir/s; returns the index's path.
std::string WriteShards(Net& a, DataDir& dir) {
  EXPECT_TRUE(
      WriteShardedSafetensors(DescribeParams(a.config, *a.model, 3), Described(a), dir.file("s"), 0)
          .ok());
  return dir.file("s/model.safetensors.index.json");
}

TEST(ShardedSafetensors, AHostileIndexOrHeaderIsRefusedNamingWhatIsWrong) {
  auto cpu = MakeCpuBackend();
  DataDir dir;
  Net a = Build(*cpu, 4, 1);
  const std::string index_path = WriteShards(a, dir);
  const std::string index = Slurp(index_path);
  auto refused = [&](const std::string& text, const std::string& needle) {
    ASSERT_TRUE(WriteFileAtomically(index_path, text).ok());
    Net b = Build(*cpu, 4, 2);
    absl::StatusOr<v1::ModelWeights> w = ReadAnyWeightsFile(dir.file("s"), b.config, *b.model);
    ASSERT_FALSE(w.ok()) << needle;
    EXPECT_NE(w.status().message().find(needle), std::string::npos) << w.status();
  };
  // No path is taken from the file: a shard name is a plain name beside the index.
  std::string evil = index;
  evil.replace(evil.find("model-00001-of-00004"), 20, "../../../../etc/passwd");
  refused(evil, "weight_map[layers.0.weight] is \"../../../../etc/passwd.safetensors\"");
  std::string moved = index;
  const std::string entry = "\"layers.0.weight\": \"model-00001";
  moved.replace(moved.find(entry), entry.size(), "\"layers.0.weight\": \"model-00002");
  refused(moved, "weight_map puts layers.0.weight in model-00002-of-00004.safetensors");
  refused("{\"metadata\": {}}", "has no \"weight_map\" object");
  refused("not json", "the index is not JSON");
  ASSERT_TRUE(WriteFileAtomically(index_path, index).ok());

  // A shard whose header points past its data.
  const std::string shard = dir.file("s/model-00002-of-00004.safetensors");
  std::string bytes = Slurp(shard);
  const size_t at = bytes.find("\"data_offsets\":[0,");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 18, "\"data_offsets\":[9,");
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  Net b = Build(*cpu, 4, 2);
  absl::StatusOr<v1::ModelWeights> w = ReadAnyWeightsFile(dir.file("s"), b.config, *b.model);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("data_offsets [9, "), std::string::npos) << w.status();
  // A header length past the file.
  uint64_t huge = uint64_t{1} << 40;
  std::memcpy(bytes.data(), &huge, 8);
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  w = ReadAnyWeightsFile(dir.file("s"), b.config, *b.model);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("header length 1099511627776 runs past"), std::string::npos)
      << w.status();

  // A file of another network: a layer it lacks, or one the job lacks.
  DataDir other;
  absl::StatusOr<v1::Job> small = ParseJob(
      "name: \"x\" rule: GREEDY data { synthetic { shape: [6] classes: 3 } }\n"
      "stages { layers { linear { out_features: 10 } } layers { relu {} } }\n",
      "x");
  ASSERT_TRUE(small.ok()) << small.status();
  Net s;
  s.job = *small;
  s.config = ToModelConfig(s.job);
  std::string error;
  s.model = Model::Create(*cpu, s.config, &error);
  ASSERT_TRUE(s.model) << error;
  ASSERT_TRUE(WriteSafetensors(DescribeParams(s.config, *s.model, 0), Described(s),
                               other.file("small.safetensors"))
                  .ok());
  w = ReadAnyWeightsFile(other.file("small.safetensors"), b.config, *b.model);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("has no tensor layers.2.weight"), std::string::npos)
      << w.status();
  ASSERT_TRUE(WriteSafetensors(DescribeParams(a.config, *a.model, 3), Described(a),
                               other.file("big.safetensors"))
                  .ok());
  w = ReadAnyWeightsFile(other.file("big.safetensors"), s.config, *s.model);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("holds layers.2.bias, which the job's network does not"),
            std::string::npos)
      << w.status();
}

// Files that used to hang or half-load: an index nested 100,000 deep, a FIFO as the index or
// as a shard, offsets that are not whole numbers, and a file missing one tensor of a head
// whose other tensors it holds. Each is refused within seconds, naming the file.
TEST(ShardedSafetensors, DeepFifoFractionalAndHalfAHeadAreRefusedQuickly) {
  auto cpu = MakeCpuBackend();
  DataDir dir;
  Net a = Build(*cpu, 4, 1);
  const std::string index_path = WriteShards(a, dir);
  const std::string index = Slurp(index_path);
  auto refused = [&](const std::string& path, const std::string& needle) {
    Net b = Build(*cpu, 4, 2);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<v1::ModelWeights> w = ReadAnyWeightsFile(path, b.config, *b.model);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_FALSE(w.ok()) << needle;
    EXPECT_NE(w.status().message().find(needle), std::string::npos) << w.status();
    EXPECT_LT(took, 5.0) << needle;
  };
  ASSERT_TRUE(
      WriteFileAtomically(index_path, std::string(100000, '[') + std::string(100000, ']')).ok());
  refused(dir.file("s"), index_path + ": the index nests deeper than 32 levels");
  ASSERT_TRUE(WriteFileAtomically(index_path, index).ok());

  // A FIFO nobody writes to: opening it would wait for ever.
  const std::string shard = dir.file("s/model-00002-of-00004.safetensors");
  const std::string shard_bytes = Slurp(shard);
  std::filesystem::remove(shard);
  ASSERT_EQ(mkfifo(shard.c_str(), 0600), 0);
  refused(dir.file("s"), "weights file " + shard + ": is a FIFO (named pipe), not a regular file");
  std::filesystem::remove(shard);
  ASSERT_TRUE(WriteFileAtomically(shard, shard_bytes).ok());
  std::filesystem::remove(index_path);
  ASSERT_EQ(mkfifo(index_path.c_str(), 0600), 0);
  refused(index_path, "weights index " + index_path + ": is a FIFO (named pipe)");
  std::filesystem::remove(index_path);
  ASSERT_TRUE(WriteFileAtomically(index_path, index).ok());

  // Offsets that are not whole numbers of bytes.
  uint64_t header_len = 0;
  std::memcpy(&header_len, shard_bytes.data(), 8);
  const std::string data = shard_bytes.substr(8 + header_len);  // offsets count from here
  std::string header = shard_bytes.substr(8, header_len);
  const size_t at = header.find("\"data_offsets\":[0,");
  ASSERT_NE(at, std::string::npos);
  const size_t end = header.find(']', at);
  header.replace(at, end - at,
                 "\"data_offsets\":[0.5," + header.substr(at + 18, end - at - 18) + ".5");
  header_len = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &header_len, 8);
  bytes += header + data;
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  refused(dir.file("s"), "data_offsets [0.5, ");
  ASSERT_TRUE(WriteFileAtomically(shard, shard_bytes).ok());

  // One tensor of a head gone from a single file: refused naming it, never half-loaded.
  std::vector<ParamInfo> params = DescribeParams(a.config, *a.model, 3);
  std::vector<ParamInfo> kept;
  for (const ParamInfo& p : params) {
    if (p.readable != "heads.3.0.bias") kept.push_back(p);
  }
  ASSERT_EQ(kept.size() + 1, params.size());
  ASSERT_TRUE(WriteSafetensors(kept, Described(a), dir.file("half.safetensors")).ok());
  refused(dir.file("half.safetensors"), "has no tensor heads.3.0.bias but holds heads.3.0.weight");
}

}  // namespace
}  // namespace localpar
