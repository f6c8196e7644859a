// Checkpoints: their directories and manifests, and finding the newest complete one.
#include "common/model_io/checkpoint.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model_io/checkpoint_file.h"

namespace localpar {

std::vector<std::pair<uint64_t, std::string>> CheckpointDirectories(const std::string& root) {
  std::vector<std::pair<uint64_t, std::string>> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    uint64_t id = 0;
    if (!e.is_directory() || name.rfind("ckpt-", 0) != 0 ||
        !absl::SimpleAtoi(name.substr(5), &id)) {
      continue;
    }
    dirs.emplace_back(id, e.path().string());
  }
  std::sort(dirs.rbegin(), dirs.rend());
  return dirs;
}

std::string CheckpointDirName(uint64_t id) { return absl::StrFormat("ckpt-%06d", id); }

absl::Status WriteManifest(const std::string& dir, const v1::CheckpointManifest& m) {
  if (absl::Status s = WriteChecksummedFile(dir + "/MANIFEST", m.SerializeAsString()); !s.ok()) {
    return s;
  }
  absl::StatusOr<v1::CheckpointManifest> back = ReadManifest(dir);
  if (!back.ok()) return back.status();
  if (back->SerializeAsString() != m.SerializeAsString()) {
    return absl::DataLossError(absl::StrCat(dir, "/MANIFEST: reads back different"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& dir) {
  absl::StatusOr<std::string> payload = ReadChecksummedFile(dir + "/MANIFEST");
  if (!payload.ok()) return payload.status();
  v1::CheckpointManifest m;
  if (!m.ParseFromString(*payload)) {
    return absl::DataLossError(absl::StrCat(dir, "/MANIFEST: unreadable"));
  }
  return m;
}

std::vector<FoundCheckpoint> CommittedCheckpoints(const std::string& root) {
  std::vector<FoundCheckpoint> out;
  for (const auto& [id, dir] : CheckpointDirectories(root)) {
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(dir);
    if (!m.ok() || m->id() != id) continue;
    out.push_back(FoundCheckpoint{dir, *std::move(m), {}, 0});
  }
  return out;
}

std::pair<std::string, uint64_t> SplitResumePath(const std::string& path) {
  const std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  const std::string name = (p.has_filename() ? p : p.parent_path()).filename().string();
  uint64_t id = 0;
  if (name.size() == 11 && absl::StartsWith(name, "ckpt-") &&
      absl::SimpleAtoi(name.substr(5), &id) && id > 0) {
    const std::filesystem::path dir = (p.has_filename() ? p : p.parent_path()).parent_path();
    return {dir.empty() ? std::string(".") : dir.string(), id};
  }
  return {path, 0};
}

absl::StatusOr<FoundCheckpoint> FindLatestCheckpoint(const std::string& root,
                                                     const std::string& fingerprint,
                                                     const std::string& network, uint64_t only) {
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) {
    return absl::NotFoundError(absl::StrCat(root, ": no such directory"));
  }
  FoundCheckpoint found;
  for (const auto& [id, dir] : CheckpointDirectories(root)) {
    if (only != 0 && id != only) continue;
    if (!std::filesystem::exists(dir + "/MANIFEST")) {
      if (only != 0) {
        return absl::NotFoundError(absl::StrCat(dir, ": never committed (no MANIFEST)"));
      }
      ++found.uncommitted;
      continue;
    }
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(dir);
    if (!m.ok()) {
      found.skipped.push_back(std::string(m.status().message()));
      continue;
    }
    if (m->id() != id) {
      found.skipped.push_back(absl::StrCat(dir, "/MANIFEST: says checkpoint ", m->id()));
      continue;
    }
    const bool same_network = !network.empty() && m->network() == network;
    if (!fingerprint.empty() && m->fingerprint() != fingerprint && !same_network) {
      found.skipped.push_back(absl::StrCat(dir, ": another run's (job ", m->job(), ", rule ",
                                           m->rule(), ", seed ", m->seed(), ", fingerprint ",
                                           m->fingerprint(), ")"));
      continue;
    }
    found.dir = dir;
    found.manifest = *std::move(m);
    return found;
  }
  std::string why = found.skipped.empty() ? "" : absl::StrCat(" (refused: ", found.skipped[0], ")");
  if (only != 0) {
    return absl::NotFoundError(
        absl::StrCat(root, "/", CheckpointDirName(only), ": no such complete checkpoint", why));
  }
  return absl::NotFoundError(absl::StrCat(root, ": no complete checkpoint", why));
}

void RemoveUncommittedCheckpoints(const std::string& root) {
  for (const auto& [id, dir] : CheckpointDirectories(root)) {
    std::error_code ec;
    if (!std::filesystem::exists(dir + "/MANIFEST")) std::filesystem::remove_all(dir, ec);
  }
}

absl::Status CheckNoCheckpoints(const std::string& root) {
  std::vector<FoundCheckpoint> found = CommittedCheckpoints(root);
  if (found.empty()) return absl::OkStatus();
  const v1::CheckpointManifest& m = found.front().manifest;
  return absl::FailedPreconditionError(
      absl::StrCat(root, " already holds checkpoints (the newest, ", found.front().dir, ", of job ",
                   m.job(), ", rule ", m.rule(), ", seed ", m.seed(), ", at step ", m.step(),
                   "); continue it with --resume, or give this run another --checkpoint_dir"));
}

void PruneCheckpoints(const std::string& root, int keep) {
  int kept = 0;
  for (const auto& [id, dir] : CheckpointDirectories(root)) {
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(dir);
    const bool committed = m.ok() && m->id() == id;
    if (!committed && !std::filesystem::exists(dir + "/MANIFEST")) continue;  // in flight
    std::error_code ec;
    if (!committed || kept >= std::max(keep, 1)) {
      std::filesystem::remove_all(dir, ec);
    } else {
      ++kept;
    }
  }
}

}  // namespace localpar