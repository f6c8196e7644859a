// The coordinator's checkpointer on its own, over a real directory: a marker per
// checkpoint, a commit once every stage reported its snapshot, nothing half-written left
// behind, fresh runs kept apart from old ones, and the newest one found to resume.
#include "services/coordinator/checkpointer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "common/job/parse.h"
#include "services/common/program_config.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::DataDir;

struct Fixture {
  DataDir dir;
  v1::CoordinatorConfig config = CoordinatorDefaults();
  v1::Job job;
  std::ostringstream log;
  std::unique_ptr<RunLedger> ledger;
  std::unique_ptr<Checkpointer> checkpointer;
  explicit Fixture(int keep = 2) {
    absl::StatusOr<v1::Job> j = ParseJob(R"(
name: "ckpt" rule: GREEDY batch_size: 2
data { synthetic { train_examples: 8 test_examples: 2 shape: [2] classes: 2 } }
stages { layers { linear { out_features: 2 } } }
stages { layers { linear { out_features: 2 } } }
)",
                                         "ckpt.textproto");
    EXPECT_TRUE(j.ok()) << j.status();
    job = *j;
    config.set_checkpoint_dir(dir.path_string());
    config.set_keep_checkpoints(keep);
    LedgerOptions o;
    o.progress = false;
    o.log = &log;
    ledger = *RunLedger::Open(job, 8, 2, o);
    checkpointer =
        std::make_unique<Checkpointer>(config, job, "f1ngerpr1nt", nullptr, *ledger, log);
  }
  // Starts a checkpoint after `step` as marker `seq` and reports the snapshots of `stages`.
  uint64_t Start(uint64_t seq, int64_t step, int stages) {
    std::optional<v1::DownItem> marker =
        checkpointer->Start(seq, step, DataCursor{step, 0, step}, 2.0 * step);
    EXPECT_TRUE(marker.has_value());
    const uint64_t id = marker->control().checkpoint_id();
    for (int k = 0; k < stages; ++k) {
      v1::StageSaved saved;
      saved.set_seq(seq);
      saved.mutable_snapshot()->set_stage(k);
      saved.mutable_snapshot()->set_checkpoint_id(id);
      saved.mutable_snapshot()->set_file(CheckpointDirName(id) + "/stage-" + std::to_string(k) +
                                         ".ckpt");
      EXPECT_TRUE(checkpointer->OnSaved(saved));
    }
    return id;
  }
};

TEST(Checkpointer, CommitsOnceEveryStageSavedAndTheMarkerCameBack) {
  Fixture f;
  const uint64_t id = f.Start(10, 2, 2);
  EXPECT_EQ(id, 1u);
  EXPECT_EQ(f.ledger->last_checkpoint_step(), 2);
  EXPECT_TRUE(f.checkpointer->last_committed().empty());
  EXPECT_TRUE(f.checkpointer->OnAck(10));
  EXPECT_FALSE(f.checkpointer->OnAck(11));  // not a checkpoint's marker
  EXPECT_EQ(f.checkpointer->committed(), 1);
  absl::StatusOr<v1::CheckpointManifest> m =
      ReadManifest(f.dir.path_string() + "/" + CheckpointDirName(id));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step(), 2);
  EXPECT_EQ(m->stages_size(), 2);
  EXPECT_EQ(m->fingerprint(), "f1ngerpr1nt");
  v1::RunReport history;
  ASSERT_TRUE(history.ParseFromString(m->report()));
  EXPECT_EQ(history.train_examples(), 4);
}

TEST(Checkpointer, AStageThatDidNotReportOrFailedLeavesNothingBehind) {
  Fixture f;
  const uint64_t missing = f.Start(10, 2, /*stages=*/1);
  EXPECT_TRUE(f.checkpointer->OnAck(10));
  EXPECT_FALSE(std::filesystem::exists(f.dir.path_string() + "/" + CheckpointDirName(missing)));
  EXPECT_NE(f.log.str().find("stage 1 did not report its snapshot"), std::string::npos)
      << f.log.str();
  const uint64_t failed = f.Start(11, 4, 2);
  v1::ItemError e;
  e.set_seq(11);
  e.set_stage(1);
  e.set_message("disk full\x1b[2J");
  EXPECT_TRUE(f.checkpointer->OnError(e));
  EXPECT_FALSE(std::filesystem::exists(f.dir.path_string() + "/" + CheckpointDirName(failed)));
  EXPECT_EQ(f.log.str().find('\x1b'), std::string::npos);  // peer text is never printed raw
  EXPECT_EQ(f.checkpointer->committed(), 0);
}

TEST(Checkpointer, AFreshRunRefusesADirectoryWithCheckpointsAndResumeFindsTheNewest) {
  Fixture f(/*keep=*/2);
  for (uint64_t seq = 10; seq < 13; ++seq) {
    f.Start(seq, 2 * static_cast<int64_t>(seq - 9), 2);
    ASSERT_TRUE(f.checkpointer->OnAck(seq));
  }
  EXPECT_EQ(CommittedCheckpoints(f.dir.path_string()).size(), 2u);  // the oldest pruned
  EXPECT_TRUE(absl::IsFailedPrecondition(f.checkpointer->CheckFresh()));
  Fixture again;
  again.config.set_checkpoint_dir(f.dir.path_string());
  Checkpointer resumed(again.config, again.job, "f1ngerpr1nt", nullptr, *again.ledger, again.log);
  absl::StatusOr<FoundCheckpoint> found = resumed.FindResume(again.log);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step(), 6);
  // Another run's fingerprint finds none of them.
  Checkpointer other(again.config, again.job, "another", nullptr, *again.ledger, again.log);
  EXPECT_FALSE(other.FindResume(again.log).ok());
}

}  // namespace
}  // namespace localpar
