// Checkpoint files: a checksummed, versioned container written atomically, the stage
// snapshot inside it, manifests, and finding the newest complete checkpoint.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/nn/stage.h"
#include "proto/checkpoint.pb.h"

namespace localpar {

inline constexpr uint32_t kCheckpointFormatVersion = 1;

// [8-byte magic][u32 version][u64 payload bytes][u32 CRC-32 of payload][payload], written to
// a temporary file, fsynced, then renamed over `path` (and the directory fsynced).
absl::Status WriteChecksummedFile(const std::string& path, const std::string& payload);
// Refuses, naming the file: a missing file, a bad magic, another format version, a length
// that disagrees with the file, or a checksum mismatch.
absl::StatusOr<std::string> ReadChecksummedFile(const std::string& path);

v1::StageCheckpoint SnapshotStageState(Stage& stage, int index, int64_t step);
// Restores parameters and optimizer state; the shapes and names must match the stage.
absl::Status RestoreStageState(Stage& stage, const v1::StageCheckpoint& ckpt,
                               const std::string& source);

// One stage file by path: the snapshot in the checksummed container.
absl::Status SaveStageFile(Stage& stage, int index, int64_t step, const std::string& path);
absl::Status LoadStageFile(Stage& stage, const std::string& path);

// A stage's training figures since its last epoch boundary, kept with its snapshot.
struct EpochProgress {
  HeadStats head;
  double train_seconds = 0;
};

// A worker's snapshot of its stage for checkpoint `id`, under the worker's own storage
// `root`: root/ckpt-NNNNNN/stage-K.ckpt (stage-K-replica-R.ckpt for replica R > 0).
// Returns what the manifest records about it.
absl::StatusOr<v1::StageSnapshot> SaveStageSnapshot(Stage& stage, int index, int64_t step,
                                                    const EpochProgress& progress,
                                                    const std::string& fingerprint,
                                                    const std::string& root, uint64_t id,
                                                    int replica = 0);
// Restores `stage` (and *progress) from the snapshot `want` names under `root`, refusing
// (DATA_LOSS, naming the stage and the file) a missing file, one whose size or checksum
// differs from `want`, a damaged one, or one written by another run (`fingerprint`). A null
// `stage` checks the file the same way and reads only *progress.
absl::Status RestoreStageSnapshot(Stage* stage, int index, const std::string& root,
                                  const v1::StageSnapshot& want, const std::string& fingerprint,
                                  EpochProgress* progress, int replica = 0);
// Replica `replica` of stage `stage`'s snapshot in `manifest`; null when it has none.
const v1::StageSnapshot* FindSnapshot(const v1::CheckpointManifest& manifest, int stage,
                                      int replica);
// Removes the snapshots under `root` whose checkpoint is not in `keep`.
void PruneSnapshots(const std::string& root, const std::vector<uint64_t>& keep);

std::string CheckpointDirName(uint64_t id);  // "ckpt-000042"
// Writes the manifest into `dir` and reads it back: OK only when what is on disk verifies.
absl::Status WriteManifest(const std::string& dir, const v1::CheckpointManifest& manifest);
absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& dir);

struct FoundCheckpoint {
  std::string dir;  // the ckpt-NNNNNN directory
  v1::CheckpointManifest manifest;
  std::vector<std::string> skipped;  // newer checkpoints refused as damaged, with the reason
  int uncommitted = 0;  // newer directories without a MANIFEST (markers still in flight)
};
// The newest checkpoint under `root` whose manifest verifies; with `fingerprint` set, only
// this run's (others are skipped, saying what differs), or with `network` set also one of the
// same network in another layout (CheckpointManifest.network). Stage snapshots are the
// workers' to verify when they restore.
absl::StatusOr<FoundCheckpoint> FindLatestCheckpoint(const std::string& root,
                                                     const std::string& fingerprint = "",
                                                     const std::string& network = "");
// Every committed checkpoint under `root` with a verifying manifest, newest first.
std::vector<FoundCheckpoint> CommittedCheckpoints(const std::string& root);
// A fresh run's check: FailedPrecondition naming the newest checkpoint (job, rule, seed,
// step) when `root` already holds one, and how to go on.
absl::Status CheckNoCheckpoints(const std::string& root);
// Removes all but the newest `keep` committed checkpoints; directories whose manifest does
// not verify do not count as committed, and are removed too.
void PruneCheckpoints(const std::string& root, int keep);
// Removes checkpoint directories that never got a MANIFEST. Only safe when no checkpoint
// is in flight (before training resumes).
void RemoveUncommittedCheckpoints(const std::string& root);

}  // namespace localpar
