/* fl_time.c - monotonic clock and condition-variable deadlines. */
#include "base/fl_time.h"

#include <errno.h>

#include "base/fl_error.h"

double fl_monotonic(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

double fl_wall_time(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

struct timespec fl_deadline_after(double seconds) {
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (!(seconds > 0)) /* negative or NaN: now (a NaN would be undefined to cast) */
        seconds = 0;
    if (seconds > 1e9) /* keeps tv_sec far from overflow; ~31 years is "forever" */
        seconds = 1e9;
    time_t whole = (time_t)seconds;
    long nanos = (long)((seconds - (double)whole) * 1e9);
    deadline.tv_sec += whole;
    deadline.tv_nsec += nanos;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    return deadline;
}

int fl_cond_init(pthread_cond_t *cond) {
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return FL_ESYS;
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return rc == 0 ? FL_OK : FL_ESYS;
}

int fl_cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mutex,
                       const struct timespec *deadline) {
    if (deadline == NULL) {
        pthread_cond_wait(cond, mutex);
        return FL_OK;
    }
    return pthread_cond_timedwait(cond, mutex, deadline) == ETIMEDOUT ? FL_ETIMEDOUT : FL_OK;
}
