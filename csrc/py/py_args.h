/* py_args.h - arguments parsed by declaration (after NumPy's npy_parse_arguments and
 * CPython's Argument Clinic): a binding names each argument once, beside its converter and
 * the C variable it fills, whose initial value is its default.
 *
 *     static fl_arg_cache put_args = FL_ARG_CACHE("put");
 *     PyObject *item, *timeout = Py_None;
 *     int block = 1;
 *     if (fl_parse_args(&put_args, args, nargs, kwnames, FL_ARG("item", OBJECT, &item),
 *                       FL_ARG("|block", BOOL, &block), FL_ARG("timeout", OBJECT, &timeout)) < 0)
 *         return NULL;
 *
 * For METH_FASTCALL | METH_KEYWORDS methods. A name starting with '|' begins the optional
 * arguments, one starting with '$' the keyword-only ones ("|$name" both); an optional argument
 * not given leaves its variable as it was. The keyword names are interned once, on the first
 * call, into the call site's cache (thread-safe, never freed). Every mistake is a TypeError
 * naming the function and the argument (missing, given twice, unexpected keyword, too many
 * positional, wrong type), or an OverflowError naming it for an int out of the C type's range.
 * Converters fill plain C values or borrowed references, so a failed parse leaves nothing to
 * release. A positional call of a warm cache is parsed inline (what the hot calls make).
 */
#ifndef FL_PY_ARGS_H
#define FL_PY_ARGS_H

#include <stdatomic.h>

#include "fl_compat.h"

#define FL_ARGS_MAX 20 /* arguments one function may declare */

/* What an argument converts to (FL_ARG's second argument without the FL_ARG_ prefix). */
typedef enum {
    FL_ARG_OBJECT,      /* PyObject *, borrowed, any object */
    FL_ARG_STR_OBJECT,  /* PyObject *, borrowed, a str */
    FL_ARG_BOOL,        /* int 0/1, from the object's truth (as PyArg_Parse's "p") */
    FL_ARG_INT,         /* int, from an int or an object with __index__ (bool included) */
    FL_ARG_SSIZE,       /* Py_ssize_t, likewise */
    FL_ARG_INT64,       /* long long, likewise */
    FL_ARG_UINT64,      /* unsigned long long, likewise and >= 0 */
    FL_ARG_DOUBLE,      /* double, from a float, an int or an object with __float__/__index__ */
    FL_ARG_STR,         /* const char *, the str's UTF-8 (owned by the str), no NUL inside */
    FL_ARG_STR_OR_NONE, /* const char *, likewise, or NULL for None */
} fl_arg_kind;

typedef struct {
    const char *name; /* '|' first: optional from here on; '$': keyword-only from here on */
    fl_arg_kind kind;
    void *out;
} fl_arg;

#define FL_ARG(name, kind, out) {(name), FL_ARG_##kind, (out)}

/* One call site's declaration, filled on its first call: static, FL_ARG_CACHE("function"). */
typedef struct {
    const char *function;
    atomic_int state; /* 0 empty, 1 filling, 2 ready */
    int count, required, positional;
    const char *names[FL_ARGS_MAX]; /* without the '|' and '$' marks */
    PyObject *interned[FL_ARGS_MAX];
} fl_arg_cache;
#define FL_ARG_CACHE(function_name) {.function = (function_name)}

/* Parses a fast call's arguments by the FL_ARG(...) declarations that follow kwnames.
 * Returns 0, or -1 with an exception set. Never blocks. */
#define fl_parse_args(cache, args, nargs, kwnames, ...)                                         \
    fl_parse_arg_list((cache), (args), (nargs), (kwnames), (const fl_arg[]){__VA_ARGS__},      \
                      (int)(sizeof((const fl_arg[]){__VA_ARGS__}) / sizeof(fl_arg)))

/* The same for a tp_new/tp_init's (args tuple, kwargs dict or NULL): constructors, not hot. */
#define fl_parse_args_dict(cache, args_tuple, kwargs, ...)                                      \
    fl_parse_args_dict_list((cache), (args_tuple), (kwargs), (const fl_arg[]){__VA_ARGS__},    \
                            (int)(sizeof((const fl_arg[]){__VA_ARGS__}) / sizeof(fl_arg)))
int fl_parse_args_dict_list(fl_arg_cache *cache, PyObject *args_tuple, PyObject *kwargs,
                            const fl_arg *decl, int count);

/* The general case: keywords, a cold cache, conversions other than the two inlined below. */
int fl_parse_args_slow(fl_arg_cache *cache, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames, const fl_arg *decl, int count);
/* The first index at which `mark` opens ('|' optional, '$' keyword-only), else count. */
static inline int fl_arg_mark(const fl_arg *decl, int count, char mark) {
    for (int i = 0; i < count; i++)
        if (decl[i].name[0] == mark || (decl[i].name[0] == '|' && decl[i].name[1] == mark))
            return i;
    return count;
}

/* Inline, a positional call of objects and floats: the declaration is constant here, so the
 * compiler folds the marks and kinds and only the stores remain. The rest: the slow path. */
static inline int fl_parse_arg_list(fl_arg_cache *cache, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames, const fl_arg *decl, int count) {
    if (kwnames != NULL || nargs < fl_arg_mark(decl, count, '|') ||
        nargs > fl_arg_mark(decl, count, '$'))
        return fl_parse_args_slow(cache, args, nargs, kwnames, decl, count);
    for (int i = 0; i < count && i < nargs; i++) {
        if (decl[i].kind == FL_ARG_OBJECT)
            *(PyObject **)decl[i].out = args[i];
        else if (decl[i].kind == FL_ARG_DOUBLE && PyFloat_CheckExact(args[i]))
            *(double *)decl[i].out = PyFloat_AS_DOUBLE(args[i]);
        else /* a conversion that calls out: all of them there, from the start */
            return fl_parse_args_slow(cache, args, nargs, kwnames, decl, count);
    }
    return 0;
}

#endif
