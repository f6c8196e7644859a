// Ctrl-C and SIGTERM as a request, not a kill: the first SIGINT or SIGTERM sets a flag that
// the run polls between steps, so that it can stop at a step boundary and write what it
// has (a checkpoint, the weights and the report so far); a second one ends the process at
// once, as the default action would.
#pragma once

#include <atomic>

namespace localpar {

// Installs the handlers for SIGINT and SIGTERM (once per process).
void InstallInterruptHandler();

// Set by the first signal; never cleared.
const std::atomic<bool>& InterruptRequested();

}  // namespace localpar
