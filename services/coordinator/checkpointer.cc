// Coordinator checkpoints.
#include "services/coordinator/checkpointer.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/model_io/regroup.h"
#include "services/common/peer_text.h"
#include "services/coordinator/coordinator_metrics.h"

namespace localpar {

using Clock = std::chrono::steady_clock;

Checkpointer::Checkpointer(const v1::CoordinatorConfig& c, const v1::Job& job,
                           std::string fingerprint, CoordinatorMetrics* metrics, RunLedger& ledger,
                           std::ostream& log)
    : dir_(c.checkpoint_dir()),
      keep_(std::max(1, c.keep_checkpoints())),
      job_(job),
      fingerprint_(std::move(fingerprint)),
      local_snapshots_(c.local_snapshots()),
      resume_id_(SplitResumePath(c.resume()).second),
      metrics_(metrics),
      ledger_(ledger),
      log_(log) {}

absl::Status Checkpointer::CheckFresh() const {
  if (!enabled()) return absl::OkStatus();
  return CheckNoCheckpoints(dir_);
}

absl::StatusOr<FoundCheckpoint> Checkpointer::FindResume(std::ostream& log) {
  absl::StatusOr<FoundCheckpoint> found =
      FindCheckpointToResume(dir_, fingerprint_, network_, job_, resume_id_);
  if (!found.ok()) return found.status();
  for (const std::string& why : found->skipped)
    log << "localpar: skipping checkpoint " << why << "\n";
  if (found->uncommitted > 0) {
    log << "localpar: discarding " << found->uncommitted
        << " newer checkpoint(s) that never committed\n";
  }
  RemoveUncommittedCheckpoints(dir_);
  std::lock_guard<std::mutex> lock(mu_);
  for (const FoundCheckpoint& f : CommittedCheckpoints(dir_)) {
    next_id_ = std::max(next_id_, f.manifest.id() + 1);
  }
  if (found->manifest.fingerprint() != fingerprint_) {
    // The same network in another layout: regrouped into a checkpoint of this run.
    absl::StatusOr<RegroupPlan> plan = PlanRegroup(found->manifest, found->dir, job_);
    if (!plan.ok()) return plan.status();
    if (!local_snapshots_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the newest checkpoint, ", found->dir, " (step ", found->manifest.step(),
          "), was written as ", LayoutName(plan->from_stages, plan->from_replicas),
          " and this run is ", LayoutName(plan->to_stages, plan->to_replicas),
          ": regrouping it needs every worker's snapshots on this machine, and these workers "
          "keep them on their own storage; resume with the checkpoint's layout, or regroup "
          "it with `localpar run` or `localpar train --resume` where the snapshots are "
          "together"));
    }
    log_ << "localpar: " << DescribeRegroup(*plan) << "\n";
    const int from_replicas = plan->from_replicas, to_replicas = std::max(1, job_.replicas());
    const uint64_t id = next_id_++;
    absl::StatusOr<FoundCheckpoint> regrouped = WriteRegroupedCheckpoint(
        *found, [&](int k, int r) { return LocalSnapshotDir(dir_, k, r, from_replicas); }, job_,
        fingerprint_, network_,
        [&](int k, int r) { return LocalSnapshotDir(dir_, k, r, to_replicas); }, dir_, id);
    if (!regrouped.ok()) return regrouped.status();
    log_ << "localpar: regrouped into " << regrouped->dir << "\n";
    found = std::move(regrouped);
  }
  last_committed_ = found->dir;
  return found;
}

std::optional<FoundCheckpoint> Checkpointer::OlderThan(uint64_t id) const {
  for (FoundCheckpoint& f : CommittedCheckpoints(dir_)) {
    if (f.manifest.id() < id && f.manifest.fingerprint() == fingerprint_) return std::move(f);
  }
  return std::nullopt;
}

std::optional<FoundCheckpoint> Checkpointer::RollBack(std::ostream& log) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.clear();  // markers in flight died with the pipeline
  }
  ledger_.ForgetCheckpointInFlight();
  absl::StatusOr<FoundCheckpoint> found = FindResume(log);
  if (!found.ok()) return std::nullopt;
  return *std::move(found);
}

// The checkpoints whose snapshots every worker keeps (besides the new one): the committed
// ones kept, and those still in flight. So a failing checkpoint never leaves nothing to
// restore, and one about to commit never loses a stage's snapshot.
std::vector<uint64_t> Checkpointer::KeptIds() const {
  std::vector<uint64_t> ids;
  for (const FoundCheckpoint& f : CommittedCheckpoints(dir_)) {
    if (static_cast<int>(ids.size()) >= keep_) break;
    ids.push_back(f.manifest.id());
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [seq, p] : pending_) ids.push_back(p.manifest.id());
  return ids;
}

void Checkpointer::Skipped(int64_t step) {
  if (said_skipped_) return;
  said_skipped_ = true;
  log_ << "localpar: the checkpoint after step " << step
       << " is skipped: " << kMaxCheckpointsInFlight
       << " earlier ones are still travelling the pipeline, and each worker keeps at most "
          "--keep_checkpoints plus that many snapshot sets (said once per run)\n";
}

std::optional<v1::DownItem> Checkpointer::Start(uint64_t seq, int64_t step,
                                                const DataCursor& cursor, double train_examples) {
  ledger_.CheckpointStarted(step);
  ++started_;
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
  }
  const std::string dir = dir_ + "/" + CheckpointDirName(id);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    log_ << "localpar: checkpoint " << dir << ": " << ec.message() << "\n";
    return std::nullopt;
  }
  Pending p{dir, {}, {}, train_examples, Clock::now()};
  v1::CheckpointManifest& m = p.manifest;
  m.set_id(id);
  m.set_job(job_.name());
  m.set_rule(v1::UpdateRule_Name(job_.rule()));
  m.set_step(step);
  m.set_epoch(cursor.epoch);
  m.set_batch_in_epoch(cursor.batch_in_epoch);
  m.set_seed(job_.seed());
  m.set_fingerprint(fingerprint_);
  m.set_network(network_);
  m.set_job_spec(job_.SerializeAsString());
  v1::DownItem item;
  v1::Control* c = item.mutable_control();
  c->set_seq(seq);
  c->set_kind(v1::Control::CHECKPOINT);
  c->set_checkpoint_id(id);
  for (uint64_t kept : KeptIds()) c->add_keep_checkpoint_ids(kept);
  std::lock_guard<std::mutex> lock(mu_);
  pending_[seq] = std::move(p);
  return item;
}

bool Checkpointer::OnSaved(const v1::StageSaved& saved) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(saved.seq());
  if (it == pending_.end()) return false;
  const v1::StageSnapshot& s = saved.snapshot();
  if (s.stage() >= 0 && s.stage() < job_.stages_size() && s.replica() >= 0 &&
      s.replica() < std::max(1, job_.replicas()) && s.checkpoint_id() == it->second.manifest.id()) {
    it->second.snapshots[{s.stage(), s.replica()}] = s;
  }
  return true;
}

bool Checkpointer::OnAck(uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = pending_.find(seq);
  if (it == pending_.end()) return false;
  Pending p = std::move(it->second);
  pending_.erase(it);
  lock.unlock();
  if (!Commit(p)) {
    std::error_code ec;
    std::filesystem::remove_all(p.dir, ec);  // nothing half-written stays behind
  }
  return true;
}

bool Checkpointer::Commit(Pending& p) {
  const int replicas = std::max(1, job_.replicas());
  p.manifest.set_replicas(replicas);
  for (int k = 0; k < job_.stages_size(); ++k) {
    for (int r = 0; r < replicas; ++r) {
      auto s = p.snapshots.find({k, r});
      if (s == p.snapshots.end()) {
        log_ << "\nlocalpar: checkpoint " << p.dir << " not committed: stage " << k
             << (replicas > 1 ? " replica " + std::to_string(r) : "")
             << " did not report its snapshot\n";
        return false;
      }
      *(r == 0 ? p.manifest.add_stages() : p.manifest.add_replica_stages()) = s->second;
    }
  }
  v1::RunReport history = ledger_.History();
  history.set_train_examples(p.train_examples);
  p.manifest.set_report(history.SerializeAsString());
  p.manifest.set_created_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
  if (absl::Status st = WriteManifest(p.dir, p.manifest); !st.ok()) {
    log_ << "\nlocalpar: checkpoint " << p.dir << " not committed: " << st.message() << "\n";
    return false;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - p.started).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_committed_ = p.dir;
    last_commit_ = Clock::now();
  }
  ++committed_;
  if (metrics_) metrics_->CheckpointCommitted(seconds);
  PruneCheckpoints(dir_, keep_);  // only now that the new one has been read back
  return true;
}

bool Checkpointer::OnError(const v1::ItemError& e) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = pending_.find(e.seq());
  if (it == pending_.end()) return false;
  const std::string dir = it->second.dir;
  pending_.erase(it);
  lock.unlock();
  log_ << "\nlocalpar: checkpoint " << dir << " failed at stage " << e.stage() << ": "
       << SanitizePeerText(e.message()) << "\n";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return true;
}

std::string Checkpointer::last_committed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_committed_;
}

double Checkpointer::seconds_since_commit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::chrono::duration<double>(Clock::now() - last_commit_).count();
}

}  // namespace localpar
