/* fl_time.h - monotonic clock and condition-variable deadlines.
 *
 * Waits in the core take a relative timeout in seconds: < 0 waits forever, 0 does not
 * wait, > 0 waits at most that long. Condition variables made by fl_cond_init() use
 * CLOCK_MONOTONIC, so a wall-clock jump never stretches or cuts a wait.
 */
#ifndef FL_TIME_H
#define FL_TIME_H

#include <pthread.h>
#include <time.h>

/* Seconds on the monotonic clock (arbitrary origin). Never fails. */
double fl_monotonic(void);

/* Seconds since the Unix epoch on the wall clock. Never fails. */
double fl_wall_time(void);

/* The absolute CLOCK_MONOTONIC time `seconds` from now, for pthread_cond_timedwait(). */
struct timespec fl_deadline_after(double seconds);

/* Initializes `cond` to wait on CLOCK_MONOTONIC. Returns 0 or FL_ESYS. */
int fl_cond_init(pthread_cond_t *cond);

/* Waits on `cond` until signalled or `deadline` passes (NULL: no deadline). Returns 0 when
 * woken (possibly spuriously) and FL_ETIMEDOUT when the deadline passed. */
int fl_cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mutex,
                       const struct timespec *deadline);

#endif
