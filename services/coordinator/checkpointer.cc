// Coordinator checkpoints.
#include "services/coordinator/checkpointer.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace localpar {

using Clock = std::chrono::steady_clock;

Checkpointer::Checkpointer(const v1::CoordinatorConfig& c, const v1::Job& job,
                           CoordinatorMetrics* metrics)
    : dir_(c.checkpoint_dir()),
      every_steps_(c.checkpoint_every_steps()),
      every_seconds_(c.checkpoint_every_seconds()),
      keep_(c.keep_checkpoints()),
      job_(job),
      metrics_(metrics) {}

absl::StatusOr<FoundCheckpoint> Checkpointer::FindResume(std::ostream& log) {
  absl::StatusOr<FoundCheckpoint> found = FindLatestCheckpoint(dir_);
  if (!found.ok()) return found.status();
  for (const std::string& why : found->skipped) {
    log << "localpar: skipping a damaged checkpoint: " << why << "\n";
  }
  if (found->uncommitted > 0) {
    log << "localpar: discarding " << found->uncommitted
        << " newer checkpoint(s) that never committed\n";
  }
  RemoveUncommittedCheckpoints(dir_);
  std::lock_guard<std::mutex> lock(mu_);
  next_id_ = std::max(next_id_, found->manifest.id() + 1);
  last_committed_ = found->dir;
  return found;
}

std::optional<FoundCheckpoint> Checkpointer::RollBack(std::ostream& log) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.clear();  // markers in flight died with the pipeline
  }
  last_started_step_ = -1;
  absl::StatusOr<FoundCheckpoint> found = FindResume(log);
  if (!found.ok()) return std::nullopt;
  return *std::move(found);
}

bool Checkpointer::Due(int64_t step) {
  if (!enabled()) return false;
  if (requested_.exchange(false)) return true;
  if (every_steps_ > 0 && step % every_steps_ == 0) return true;
  return every_seconds_ > 0 &&
         Clock::now() - last_start_ >= std::chrono::duration<double>(every_seconds_);
}

std::optional<v1::DownItem> Checkpointer::Start(uint64_t seq, int64_t step,
                                                const DataCursor& cursor) {
  last_start_ = Clock::now();
  last_started_step_ = step;
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
  }
  const std::string dir = dir_ + "/" + CheckpointDirName(id);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::cerr << "localpar: checkpoint " << dir << ": " << ec.message() << "\n";
    return std::nullopt;
  }
  v1::CheckpointManifest m;
  m.set_id(id);
  m.set_job(job_.name());
  m.set_rule(v1::UpdateRule_Name(job_.rule()));
  m.set_step(step);
  m.set_epoch(cursor.epoch);
  m.set_batch_in_epoch(cursor.batch_in_epoch);
  m.set_seed(job_.seed());
  for (int k = 0; k < job_.stages_size(); ++k)
    m.add_stage_files(absl::StrCat("stage-", k, ".ckpt"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[seq] = Pending{dir, m, Clock::now()};
  }
  v1::DownItem item;
  v1::Control* c = item.mutable_control();
  c->set_seq(seq);
  c->set_kind(v1::Control::CHECKPOINT);
  c->set_path(std::filesystem::absolute(dir).string());
  return item;
}

bool Checkpointer::OnAck(uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = pending_.find(seq);
  if (it == pending_.end()) return false;
  Pending p = std::move(it->second);
  pending_.erase(it);
  lock.unlock();
  p.manifest.set_created_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
  if (absl::Status st = WriteManifest(p.dir, p.manifest); !st.ok()) {
    std::cerr << "\nlocalpar: checkpoint " << p.dir << " not committed: " << st.message() << "\n";
    return true;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - p.started).count();
  lock.lock();
  last_committed_ = p.dir;
  last_commit_ = Clock::now();
  lock.unlock();
  if (metrics_) metrics_->CheckpointCommitted(seconds);
  PruneCheckpoints(dir_, keep_);
  return true;
}

bool Checkpointer::OnError(const v1::ItemError& e) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = pending_.find(e.seq());
  if (it == pending_.end()) return false;
  const std::string dir = it->second.dir;
  pending_.erase(it);
  lock.unlock();
  std::cerr << "\nlocalpar: checkpoint " << dir << " failed at stage " << e.stage() << ": "
            << e.message() << "\n";
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
