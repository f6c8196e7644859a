// The coordinator's Prometheus metrics.
#include "services/coordinator/coordinator_metrics.h"

namespace localpar {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& r, const std::string& job,
                                       bool checkpoints, int64_t positions)
    : positions_(positions),
      epoch_(BuildGauge()
                 .Name("localpar_epoch")
                 .Help("Epoch the coordinator is feeding (1-based)")
                 .Register(r)
                 .Add({{labels::kJob, job}})),
      progress_(BuildGauge()
                    .Name("localpar_progress_ratio")
                    .Help("Fraction of the job's training steps fed so far")
                    .Register(r)
                    .Add({{labels::kJob, job}})),
      ingested_(BuildCounter()
                    .Name("localpar_ingested_examples_total")
                    .Help("Training examples the coordinator has streamed into the pipeline")
                    .Register(r)
                    .Add({{labels::kJob, job}})),
      errors_(BuildCounter()
                  .Name("localpar_item_errors_total")
                  .Help("In-band item errors that reached the coordinator")
                  .Register(r)
                  .Add({{labels::kJob, job}})),
      checkpoints_(BuildCounter()
                       .Name("localpar_checkpoints_total")
                       .Help("Checkpoints committed (every stage saved, manifest written)")
                       .Register(r)
                       .Add({{labels::kJob, job}})),
      checkpoint_seconds_(BuildHistogram()
                              .Name("localpar_checkpoint_duration_seconds")
                              .Help("From placing a checkpoint marker to its manifest")
                              .Register(r)
                              .Add({{labels::kJob, job}},
                                   prometheus::Histogram::BucketBoundaries{0.01, 0.03, 0.1, 0.3, 1,
                                                                           3, 10, 30, 100})),
      lr_(BuildGauge()
              .Name("localpar_learning_rate")
              .Help("The schedule's learning rate at the step the coordinator last fed")
              .Register(r)
              .Add({{labels::kJob, job}})) {
  // Only where checkpoints are written: without them there is no last one to age.
  if (checkpoints) {
    last_checkpoint_ =
        &BuildGauge()
             .Name("localpar_last_checkpoint_timestamp_seconds")
             .Help(
                 "Unix time of the last committed checkpoint (of the start, before the "
                 "first): time() minus it is the work a failure would lose")
             .Register(r)
             .Add({{labels::kJob, job}});
    last_checkpoint_->SetToCurrentTime();
  }
  // A sequence model's examples are windows; its tokens are what rates compare.
  if (positions > 1) {
    tokens_ = &BuildCounter()
                   .Name("localpar_ingested_tokens_total")
                   .Help("Training tokens (positions of the windows) the coordinator has streamed")
                   .Register(r)
                   .Add({{labels::kJob, job}});
  }
}

}  // namespace localpar
