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

absl::Status SaveStageFile(Stage& stage, int index, int64_t step, const std::string& path);
absl::Status LoadStageFile(Stage& stage, const std::string& path);

std::string CheckpointDirName(uint64_t id);  // "ckpt-000042"
absl::Status WriteManifest(const std::string& dir, const v1::CheckpointManifest& manifest);

struct FoundCheckpoint {
  std::string dir;  // the ckpt-NNNNNN directory
  v1::CheckpointManifest manifest;
  std::vector<std::string> skipped;  // newer checkpoints refused as damaged, with the reason
  int uncommitted = 0;  // newer directories without a MANIFEST (markers still in flight)
};
// The newest checkpoint under `root` whose manifest and every stage file verify.
absl::StatusOr<FoundCheckpoint> FindLatestCheckpoint(const std::string& root);
// Removes all but the newest `keep` committed checkpoints.
void PruneCheckpoints(const std::string& root, int keep);
// Removes checkpoint directories that never got a MANIFEST. Only safe when no checkpoint
// is in flight (before training resumes).
void RemoveUncommittedCheckpoints(const std::string& root);

}  // namespace localpar
