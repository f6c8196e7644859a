// The job-override flags (--rule, --epochs, --max_steps, --seed, --stages) that localpar
// and localpar_coordinator both take, defined once.
#pragma once

#include "services/coordinator/coordinator.h"

namespace localpar {

// Copies --rule, --epochs, --max_steps, --seed and --stages into *o.
void JobOverridesFromFlags(CoordinatorOptions* o);

}  // namespace localpar
