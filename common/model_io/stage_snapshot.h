// A stage's snapshot: its parameters and optimizer state in a file of its own (streamed a
// tensor at a time, so a stage of any size fits), as one worker's part of a checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/nn/stage.h"
#include "proto/checkpoint.pb.h"

namespace localpar {

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

}  // namespace localpar
