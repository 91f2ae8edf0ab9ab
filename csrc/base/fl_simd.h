/* fl_simd.h - FL_SIMD_CLONES marks a hot loop for an extra AVX2+FMA build (x86-64-v3)
 * chosen at load time by CPU, so wheels stay portable and still use AVX2 where it exists.
 *
 * Off under ThreadSanitizer: its runtime is not up yet when the ifunc resolvers run.
 */
#ifndef FL_SIMD_H
#define FL_SIMD_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define FL_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FL_SIMD_CLONES
#endif

#endif
