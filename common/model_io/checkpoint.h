// Checkpoints: the ckpt-NNNNNN directories, their manifests (written in the checksummed
// container of checkpoint_file.h), and finding the newest complete checkpoint. A stage's own
// snapshot inside a checkpoint is stage_snapshot.h's.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"

namespace localpar {

std::string CheckpointDirName(uint64_t id);  // "ckpt-000042"
// The ids and paths of the ckpt-NNNNNN directories under `root`, newest first.
std::vector<std::pair<uint64_t, std::string>> CheckpointDirectories(const std::string& root);
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
// `only` (a checkpoint id, 0: any) rolls back to that checkpoint: it is the one found, or
// NotFound says why not.
absl::StatusOr<FoundCheckpoint> FindLatestCheckpoint(const std::string& root,
                                                     const std::string& fingerprint = "",
                                                     const std::string& network = "",
                                                     uint64_t only = 0);
// --resume=PATH: a checkpoint directory (the newest checkpoint in it: {PATH, 0}) or one
// checkpoint, DIR/ckpt-NNNNNN ({DIR, N}).
std::pair<std::string, uint64_t> SplitResumePath(const std::string& path);
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
