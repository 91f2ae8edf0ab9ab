/* fl_error.c - message table and the thread-local detail buffer. */
#include "base/fl_error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char error_detail[1024]; /* room for a path and its context */
static _Thread_local int error_errno;          /* errno behind an FL_ESYS detail, or 0 */

const char *fl_strerror(int err) {
    switch (err) {
    case FL_OK:
        return "success";
#define FL__ERR_MESSAGE(name, msg) \
    case FL_##name:                \
        return msg;
        FL_ERRNO_MAP(FL__ERR_MESSAGE)
#undef FL__ERR_MESSAGE
    default:
        return "unknown error";
    }
}

const char *fl_err_name(int err) {
    switch (err) {
    case FL_OK:
        return "FL_OK";
#define FL__ERR_NAME(name, msg) \
    case FL_##name:             \
        return "FL_" #name;
        FL_ERRNO_MAP(FL__ERR_NAME)
#undef FL__ERR_NAME
    default:
        return "FL_UNKNOWN";
    }
}

int fl_error_set(int err, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(error_detail, sizeof error_detail, fmt, args);
    va_end(args);
    error_errno = 0;
    return err;
}

int fl_error_sys(const char *fmt, ...) {
    int saved = errno;
    va_list args;
    va_start(args, fmt);
    int used = vsnprintf(error_detail, sizeof error_detail, fmt, args);
    va_end(args);
    if (used >= 0 && (size_t)used < sizeof error_detail)
        snprintf(error_detail + used, sizeof error_detail - (size_t)used, ": %s", strerror(saved));
    error_errno = saved;
    return FL_ESYS;
}

int fl_error_errno(void) { return error_errno; }

void fl_error_set_errno(int sys_errno) { error_errno = sys_errno; }

int fl_error_prefix(int err, const char *fmt, ...) {
    char previous[sizeof error_detail], context[128];
    snprintf(previous, sizeof previous, "%s", error_detail); /* the detail is also the target */
    va_list args;
    va_start(args, fmt);
    vsnprintf(context, sizeof context, fmt, args);
    va_end(args);
    const char *reason = previous[0] ? previous : fl_strerror(err);
    size_t used = strlen(context), room = sizeof error_detail - 1;
    memcpy(error_detail, context, used);
    memcpy(error_detail + used, ": ", 2); /* context is under 128 bytes: this fits */
    used += 2;
    size_t tail = strlen(reason) < room - used ? strlen(reason) : room - used; /* truncate */
    memcpy(error_detail + used, reason, tail);
    error_detail[used + tail] = '\0';
    return err;
}

const char *fl_error_detail(void) { return error_detail; }

void fl_error_clear(void) {
    error_detail[0] = '\0';
    error_errno = 0;
}
