/* fl_procpool.c - forked workers, shared slots, and the socket protocol between them.
 *
 *   parent slot states:  FREE --dispatch--> ASSIGNED(worker) --"done"--> READY
 *                        READY --next() in order--> LENT --release()--> FREE
 *
 * Each worker talks to the parent over one Unix stream socket pair (written with
 * MSG_NOSIGNAL: a dead peer is an error code, never a SIGPIPE). Messages are fixed headers
 * (plus sample ids, or an error text and the batch's extra bytes) written whole by one writer
 * per direction. `lock` guards the slot states, the error and `lent`, because a lease may
 * be released from another thread while the consumer waits in poll() without it.
 */
#define _GNU_SOURCE /* SOCK_CLOEXEC, MSG_NOSIGNAL */
#include "data/fl_procpool.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/fl_error.h"
#include "base/fl_size.h"
#include "base/fl_time.h"

enum { ALIGN = 4096, STOP_GRACE_MS = 1000 };

typedef enum slot_state { SLOT_FREE, SLOT_ASSIGNED, SLOT_READY, SLOT_LENT } slot_state;

typedef struct slot {
    slot_state state;
    uint64_t batch;
    size_t count;
    int worker;
    unsigned char *extra; /* READY or LENT: the bytes the worker sent after the batch, or NULL */
    size_t extra_len;
} slot;

typedef struct worker {
    pid_t pid; /* 0: not running */
    int fd;    /* the parent's end of the worker's socket pair, -1 when closed */
    int in_flight;
} worker;

typedef struct task_header {
    uint64_t batch;
    uint64_t seed; /* the epoch's augmentation seed */
    uint32_t slot;
    uint32_t count;
} task_header;

typedef struct result_header {
    uint64_t batch;
    uint32_t slot;
    uint32_t failed;
    int64_t index;
    uint32_t text_len;
    uint32_t reserved;
    uint64_t extra_len; /* bytes after the text: the batch's fl_proc_extra */
} result_header;

struct fl_procpool {
    fl_procpool_config config;
    int n_slots;
    unsigned char *region; /* n_slots * slot_stride, shared with the workers */
    size_t region_len, slot_stride;
    slot *slots;
    worker *workers;
    int running;
    int64_t *order;
    uint64_t order_len, n_batches, next_claim, next_deliver, epoch_seed;
    uint64_t *ends; /* fl_procpool_set_batches: where each batch ends in the order, or NULL */
    int epoch_active;

    pthread_mutex_t lock;
    int error; /* an fl_proc_error is waiting at error_batch */
    uint64_t error_batch;
    fl_proc_error failure;
    int lent;
};

/* ---- sockets ---- */

enum { RECEIVE, SEND };

/* Moves exactly len bytes over a worker's socket in `direction`, retrying short transfers and
 * EINTR; -1 on EOF or error (the other end is gone). */
static int transfer_all(int fd, void *data, size_t len, int direction) {
    char *p = data;
    while (len > 0) {
        /* send(MSG_NOSIGNAL), not write: a peer that died fails with EPIPE instead of raising
         * SIGPIPE, whose default action would kill this process. */
        ssize_t n = direction == SEND ? send(fd, p, len, MSG_NOSIGNAL) : read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int write_all(int fd, const void *data, size_t len) {
    return transfer_all(fd, (void *)data, len, SEND); /* send only reads data */
}

static int read_all(int fd, void *data, size_t len) {
    return transfer_all(fd, data, len, RECEIVE);
}

/* ---- the worker process ---- */

/* In a new worker: closes the parent's ends of the other workers' sockets, so that only the
 * parent holds them and a worker's death hangs up its socket for the parent. */
static void close_other_workers_sockets(fl_procpool *pool) {
    for (int w = 0; w < pool->config.workers; w++)
        if (pool->workers[w].fd >= 0)
            close(pool->workers[w].fd);
}

static void worker_loop(fl_procpool *pool, int me, int fd) {
    int64_t *ids = malloc(fl_sampler_batch_capacity(&pool->config.sampler) * sizeof *ids); /* checked in _new */
    char *text = malloc(sizeof pool->failure.text);
    if (ids == NULL || text == NULL)
        _exit(70);
    task_header task;
    while (read_all(fd, &task, sizeof task) == 0 &&
           read_all(fd, ids, task.count * sizeof *ids) == 0) {
        result_header result = {task.batch, task.slot, 0, -1, 0, 0, 0};
        unsigned char *dst = pool->region + (size_t)task.slot * pool->slot_stride;
        fl_proc_extra extra = {NULL, 0};
        text[0] = '\0';
        if (pool->config.fill(pool->config.fill_ctx, me, task.seed, ids, task.count, dst, &extra,
                              &result.index, text, sizeof pool->failure.text) != 0) {
            result.failed = 1;
            result.text_len = (uint32_t)strnlen(text, sizeof pool->failure.text - 1);
        } else {
            result.extra_len = extra.len;
        }
        if (write_all(fd, &result, sizeof result) != 0 ||
            write_all(fd, text, result.text_len) != 0 ||
            write_all(fd, extra.data, (size_t)result.extra_len) != 0)
            break;
    }
    _exit(0); /* never return into the parent's code, never run its exit handlers */
}

/* Forks worker w; in the child, never returns. Called without `lock`: the hooks may run code
 * (Python's at-fork callbacks, its garbage collector) that frees a batch and so calls
 * fl_procpool_release() from this very thread. */
static int spawn(fl_procpool *pool, int w) {
    int pair[2]; /* [0]: the parent's end, [1]: the worker's */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        return fl_error_sys("socketpair");
    fl_proc_hooks *h = &pool->config.hooks;
    pid_t parent = getpid();
    if (h->before_fork)
        h->before_fork(h->ctx);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* no orphans if the parent dies */
        if (getppid() != parent)          /* it died before prctl took hold */
            _exit(0);
        signal(SIGINT, SIG_IGN); /* Ctrl-C belongs to the parent, which stops us */
        close(pair[0]);
        close_other_workers_sockets(pool);
        if (h->after_fork_child)
            h->after_fork_child(h->ctx, w);
        worker_loop(pool, w, pair[1]);
    }
    int fork_errno = errno;
    if (h->after_fork_parent)
        h->after_fork_parent(h->ctx);
    close(pair[1]);
    if (pid < 0) {
        close(pair[0]);
        errno = fork_errno;
        return fl_error_sys("fork");
    }
    pthread_mutex_lock(&pool->lock);
    pool->workers[w] = (worker){pid, pair[0], 0};
    pthread_mutex_unlock(&pool->lock);
    return FL_OK;
}

/* ---- stopping and reaping ---- */

/* A slot back to FREE, dropping the extra bytes its batch came with. */
static void free_slot(slot *s) {
    s->state = SLOT_FREE;
    free(s->extra);
    s->extra = NULL;
    s->extra_len = 0;
}

static void describe_exit(fl_proc_error *e, int status) {
    if (WIFSIGNALED(status)) {
        e->signal = WTERMSIG(status);
        snprintf(e->text, sizeof e->text, "worker %d (pid %d) was killed by signal %d (%s)",
                 e->worker, (int)e->pid, e->signal, strsignal(e->signal));
    } else {
        e->exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        snprintf(e->text, sizeof e->text, "worker %d (pid %d) exited with status %d",
                 e->worker, (int)e->pid, e->exit_status);
    }
}

/* Closes every worker's socket, gives them a second to exit, kills the rest, reaps all. */
static void stop_workers(fl_procpool *pool) {
    for (int w = 0; w < pool->config.workers; w++) {
        worker *k = &pool->workers[w];
        if (k->fd >= 0)
            close(k->fd); /* EOF: the worker's loop ends */
        k->fd = -1;
        k->in_flight = 0;
    }
    double deadline = fl_monotonic() + STOP_GRACE_MS / 1000.0;
    for (int w = 0; w < pool->config.workers; w++) {
        worker *k = &pool->workers[w];
        while (k->pid > 0 && waitpid(k->pid, NULL, WNOHANG) == 0) {
            if (fl_monotonic() >= deadline) {
                kill(k->pid, SIGKILL);
                waitpid(k->pid, NULL, 0);
                break;
            }
            nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
        }
        k->pid = 0;
    }
    pool->running = 0;
}

/* A worker hung up: reap it, stop the others, and report the death with the next batch (the
 * batches in flight are lost with it, so nothing after this can be delivered in order). */
static void worker_died(fl_procpool *pool, int w) {
    worker *k = &pool->workers[w];
    int status = 0;
    pid_t pid = k->pid;
    waitpid(pid, &status, 0); /* it has closed its socket: it is exiting or gone */
    k->pid = 0;
    if (!pool->error || pool->failure.kind != FL_PROC_DIED) {
        pool->error = 1;
        pool->error_batch = pool->next_deliver;
        pool->failure = (fl_proc_error){.kind = FL_PROC_DIED, .worker = w, .pid = pid, .index = -1};
        describe_exit(&pool->failure, status);
    }
    for (int s = 0; s < pool->n_slots; s++)
        if (pool->slots[s].state == SLOT_ASSIGNED)
            free_slot(&pool->slots[s]);
    stop_workers(pool);
    pool->epoch_active = 0;
}

/* ---- dispatching and collecting (lock held) ---- */

static int least_busy_worker(fl_procpool *pool) {
    int best = -1;
    for (int w = 0; w < pool->config.workers; w++)
        if (pool->workers[w].pid > 0 && pool->workers[w].in_flight < pool->config.prefetch &&
            (best < 0 || pool->workers[w].in_flight < pool->workers[best].in_flight))
            best = w;
    return best;
}

/* Batches assigned or ready: made ahead of the consumer. */
static int batches_ahead(const fl_procpool *pool) {
    int n = 0;
    for (int s = 0; s < pool->n_slots; s++)
        n += pool->slots[s].state == SLOT_ASSIGNED || pool->slots[s].state == SLOT_READY;
    return n;
}

/* Where batch b starts in the epoch order, and its samples. */
static void batch_span(const fl_procpool *pool, uint64_t b, size_t *start, size_t *count) {
    if (pool->ends != NULL) { /* a batch sampler's batches */
        *start = (size_t)(b > 0 ? pool->ends[b - 1] : 0);
        *count = (size_t)(pool->ends[b] - *start);
        return;
    }
    size_t batch_size = pool->config.sampler.batch_size;
    *start = (size_t)(b * batch_size);
    *count = pool->order_len - *start < batch_size ? pool->order_len - *start : batch_size;
}

/* Sends batches to workers while slots are free, workers have room and fewer than
 * workers * prefetch batches are ahead of the consumer. */
static void dispatch(fl_procpool *pool) {
    int ahead = batches_ahead(pool);
    for (int s = 0; s < pool->n_slots && pool->epoch_active &&
                    ahead < pool->config.workers * pool->config.prefetch; s++) {
        if (pool->slots[s].state != SLOT_FREE || pool->next_claim >= pool->n_batches ||
            (pool->error && pool->next_claim >= pool->error_batch))
            continue;
        int w = least_busy_worker(pool);
        if (w < 0)
            return;
        uint64_t b = pool->next_claim++;
        size_t start, count;
        batch_span(pool, b, &start, &count);
        task_header task = {b, pool->epoch_seed, (uint32_t)s, (uint32_t)count};
        if (write_all(pool->workers[w].fd, &task, sizeof task) != 0 ||
            write_all(pool->workers[w].fd, pool->order + start, count * sizeof(int64_t)) != 0) {
            pool->next_claim--; /* the worker is gone; its hang-up is collected next */
            return;
        }
        pool->slots[s] = (slot){SLOT_ASSIGNED, b, count, w, NULL, 0};
        pool->workers[w].in_flight++;
        ahead++;
    }
}

/* Reads the extra bytes of a result into *out (malloc'd); with no memory for them, reads them
 * away and says so in `text` (in the fill's "module.type\x1emessage\x1e" form). Returns -1 if
 * the worker is gone, 1 when out of memory, 0 on success. */
static int read_extra(int fd, uint64_t len, unsigned char **out, char *text, size_t text_size) {
    *out = NULL;
    if (len == 0)
        return 0;
    *out = malloc((size_t)len);
    if (*out != NULL) {
        if (read_all(fd, *out, (size_t)len) == 0)
            return 0;
        free(*out);
        *out = NULL;
        return -1;
    }
    char sink[4096];
    for (uint64_t left = len; left > 0;) {
        size_t n = left < sizeof sink ? (size_t)left : sizeof sink;
        if (read_all(fd, sink, n) != 0)
            return -1;
        left -= n;
    }
    snprintf(text, text_size,
             "builtins.MemoryError\x1ethe main process has no memory for the %llu bytes of "
             "sample data that did not fit the batch's slot\x1e",
             (unsigned long long)len);
    return 1;
}

/* Reads one result from worker w (its socket is readable). */
static void collect(fl_procpool *pool, int w) {
    result_header r;
    worker *k = &pool->workers[w];
    char *text = pool->failure.text;
    static _Thread_local char spare[sizeof ((fl_proc_error *)0)->text];
    if (pool->error) /* keep the recorded failure's text; read into a spare buffer */
        text = spare;
    unsigned char *extra = NULL;
    int extra_rc = 0;
    if (read_all(k->fd, &r, sizeof r) != 0 || r.slot >= (uint32_t)pool->n_slots ||
        r.text_len >= sizeof spare || read_all(k->fd, text, r.text_len) != 0 ||
        (extra_rc = read_extra(k->fd, r.extra_len, &extra, text, sizeof spare)) < 0) {
        worker_died(pool, w);
        return;
    }
    if (extra_rc == 0)
        text[r.text_len] = '\0';
    slot *s = &pool->slots[r.slot];
    k->in_flight--;
    if (!r.failed && extra_rc == 0) {
        s->state = SLOT_READY;
        s->extra = extra;
        s->extra_len = extra != NULL ? (size_t)r.extra_len : 0;
        return;
    }
    free_slot(s);
    r.text_len = (uint32_t)strlen(text);
    if (extra_rc != 0)
        r.index = -1;
    if (!pool->error || r.batch < pool->error_batch) {
        if (text == spare)
            memcpy(pool->failure.text, spare, r.text_len + 1);
        pool->error = 1;
        pool->error_batch = r.batch;
        pool->failure.kind = FL_PROC_FAILED;
        pool->failure.worker = w;
        pool->failure.pid = k->pid;
        pool->failure.index = r.index;
    }
}

static slot *ready_slot(fl_procpool *pool, uint64_t b) {
    for (int s = 0; s < pool->n_slots; s++)
        if (pool->slots[s].state == SLOT_READY && pool->slots[s].batch == b)
            return &pool->slots[s];
    return NULL;
}

/* Waits up to `seconds` for results (lock released meanwhile) and collects them. */
static void wait_for_results(fl_procpool *pool, double seconds) {
    struct pollfd fds[256];
    int who[256], n = 0;
    for (int w = 0; w < pool->config.workers && n < 256; w++)
        if (pool->workers[w].pid > 0 && pool->workers[w].fd >= 0) {
            fds[n] = (struct pollfd){pool->workers[w].fd, POLLIN, 0};
            who[n++] = w;
        }
    pthread_mutex_unlock(&pool->lock);
    int ready = n > 0 ? poll(fds, (nfds_t)n, (int)(seconds * 1000)) : 0;
    if (n == 0 && seconds > 0)
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    pthread_mutex_lock(&pool->lock);
    for (int i = 0; i < n && ready > 0; i++)
        if (fds[i].revents && pool->workers[who[i]].pid > 0)
            collect(pool, who[i]); /* POLLHUP with nothing left reads EOF: a death */
}

/* ---- owner API ---- */

int fl_procpool_new(const fl_procpool_config *config, fl_procpool **out) {
    *out = NULL;
    int rc = fl_sampler_check(&config->sampler);
    if (rc != FL_OK)
        return rc;
    if (config->workers < 1 || config->workers > 256 || config->prefetch < 1 || config->fill == NULL)
        return fl_error_set(FL_EINVAL, "a process pool needs 1..256 workers, prefetch >= 1 and a fill function");
    /* + 2: the batch the consumer still holds while it takes the next one, so that
     * `prefetch` batches per worker stay in flight meanwhile (as DataLoader's prefetch_factor) */
    int n_slots;
    size_t stride, region_len;
    if (__builtin_mul_overflow(config->workers, config->prefetch, &n_slots) ||
        __builtin_add_overflow(n_slots, 2, &n_slots))
        return fl_error_set(FL_EOVERFLOW, "workers x prefetch is too large: %d x %d", config->workers,
                            config->prefetch);
    if (fl_sampler_batch_capacity(&config->sampler) > UINT32_MAX) /* a task's count is 32 bits */
        return fl_error_set(FL_EINVAL, "batch_size is too large: at most %u samples per batch in worker processes",
                            (unsigned)UINT32_MAX);
    const char *slots = "the batch slots ((workers x prefetch + 2) x batch_size x sample bytes)";
    size_t with_bookkeeping;
    if ((rc = fl_size_align(config->slot_bytes, ALIGN, "batch_size x sample bytes", &stride)) != FL_OK ||
        (rc = fl_size_mul(stride, (size_t)n_slots, slots, &region_len)) != FL_OK ||
        (rc = fl_size_mul(stride + sizeof(slot), (size_t)n_slots, slots, &with_bookkeeping)) != FL_OK ||
        (rc = fl_size_fits_memory(with_bookkeeping, slots)) != FL_OK)
        return rc;
    fl_procpool *pool = calloc(1, sizeof *pool);
    if (pool == NULL)
        return FL_ENOMEM;
    pool->config = *config;
    pool->n_slots = n_slots;
    pool->slot_stride = stride;
    pool->region_len = region_len;
    pool->region = mmap(NULL, pool->region_len ? pool->region_len : ALIGN, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pool->slots = calloc((size_t)pool->n_slots, sizeof *pool->slots);
    pool->workers = calloc((size_t)config->workers, sizeof *pool->workers);
    pthread_mutex_init(&pool->lock, NULL);
    if (pool->region == MAP_FAILED)
        pool->region = NULL;
    if (pool->region == NULL || pool->slots == NULL || pool->workers == NULL) {
        fl_procpool_free(pool);
        return fl_error_set(FL_ENOMEM, "cannot map %zu bytes of shared batch slots", pool->region_len);
    }
    for (int w = 0; w < config->workers; w++)
        pool->workers[w] = (worker){0, -1, 0};
    pool->n_batches = fl_sampler_batches(&config->sampler);
    *out = pool;
    return FL_OK;
}

int fl_procpool_needs_stop(fl_procpool *pool) {
    pthread_mutex_lock(&pool->lock);
    int abandon = (pool->epoch_active && pool->next_deliver < pool->n_batches) || pool->error;
    pthread_mutex_unlock(&pool->lock);
    return abandon;
}

int fl_procpool_start_epoch(fl_procpool *pool, uint64_t epoch) { return fl_procpool_start_epoch_at(pool, epoch, 0); }

int fl_procpool_start_epoch_at(fl_procpool *pool, uint64_t epoch, uint64_t first_batch) {
    if (fl_procpool_needs_stop(pool))
        fl_procpool_stop(pool);
    uint64_t shard = fl_sampler_shard_size(&pool->config.sampler);
    int64_t *order = malloc((shard ? shard : 1) * sizeof *order);
    if (order == NULL || fl_sampler_epoch(&pool->config.sampler, epoch, order) != FL_OK) {
        free(order);
        return FL_ENOMEM;
    }
    pthread_mutex_lock(&pool->lock);
    free(pool->order);
    pool->order = order;
    pool->order_len = shard;
    pool->epoch_seed = fl_sampler_epoch_seed(pool->config.sampler.seed, epoch);
    pool->next_claim = pool->next_deliver = first_batch < pool->n_batches ? first_batch : pool->n_batches;
    pool->error = 0;
    int fork_workers = !pool->running;
    pool->epoch_active = !fork_workers; /* until the workers run, a release dispatches nothing */
    pthread_mutex_unlock(&pool->lock);
    int rc = FL_OK;
    for (int w = 0; fork_workers && w < pool->config.workers && rc == FL_OK; w++)
        rc = spawn(pool, w);
    pthread_mutex_lock(&pool->lock);
    if (rc != FL_OK)
        stop_workers(pool);
    else
        pool->running = 1;
    pool->epoch_active = rc == FL_OK;
    pthread_mutex_unlock(&pool->lock);
    return rc;
}

int fl_procpool_next(fl_procpool *pool, double timeout_s, int *slot_out, size_t *count) {
    pthread_mutex_lock(&pool->lock);
    double deadline = timeout_s < 0 ? -1 : fl_monotonic() + timeout_s;
    int rc;
    for (;;) {
        if (pool->error && pool->next_deliver >= pool->error_batch) {
            rc = FL_EWORKER;
            break;
        }
        if (!pool->epoch_active || pool->next_deliver >= pool->n_batches) {
            rc = FL_EEND;
            break;
        }
        wait_for_results(pool, 0); /* collect finished batches and keep every worker's queue full */
        dispatch(pool);
        slot *s = ready_slot(pool, pool->next_deliver);
        if (s != NULL) {
            s->state = SLOT_LENT;
            pool->lent++;
            pool->next_deliver++;
            *slot_out = (int)(s - pool->slots);
            *count = s->count;
            dispatch(pool); /* one fewer ahead: the next batch can start */
            rc = FL_OK;
            break;
        }
        double left = deadline < 0 ? 0.05 : deadline - fl_monotonic();
        if (left <= 0) {
            rc = timeout_s == 0 ? FL_EAGAIN : FL_ETIMEDOUT;
            break;
        }
        wait_for_results(pool, left < 0.05 ? left : 0.05);
        if (deadline < 0) /* no limit: keep waiting */
            continue;
    }
    pthread_mutex_unlock(&pool->lock);
    if (rc == FL_OK && pool->config.metrics != NULL) {
        fl_metrics_add(pool->config.metrics, "loader/samples", (double)*count);
        fl_metrics_add(pool->config.metrics, "loader/batches", 1);
    }
    return rc;
}

const fl_proc_error *fl_procpool_error(fl_procpool *pool) { return &pool->failure; }

const void *fl_procpool_extra(fl_procpool *pool, int s, size_t *len) {
    pthread_mutex_lock(&pool->lock);
    int lent = s >= 0 && s < pool->n_slots && pool->slots[s].state == SLOT_LENT;
    const void *data = lent ? pool->slots[s].extra : NULL;
    *len = data != NULL ? pool->slots[s].extra_len : 0;
    pthread_mutex_unlock(&pool->lock);
    return data;
}

/* FL_OK when `ends` (n of them) split the shard into batches of 1 to batch_size samples. */
static int check_ends(const fl_procpool *pool, const uint64_t *ends, uint64_t n) {
    uint64_t shard = fl_sampler_shard_size(&pool->config.sampler), start = 0;
    for (uint64_t b = 0; b < n; start = ends[b++])
        if (ends[b] <= start || ends[b] - start > pool->config.sampler.batch_size)
            return fl_error_set(FL_EINVAL, "batch %llu has %lld samples; each must have 1 to %zu",
                                (unsigned long long)b, (long long)(ends[b] - start),
                                pool->config.sampler.batch_size);
    if (start != shard)
        return fl_error_set(FL_EINVAL, "the batches hold %llu samples in all, the order %llu",
                            (unsigned long long)start, (unsigned long long)shard);
    return FL_OK;
}

int fl_procpool_set_batches(fl_procpool *pool, const uint64_t *ends, uint64_t n) {
    int rc = ends != NULL ? check_ends(pool, ends, n) : FL_OK;
    uint64_t *copy = NULL;
    if (rc == FL_OK && ends != NULL &&
        (n > SIZE_MAX / sizeof *copy || (copy = malloc(n ? n * sizeof *copy : 1)) == NULL))
        rc = FL_ENOMEM;
    if (rc != FL_OK)
        return rc;
    if (copy != NULL)
        memcpy(copy, ends, n * sizeof *copy);
    pthread_mutex_lock(&pool->lock);
    if (pool->epoch_active && pool->next_deliver < pool->n_batches) {
        pthread_mutex_unlock(&pool->lock);
        free(copy);
        return fl_error_set(FL_EINVAL, "the batches cannot change while an epoch is in progress");
    }
    free(pool->ends);
    pool->ends = copy;
    pool->n_batches = copy != NULL ? n : fl_sampler_batches(&pool->config.sampler);
    pthread_mutex_unlock(&pool->lock);
    return FL_OK;
}

void fl_procpool_release(fl_procpool *pool, int s) {
    pthread_mutex_lock(&pool->lock);
    if (s >= 0 && s < pool->n_slots && pool->slots[s].state == SLOT_LENT) {
        free_slot(&pool->slots[s]);
        pool->lent--;
        dispatch(pool); /* refill it now: a worker idle until the consumer's next call is time lost */
    }
    pthread_mutex_unlock(&pool->lock);
}

void fl_procpool_stop(fl_procpool *pool) {
    pthread_mutex_lock(&pool->lock);
    stop_workers(pool);
    for (int s = 0; s < pool->n_slots; s++)
        if (pool->slots[s].state == SLOT_ASSIGNED || pool->slots[s].state == SLOT_READY)
            free_slot(&pool->slots[s]);
    pool->epoch_active = 0;
    pthread_mutex_unlock(&pool->lock);
}

pid_t fl_procpool_pid(fl_procpool *pool, int w) {
    pthread_mutex_lock(&pool->lock);
    pid_t pid = w >= 0 && w < pool->config.workers ? pool->workers[w].pid : 0;
    pthread_mutex_unlock(&pool->lock);
    return pid;
}

void *fl_procpool_slot(fl_procpool *pool, int s) { return pool->region + (size_t)s * pool->slot_stride; }

int fl_procpool_lent(fl_procpool *pool) {
    pthread_mutex_lock(&pool->lock);
    int lent = pool->lent;
    pthread_mutex_unlock(&pool->lock);
    return lent;
}

int fl_procpool_slots(const fl_procpool *pool) { return pool->n_slots; }

int fl_procpool_ahead(fl_procpool *pool) {
    pthread_mutex_lock(&pool->lock);
    int ahead = batches_ahead(pool);
    pthread_mutex_unlock(&pool->lock);
    return ahead;
}

uint64_t fl_procpool_batches(const fl_procpool *pool) { return pool->n_batches; }

void fl_procpool_free(fl_procpool *pool) {
    if (pool == NULL)
        return;
    if (pool->workers != NULL)
        fl_procpool_stop(pool);
    if (pool->region != NULL)
        munmap(pool->region, pool->region_len ? pool->region_len : ALIGN);
    pthread_mutex_destroy(&pool->lock);
    for (int s = 0; pool->slots != NULL && s < pool->n_slots; s++)
        free(pool->slots[s].extra);
    free(pool->ends);
    free(pool->order);
    free(pool->slots);
    free(pool->workers);
    free(pool);
}

/* ---- the batch-source table (fl_batch_source.h): the typed API above, behind void * ---- */

static int source_start_epoch(void *pool, uint64_t epoch, uint64_t first_batch) {
    return fl_procpool_start_epoch_at(pool, epoch, first_batch);
}
static int source_needs_stop(void *pool) { return fl_procpool_needs_stop(pool); }
static int source_next(void *pool, double timeout_s, int *slot, size_t *count) {
    return fl_procpool_next(pool, timeout_s, slot, count);
}
static void source_release(void *pool, int slot) { fl_procpool_release(pool, slot); }
static void source_stop(void *pool) { fl_procpool_stop(pool); }
static void *source_slot(void *pool, int slot) { return fl_procpool_slot(pool, slot); }
static int source_ahead(void *pool) { return fl_procpool_ahead(pool); }
static int source_lent(void *pool) { return fl_procpool_lent(pool); }
static int source_slots(const void *pool) { return fl_procpool_slots(pool); }
static uint64_t source_batches(const void *pool) { return fl_procpool_batches(pool); }
static const char *source_error(void *pool) { return fl_procpool_error(pool)->text; }
static void source_free(void *pool) { fl_procpool_free(pool); }

static const fl_batch_source_ops procpool_source_ops = {
    .name = "processes", .start_forks = 1, .release_blocks = 1,
    .start_epoch = source_start_epoch, .needs_stop = source_needs_stop, .next = source_next,
    .release = source_release, .stop = source_stop, .slot = source_slot, .lent = source_lent,
    .ahead = source_ahead, .slots = source_slots, .batches = source_batches, .error = source_error,
    .free = source_free,
};

fl_batch_source fl_procpool_source(fl_procpool *pool) {
    return (fl_batch_source){&procpool_source_ops, pool};
}
