// Invariant checks for programmer errors inside the compute core (not for user input).
#pragma once

#include <cstdio>
#include <cstdlib>

// The core has no absl dependency (it must build on a CUDA-only machine), so broken
// invariants report file and line and abort; input validation happens at the edges.
#define LP_CHECK(cond)                                                              \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#define LP_CHECK_MSG(cond, ...)                                                     \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                            \
      std::fprintf(stderr, "\n");                                                   \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)
