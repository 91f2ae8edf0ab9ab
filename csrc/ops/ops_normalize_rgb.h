/* ops_normalize_rgb.h - internal to ops/ (ops_normalize.c): a hand-vectorized row loop for fl_normalize()'s most common case,
 * uint8 RGB pixels (HWC) to float32 planes (CHW), used where the CPU has AVX2 and FMA. */
#ifndef FL_OPS_NORMALIZE_RGB_H
#define FL_OPS_NORMALIZE_RGB_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this CPU can run fl_normalize_rgb_u8_row(), else 0. Never fails. */
int fl_normalize_rgb_u8_available(void);

/* d_ch[x] = src[3x + ch] * a[ch] + b[ch] for x < w, ch < 3 (one fused multiply-add, as the
 * compiler-vectorized loop computes it). Call only where fl_normalize_rgb_u8_available(). */
void fl_normalize_rgb_u8_row(const uint8_t *src, float *d0, float *d1, float *d2, size_t w,
                             const float a[3], const float b[3]);

#endif
