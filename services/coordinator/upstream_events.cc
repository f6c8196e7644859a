// The coordinator's upstream events.
#include "services/coordinator/upstream_events.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "services/common/peer_text.h"
#include "services/coordinator/coordinator_metrics.h"

namespace localpar {
namespace {

absl::Status CheckHead(const v1::HeadStatistics& h, const std::string& field) {
  if (h.count() < 0 || !std::isfinite(h.correct()) || h.correct() < 0 ||
      h.correct() > static_cast<double>(h.count()) || std::isinf(h.loss_sum())) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": count ", h.count(), ", correct ",
                                                   h.correct(), ", loss sum ", h.loss_sum(),
                                                   " do not make sense"));
  }
  return absl::OkStatus();
}

HeadStats ToHeadStats(const v1::HeadStatistics& h) {
  return {h.loss_sum(), h.correct(), h.count()};
}

}  // namespace

absl::StatusOr<Scores> ScoresOf(const v1::Ack& ack, int stages) {
  if (ack.scores_size() != stages) {
    return absl::InvalidArgumentError(absl::StrCat("ack.scores: ", ack.scores_size(),
                                                   " stages' figures for ", stages, " stages"));
  }
  if (ack.epoch() < 1 || ack.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ack: epoch ", ack.epoch(), " and step ", ack.step(), " are out of range"));
  }
  Scores s;
  s.step = ack.step();
  s.epoch = ack.epoch();
  s.interim = ack.interim();
  s.eval.resize(stages);
  s.train.resize(stages);
  std::vector<bool> seen(stages, false);
  for (const v1::StageScore& score : ack.scores()) {
    const int k = score.stage();
    if (k < 0 || k >= stages || seen[k]) {
      return absl::InvalidArgumentError(absl::StrCat("ack.scores: stage ", k,
                                                     " is out of range or "
                                                     "appears twice"));
    }
    seen[k] = true;
    const std::string at = absl::StrCat("ack.scores[stage ", k, "]");
    for (absl::Status st :
         {CheckHead(score.eval(), at + ".eval"), CheckHead(score.train(), at + ".train")}) {
      if (!st.ok()) return st;
    }
    if (!(score.train_seconds() >= 0) || !std::isfinite(score.train_seconds())) {
      return absl::InvalidArgumentError(at + ".train_seconds: must be a finite number >= 0");
    }
    s.eval[k] = ToHeadStats(score.eval());
    s.train[k] = ToHeadStats(score.train());
    s.seconds = std::max(s.seconds, score.train_seconds());
  }
  if (s.interim) {
    s.train.clear();
    s.seconds = -1;
  }
  return s;
}

UpstreamEvents::UpstreamEvents(RunLedger& ledger, Checkpointer& checkpointer, WorkerPool& pool,
                               CoordinatorMetrics* metrics, std::ostream& log)
    : ledger_(ledger), checkpointer_(checkpointer), pool_(pool), metrics_(metrics), log_(log) {}

UpstreamEvents::~UpstreamEvents() {
  if (thread_.joinable()) thread_.join();
}

void UpstreamEvents::Start(PipelineLink& link) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    acked_.clear();
    ended_ = false;
  }
  thread_ = std::thread([this, &link] { Loop(link); });
}

void UpstreamEvents::Stop(PipelineLink& link) {
  if (!thread_.joinable()) return;
  link.Finish();
  thread_.join();
}

void UpstreamEvents::OnAck(const v1::Ack& a) {
  if (a.kind() == v1::Control::END_OF_EVAL) {
    // Every stage has scored this evaluation: its figures came back with the marker.
    absl::StatusOr<Scores> scores = ScoresOf(a, pool_.size());
    if (scores.ok()) {
      ledger_.Scored(*scores);
    } else {
      log_ << "\nlocalpar: the figures of the evaluation at step " << a.step()
           << " are refused: " << scores.status().message() << "\n";
      if (metrics_) metrics_->AddError();
    }
  }
  checkpointer_.OnAck(a.seq());  // commits, if this was a checkpoint's marker
  std::lock_guard<std::mutex> lock(mu_);
  acked_.insert(a.seq());
  acked_cv_.notify_all();
}

void UpstreamEvents::Loop(PipelineLink& link) {
  while (std::optional<v1::UpItem> up = link.Next()) {
    if (up->has_ack()) {
      OnAck(up->ack());
    } else if (up->has_saved()) {
      checkpointer_.OnSaved(up->saved());
    } else if (up->has_error() && up->error().stage() < 0) {
      // Only a worker with no configuration answers as stage -1. Mid-run that is a stage
      // restarted after this link was opened, which its upstream neighbour reached again
      // before anyone saw the old one go: the pipeline is broken even though every stream
      // is still up, and it is recovered (or given up) like any other break.
      if (metrics_) metrics_->AddError();
      if (!link.broken()) {
        log_ << "\nlocalpar: a stage answered item " << up->error().seq()
             << " unconfigured: " << SanitizePeerText(up->error().message()) << "\n";
        link.Break(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "a stage restarted mid-run and lost its configuration"));
      }
    } else if (up->has_error() && !checkpointer_.OnError(up->error())) {
      log_ << "\nlocalpar: " << pool_.Name(up->error().stage(), up->error().replica())
           << " refused item " << up->error().seq() << ": "
           << SanitizePeerText(up->error().message()) << "\n";
      if (metrics_) metrics_->AddError();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  acked_cv_.notify_all();
}

bool UpstreamEvents::WaitAck(uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  acked_cv_.wait(lock, [&] { return ended_ || acked_.count(seq) > 0; });
  return acked_.count(seq) > 0;
}

}  // namespace localpar
