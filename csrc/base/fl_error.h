/* fl_error.h - error codes of the fastloop C core and their messages.
 *
 * Every core call that can fail returns 0 (FL_OK) or one negative fl_err code. The codes
 * and messages come from one X-macro table (FL_ERRNO_MAP), in the manner of libuv's
 * UV_ERRNO_MAP, so the enum and fl_strerror() can never disagree. A call may also leave a
 * detail message (a path, an index, a pid) in a thread-local buffer: fl_error_detail()
 * reads it on the same thread right after the failing call.
 */
#ifndef FL_ERROR_H
#define FL_ERROR_H

#define FL_ERRNO_MAP(X)                                               \
    X(EINVAL, "invalid argument")                                     \
    X(ENOMEM, "out of memory")                                        \
    X(EAGAIN, "would block: queue full or empty")                     \
    X(ETIMEDOUT, "timed out")                                         \
    X(ECLOSED, "closed")                                              \
    X(EINTR, "interrupted")                                           \
    X(ESYS, "system call failed")                                     \
    X(EOVERFLOW, "size overflow")                                     \
    X(EEND, "end of data")                                            \
    X(EWORKER, "a worker process failed")                             \
    X(EUNAVAILABLE, "a library is not available")                     \
    X(ENOTSUP, "not handled by this fast path: take the general one") \
    X(ECUDA, "a CUDA or cuBLAS call failed")                          \
    X(EDECODE, "the data is not a valid image")

/* X-macro expansions inside enums confuse clang-format. */
/* clang-format off */
/* Positions in the table, 1-based; the codes are their negatives. */
enum fl__err_index {
    FL__ERR_INDEX_FIRST = 0,
#define FL__ERR_INDEX(name, msg) FL__ERR_INDEX_##name,
    FL_ERRNO_MAP(FL__ERR_INDEX)
#undef FL__ERR_INDEX
    FL__ERR_INDEX_END
};

typedef enum fl_err {
    FL_OK = 0,
#define FL__ERR_CODE(name, msg) FL_##name = -FL__ERR_INDEX_##name,
    FL_ERRNO_MAP(FL__ERR_CODE)
#undef FL__ERR_CODE
} fl_err;
/* clang-format on */

/* Returns a static message for an fl_err code ("unknown error" for codes outside the table).
 * Never fails, never allocates. */
const char *fl_strerror(int err);

/* Returns the symbolic name ("FL_ETIMEDOUT") of a code, or "FL_UNKNOWN". Never fails. */
const char *fl_err_name(int err);

/* Records a printf-style detail for the last error on this thread (truncated to 1023 bytes)
 * and returns err, so a failing path can say `return fl_error_set(FL_EINVAL, "...")`. */
int fl_error_set(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* fl_error_set() for a failed system call: the detail is the printf-style text, ": " and
 * strerror(errno), and errno is kept for fl_error_errno(). Returns FL_ESYS. */
int fl_error_sys(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The errno behind this thread's last FL_ESYS detail (0 if it has none), so a binding can
 * raise the matching OSError subclass (FileNotFoundError, PermissionError, ...). */
int fl_error_errno(void);

/* Sets the errno fl_error_errno() reports: for an error carried from another thread. */
void fl_error_set_errno(int sys_errno);

/* Prepends printf-style context and ": " to this thread's detail message (which may be
 * empty) and returns err: `return fl_error_prefix(rc, "sample %lld", i)`. */
int fl_error_prefix(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Returns this thread's last detail message ("" if none); valid until the next
 * fl_error_set() or fl_error_clear() on this thread. */
const char *fl_error_detail(void);

/* Forgets this thread's detail message and errno. */
void fl_error_clear(void);

#endif
