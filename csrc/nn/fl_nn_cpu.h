/* fl_nn_cpu.h - the CPU implementation of fl_nn_backend (BLAS via fl_blas + C loops). */
#ifndef FL_NN_CPU_H
#define FL_NN_CPU_H

#include "nn/fl_nn_backend.h"

/* The CPU backend table. Its gemm needs a BLAS loaded with fl_blas_load() first. */
const fl_nn_backend *fl_nn_cpu_backend(void);

#endif
