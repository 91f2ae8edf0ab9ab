/* fl_checkpoint.c - the checkpointer's state machine and writer thread.
 *
 *   IDLE --begin--> FILLING --commit--> PENDING --writer--> WRITING --done--> IDLE
 *                       \--abort--> IDLE
 */
#include "checkpoint/fl_checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/fl_error.h"
#include "base/fl_file.h"
#include "base/fl_thread.h"
#include "base/fl_time.h"

typedef enum { IDLE, FILLING, PENDING, WRITING } snapshot_state;

struct fl_checkpointer {
    atomic_int refs; /* owner + writer */
    char dir[PATH_MAX - 64]; /* leaves room for the file names made from it */
    int keep;
    pthread_t writer;
    int has_writer;

    pthread_mutex_t lock;
    pthread_cond_t changed; /* state, closed or the error changed */
    snapshot_state state;
    int closed, joined;
    int64_t step;
    fl_npz_entry *entries;
    size_t n, entries_cap;
    unsigned char *data;
    size_t data_cap;
    char error[PATH_MAX + 256];
    int error_pending;
    fl_checkpoint_stats stats;
};

void fl_checkpoint_path(const char *dir, int64_t step, char *buf, size_t len) {
    snprintf(buf, len, "%.*s/ckpt-%012lld.npz", PATH_MAX - 64, dir, (long long)step);
}

/* ---- files in the directory ---- */

/* Step of a published checkpoint's file name, or -1. */
static int64_t published_step(const char *name) {
    long long step;
    char tail[8];
    if (sscanf(name, "ckpt-%lld%7s", &step, tail) == 2 && strcmp(tail, ".npz") == 0 && step >= 0)
        return step;
    return -1;
}

/* Deletes ".ckpt-*.tmp.<pid>" files whose writer is gone (or is this process). */
static void remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        const char *mark = strstr(e->d_name, ".tmp.");
        if (strncmp(e->d_name, ".ckpt-", 6) != 0 || mark == NULL)
            continue;
        pid_t pid = (pid_t)atol(mark + 5);
        if (pid == getpid() || (kill(pid, 0) != 0 && errno == ESRCH)) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
}

static int compare_steps(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Deletes all but the newest `keep` published checkpoints. */
static int prune(const char *dir, int keep) {
    DIR *d = opendir(dir);
    if (d == NULL)
        return fl_error_sys("cannot list %s", dir);
    int64_t steps[4096];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < sizeof steps / sizeof *steps) {
        int64_t step = published_step(e->d_name);
        if (step >= 0)
            steps[n++] = step;
    }
    closedir(d);
    qsort(steps, n, sizeof *steps, compare_steps);
    char path[PATH_MAX];
    for (size_t i = 0; i + (size_t)keep < n; i++) {
        fl_checkpoint_path(dir, steps[i], path, sizeof path);
        if (unlink(path) != 0 && errno != ENOENT)
            return fl_error_sys("cannot delete %s", path);
    }
    return n > (size_t)keep ? fl_file_sync_parent(path) : FL_OK;
}

/* Writes one snapshot: temp file, fsync, rename, fsync of the directory, prune. */
static int write_checkpoint(fl_checkpointer *c) {
    char temp[PATH_MAX], final[PATH_MAX];
    fl_checkpoint_path(c->dir, c->step, final, sizeof final);
    snprintf(temp, sizeof temp, "%s/.ckpt-%012lld.npz.tmp.%d", c->dir, (long long)c->step,
             (int)getpid());
    int fd = open(temp, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0)
        return fl_error_sys("cannot create %s", temp);
    int rc = fl_npz_write(fd, temp, c->entries, c->n, c->data, 0);
    if (rc == FL_OK)
        rc = fl_file_sync(fd, temp);
    if (close(fd) != 0 && rc == FL_OK)
        rc = fl_error_sys("cannot close %s", temp);
    if (rc == FL_OK)
        rc = fl_file_publish(temp, final);
    if (rc != FL_OK) {
        unlink(temp);
        return rc;
    }
    return prune(c->dir, c->keep);
}

/* ---- writer thread ---- */

static void *writer_main(void *arg) {
    fl_checkpointer *c = arg;
    fl_thread_background();
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (c->state != PENDING && !(c->closed && c->state == IDLE))
            pthread_cond_wait(&c->changed, &c->lock);
        if (c->state != PENDING)
            break; /* closed with nothing left to write */
        c->state = WRITING;
        pthread_mutex_unlock(&c->lock);
        double start = fl_monotonic();
        int rc = write_checkpoint(c); /* entries/data are ours while WRITING */
        double seconds = fl_monotonic() - start;
        pthread_mutex_lock(&c->lock);
        if (rc != FL_OK && !c->error_pending) {
            snprintf(c->error, sizeof c->error, "checkpoint %lld not written: %s",
                     (long long)c->step, fl_error_detail());
            c->error_pending = 1;
        } else if (rc == FL_OK) {
            c->stats.written++;
            c->stats.last_step = c->step;
            c->stats.last_write_s = seconds;
            for (size_t i = 0; i < c->n; i++)
                c->stats.bytes += c->entries[i].nbytes;
        }
        c->state = IDLE;
        pthread_cond_broadcast(&c->changed);
    }
    pthread_mutex_unlock(&c->lock);
    fl_checkpointer_release(c);
    return NULL;
}

/* ---- owner API ---- */

int fl_checkpointer_new(const char *dir, int keep, fl_checkpointer **out) {
    *out = NULL;
    if (keep < 1)
        return fl_error_set(FL_EINVAL, "keep must be >= 1, not %d", keep);
    if (strlen(dir) + 64 >= PATH_MAX)
        return fl_error_set(FL_EINVAL, "directory path too long: %.100s...", dir);
    int rc = fl_file_make_dirs(dir);
    if (rc != FL_OK)
        return rc;
    fl_checkpointer *c = calloc(1, sizeof *c);
    if (c == NULL)
        return FL_ENOMEM;
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    c->keep = keep;
    c->stats.last_step = -1;
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

/* Grows the staging arrays to n entries and `bytes`; called with the lock held, IDLE. */
static int reserve(fl_checkpointer *c, size_t n, size_t bytes) {
    if (n > c->entries_cap) {
        fl_npz_entry *entries = realloc(c->entries, n * sizeof *entries);
        if (entries == NULL)
            return FL_ENOMEM;
        c->entries = entries;
        c->entries_cap = n;
    }
    if (bytes > c->data_cap) {
        size_t cap;
        unsigned char *data = staging_map(bytes, &cap);
        if (data == NULL)
            return FL_ENOMEM;
        staging_unmap(c->data, c->data_cap);
        c->data = data;
        c->data_cap = cap;
    }
    return FL_OK;
}

int fl_checkpointer_begin(fl_checkpointer *c, size_t n, size_t bytes, double timeout_s,
                          fl_npz_entry **entries, unsigned char **data) {
    pthread_mutex_lock(&c->lock);
    int rc = FL_OK;
    struct timespec until = fl_deadline_after(timeout_s);
    while (c->state != IDLE && !c->closed && rc == FL_OK)
        rc = timeout_s == 0 ? FL_EAGAIN
                            : fl_cond_wait_until(&c->changed, &c->lock, timeout_s < 0 ? NULL : &until);
    if (c->closed)
        rc = FL_ECLOSED;
    else if (c->state == IDLE)
        rc = reserve(c, n ? n : 1, bytes ? bytes : 1);
    if (rc == FL_OK) {
        c->state = FILLING;
        c->n = n;
        *entries = c->entries;
        *data = c->data;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void fl_checkpointer_commit(fl_checkpointer *c, int64_t step) {
    pthread_mutex_lock(&c->lock);
    c->step = step;
    c->state = PENDING;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

void fl_checkpointer_abort(fl_checkpointer *c) {
    pthread_mutex_lock(&c->lock);
    c->state = IDLE;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

int fl_checkpointer_wait(fl_checkpointer *c, double timeout_s) {
    pthread_mutex_lock(&c->lock);
    int rc = FL_OK;
    struct timespec until = fl_deadline_after(timeout_s);
    while ((c->state == PENDING || c->state == WRITING) && rc == FL_OK)
        rc = timeout_s == 0 ? FL_EAGAIN
                            : fl_cond_wait_until(&c->changed, &c->lock, timeout_s < 0 ? NULL : &until);
    if (c->state != PENDING && c->state != WRITING)
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
    pthread_mutex_unlock(&c->lock);
}

void fl_checkpointer_close(fl_checkpointer *c, int wait) {
    pthread_mutex_lock(&c->lock);
    c->closed = 1;
    int join = wait && c->has_writer && !c->joined;
    if (join)
        c->joined = 1;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    if (join)
        pthread_join(c->writer, NULL);
}

void fl_checkpointer_release(fl_checkpointer *c) {
    if (c == NULL || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (c->has_writer && !c->joined)
        pthread_detach(c->writer); /* the writer itself dropped the last reference */
    pthread_cond_destroy(&c->changed);
    pthread_mutex_destroy(&c->lock);
    free(c->entries);
    staging_unmap(c->data, c->data_cap);
    free(c);
}
