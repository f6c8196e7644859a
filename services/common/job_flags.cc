// Job-override flags shared by localpar and localpar_coordinator.
#include "services/common/job_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, rule, "",
          "Override the job's update rule: BACKPROP, GREEDY, CHUNKED or OVERLAP");
ABSL_FLAG(int, epochs, 0, "Override the job's epoch count (0: keep the job's)");
ABSL_FLAG(int64_t, max_steps, 0, "Stop after this many training steps (0: keep the job's)");
ABSL_FLAG(int64_t, seed, -1, "Override the job's seed (-1: keep the job's)");
ABSL_FLAG(int, stages, 0,
          "Regroup the job's stages into this many, merging consecutive stages (each group keeps "
          "its last stage's head); 0: keep the job's. plan: the number of stages to propose");

namespace localpar {

void JobOverridesFromFlags(CoordinatorOptions* o) {
  o->rule = absl::GetFlag(FLAGS_rule);
  o->epochs = absl::GetFlag(FLAGS_epochs);
  o->max_steps = absl::GetFlag(FLAGS_max_steps);
  o->seed = absl::GetFlag(FLAGS_seed);
  o->stages = absl::GetFlag(FLAGS_stages);
}

}  // namespace localpar
