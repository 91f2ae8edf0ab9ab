/* fl_thread.h - starting the core's threads. Every thread fastloop starts blocks every
 * signal, so Ctrl-C and other signals reach Python's main thread, whose handlers run there. */
#ifndef FL_THREAD_H
#define FL_THREAD_H

#include <pthread.h>

/* pthread_create() with all signals blocked in the new thread. Returns 0 or FL_ESYS. */
int fl_thread_start(pthread_t *thread, void *(*main)(void *), void *arg);

/* Lowers the calling thread's CPU priority (nice +10 on Linux) so a background thread
 * (a log writer, a sampler) yields to the training threads when cores are contended. Best
 * effort: never fails. */
void fl_thread_background(void);

/* Names the calling thread (up to 15 bytes are kept), as ps, top, gdb and py-spy show it.
 * Best effort: never fails. */
void fl_thread_name(const char *name);

/* The number of CPUs this process may run on (its affinity mask), at least 1. */
int fl_thread_cpus(void);

#endif
