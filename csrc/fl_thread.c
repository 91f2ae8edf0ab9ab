/* fl_thread.c - thread creation with every signal blocked. */
#include "fl_thread.h"

#include <signal.h>

#include "fl_error.h"

int fl_thread_start(pthread_t *thread, void *(*main)(void *), void *arg) {
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous); /* the new thread inherits this mask */
    int rc = pthread_create(thread, NULL, main, arg);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    return rc == 0 ? FL_OK : FL_ESYS;
}
