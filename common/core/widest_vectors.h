// LP_WIDEST_VECTORS: an elementwise CPU loop compiled for AVX-512, AVX2 and x86-64's
// baseline (GCC's target_clones); the loader picks the widest the CPU has. Each lane does
// the scalar code's operations in its order, so every width gives the same bits, provided
// the file is compiled with -ffp-contract=off: AVX2 and AVX-512 machines have FMA, and a
// fused multiply-add rounds once where the scalar code rounds twice. Loops that sum across
// elements are not vectorised by the compiler (that would reorder the sum), so they gain
// nothing from it and should not use it.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define LP_WIDEST_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LP_WIDEST_VECTORS
#endif
