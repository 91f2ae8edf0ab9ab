/* fl_thread.c - thread creation with every signal blocked. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "base/fl_thread.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/fl_error.h"

int fl_thread_start(pthread_t *thread, void *(*main)(void *), void *arg) {
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous); /* the new thread inherits this mask */
    int rc = pthread_create(thread, NULL, main, arg);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    return rc == 0 ? FL_OK : FL_ESYS;
}

void fl_thread_background(void) {
#ifdef SYS_gettid
    /* Linux keeps a nice value per thread: PRIO_PROCESS with a thread id sets just this one */
    int tid = (int)syscall(SYS_gettid);
    int current = getpriority(PRIO_PROCESS, (id_t)tid);
    if (current < 10)
        setpriority(PRIO_PROCESS, (id_t)tid, 10);
#endif
}

void fl_thread_name(const char *name) {
    char kept[16];
    snprintf(kept, sizeof kept, "%s", name); /* Linux refuses names over 15 bytes outright */
    pthread_setname_np(pthread_self(), kept);
}

int fl_thread_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int)online : 1;
}
