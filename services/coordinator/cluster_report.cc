// Cluster reports.
#include "services/coordinator/cluster_report.h"

#include <algorithm>

namespace localpar {
namespace {

void SetHead(int stage, const v1::HeadStatistics& s, v1::HeadFigures* out) {
  out->set_stage(stage);
  out->set_loss(s.count() ? s.loss_sum() / s.count() : 0.0);
  out->set_accuracy(s.count() ? s.correct() / s.count() : 0.0);
  out->set_examples(static_cast<double>(s.count()));
}

v1::StageFigures StageFiguresOf(int k, const v1::StatsResponse& s) {
  v1::StageFigures f;
  f.set_stage(k);
  double busy = 0;
  for (const auto& e : s.epochs()) busy += e.train_seconds();
  f.set_examples_per_second(busy > 0 ? s.examples() / busy : 0);
  f.set_resident_bytes(static_cast<double>(s.resident_bytes()));
  if (s.epochs_size() > 0) {
    f.set_resident_bytes_first_epoch(static_cast<double>(s.epochs(0).resident_bytes()));
  }
  f.set_queue_max_depth(static_cast<int32_t>(s.queue_max_depth()));
  f.set_queue_capacity(static_cast<int32_t>(s.queue_capacity()));
  f.set_overlap_max_delay(static_cast<int32_t>(s.overlap_max_delay_seen()));
  f.set_overlap_mean_delay(s.overlap_mean_delay());
  int64_t rejected = 0;
  for (const auto& [reason, n] : s.rejected()) rejected += n;
  f.set_rejected(static_cast<double>(rejected));
  f.set_baseline_bytes(static_cast<double>(s.baseline_bytes()));
  f.set_state_bytes(static_cast<double>(s.state_bytes()));
  f.set_activation_bytes_per_example(static_cast<double>(s.activation_bytes_per_example()));
  for (const auto& e : s.epochs())
    f.add_resident_bytes_by_epoch(static_cast<double>(e.resident_bytes()));
  *f.mutable_phase_seconds() = s.phase_seconds();
  f.set_bytes_received(static_cast<double>(s.bytes_received()));
  f.set_bytes_sent(static_cast<double>(s.bytes_sent()));
  return f;
}

}  // namespace

void AddClusterFigures(const std::vector<v1::StatsResponse>& stats,
                       const std::map<int, std::vector<v1::StatsResponse>>& at_epoch_end,
                       const v1::RunReport& before, int epochs, v1::RunReport* report) {
  const int stages = static_cast<int>(stats.size());
  for (int e = 1; e <= epochs; ++e) {
    auto it = at_epoch_end.find(e);
    auto inherited = std::find_if(before.epochs().begin(), before.epochs().end(),
                                  [&](const v1::EpochFigures& f) { return f.epoch() == e; });
    if (it == at_epoch_end.end() && inherited != before.epochs().end()) {
      *report->add_epochs() = *inherited;
      continue;
    }
    const std::vector<v1::StatsResponse>& source =
        it != at_epoch_end.end() && static_cast<int>(it->second.size()) == stages ? it->second
                                                                                  : stats;
    v1::EpochFigures* ef = report->add_epochs();
    ef->set_epoch(e);
    for (int k = 0; k < stages; ++k) {
      v1::HeadFigures* train = ef->add_train();
      v1::HeadFigures* test = ef->add_test();
      train->set_stage(k);
      test->set_stage(k);
      for (const auto& es : source[k].epochs()) {
        if (es.epoch() != e) continue;
        SetHead(k, es.train(), train);
        SetHead(k, es.eval(), test);
        ef->set_seconds(std::max(ef->seconds(), es.train_seconds()));
      }
    }
  }
  for (int k = 0; k < stages; ++k) *report->add_stage_reports() = StageFiguresOf(k, stats[k]);
}

v1::Trace ClusterTrace(const std::vector<v1::StatsResponse>& stats) {
  v1::Trace trace;
  for (size_t k = 0; k < stats.size(); ++k) {
    v1::StageTrace* st = trace.add_stages();
    st->set_stage(static_cast<int>(k));
    for (const v1::Interval& iv : stats[k].intervals()) {
      v1::TraceInterval* t = st->add_intervals();
      t->set_seq(static_cast<double>(iv.seq()));
      t->set_start_ns(static_cast<double>(iv.start_ns()));
      t->set_end_ns(static_cast<double>(iv.end_ns()));
    }
  }
  return trace;
}

}  // namespace localpar
