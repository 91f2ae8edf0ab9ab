/* fl_error.c - message table and the thread-local detail buffer. */
#include "fl_error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char error_detail[256];

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
    return err;
}

const char *fl_error_detail(void) { return error_detail; }

void fl_error_clear(void) { error_detail[0] = '\0'; }
