// Interrupts as requests.
#include "services/common/interrupt.h"

#include <signal.h>

#include <cstdlib>

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

// Room for the signal frame with the largest register state x86-64 saves (AVX-512 and AMX
// tiles take about 11 KiB) and the handler's own few calls.
constexpr size_t kSignalStackBytes = 256 << 10;

}  // namespace

void InstallSignalHandler(void (*handler)(int)) {
  // Kept for the life of the process: the kernel uses it whenever a signal arrives.
  static void* const alt = std::malloc(kSignalStackBytes);
  stack_t ss = {};
  ss.ss_sp = alt;
  ss.ss_size = kSignalStackBytes;
  if (alt != nullptr) sigaltstack(&ss, nullptr);
  struct sigaction sa = {};
  sa.sa_handler = handler;
  sa.sa_flags = alt != nullptr ? SA_ONSTACK : 0;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void InstallInterruptHandler() { InstallSignalHandler(OnSignal); }

const std::atomic<bool>& InterruptRequested() { return g_requested; }

}  // namespace localpar
