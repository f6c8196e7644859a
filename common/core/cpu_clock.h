// CPU time of this process and of the calling thread (POSIX clocks): what a program spends
// set against what its layers compute (the framework-cost figures in report.json).
#pragma once

#include <time.h>

namespace localpar {

inline double ClockSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
inline double ProcessCpuSeconds() { return ClockSeconds(CLOCK_PROCESS_CPUTIME_ID); }
inline double ThreadCpuSeconds() { return ClockSeconds(CLOCK_THREAD_CPUTIME_ID); }

}  // namespace localpar
