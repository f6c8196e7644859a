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

// Makes `handler` the action for SIGINT and SIGTERM, run on a stack of its own (an
// alternate signal stack for the calling thread, which should be main). A signal's frame
// must never land on the stack the interrupted code was using: oneDNN's JIT GEMM kernels
// point the stack pointer into a heap buffer while they run, and a frame pushed there
// overwrites the heap around it. Every program that handles these signals goes through
// here.
void InstallSignalHandler(void (*handler)(int));

}  // namespace localpar
