// Interrupts as requests.
#include "services/common/interrupt.h"

#include <signal.h>

namespace localpar {
namespace {

std::atomic<bool> g_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

void OnSignal(int sig) {
  if (g_requested.exchange(true)) {
    // The second one: what the signal would have done without a handler.
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

}  // namespace

void InstallInterruptHandler() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

const std::atomic<bool>& InterruptRequested() { return g_requested; }

}  // namespace localpar
