/* fl_checkpoint.c - the checkpointer's ring of staging areas and its writer thread.
 *
 * Each staging area goes FREE --begin--> FILLING --commit--> PENDING --writer--> WRITING
 * --done--> FREE (abort: FILLING --> FREE). The areas in use are a run of the ring from
 * `first`: the oldest is the one written next, the newest may be the one being filled.
 *
 * Closing: `closed` refuses new snapshots; the writer exits once no area is in use (one being
 * filled is committed and written first), setting `writer_done`. The first
 * fl_checkpointer_close() takes the thread (`thread_taken`, under the lock) and is the only
 * caller that joins or detaches it; every later close that waits waits for writer_done, so no
 * thread is joined twice.
 *
 * Temp files, and who may delete them: each write goes to
 * "<dir>/.ckpt-<step>.safetensors.tmp.<host>-<pid>-<token>-<n>" (the token random per
 * checkpointer, n counting its writes), a name no other writer uses, even one of this process
 * or of another host writing the same step. The writer holds an exclusive flock() on it from
 * creating it until it is renamed to its final name. A new checkpointer deletes a temp file
 * only when it can take a shared lock on it without waiting: no writer holds it, so its writer
 * finished or died (the kernel drops a dead process's locks; NFS forwards flock() to the
 * server as a whole-file lock, so a writer on another host holds it there too). A pid proves
 * nothing: a second checkpointer of this process, or a process of another host whose pid is
 * free here, is alive and writing. Where the filesystem refuses locks, nothing is deleted: a
 * leftover temp file wastes space, deleting a live one loses a checkpoint. A cleaner can lock
 * a file in the moment between its creation and the writer's lock; the writer, once it holds
 * the lock, checks that the name is still its file and else starts over under a new name.
 */
#include "checkpoint/fl_checkpoint.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fl_buf.h"
#include "base/fl_crc.h"
#include "base/fl_error.h"
#include "base/fl_file.h"
#include "base/fl_thread.h"
#include "base/fl_time.h"

typedef enum { FREE, FILLING, PENDING, WRITING } snapshot_state;

typedef struct snapshot {
    snapshot_state state;
    int64_t step;
    fl_st_entry *entries;
    size_t n, entries_cap;
    unsigned char *data;
    size_t reserved, data_cap;
    fl_buf meta; /* n_meta pairs as "key\0value\0" */
    size_t n_meta;
} snapshot;

enum { NAME_ROOM = 160 }; /* the longest file name made in `dir`, its '/' included */

struct fl_checkpointer {
    atomic_int refs; /* owner + writer */
    char dir[PATH_MAX - NAME_ROOM]; /* leaves room for the file names made from it */
    int keep;
    pthread_t writer;
    int has_writer;
    char temp_tag[64];     /* "<host>-<pid>-<token>": this writer's part of its temp names */
    uint64_t temp_serial;  /* writer-only: temp files created so far */

    pthread_mutex_t lock;
    pthread_cond_t changed; /* a state, closed, writer_done or the error changed */
    int closed, thread_taken, writer_done;
    snapshot *slots;
    int max_pending;
    int first;   /* the oldest area in use */
    int used;    /* areas in use from `first` on, the one being filled included */
    int filling; /* 1 while the newest area in use is being filled */
    char error[PATH_MAX + 256];
    int error_pending;
    fl_checkpoint_stats stats;
};

static const char *const EXTENSIONS[] = {".safetensors", ".npz"}; /* written; read by older versions */

static void path_with(const char *dir, int64_t step, const char *ext, char *buf, size_t len) {
    snprintf(buf, len, "%.*s/ckpt-%012lld%s", PATH_MAX - NAME_ROOM, dir, (long long)step, ext);
}

void fl_checkpoint_path(const char *dir, int64_t step, char *buf, size_t len) {
    path_with(dir, step, EXTENSIONS[0], buf, len);
}

/* ---- files in the directory ---- */

typedef struct published {
    int64_t step;
    int ext; /* index in EXTENSIONS */
} published;

/* 1 and *out when `name` is a published checkpoint's file name. */
static int published_name(const char *name, published *out) {
    long long step;
    int end = 0;
    if (strncmp(name, "ckpt-", 5) != 0 || !isdigit((unsigned char)name[5]) ||
        sscanf(name, "ckpt-%lld%n", &step, &end) != 1)
        return 0;
    for (int i = 0; i < (int)(sizeof EXTENSIONS / sizeof *EXTENSIONS); i++)
        if (strcmp(name + end, EXTENSIONS[i]) == 0) {
            *out = (published){step, i};
            return 1;
        }
    return 0;
}

/* ---- temp files (see the top of this file) ---- */

/* 1 when fd is the file `path` names now. */
static int still_named(int fd, const char *path) {
    struct stat opened, named;
    return fstat(fd, &opened) == 0 && stat(path, &named) == 0 && opened.st_dev == named.st_dev &&
           opened.st_ino == named.st_ino;
}

/* Deletes the temp file at `path` when no writer holds its lock. */
static void remove_if_abandoned(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    if (flock(fd, LOCK_SH | LOCK_NB) == 0 && still_named(fd, path))
        unlink(path); /* locked by us: no writer can take it until we close */
    close(fd);
}

/* Deletes the temp files (".ckpt-*.tmp.*", this version's and older ones) no writer holds. */
static void remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, ".ckpt-", 6) == 0 && strstr(e->d_name, ".tmp.") != NULL &&
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
            remove_if_abandoned(path);
    closedir(d);
}

/* "<host>-<pid>-<random token>" into tag: what makes this writer's temp names its own. */
static void make_temp_tag(char *tag, size_t len, const void *self) {
    char host[33] = "";
    gethostname(host, sizeof host - 1);
    for (char *p = host; *p; p++) /* a hostname is letters, digits, '-' and '.'; to be sure */
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '.')
            *p = '_';
    uint64_t token;
    if (getrandom(&token, sizeof token, GRND_NONBLOCK) != (ssize_t)sizeof token) /* early boot */
        token = (uint64_t)(fl_monotonic() * 1e9) ^ (uint64_t)(uintptr_t)self;
    snprintf(tag, len, "%s-%d-%016llx", host[0] ? host : "host", (int)getpid(),
             (unsigned long long)token);
}

/* Creates this writer's next temp file for `step`, its name into temp, and locks it (see the
 * top of this file). Returns the open fd, or -1 with an FL_ESYS detail naming the path. */
static int create_temp(fl_checkpointer *c, int64_t step, char *temp, size_t len) {
    for (int attempt = 0; attempt < 8; attempt++) {
        snprintf(temp, len, "%s/.ckpt-%012lld%s.tmp.%s-%llu", c->dir, (long long)step,
                 EXTENSIONS[0], c->temp_tag, (unsigned long long)c->temp_serial++);
        int fd = open(temp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0)
            break;
        while (flock(fd, LOCK_EX) != 0 && errno == EINTR) /* waits only for a cleaner's look */
            ;
        if (still_named(fd, temp)) /* locked (or a filesystem without locks: see the top) */
            return fd;
        close(fd); /* a cleaner deleted it before we locked it: again, under a new name */
    }
    fl_error_sys("cannot create %s", temp);
    return -1;
}

static int compare_published(const void *a, const void *b) {
    const published *x = a, *y = b;
    return x->step != y->step ? (x->step > y->step) - (x->step < y->step) : y->ext - x->ext;
}

/* Deletes all but the newest `keep` published checkpoints. */
static int prune(const char *dir, int keep) {
    DIR *d = opendir(dir);
    if (d == NULL)
        return fl_error_sys("cannot list %s", dir);
    published files[4096];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < sizeof files / sizeof *files)
        n += (size_t)published_name(e->d_name, &files[n]);
    closedir(d);
    qsort(files, n, sizeof *files, compare_published); /* oldest first; .npz before .safetensors */
    char path[PATH_MAX];
    for (size_t i = 0; i + (size_t)keep < n; i++) {
        path_with(dir, files[i].step, EXTENSIONS[files[i].ext], path, sizeof path);
        if (unlink(path) != 0 && errno != ENOENT)
            return fl_error_sys("cannot delete %s", path);
    }
    return n > (size_t)keep ? fl_file_sync_parent(path) : FL_OK;
}

/* The snapshot's metadata pairs plus the data's CRC-32, then the file. */
static int write_file(int fd, const char *path, const snapshot *s) {
    size_t total = s->n > 0 ? s->entries[s->n - 1].offset + s->entries[s->n - 1].nbytes : 0;
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", (unsigned)fl_crc32(0, s->data, total));
    fl_st_meta *meta = malloc((s->n_meta + 1) * sizeof *meta);
    if (meta == NULL)
        return FL_ENOMEM;
    const char *text = (const char *)s->meta.data;
    for (size_t i = 0; i < s->n_meta; i++) {
        meta[i].key = text;
        meta[i].value = text + strlen(text) + 1;
        text = meta[i].value + strlen(meta[i].value) + 1;
    }
    meta[s->n_meta] = (fl_st_meta){FL_CHECKPOINT_CRC_KEY, crc};
    int rc = fl_st_write(fd, path, s->entries, s->n, s->data, meta, s->n_meta + 1);
    free(meta);
    return rc;
}

/* Writes one snapshot: locked temp file, fsync, rename, fsync of the directory, prune. The
 * temp file stays open, so locked, until it is renamed: a cleaner could delete it otherwise. */
static int write_checkpoint(fl_checkpointer *c, const snapshot *s) {
    char temp[PATH_MAX], final[PATH_MAX];
    fl_checkpoint_path(c->dir, s->step, final, sizeof final);
    int fd = create_temp(c, s->step, temp, sizeof temp);
    if (fd < 0)
        return FL_ESYS;
    int rc = write_file(fd, temp, s);
    if (rc == FL_OK)
        rc = fl_file_sync(fd, temp);
    if (rc == FL_OK)
        rc = fl_file_publish(temp, final);
    if (rc != FL_OK)
        unlink(temp);
    close(fd); /* its status adds nothing: fsync above reported any write error */
    return rc == FL_OK ? prune(c->dir, c->keep) : rc;
}

/* ---- writer thread ---- */

/* Records the outcome of writing s; called with the lock held. */
static void record_write(fl_checkpointer *c, const snapshot *s, int rc, double seconds) {
    if (rc != FL_OK && !c->error_pending) {
        snprintf(c->error, sizeof c->error, "checkpoint %lld not written: %s", (long long)s->step,
                 fl_error_detail()[0] ? fl_error_detail() : fl_strerror(rc));
        c->error_pending = 1;
    } else if (rc == FL_OK) {
        c->stats.written++;
        c->stats.last_step = s->step;
        c->stats.last_write_s = seconds;
        for (size_t i = 0; i < s->n; i++)
            c->stats.bytes += s->entries[i].nbytes;
    }
}

static void *writer_main(void *arg) {
    fl_checkpointer *c = arg;
    fl_thread_background();
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!(c->used > 0 && c->slots[c->first].state == PENDING) && !(c->closed && c->used == 0))
            pthread_cond_wait(&c->changed, &c->lock);
        if (c->used == 0)
            break; /* closed with nothing left to write */
        snapshot *s = &c->slots[c->first];
        s->state = WRITING;
        pthread_mutex_unlock(&c->lock);
        double start = fl_monotonic();
        int rc = write_checkpoint(c, s); /* the area is ours while WRITING */
        double seconds = fl_monotonic() - start;
        pthread_mutex_lock(&c->lock);
        record_write(c, s, rc, seconds);
        s->state = FREE;
        c->first = (c->first + 1) % c->max_pending;
        c->used--;
        pthread_cond_broadcast(&c->changed);
    }
    c->writer_done = 1;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    fl_checkpointer_release(c);
    return NULL;
}

/* ---- owner API ---- */

int fl_checkpointer_new(const char *dir, int keep, int max_pending, fl_checkpointer **out) {
    *out = NULL;
    if (keep < 1)
        return fl_error_set(FL_EINVAL, "keep must be >= 1, not %d", keep);
    if (max_pending < 1 || max_pending > FL_CHECKPOINT_MAX_PENDING)
        return fl_error_set(FL_EINVAL, "max_pending must be 1 to %d, not %d",
                            FL_CHECKPOINT_MAX_PENDING, max_pending);
    if (strlen(dir) + NAME_ROOM >= PATH_MAX)
        return fl_error_set(FL_EINVAL, "directory path too long: %.100s...", dir);
    int rc = fl_file_make_dirs(dir);
    if (rc != FL_OK)
        return rc;
    fl_checkpointer *c = calloc(1, sizeof *c);
    snapshot *slots = calloc((size_t)max_pending, sizeof *slots);
    if (c == NULL || slots == NULL) {
        free(c);
        free(slots);
        return FL_ENOMEM;
    }
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    c->keep = keep;
    c->slots = slots;
    c->max_pending = max_pending;
    c->stats.last_step = -1;
    make_temp_tag(c->temp_tag, sizeof c->temp_tag, c);
    atomic_init(&c->refs, 2);
    pthread_mutex_init(&c->lock, NULL);
    fl_cond_init(&c->changed); /* monotonic deadlines, as every wait in the core */
    remove_stale_temps(dir);
    rc = fl_thread_start(&c->writer, writer_main, c);
    if (rc != FL_OK) {
        atomic_store(&c->refs, 1);
        fl_checkpointer_release(c);
        return fl_error_set(rc, "cannot start the checkpoint writer thread");
    }
    c->has_writer = 1;
    *out = c;
    return FL_OK;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL and fault lazily */
#endif

enum { STAGING_ALIGN = 2 << 20 }; /* one transparent huge page */

/* A staging area of `bytes` (rounded up to huge pages): private anonymous memory asked to be
 * backed by huge pages and populated now, so the first snapshot copies into mapped memory
 * instead of taking a page fault per 4 KiB (the fault cost dominated the first save). Returns
 * NULL and sets *cap to 0 on failure. */
static unsigned char *staging_map(size_t bytes, size_t *cap) {
    size_t size = (bytes + STAGING_ALIGN - 1) / STAGING_ALIGN * STAGING_ALIGN;
    void *data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {
        *cap = 0;
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(data, size, MADV_HUGEPAGE); /* advice: refused (THP off) it still works */
#endif
    madvise(data, size, MADV_POPULATE_WRITE);
    *cap = size;
    return data;
}

static void staging_unmap(unsigned char *data, size_t cap) {
    if (data != NULL)
        munmap(data, cap);
}

/* Grows one area to n entries and `bytes`; it is FILLING (the owner's), so no lock needed. */
static int reserve(snapshot *s, size_t n, size_t bytes) {
    if (bytes > SIZE_MAX - STAGING_ALIGN || n > SIZE_MAX / sizeof *s->entries)
        return fl_error_set(FL_ENOMEM, "a snapshot of %zu bytes in %zu tensors", bytes, n);
    if (n > s->entries_cap) {
        fl_st_entry *entries = realloc(s->entries, n * sizeof *entries);
        if (entries == NULL)
            return FL_ENOMEM;
        s->entries = entries;
        s->entries_cap = n;
    }
    if (bytes > s->data_cap) {
        size_t cap;
        unsigned char *data = staging_map(bytes, &cap);
        if (data == NULL)
            return FL_ENOMEM;
        staging_unmap(s->data, s->data_cap);
        s->data = data;
        s->data_cap = cap;
    }
    return FL_OK;
}

/* Takes the next area of the ring for filling; called with the lock held. */
static snapshot *take_area(fl_checkpointer *c) {
    snapshot *s = &c->slots[(c->first + c->used) % c->max_pending];
    c->used++;
    c->filling = 1;
    s->state = FILLING;
    return s;
}

/* Gives the area being filled back; called with the lock held. */
static void give_back(fl_checkpointer *c, snapshot *s) {
    s->state = FREE;
    c->used--;
    c->filling = 0;
    pthread_cond_broadcast(&c->changed);
}

static snapshot *filling_area(fl_checkpointer *c) {
    return &c->slots[(c->first + c->used - 1) % c->max_pending];
}

int fl_checkpointer_begin(fl_checkpointer *c, size_t n, size_t bytes, double timeout_s,
                          fl_st_entry **entries, unsigned char **data) {
    pthread_mutex_lock(&c->lock);
    int rc = FL_OK;
    struct timespec until = fl_deadline_after(timeout_s);
    while ((c->filling || c->used == c->max_pending) && !c->closed && rc == FL_OK)
        rc = timeout_s == 0 ? FL_EAGAIN
                            : fl_cond_wait_until(&c->changed, &c->lock, timeout_s < 0 ? NULL : &until);
    if (c->closed)
        rc = FL_ECLOSED;
    else if (!c->filling && c->used < c->max_pending)
        rc = FL_OK; /* room appeared just as the wait timed out */
    snapshot *s = rc == FL_OK ? take_area(c) : NULL;
    pthread_mutex_unlock(&c->lock);
    if (s == NULL)
        return rc;
    rc = reserve(s, n ? n : 1, bytes ? bytes : 1); /* outside the lock: mapping takes a while */
    if (rc != FL_OK) {
        pthread_mutex_lock(&c->lock);
        give_back(c, s);
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    s->n = n;
    s->reserved = bytes;
    *entries = s->entries;
    *data = s->data;
    return FL_OK;
}

enum { COPY_CHUNK = 4 << 20 };

typedef struct copy_job {
    const fl_st_entry *entries;
    size_t n, total;
    const void *const *sources;
    unsigned char *data;
} copy_job;

/* The first entry that ends after byte `at` (n when none). */
static size_t entry_at(const fl_st_entry *entries, size_t n, size_t at) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (entries[mid].offset + entries[mid].nbytes <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Copies the bytes of chunks [begin, end) from the entries' sources. */
static void copy_chunks(void *ctx, size_t begin, size_t end) {
    const copy_job *job = ctx;
    size_t from = begin * (size_t)COPY_CHUNK;
    size_t to = end * (size_t)COPY_CHUNK < job->total ? end * (size_t)COPY_CHUNK : job->total;
    for (size_t i = entry_at(job->entries, job->n, from); i < job->n && from < to; i++) {
        const fl_st_entry *e = &job->entries[i];
        size_t stop = e->offset + e->nbytes < to ? e->offset + e->nbytes : to;
        if (stop > from)
            memcpy(job->data + from, (const unsigned char *)job->sources[i] + (from - e->offset), stop - from);
        from = stop > from ? stop : from;
    }
}

void fl_checkpoint_copy(fl_exec exec, const fl_st_entry *entries, size_t n,
                        const void *const *sources, unsigned char *data) {
    copy_job job = {entries, n, n > 0 ? entries[n - 1].offset + entries[n - 1].nbytes : 0, sources, data};
    fl_exec_run(exec, (job.total + COPY_CHUNK - 1) / COPY_CHUNK, 1, copy_chunks, &job);
}

/* Validates the filled area and copies the metadata into it; the owner's, no lock. */
static int seal(snapshot *s, const fl_st_meta *meta, size_t n_meta) {
    size_t total;
    int rc = fl_st_check(s->entries, s->n, &total);
    if (rc != FL_OK)
        return rc;
    if (total > s->reserved)
        return fl_error_set(FL_EINVAL, "the tensors hold %zu bytes, %zu were reserved", total,
                            s->reserved);
    s->meta.len = 0;
    s->n_meta = n_meta;
    for (size_t i = 0; i < n_meta; i++) {
        fl_buf_append(&s->meta, meta[i].key, strlen(meta[i].key) + 1);
        fl_buf_append(&s->meta, meta[i].value, strlen(meta[i].value) + 1);
    }
    if (s->meta.failed) {
        fl_buf_free(&s->meta);
        return FL_ENOMEM;
    }
    return FL_OK;
}

int fl_checkpointer_commit(fl_checkpointer *c, int64_t step, const fl_st_meta *meta, size_t n_meta) {
    pthread_mutex_lock(&c->lock);
    snapshot *s = filling_area(c);
    pthread_mutex_unlock(&c->lock);
    int rc = seal(s, meta, n_meta);
    pthread_mutex_lock(&c->lock);
    if (rc != FL_OK) {
        give_back(c, s);
    } else {
        s->step = step;
        s->state = PENDING;
        c->filling = 0;
        pthread_cond_broadcast(&c->changed);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void fl_checkpointer_abort(fl_checkpointer *c) {
    pthread_mutex_lock(&c->lock);
    give_back(c, filling_area(c));
    pthread_mutex_unlock(&c->lock);
}

int fl_checkpointer_wait(fl_checkpointer *c, double timeout_s) {
    pthread_mutex_lock(&c->lock);
    int rc = FL_OK;
    struct timespec until = fl_deadline_after(timeout_s);
    while (c->used - c->filling > 0 && rc == FL_OK)
        rc = timeout_s == 0 ? FL_EAGAIN
                            : fl_cond_wait_until(&c->changed, &c->lock, timeout_s < 0 ? NULL : &until);
    if (c->used - c->filling == 0)
        rc = FL_OK;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int fl_checkpointer_take_error(fl_checkpointer *c, char *message, size_t len) {
    pthread_mutex_lock(&c->lock);
    int found = c->error_pending;
    if (found)
        snprintf(message, len, "%s", c->error);
    c->error_pending = 0;
    pthread_mutex_unlock(&c->lock);
    return found;
}

void fl_checkpointer_stats(fl_checkpointer *c, fl_checkpoint_stats *out) {
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    out->pending = c->used - c->filling;
    out->pending_step = -1;
    if (out->pending > 0)
        out->pending_step = c->slots[(c->first + out->pending - 1) % c->max_pending].step;
    pthread_mutex_unlock(&c->lock);
}

void fl_checkpointer_close(fl_checkpointer *c, int wait) {
    pthread_mutex_lock(&c->lock);
    c->closed = 1;
    int take = c->has_writer && !c->thread_taken; /* this caller alone joins or detaches it */
    c->thread_taken = 1;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    if (take)
        wait ? pthread_join(c->writer, NULL) : pthread_detach(c->writer);
    else if (wait)
        fl_checkpointer_wait_closed(c, -1);
}

int fl_checkpointer_wait_closed(fl_checkpointer *c, double timeout_s) {
    pthread_mutex_lock(&c->lock);
    int rc = FL_OK;
    struct timespec until = fl_deadline_after(timeout_s);
    while (!c->writer_done && c->has_writer && rc == FL_OK)
        rc = timeout_s == 0 ? FL_ETIMEDOUT
                            : fl_cond_wait_until(&c->changed, &c->lock,
                                                 timeout_s < 0 ? NULL : &until);
    if (c->writer_done || !c->has_writer)
        rc = FL_OK;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void fl_checkpointer_release(fl_checkpointer *c) {
    if (c == NULL || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_cond_destroy(&c->changed);
    pthread_mutex_destroy(&c->lock);
    for (int i = 0; i < c->max_pending; i++) {
        free(c->slots[i].entries);
        staging_unmap(c->slots[i].data, c->slots[i].data_cap);
        fl_buf_free(&c->slots[i].meta);
    }
    free(c->slots);
    free(c);
}
