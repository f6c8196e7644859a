// Checkpoint files: a saved stage restores bit for bit; a corrupt, truncated or
// version-mismatched file is refused naming the file; the newest complete checkpoint is
// found past damaged ones; pruning keeps the newest K.
#include "common/model_io/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/model_io/checkpoint_file.h"
#include "common/model_io/stage_snapshot.h"
#include "common/model_io/tensor_proto.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::DataDir;

std::unique_ptr<Stage> MakeStage(Backend& b, uint64_t seed) {
  StageConfig c;
  LayerConfig lin;
  lin.kind = "linear";
  lin.Set("out_features", 5);
  c.layers = {lin};
  OptimizerConfig o;  // AdamW: two moments per parameter
  std::string error;
  return Stage::Create(b, c, {4}, 3, o, seed, &error);
}

std::vector<std::vector<float>> State(Stage& s) {
  std::vector<std::vector<float>> out;
  for (Param* p : s.params()) {
    out.push_back(p->value.ToHost());
    out.push_back(p->state1.defined() ? p->state1.ToHost() : std::vector<float>());
    out.push_back(p->state2.defined() ? p->state2.ToHost() : std::vector<float>());
  }
  return out;
}

void Flip(const std::string& path, size_t offset_from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  std::streamoff size = f.tellg();
  f.seekp(size - static_cast<std::streamoff>(offset_from_end));
  char c;
  f.seekg(size - static_cast<std::streamoff>(offset_from_end));
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(size - static_cast<std::streamoff>(offset_from_end));
  f.write(&c, 1);
}

TEST(Checkpoint, StageRoundTripsBitForBitIncludingOptimizerState) {
  auto cpu = MakeCpuBackend();
  DataDir dir;
  auto a = MakeStage(*cpu, 1);
  // Take two optimizer steps so moments and the step count are non-trivial.
  for (int i = 0; i < 2; ++i) {
    for (Param* p : a->params()) cpu->Fill(p->grad.f32(), 0.25f * (i + 1), p->grad.numel());
    a->Step(0.1f);
  }
  ASSERT_TRUE(SaveStageFile(*a, 0, 2, dir.file("s.ckpt")).ok());
  auto b = MakeStage(*cpu, 99);  // different initial weights
  ASSERT_NE(State(*a), State(*b));
  absl::Status st = LoadStageFile(*b, dir.file("s.ckpt"));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(State(*a), State(*b));
  EXPECT_EQ(b->optimizer().steps(), 2);
}

TEST(Checkpoint, DamagedFilesAreRefusedNamingTheFile) {
  auto cpu = MakeCpuBackend();
  DataDir dir;
  auto s = MakeStage(*cpu, 1);
  std::string path = dir.file("s.ckpt");
  ASSERT_TRUE(SaveStageFile(*s, 0, 0, path).ok());
  std::string good;
  {
    std::ifstream in(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto expect_error = [&](const std::string& bytes, const std::string& text) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    absl::Status st = LoadStageFile(*s, path);
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_NE(st.message().find(path), std::string::npos) << st;
    EXPECT_NE(st.message().find(text), std::string::npos) << st;
  };
  std::string flipped = good;
  flipped[good.size() - 3] ^= 0x01;
  expect_error(flipped, "checksum mismatch");
  expect_error(good.substr(0, good.size() - 10), "truncated");
  std::string version = good;
  version[8] = 7;
  expect_error(version, "format version 7");
  expect_error("hello", "not a localpar checkpoint");
}

// Snapshots are written as format 2 (a header, then each tensor's values: no 2 GiB limit);
// format 1 (one protobuf) still loads; a format-2 header whose shapes do not add up to the
// values the file holds is refused even with a valid checksum.
TEST(Checkpoint, StreamedFormatIsWrittenTheOldOneStillLoadsAndShapesMustAddUp) {
  auto cpu = MakeCpuBackend();
  DataDir dir;
  auto a = MakeStage(*cpu, 1);
  for (Param* p : a->params()) cpu->Fill(p->grad.f32(), 0.5f, p->grad.numel());
  a->Step(0.1f);
  ASSERT_TRUE(SaveStageFile(*a, 0, 1, dir.file("new.ckpt")).ok());
  std::string bytes;
  {
    std::ifstream in(dir.file("new.ckpt"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_EQ(bytes[8], 2) << "format 2";
  ASSERT_TRUE(
      WriteChecksummedFile(dir.file("old.ckpt"), SnapshotStageState(*a, 0, 1).SerializeAsString())
          .ok());
  auto b = MakeStage(*cpu, 5);
  absl::Status st = LoadStageFile(*b, dir.file("old.ckpt"));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(State(*a), State(*b));
  // Grow the first tensor's first extent in the header, and make the checksum right again.
  uint64_t described = 0;
  std::memcpy(&described, bytes.data() + 20, 8);
  v1::StageCheckpoint head;
  ASSERT_TRUE(head.ParseFromString(bytes.substr(28, described)));
  head.mutable_params(0)->mutable_tensor()->set_shape(0, 4000);
  std::string grown = head.SerializeAsString();
  std::string payload(8, '\0');
  const uint64_t n = grown.size();
  std::memcpy(payload.data(), &n, 8);
  payload += grown + bytes.substr(28 + described, bytes.size() - 28 - described - 4);
  std::string file = bytes.substr(0, 12);
  const uint64_t length = payload.size();
  file.append(reinterpret_cast<const char*>(&length), 8);
  file += payload;
  const uint32_t crc = static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0),
                                                   reinterpret_cast<const Bytef*>(payload.data()),
                                                   static_cast<uInt>(payload.size())));
  file.append(reinterpret_cast<const char*>(&crc), 4);
  std::ofstream(dir.file("grown.ckpt"), std::ios::binary) << file;
  auto c = MakeStage(*cpu, 7);
  const auto before = State(*c);
  st = LoadStageFile(*c, dir.file("grown.ckpt"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("shapes give"), std::string::npos) << st;
  EXPECT_EQ(State(*c), before);
}

TEST(Checkpoint, AnInconsistentSnapshotIsRefusedWithoutTouchingTheStage) {
  auto cpu = MakeCpuBackend();
  auto a = MakeStage(*cpu, 1), b = MakeStage(*cpu, 2);
  v1::StageCheckpoint c = SnapshotStageState(*a, 0, 0);
  auto before = State(*b);
  // The second parameter (the bias) claims int32 data of the right shape (found by fuzzing).
  v1::Tensor* bias = c.mutable_params(1)->mutable_tensor();
  bias->set_dtype(v1::I32);
  absl::Status st = RestoreStageState(*b, c, "snapshot");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("is not F32"), std::string::npos) << st;
  EXPECT_EQ(State(*b), before) << "nothing was applied, not even the first (valid) tensor";
}

// A worker's snapshot restores only when it is exactly the one the manifest recorded.
TEST(Checkpoint, ASnapshotRestoresOnlyWhenItMatchesTheManifestNamingStageAndFile) {
  auto cpu = MakeCpuBackend();
  DataDir worker;
  auto a = MakeStage(*cpu, 1), b = MakeStage(*cpu, 2);
  const EpochProgress progress{HeadStats{5.5, 3, 8}, 1.25};
  absl::StatusOr<v1::StageSnapshot> snap =
      SaveStageSnapshot(*a, 3, 10, progress, "run-a", worker.path_string(), 7);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->file(), "ckpt-000007/stage-3.ckpt");
  EXPECT_EQ(snap->bytes(),
            static_cast<int64_t>(std::filesystem::file_size(worker.file(snap->file()))));
  EpochProgress restored;
  ASSERT_TRUE(
      RestoreStageSnapshot(b.get(), 3, worker.path_string(), *snap, "run-a", &restored).ok());
  EXPECT_EQ(State(*a), State(*b));
  EXPECT_EQ(restored.head.count, 8);
  EXPECT_EQ(restored.head.loss_sum, 5.5);
  EXPECT_EQ(restored.train_seconds, 1.25);
  auto refused = [&](const v1::StageSnapshot& want, const std::string& fingerprint,
                     const std::string& text) {
    EpochProgress p;
    absl::Status st = RestoreStageSnapshot(b.get(), 3, worker.path_string(), want, fingerprint, &p);
    EXPECT_TRUE(absl::IsDataLoss(st)) << st;
    EXPECT_NE(st.message().find("stage 3, checkpoint 7: "), std::string::npos) << st;
    EXPECT_NE(st.message().find(text), std::string::npos) << st;
  };
  refused(*snap, "run-b", "written by another run");
  v1::StageSnapshot other = *snap;
  other.set_crc32(snap->crc32() ^ 1);
  refused(other, "run-a", "the manifest says");
  Flip(worker.file(snap->file()), 5);
  refused(*snap, "run-a", "checksum mismatch");
  std::filesystem::remove(worker.file(snap->file()));
  refused(*snap, "run-a", worker.file(snap->file()));  // the volume lost its file
  // Pruning keeps the snapshots of the checkpoints still kept.
  for (uint64_t id : {8, 9})
    ASSERT_TRUE(SaveStageSnapshot(*a, 3, 1, progress, "r", worker.path_string(), id).ok());
  PruneSnapshots(worker.path_string(), {9});
  EXPECT_FALSE(std::filesystem::exists(worker.file("ckpt-000008")));
  EXPECT_TRUE(std::filesystem::exists(worker.file("ckpt-000009/stage-3.ckpt")));
}

TEST(Checkpoint, FindsTheNewestCommittedCheckpointOfThisRunPastDamagedOnesAndPrunes) {
  DataDir root;
  for (uint64_t id = 1; id <= 5; ++id) {
    std::string dir = root.path_string() + "/" + CheckpointDirName(id);
    std::filesystem::create_directories(dir);
    if (id == 5) continue;  // never committed: no manifest
    v1::CheckpointManifest m;
    m.set_id(id);
    m.set_step(static_cast<int64_t>(10 * id));
    m.set_fingerprint(id == 4 ? "another" : "this");
    ASSERT_TRUE(WriteManifest(dir, m).ok());
  }
  Flip(root.path_string() + "/" + CheckpointDirName(3) + "/MANIFEST", 2);  // damage it
  std::filesystem::create_directories(root.path_string() + "/ckpt-junk");
  absl::StatusOr<FoundCheckpoint> f = FindLatestCheckpoint(root.path_string(), "this");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->manifest.id(), 2u);
  EXPECT_EQ(f->manifest.step(), 20);
  EXPECT_EQ(f->uncommitted, 1);  // ckpt 5: no manifest, not damaged
  ASSERT_EQ(f->skipped.size(), 2u);
  EXPECT_NE(f->skipped[0].find("another run's"), std::string::npos) << f->skipped[0];
  EXPECT_NE(f->skipped[1].find("checksum mismatch"), std::string::npos) << f->skipped[1];
  RemoveUncommittedCheckpoints(root.path_string());
  EXPECT_FALSE(std::filesystem::exists(root.path_string() + "/" + CheckpointDirName(5)));
  // A damaged manifest takes no kept slot: keeping 2 keeps 4 and 2, and removes 3 and 1.
  PruneCheckpoints(root.path_string(), 2);
  EXPECT_TRUE(std::filesystem::exists(root.path_string() + "/" + CheckpointDirName(4)));
  EXPECT_TRUE(std::filesystem::exists(root.path_string() + "/" + CheckpointDirName(2)));
  EXPECT_FALSE(std::filesystem::exists(root.path_string() + "/" + CheckpointDirName(3)));
  EXPECT_FALSE(std::filesystem::exists(root.path_string() + "/" + CheckpointDirName(1)));
  EXPECT_TRUE(absl::IsNotFound(FindLatestCheckpoint(root.path_string() + "/none").status()));
}

}  // namespace
}  // namespace localpar
