/* fl_npy.c - a strict parser for .npy headers, and mmap or plain reads of the data behind them. */
#include "data/fl_npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fl_error.h"
#include "base/fl_size.h"

enum {
    HEADER_CAP = 1 << 20, /* longest header dict accepted (NumPy's own default is 10000) */
    PREAMBLE_MIN = 10,    /* magic, version, 2-byte length (1.0) */
    PREAMBLE_MAX = 12,    /* magic, version, 4-byte length (2.0, 3.0) */
    MAP_FIRST_READ = 1 << 16,
    FILE_FIRST_READ = 1 << 12, /* per-sample files: headers are ~128 bytes, data follows */
    SHOWN_MAX = 24,            /* bytes of unexpected input quoted in a detail */
};

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define NATIVE_ORDER '<'
#else
#define NATIVE_ORDER '>'
#endif

typedef struct cursor {
    const char *p, *start, *end;
    int py2; /* format 1.0 or 2.0: Python 2 wrote long dimensions as "3L" */
} cursor;

/* Copies up to SHOWN_MAX bytes of s into buf (SHOWN_MAX + 4 bytes) for a message, with
 * anything unprintable as '?' so a hostile header cannot put control bytes into a detail. */
static const char *shown(const char *s, size_t n, char *buf) {
    size_t k = n < SHOWN_MAX ? n : SHOWN_MAX;
    for (size_t i = 0; i < k; i++)
        buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    strcpy(buf + k, n > k ? "..." : "");
    return buf;
}

/* "(2, 3)", "(5,)" or "()", as Python prints a shape (cut short if buf is too small). */
static const char *format_shape(const int64_t *shape, int ndim, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "(");
    for (int d = 0; d < ndim && used < size; d++)
        used +=
            (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (used < size)
        snprintf(buf + used, size - used, ndim == 1 ? ",)" : ")");
    return buf;
}

static int syntax_error(const cursor *c, const char *what) {
    char buf[SHOWN_MAX + 4];
    if (c->p == c->end)
        return fl_error_set(FL_EINVAL, "header: %s, found the end of the header", what);
    return fl_error_set(FL_EINVAL, "header: %s at byte %zu of the dict, found '%s'", what,
                        (size_t)(c->p - c->start), shown(c->p, (size_t)(c->end - c->p), buf));
}

static void skip_space(cursor *c) {
    while (c->p < c->end &&
           (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r' || *c->p == '\f'))
        c->p++;
}

/* Skips whitespace, then consumes ch if it comes next. */
static int take(cursor *c, char ch) {
    skip_space(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* A quoted Python string without escapes; *s and *n point into the header. */
static int parse_string(cursor *c, const char *what, const char **s, size_t *n) {
    skip_space(c);
    if (c->p == c->end || (*c->p != '\'' && *c->p != '"'))
        return syntax_error(c, what);
    char quote = *c->p;
    const char *q = c->p + 1;
    while (q < c->end && *q != quote && *q != '\\' && *q != '\n')
        q++;
    if (q == c->end || *q != quote)
        return syntax_error(c, q < c->end && *q == '\\' ? "escapes in strings are not supported"
                                                        : "unterminated string");
    *s = c->p + 1;
    *n = (size_t)(q - *s);
    c->p = q + 1;
    return FL_OK;
}

/* Unsigned decimal digits at s[*i..n) into *out; 0 if there are none, a leading zero or an
 * overflow past `max`. */
static int parse_digits(const char *s, size_t n, size_t *i, uint64_t max, uint64_t *out) {
    size_t start = *i;
    uint64_t v = 0;
    for (; *i < n && is_digit(s[*i]); (*i)++) {
        if (v > (max - (uint64_t)(s[*i] - '0')) / 10)
            return 0;
        v = v * 10 + (uint64_t)(s[*i] - '0');
    }
    if (*i == start || (s[start] == '0' && *i - start > 1))
        return 0;
    *out = v;
    return 1;
}

/* A datetime unit after 'M8'/'m8': "", "[ns]", "[10us]"... */
static int valid_time_unit(const char *s, size_t n) {
    static const char *const units[] = {"Y",  "M",  "W",  "D",  "h",  "m", "s",
                                        "ms", "us", "ns", "ps", "fs", "as"};
    if (n == 0)
        return 1; /* generic */
    if (n < 3 || s[0] != '[' || s[n - 1] != ']')
        return 0;
    size_t i = 1;
    uint64_t count;
    if (is_digit(s[1]) && (!parse_digits(s, n - 1, &i, INT32_MAX, &count) || count == 0))
        return 0;
    for (size_t u = 0; u < sizeof units / sizeof *units; u++)
        if (strlen(units[u]) == n - 1 - i && memcmp(s + i, units[u], n - 1 - i) == 0)
            return 1;
    return 0;
}

static int valid_itemsize(char kind, uint64_t size) {
    switch (kind) {
    case 'b':
        return size == 1;
    case 'i':
    case 'u':
        return size == 1 || size == 2 || size == 4 || size == 8;
    case 'f': /* f12 and c24 exist only where long double is 12 bytes: not on x86-64 */
        return size == 2 || size == 4 || size == 8 || size == 16;
    case 'c':
        return size == 8 || size == 16 || size == 32;
    case 'M':
    case 'm':
        return size == 8;
    default: /* U, S, V: any positive size */
        return size > 0;
    }
}

/* The byte order that NumPy itself reports for the type: '|' where it cannot matter, the
 * native order for '=', '|' on a multi-byte number, or none given. */
static char normal_order(char given, char kind, size_t itemsize) {
    if (kind == 'S' || kind == 'V' || itemsize == 1)
        return '|';
    return given == '<' || given == '>' ? given : NATIVE_ORDER;
}

static int one_of(char ch, const char *set) { return ch != '\0' && strchr(set, ch) != NULL; }

/* A descr string such as '<f4', 'S5', '<U3' or '<M8[ns]' into the type fields of *h. */
static int parse_descr(const char *s, size_t n, fl_npy_header *h) {
    char buf[SHOWN_MAX + 4], kind_buf[SHOWN_MAX + 4];
    const char *show = shown(s, n, buf);
    size_t skip = n > 0 && one_of(s[0], "<>|=") ? 1 : 0, i = skip + 1;
    if (n == 0 || n + 1 - skip >= FL_NPY_DESCR_MAX)
        return fl_error_set(FL_EINVAL, "descr '%s' is %s", show, n ? "too long" : "empty");
    char kind = skip < n ? s[skip] : '\0';
    if (kind == 'O')
        return fl_error_set(FL_EINVAL, "descr '%s': object arrays are not supported", show);
    if (!one_of(kind, "biufcUSVMm"))
        return fl_error_set(FL_EINVAL, "descr '%s': unsupported dtype kind '%s'", show,
                            shown(s + skip, n - skip ? 1 : 0, kind_buf));
    uint64_t size;
    if (!parse_digits(s, n, &i, INT32_MAX, &size))
        return fl_error_set(FL_EINVAL, "descr '%s': missing or malformed item size", show);
    int dated = kind == 'M' || kind == 'm';
    if ((dated && !valid_time_unit(s + i, n - i)) || (!dated && i != n))
        return fl_error_set(FL_EINVAL, "descr '%s': unexpected text after the item size", show);
    if (!valid_itemsize(kind, size))
        return fl_error_set(FL_EINVAL, "descr '%s': item size %llu is not valid for kind '%c'",
                            show, (unsigned long long)size, kind);
    h->kind = kind;
    h->itemsize = kind == 'U' ? (size_t)size * 4 : (size_t)size; /* UCS-4 code points */
    h->byteorder = normal_order(skip ? s[0] : '\0', kind, h->itemsize);
    snprintf(h->descr, sizeof h->descr, "%c%.*s", h->byteorder, (int)(n - skip), s + skip);
    return FL_OK;
}

/* The 'descr' value: a string (a list would be a structured dtype). */
static int parse_descr_value(cursor *c, fl_npy_header *h) {
    skip_space(c);
    if (c->p < c->end && *c->p == '[')
        return fl_error_set(FL_EINVAL, "descr is a list: structured dtypes are not supported");
    const char *s;
    size_t n;
    int rc = parse_string(c, "descr is not a string", &s, &n);
    return rc ? rc : parse_descr(s, n, h);
}

static int parse_bool(cursor *c, int *out) {
    skip_space(c);
    size_t left = (size_t)(c->end - c->p);
    size_t len = left >= 4 && memcmp(c->p, "True", 4) == 0    ? 4
                 : left >= 5 && memcmp(c->p, "False", 5) == 0 ? 5
                                                              : 0;
    char next = len < left ? c->p[len] : ' ';
    if (len == 0 || next == '_' || is_digit(next) || ((next | 0x20) >= 'a' && (next | 0x20) <= 'z'))
        return syntax_error(c, "fortran_order is not True or False");
    *out = len == 4;
    c->p += len;
    return FL_OK;
}

/* One dimension: a decimal integer, maybe negative (rejected later, with the whole shape). */
static int parse_dim(cursor *c, int64_t *out) {
    skip_space(c);
    const char *s = c->p;
    size_t n = (size_t)(c->end - s), i = n > 0 && s[0] == '-' ? 1 : 0;
    uint64_t v;
    if (i == n || !is_digit(s[i]))
        return syntax_error(c, "expected an integer dimension in shape");
    if (!parse_digits(s, n, &i, INT64_MAX, &v))
        return syntax_error(c, "dimension is too large or malformed");
    if (c->py2 && i < n && s[i] == 'L') /* NumPy still reads these (_filter_header) */
        i++;
    *out = s[0] == '-' ? -(int64_t)v : (int64_t)v;
    c->p += i;
    return FL_OK;
}

/* A tuple of integers: "()", "(5,)", "(2, 3)", "(2, 3,)". */
static int parse_shape(cursor *c, fl_npy_header *h) {
    if (!take(c, '('))
        return syntax_error(c, "shape is not a tuple");
    int ndim = 0, comma = 0;
    while (!take(c, ')')) {
        if (ndim > 0 && !comma)
            return syntax_error(c, "expected ',' or ')' in shape");
        if (ndim == FL_NPY_MAX_DIMS)
            return fl_error_set(FL_EINVAL, "shape has more than %d dimensions", FL_NPY_MAX_DIMS);
        int rc = parse_dim(c, &h->shape[ndim++]);
        if (rc)
            return rc;
        comma = take(c, ',');
    }
    if (ndim == 1 && !comma) /* Python's (5) is the int 5, not a tuple */
        return fl_error_set(FL_EINVAL, "shape (%lld) is not a tuple: it needs a trailing comma",
                            (long long)h->shape[0]);
    h->ndim = ndim;
    return FL_OK;
}

enum { KEY_DESCR = 1, KEY_FORTRAN = 2, KEY_SHAPE = 4, KEY_ALL = 7 };

/* One "'key': value" pair; *seen collects the keys met so far. */
static int parse_entry(cursor *c, fl_npy_header *h, int *seen) {
    const char *key;
    size_t n;
    int rc = parse_string(c, "expected a quoted key", &key, &n);
    if (rc)
        return rc;
    char buf[SHOWN_MAX + 4];
    int which = n == 5 && memcmp(key, "descr", 5) == 0             ? KEY_DESCR
                : n == 13 && memcmp(key, "fortran_order", 13) == 0 ? KEY_FORTRAN
                : n == 5 && memcmp(key, "shape", 5) == 0           ? KEY_SHAPE
                                                                   : 0;
    if (which == 0)
        return fl_error_set(FL_EINVAL, "header has an unexpected key '%s'", shown(key, n, buf));
    if (*seen & which)
        return fl_error_set(FL_EINVAL, "header has the key '%s' twice", shown(key, n, buf));
    *seen |= which;
    if (!take(c, ':'))
        return syntax_error(c, "expected ':' after a key");
    if (which == KEY_DESCR)
        return parse_descr_value(c, h);
    return which == KEY_FORTRAN ? parse_bool(c, &h->fortran_order) : parse_shape(c, h);
}

/* Python refuses an indented first or last line ("\n {...}", "{...}\n "): whitespace around
 * the dict that crosses a line start must end with one. */
static int indented(const char *from, const char *to) {
    const char *p = from;
    while (p < to && *p != '\n' && *p != '\r' && *p != '\f')
        p++;
    return p < to && to[-1] != '\n' && to[-1] != '\r' && to[-1] != '\f';
}

/* The dict literal, which must fill the whole header but for whitespace. */
static int parse_dict(cursor *c, fl_npy_header *h) {
    char buf[SHOWN_MAX + 4];
    if (!take(c, '{'))
        return fl_error_set(FL_EINVAL, "header is not a dict: it starts with '%s'",
                            shown(c->p, (size_t)(c->end - c->p), buf));
    if (indented(c->start, c->p - 1))
        return fl_error_set(FL_EINVAL, "header: the dict is on an indented line");
    int seen = 0, comma = 0;
    while (!take(c, '}')) {
        if (seen && !comma)
            return syntax_error(c, "expected ',' or '}' after a value");
        int rc = parse_entry(c, h, &seen);
        if (rc)
            return rc;
        comma = take(c, ',');
    }
    const char *close = c->p;
    skip_space(c);
    if (c->p != c->end)
        return syntax_error(c, "unexpected text after the dict");
    if (indented(close, c->end))
        return fl_error_set(FL_EINVAL, "header: an indented line follows the dict");
    if (seen != KEY_ALL)
        return fl_error_set(FL_EINVAL, "header has no '%s' key",
                            !(seen & KEY_DESCR)     ? "descr"
                            : !(seen & KEY_FORTRAN) ? "fortran_order"
                                                    : "shape");
    return FL_OK;
}

/* data_len = product(shape) * itemsize; no array NumPy can make is over PTRDIFF_MAX (FL_SIZE_MAX) bytes. */
static int compute_data_len(fl_npy_header *h) {
    char buf[256];
    size_t total = h->itemsize;
    int empty = 0;
    for (int d = 0; d < h->ndim; d++) {
        if (h->shape[d] < 0)
            return fl_error_set(FL_EINVAL, "shape %s has a negative dimension",
                                format_shape(h->shape, h->ndim, buf, sizeof buf));
        empty |= h->shape[d] == 0;
        if (h->shape[d] > 0 && fl_size_mul(total, (size_t)h->shape[d], "shape", &total) != FL_OK)
            return fl_error_set(FL_EINVAL, /* a header's fault: FL_EINVAL, as every refusal here */
                                "shape %s with item size %zu is too large: over %td bytes",
                                format_shape(h->shape, h->ndim, buf, sizeof buf), h->itemsize,
                                (ptrdiff_t)PTRDIFF_MAX);
    }
    h->data_len = empty ? 0 : total;
    return FL_OK;
}

static int incomplete(size_t need, size_t have, const char *at_least) {
    return fl_error_set(FL_EAGAIN, "header is incomplete: it needs %s%zu bytes, there are %zu",
                        at_least, need, have);
}

/* Magic, version and header length; sets header_len or asks for more bytes. */
static int parse_preamble(const unsigned char *b, size_t len, fl_npy_header *h) {
    if (memcmp(b, "\x93NUMPY", len < 6 ? len : 6) != 0)
        return fl_error_set(FL_EINVAL, "bad magic: not a .npy file");
    if (len < 8)
        return incomplete(PREAMBLE_MIN, len, "at least ");
    if (b[6] < 1 || b[6] > 3 || b[7] != 0)
        return fl_error_set(FL_EINVAL, "unsupported format version %d.%d", b[6], b[7]);
    h->major = b[6];
    h->minor = b[7];
    size_t preamble = h->major == 1 ? PREAMBLE_MIN : PREAMBLE_MAX;
    if (len < preamble)
        return incomplete(preamble, len, "");
    size_t dict_len = (size_t)b[8] | (size_t)b[9] << 8;
    if (h->major > 1)
        dict_len |= (size_t)b[10] << 16 | (size_t)b[11] << 24;
    if (dict_len > HEADER_CAP)
        return fl_error_set(FL_EINVAL, "header length %zu is over the limit of %d bytes", dict_len,
                            HEADER_CAP);
    h->header_len = preamble + dict_len;
    return len < h->header_len ? incomplete(h->header_len, len, "") : FL_OK;
}

int fl_npy_parse_header(const void *data, size_t len, fl_npy_header *out) {
    if (len == 0)
        return incomplete(PREAMBLE_MIN, 0, "at least ");
    fl_npy_header h = {0};
    int rc = parse_preamble(data, len, &h);
    if (rc)
        return rc;
    const char *dict = (const char *)data + (h.major == 1 ? PREAMBLE_MIN : PREAMBLE_MAX);
    cursor c = {dict, dict, (const char *)data + h.header_len, h.major < 3};
    rc = parse_dict(&c, &h);
    if (rc == FL_OK)
        rc = compute_data_len(&h);
    if (rc == FL_OK)
        *out = h;
    return rc;
}

static int sys_error(const char *what, const char *path) {
    return fl_error_sys("cannot %s %s", what, path);
}

/* Prefixes this thread's detail with the path (and `what`), keeping the code. */
static int with_path(int rc, const char *path, const char *what) {
    char detail[256];
    snprintf(detail, sizeof detail, "%s", fl_error_detail());
    return fl_error_set(rc, "%s: %s%s", path, what, detail);
}

/* Reads up to len bytes at offset into buf, retrying short reads and EINTR; *got stops short
 * only at the end of the file. */
static int read_at(int fd, void *buf, size_t len, size_t offset, size_t *got, const char *path) {
    *got = 0;
    while (*got < len) {
        size_t chunk = len - *got < (1u << 30) ? len - *got : (1u << 30);
        ssize_t n = pread(fd, (char *)buf + *got, chunk, (off_t)(offset + *got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return sys_error("read", path);
        if (n == 0)
            break;
        *got += (size_t)n;
    }
    return FL_OK;
}

/* fstat, refusing anything but a regular file (a FIFO or a device has no fixed size). */
static int file_size(int fd, const char *path, size_t *size) {
    struct stat st;
    if (fstat(fd, &st) != 0)
        return sys_error("stat", path);
    if (!S_ISREG(st.st_mode))
        return fl_error_set(FL_EINVAL, "%s: not a regular file", path);
    *size = (size_t)st.st_size;
    return FL_OK;
}

/* Grows *buf to `want` bytes, reads bytes [got, want) of the file into it and parses it all. */
static int read_rest(int fd, unsigned char **buf, size_t got, size_t want, const char *path,
                     fl_npy_header *h) {
    unsigned char *grown = realloc(*buf, want);
    size_t more = 0;
    if (grown == NULL)
        return fl_error_set(FL_ENOMEM, "%s: no memory to read the header", path);
    *buf = grown;
    int rc = read_at(fd, grown + got, want - got, got, &more, path);
    return rc ? rc : fl_npy_parse_header(grown, got + more, h);
}

/* Reads the first `first` bytes of the file and parses them; if the header is longer, reads
 * the rest of it (the preamble, which is there by then, says how long it is). */
static int read_header(int fd, size_t size, size_t first, const char *path, fl_npy_header *h) {
    size_t want = size < first ? size : first, got = 0;
    unsigned char *buf = malloc(want > 0 ? want : 1);
    if (buf == NULL)
        return fl_error_set(FL_ENOMEM, "%s: no memory to read the header", path);
    int rc = read_at(fd, buf, want, 0, &got, path);
    if (rc == FL_OK)
        rc = fl_npy_parse_header(buf, got, h);
    if (rc == FL_EAGAIN && got == want && size > want) {
        fl_npy_header preamble = {0};
        parse_preamble(buf, got, &preamble); /* sets header_len, then asks for more */
        size_t need = preamble.header_len < size ? preamble.header_len : size;
        if (need > got)
            rc = read_rest(fd, &buf, got, need, path, h);
    }
    free(buf);
    if (rc == FL_EAGAIN)
        return with_path(FL_EINVAL, path, "file is truncated: ");
    return rc == FL_EINVAL ? with_path(FL_EINVAL, path, "") : rc;
}

static int truncated(const char *path, size_t have, const fl_npy_header *h) {
    return fl_error_set(FL_EINVAL, "%s: file is truncated: %zu bytes of data, expected %zu", path,
                        have, h->data_len);
}

int fl_npy_map_open(const char *path, fl_npy_map *out) {
    memset(out, 0, sizeof *out);
    fl_npy_header h;
    size_t size = 0;
    void *base = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sys_error("open", path);
    int rc = file_size(fd, path, &size);
    if (rc == FL_OK)
        rc = read_header(fd, size, MAP_FIRST_READ, path, &h);
    if (rc == FL_OK && size - h.header_len < h.data_len)
        rc = truncated(path, size - h.header_len, &h);
    if (rc == FL_OK && h.data_len > 0) {
        base = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED)
            rc = sys_error("map", path);
    }
    close(fd); /* the mapping keeps its own reference to the file */
    if (rc != FL_OK)
        return rc;
    out->header = h;
    out->base = base;
    out->map_len = base ? size : 0;
    out->data = base ? (const char *)base + h.header_len : NULL;
    return FL_OK;
}

void fl_npy_map_close(fl_npy_map *map) {
    if (map->base != NULL)
        munmap(map->base, map->map_len);
    memset(map, 0, sizeof *map);
}

static int same_header(const fl_npy_header *a, const fl_npy_header *b) {
    if (strcmp(a->descr, b->descr) != 0 || !a->fortran_order != !b->fortran_order ||
        a->ndim != b->ndim)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    return 1;
}

/* Compares the file's header with the caller's, whose descr may be unnormalized ('=f4'). */
static int check_expected(const fl_npy_header *h, const fl_npy_header *expect, const char *path) {
    fl_npy_header want = *expect;
    size_t n = strnlen(expect->descr, sizeof expect->descr);
    int ndim_ok = want.ndim >= 0 && want.ndim <= FL_NPY_MAX_DIMS;
    if (n < sizeof expect->descr && ndim_ok && parse_descr(expect->descr, n, &want) == FL_OK &&
        same_header(h, &want))
        return FL_OK;
    char have_shape[96], want_shape[96];
    return fl_error_set(
        FL_EINVAL, "%s: expected %.*s %s %s order, the file has %s %s %s order", path,
        FL_NPY_DESCR_MAX, want.descr,
        format_shape(want.shape, ndim_ok ? want.ndim : 0, want_shape, sizeof want_shape),
        want.fortran_order ? "Fortran" : "C", h->descr,
        format_shape(h->shape, h->ndim, have_shape, sizeof have_shape),
        h->fortran_order ? "Fortran" : "C");
}

int fl_npy_read_file(const char *path, const fl_npy_header *expect, void *dst, size_t cap,
                     size_t *nbytes) {
    fl_npy_header h;
    size_t size = 0, got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sys_error("open", path);
    int rc = file_size(fd, path, &size);
    if (rc == FL_OK)
        rc = read_header(fd, size, FILE_FIRST_READ, path, &h);
    if (rc == FL_OK && expect != NULL)
        rc = check_expected(&h, expect, path);
    if (rc == FL_OK && h.data_len > cap)
        rc = fl_error_set(FL_EINVAL, "%s: the array's %zu bytes do not fit in the %zu-byte buffer",
                          path, h.data_len, cap);
    if (rc == FL_OK)
        rc = read_at(fd, dst, h.data_len, h.header_len, &got, path);
    if (rc == FL_OK && got < h.data_len)
        rc = truncated(path, got, &h);
    close(fd);
    if (rc == FL_OK)
        *nbytes = h.data_len;
    return rc;
}
