// Defaults: every zero-valued field with a documented default, filled in one pass.
#include "common/job/defaults.h"

#include "common/data/dataset.h"
#include "common/job/data_source.h"
#include "common/job/layer_spec.h"

namespace localpar {

void ApplyJobDefaults(v1::Job& job) {
  if (job.name().empty()) job.set_name("job");
  if (job.batch_size() == 0) job.set_batch_size(128);
  // Unset epochs with max_steps set: as many as max_steps takes (TotalSteps).
  if (job.epochs() == 0 && job.max_steps() <= 0) job.set_epochs(1);
  if (job.micro_batches() == 0) job.set_micro_batches(1);
  if (job.replicas() == 0) job.set_replicas(1);
  ApplyReplicaSyncDefaults(job);
  if (job.eval_batch_size() == 0) job.set_eval_batch_size(1000);
  v1::Data* data = job.mutable_data();
  if (data->source_case() == v1::Data::SOURCE_NOT_SET) data->mutable_fashion_mnist();
  DataSourceOf(*data).Defaults(data);
  if (job.optimizer().kind_case() == v1::Optimizer::KIND_NOT_SET) {
    job.mutable_optimizer()->mutable_adamw();
  }
  if (job.optimizer().has_adamw()) {
    v1::AdamW* a = job.mutable_optimizer()->mutable_adamw();
    if (a->beta1() == 0.0f) a->set_beta1(0.9f);
    if (a->beta2() == 0.0f) a->set_beta2(0.999f);
    if (a->eps() == 0.0f) a->set_eps(1e-8f);
  }
  if (job.schedule().lr() == 0.0f) job.mutable_schedule()->set_lr(1e-3f);
  for (v1::Stage& st : *job.mutable_stages()) {
    for (v1::Layer& l : *st.mutable_layers()) ApplyLayerSpecDefaults(&l);
    if (st.head().kind() == v1::Head::MLP && st.head().hidden() == 0) {
      st.mutable_head()->set_hidden(256);
    }
    if (st.head().kind() == v1::Head::CONV_POOL_LINEAR && st.head().channels() == 0) {
      st.mutable_head()->set_channels(32);
    }
  }
}

void ApplyReplicaSyncDefaults(v1::Job& job) {
  if (job.replica_sync().every() > 1) {
    v1::ReplicaSync* sync = job.mutable_replica_sync();
    if (!sync->has_outer_lr()) sync->set_outer_lr(0.7f);  // the DiLoCo paper's
    if (!sync->has_outer_momentum()) sync->set_outer_momentum(0.9f);
  } else if (!job.replica_sync().has_outer_lr() && !job.replica_sync().has_outer_momentum() &&
             !job.replica_sync().bf16()) {
    job.clear_replica_sync();  // every step: the gradient exchange, no outer step
  }
}

}  // namespace localpar
