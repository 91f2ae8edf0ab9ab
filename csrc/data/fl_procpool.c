/* fl_procpool.c - forked workers, shared slots, and the socket protocol between them.
 *
 *   slot states:    FREE --dispatch--> ASSIGNED(worker) --"done"--> READY
 *                   READY --next() in order--> LENT --release()--> FREE
 *   worker phases:  IDLE --start_epoch--> STARTING --forked--> RUNNING --stop, a death--> STOPPING
 *                   --reaped--> IDLE
 *
 * Each worker talks to the parent over one Unix stream socket pair (written with
 * MSG_NOSIGNAL: a dead peer is an error code, never a SIGPIPE). Messages are fixed headers
 * (plus sample ids, or an error text and the batch's extra bytes) written whole by one writer
 * per direction.
 *
 * Locking: `lock` guards the state, and no thread holds it across a blocking call or a sleep.
 * Whatever does I/O first takes a role under the lock, drops the lock for the I/O, and
 * publishes what came of it under the lock again; one thread at a time holds each role:
 *   - the starter (phase STARTING) forks the workers;
 *   - the collector (`collecting`) polls the workers' sockets and reads their results;
 *   - the dispatcher (`dispatching`) writes tasks to them; a thread that finds it busy sets
 *     `dispatch_again`, and the dispatcher goes round once more;
 *   - the stopper (phase STOPPING) ends and reaps the workers; other stops wait for it.
 * A worker's socket stays open while `fd_users` (the collector, the dispatcher) may touch it:
 * the stopper shuts the sockets down first (a worker reads EOF; a read, write or poll of ours
 * blocked on one returns), reaps the workers, waits for fd_users to drop to 0, and only then
 * closes them, so no descriptor is closed under a thread using it. `changed` is broadcast on
 * every change a waiter may want; every wait on it is a timed slice.
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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/fl_error.h"
#include "base/fl_size.h"
#include "base/fl_time.h"

enum {
    ALIGN = 4096,
    MAX_WORKERS = 256,
    STOP_GRACE_MS = 1000,  /* how long a worker may take to end the batch in hand at a stop */
    PARENT_CHECK_MS = 200, /* how often an idle worker checks that its parent process lives */
    TEXT_SIZE = sizeof ((fl_proc_error *)0)->text,
};
static const double WAIT_SLICE_S = 0.05; /* the longest a wait on `changed` or poll() lasts */

typedef enum slot_state { SLOT_FREE, SLOT_ASSIGNED, SLOT_READY, SLOT_LENT } slot_state;
typedef enum pool_phase { PHASE_IDLE, PHASE_STARTING, PHASE_RUNNING, PHASE_STOPPING } pool_phase;

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

typedef struct task { /* a batch planned for a worker, sent by the dispatcher without the lock */
    int fd;
    task_header header;
    const int64_t *ids; /* into `order`, which start_epoch replaces only while no one dispatches */
} task;

typedef struct result { /* read by the collector without the lock; text in result_text */
    result_header header;
    unsigned char *extra; /* malloc'd, or NULL */
    int extra_dropped;    /* no memory for the extra bytes: result_text says so */
} result;

typedef struct ending { /* a worker being ended, the stopper's */
    pid_t pid;
    int fd;
    int status;    /* from waitpid */
    int killed_us; /* it outlived the grace: the stopper sent the SIGKILL */
} ending;

struct fl_procpool {
    fl_procpool_config config;
    int n_slots;
    unsigned char *region; /* n_slots * slot_stride, shared with the workers */
    size_t region_len, slot_stride;
    int64_t *worker_ids; /* a worker's buffers, made before it forks: a worker mallocs nothing */
    char *worker_text;

    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t changed;
    slot *slots;
    worker *workers;
    pool_phase phase;
    pthread_t starter;  /* STARTING: the thread forking */
    int stop_requested; /* STARTING: a stop came meanwhile; the starter ends what it forked */
    uint64_t starts;      /* epochs begun: a stop waiting for another ends if a start comes */
    uint64_t generation;  /* bumped when an epoch begins or is stopped: a waiting next() ends */
    int collecting, dispatching, dispatch_again, fd_users;
    task *tasks;        /* the dispatcher's: n_slots */
    ending *ending;     /* the stopper's: one per worker */
    char *result_text;  /* the collector's: TEXT_SIZE */
    int64_t *order;
    uint64_t order_len, n_batches, next_claim, next_deliver, epoch_seed;
    uint64_t *ends; /* fl_procpool_set_batches: where each batch ends in the order, or NULL */
    int epoch_active;
    int error; /* an fl_proc_error is waiting at error_batch */
    uint64_t error_batch;
    fl_proc_error failure;
    int lent;
};

/* ---- sockets ---- */

enum { RECEIVE, SEND };

/* Moves exactly len bytes over a worker's socket in `direction`, retrying short transfers and
 * EINTR; -1 on EOF or error (the other end is gone, or a stop shut the socket down). */
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

/* Lock held: waits up to `seconds` (at most a slice: the caller checks its condition again)
 * for a broadcast of `changed`. Returns at once for 0. */
static void wait_changed(fl_procpool *pool, double seconds) {
    if (!(seconds > 0))
        return;
    struct timespec deadline = fl_deadline_after(seconds < WAIT_SLICE_S ? seconds : WAIT_SLICE_S);
    fl_cond_wait_until(&pool->changed, &pool->lock, &deadline);
}

/* ---- the worker process ---- */

/* In a worker process: the pid of the process that forked it (0 in any other process). A
 * worker is single-threaded: set once, right after fork, then only read. */
static pid_t worker_parent;

void fl_procpool_exit_if_orphaned(void) {
    if (worker_parent != 0 && getppid() != worker_parent)
        _exit(0);
}

/* In a new worker: closes the parent's ends of the other workers' sockets, so that only the
 * parent holds them and a worker's death hangs up its socket for the parent. */
static void close_other_workers_sockets(fl_procpool *pool) {
    for (int w = 0; w < pool->config.workers; w++)
        if (pool->workers[w].fd >= 0)
            close(pool->workers[w].fd);
}

/* In a worker: waits for the parent's next command. Returns 0 when the socket has something
 * to read (a command, or the EOF of a stop or of the parent's end), -1 once the parent process
 * has died: then no EOF need come, as a process the parent forked later (another pool's
 * worker, a plain os.fork()) may hold a copy of its end of the socket. */
static int await_command(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    for (;;) {
        int n = poll(&p, 1, PARENT_CHECK_MS);
        if (getppid() != worker_parent)
            return -1;
        if (n > 0 || (n < 0 && errno != EINTR))
            return 0; /* the read that follows tells which */
    }
}

static void worker_loop(fl_procpool *pool, int me, int fd) {
    int64_t *ids = pool->worker_ids;
    char *text = pool->worker_text;
    size_t capacity = fl_sampler_batch_capacity(&pool->config.sampler);
    task_header task;
    while (await_command(fd) == 0 && read_all(fd, &task, sizeof task) == 0 && task.count <= capacity &&
           read_all(fd, ids, task.count * sizeof *ids) == 0) {
        result_header result = {task.batch, task.slot, 0, -1, 0, 0, 0};
        unsigned char *dst = pool->region + (size_t)task.slot * pool->slot_stride;
        fl_proc_extra extra = {NULL, 0};
        text[0] = '\0';
        if (pool->config.fill(pool->config.fill_ctx, me, task.seed, ids, task.count, dst, &extra,
                              &result.index, text, TEXT_SIZE) != 0) {
            result.failed = 1;
            result.text_len = (uint32_t)strnlen(text, TEXT_SIZE - 1);
        } else {
            result.extra_len = extra.len;
        }
        if (write_all(fd, &result, sizeof result) != 0 || write_all(fd, text, result.text_len) != 0 ||
            write_all(fd, extra.data, (size_t)result.extra_len) != 0)
            break;
    }
    _exit(0); /* never return into the parent's code, never run its exit handlers */
}

/* In a new worker, never returning. PR_SET_PDEATHSIG fires when the *thread* that forked the
 * worker ends, not its process: set only when the main thread forks (whose end is the
 * process's), it ends the worker at once however busy; otherwise the worker ends on its
 * parent's death as await_command() and fl_procpool_exit_if_orphaned() notice it. */
static void worker_main(fl_procpool *pool, int w, int fd, int fd_parent, pid_t parent,
                        int main_thread) {
    worker_parent = parent;
    if (main_thread)
        prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) /* it died before prctl took hold */
        _exit(0);
    signal(SIGINT, SIG_IGN); /* Ctrl-C belongs to the parent, which stops us */
    close(fd_parent);
    close_other_workers_sockets(pool);
    fl_proc_hooks *h = &pool->config.hooks;
    if (h->after_fork_child)
        h->after_fork_child(h->ctx, w);
    worker_loop(pool, w, fd);
}

/* Forks worker w; in the child, never returns. Called by the starter without `lock`: the
 * hooks may run code (Python's at-fork callbacks, its garbage collector) that frees a batch
 * and so calls fl_procpool_release() from this very thread. */
static int spawn(fl_procpool *pool, int w) {
    int pair[2]; /* [0]: the parent's end, [1]: the worker's */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        return fl_error_sys("socketpair");
    fl_proc_hooks *h = &pool->config.hooks;
    pid_t parent = getpid();
    int main_thread = (pid_t)syscall(SYS_gettid) == parent; /* glibc 2.28 has no gettid() */
    if (h->before_fork)
        h->before_fork(h->ctx);
    pid_t pid = fork();
    if (pid == 0)
        worker_main(pool, w, pair[1], pair[0], parent, main_thread);
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

static void describe_exit(fl_proc_error *e, const ending *k) {
    int status = k->status;
    if (k->killed_us) {
        e->signal = SIGKILL;
        snprintf(e->text, sizeof e->text,
                 "worker %d (pid %d) closed its connection to the main process but did not exit; "
                 "fastloop ended it with SIGKILL after %d ms",
                 e->worker, (int)e->pid, STOP_GRACE_MS);
    } else if (WIFSIGNALED(status)) {
        e->signal = WTERMSIG(status);
        snprintf(e->text, sizeof e->text, "worker %d (pid %d) died of signal %d (%s)%s", e->worker,
                 (int)e->pid, e->signal, strsignal(e->signal),
                 e->signal == SIGKILL ? ", sent from outside fastloop: most often by the kernel's "
                                        "out-of-memory killer (see dmesg)" : "");
    } else {
        e->exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        snprintf(e->text, sizeof e->text, "worker %d (pid %d) exited with status %d", e->worker,
                 (int)e->pid, e->exit_status);
    }
}

/* Lock held: worker w's death (reaped: k) becomes the error at the next batch, unless a
 * death is already reported (a FAILED batch gives way: nothing after a death is delivered). */
static void record_death(fl_procpool *pool, int w, const ending *k) {
    if (pool->error && pool->failure.kind == FL_PROC_DIED)
        return;
    pool->error = 1;
    pool->error_batch = pool->next_deliver;
    pool->failure = (fl_proc_error){.kind = FL_PROC_DIED, .worker = w, .pid = k->pid, .index = -1};
    describe_exit(&pool->failure, k);
}

/* Without the lock: reaps worker k, waiting until `deadline` for it to exit, then SIGKILLing
 * it (and saying so in k->killed_us). */
static void reap_one(ending *k, double deadline) {
    for (;;) {
        pid_t done = waitpid(k->pid, &k->status, WNOHANG);
        if (done > 0 || (done < 0 && errno != EINTR))
            return; /* reaped, or not ours to reap (ECHILD) */
        if (fl_monotonic() >= deadline)
            break;
        nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
    }
    kill(k->pid, SIGKILL);
    k->killed_us = 1;
    while (waitpid(k->pid, &k->status, 0) < 0 && errno == EINTR) {
    }
}

/* Without the lock: shuts the workers' sockets down (each worker reads EOF and ends after the
 * batch in hand; a thread of ours blocked on one returns), gives them STOP_GRACE_MS, SIGKILLs
 * the rest, and reaps them all, keeping each one's status. */
static void reap(ending *k, int n) {
    for (int i = 0; i < n; i++)
        if (k[i].fd >= 0)
            shutdown(k[i].fd, SHUT_RDWR);
    double deadline = fl_monotonic() + STOP_GRACE_MS / 1000.0;
    for (int i = 0; i < n; i++)
        if (k[i].pid > 0) /* never waitpid(0): that is any child of the process group */
            reap_one(&k[i], deadline);
}

/* Lock held, and the caller owns the workers (phase RUNNING, or STARTING as the starter).
 * Ends them as the stopper (dropping the lock meanwhile): the batches made for the epoch and
 * not handed out are forgotten, lent slots stay lent. `died` >= 0: the worker whose hang-up
 * called for this, whose death becomes the epoch's error. Returns with the phase IDLE. */
static void end_workers(fl_procpool *pool, int died) {
    pool->phase = PHASE_STOPPING;
    for (int w = 0; w < pool->config.workers; w++) {
        pool->ending[w] = (ending){pool->workers[w].pid, pool->workers[w].fd, 0, 0};
        pool->workers[w] = (worker){0, -1, 0};
    }
    pthread_cond_broadcast(&pool->changed);
    pthread_mutex_unlock(&pool->lock);
    reap(pool->ending, pool->config.workers);
    pthread_mutex_lock(&pool->lock);
    while (pool->fd_users > 0) /* their I/O failed at the shutdown: they are on their way out */
        wait_changed(pool, WAIT_SLICE_S);
    for (int w = 0; w < pool->config.workers; w++)
        if (pool->ending[w].fd >= 0)
            close(pool->ending[w].fd); /* no one uses it now; a socket's close does not block */
    for (int s = 0; s < pool->n_slots; s++)
        if (pool->slots[s].state == SLOT_ASSIGNED || pool->slots[s].state == SLOT_READY)
            free_slot(&pool->slots[s]);
    if (died >= 0)
        record_death(pool, died, &pool->ending[died]);
    pool->epoch_active = 0;
    pool->generation++;
    pool->phase = PHASE_IDLE;
    pthread_cond_broadcast(&pool->changed);
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

/* Assigns batches to workers while slots are free, workers have room and fewer than
 * workers * prefetch batches are ahead of the consumer, into pool->tasks; returns how many. */
static int plan_tasks(fl_procpool *pool) {
    int n = 0, ahead = batches_ahead(pool);
    for (int s = 0; s < pool->n_slots && ahead < pool->config.workers * pool->config.prefetch; s++) {
        if (pool->slots[s].state != SLOT_FREE || pool->next_claim >= pool->n_batches ||
            (pool->error && pool->next_claim >= pool->error_batch))
            continue;
        int w = least_busy_worker(pool);
        if (w < 0)
            break;
        uint64_t b = pool->next_claim++;
        size_t start, count;
        batch_span(pool, b, &start, &count);
        task_header header = {b, pool->epoch_seed, (uint32_t)s, (uint32_t)count};
        pool->tasks[n++] = (task){pool->workers[w].fd, header, pool->order + start};
        pool->slots[s] = (slot){SLOT_ASSIGNED, b, count, w, NULL, 0};
        pool->workers[w].in_flight++;
        ahead++;
    }
    return n;
}

/* Without the lock: writes the planned tasks. A write fails only when its worker is gone or a
 * stop shut the socket down; the collector or the stopper then deals with its batches. */
static void send_tasks(const task *tasks, int n) {
    for (int i = 0; i < n; i++)
        if (write_all(tasks[i].fd, &tasks[i].header, sizeof tasks[i].header) == 0)
            write_all(tasks[i].fd, tasks[i].ids, tasks[i].header.count * sizeof *tasks[i].ids);
}

/* Lock held (dropped while writing): hands batches to workers as plan_tasks allows. If
 * another thread is dispatching, it goes round again for this call instead. */
static void dispatch(fl_procpool *pool) {
    pool->dispatch_again = 1;
    if (pool->dispatching)
        return;
    pool->dispatching = 1;
    while (pool->dispatch_again && pool->phase == PHASE_RUNNING && pool->epoch_active) {
        pool->dispatch_again = 0;
        int n = plan_tasks(pool);
        if (n == 0)
            break;
        pool->fd_users++;
        pthread_mutex_unlock(&pool->lock);
        send_tasks(pool->tasks, n);
        pthread_mutex_lock(&pool->lock);
        pool->fd_users--;
    }
    pool->dispatching = 0;
    pthread_cond_broadcast(&pool->changed);
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

/* The collector, without the lock: reads one whole result from a worker's socket into *r (its
 * text into pool->result_text). Returns 0, or -1 when the worker is gone or sent garbage. */
static int read_result(fl_procpool *pool, int fd, result *r) {
    *r = (result){.extra = NULL};
    if (read_all(fd, &r->header, sizeof r->header) != 0 || r->header.slot >= (uint32_t)pool->n_slots ||
        r->header.text_len >= TEXT_SIZE || read_all(fd, pool->result_text, r->header.text_len) != 0)
        return -1;
    pool->result_text[r->header.text_len] = '\0';
    int rc = read_extra(fd, r->header.extra_len, &r->extra, pool->result_text, TEXT_SIZE);
    r->extra_dropped = rc == 1;
    return rc < 0 ? -1 : 0;
}

/* Lock held: a failed batch's error, kept if it comes before the one recorded. */
static void record_failure(fl_procpool *pool, int w, const result *r) {
    if (pool->error && r->header.batch >= pool->error_batch)
        return;
    memcpy(pool->failure.text, pool->result_text, strlen(pool->result_text) + 1);
    pool->error = 1;
    pool->error_batch = r->header.batch;
    pool->failure.kind = FL_PROC_FAILED;
    pool->failure.worker = w;
    pool->failure.pid = pool->workers[w].pid;
    pool->failure.index = r->extra_dropped ? -1 : r->header.index;
}

/* Lock held: worker w's result into its slot. Returns -1 (taking the extra bytes) if it names
 * a slot not assigned to w for that batch: a corrupt stream, treated as a death. */
static int publish(fl_procpool *pool, int w, result *r) {
    slot *s = &pool->slots[r->header.slot];
    if (s->state != SLOT_ASSIGNED || s->worker != w || s->batch != r->header.batch) {
        free(r->extra);
        return -1;
    }
    pool->workers[w].in_flight--;
    if (!r->header.failed && !r->extra_dropped) {
        s->state = SLOT_READY;
        s->extra = r->extra;
        s->extra_len = r->extra != NULL ? (size_t)r->header.extra_len : 0;
        return 0;
    }
    free(r->extra);
    free_slot(s);
    record_failure(pool, w, r);
    return 0;
}

static int timeout_ms(double seconds) {
    return seconds > 0 ? (int)(seconds * 1000 + 0.999) : 0; /* a part of a ms waits, never spins */
}

/* Lock held (dropped while waiting and reading): as the collector, waits up to `seconds` for
 * results and collects them; if another thread is collecting, or no worker runs, waits for
 * its news instead. A worker found gone is ended here, with the others. */
static void collect(fl_procpool *pool, double seconds) {
    if (pool->phase != PHASE_RUNNING || pool->collecting) {
        wait_changed(pool, seconds);
        return;
    }
    struct pollfd fds[MAX_WORKERS];
    int who[MAX_WORKERS], n = 0, died = -1;
    for (int w = 0; w < pool->config.workers; w++)
        if (pool->workers[w].pid > 0) {
            fds[n] = (struct pollfd){pool->workers[w].fd, POLLIN, 0};
            who[n++] = w;
        }
    pool->collecting = 1;
    pool->fd_users++;
    pthread_mutex_unlock(&pool->lock);
    int ready = poll(fds, (nfds_t)n, timeout_ms(seconds));
    int running = 1;
    for (int i = 0; i < n && ready > 0 && running && died < 0; i++) {
        if (fds[i].revents == 0)
            continue;
        result r;
        int rc = read_result(pool, fds[i].fd, &r); /* POLLHUP with nothing left reads EOF: a death */
        pthread_mutex_lock(&pool->lock);
        running = pool->phase == PHASE_RUNNING; /* else a stop shut the sockets: drop what came */
        if (!running)
            free(r.extra);
        else if (rc != 0 || publish(pool, who[i], &r) != 0)
            died = who[i];
        pthread_cond_broadcast(&pool->changed);
        pthread_mutex_unlock(&pool->lock);
    }
    pthread_mutex_lock(&pool->lock);
    pool->collecting = 0;
    pool->fd_users--;
    pthread_cond_broadcast(&pool->changed);
    if (died >= 0 && pool->phase == PHASE_RUNNING)
        end_workers(pool, died);
}

static slot *ready_slot(fl_procpool *pool, uint64_t b) {
    for (int s = 0; s < pool->n_slots; s++)
        if (pool->slots[s].state == SLOT_READY && pool->slots[s].batch == b)
            return &pool->slots[s];
    return NULL;
}

/* ---- owner API ---- */

int fl_procpool_new(const fl_procpool_config *config, fl_procpool **out) {
    *out = NULL;
    int rc = fl_sampler_check(&config->sampler);
    if (rc != FL_OK)
        return rc;
    if (config->workers < 1 || config->workers > MAX_WORKERS || config->prefetch < 1 || config->fill == NULL)
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
        (rc = fl_size_mul(stride + sizeof(slot) + sizeof(task), (size_t)n_slots, slots,
                          &with_bookkeeping)) != FL_OK ||
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
    pool->tasks = calloc((size_t)pool->n_slots, sizeof *pool->tasks);
    pool->workers = calloc((size_t)config->workers, sizeof *pool->workers);
    pool->ending = calloc((size_t)config->workers, sizeof *pool->ending);
    pool->result_text = malloc(TEXT_SIZE);
    pool->worker_text = malloc(TEXT_SIZE);
    size_t capacity = fl_sampler_batch_capacity(&config->sampler); /* checked above */
    pool->worker_ids = malloc(capacity * sizeof *pool->worker_ids);
    pthread_mutex_init(&pool->lock, NULL);
    int cond_rc = fl_cond_init(&pool->changed);
    if (pool->region == MAP_FAILED)
        pool->region = NULL;
    if (pool->region == NULL || pool->slots == NULL || pool->tasks == NULL || pool->workers == NULL ||
        pool->ending == NULL || pool->result_text == NULL || pool->worker_text == NULL ||
        pool->worker_ids == NULL || cond_rc != FL_OK) {
        fl_procpool_free(pool);
        return fl_error_set(FL_ENOMEM, "cannot map %zu bytes of shared batch slots", region_len);
    }
    for (int w = 0; w < config->workers; w++)
        pool->workers[w] = (worker){0, -1, 0};
    pool->n_batches = fl_sampler_batches(&config->sampler);
    *out = pool;
    return FL_OK;
}

/* Lock held: whether the last epoch was cut short or failed, so that its workers, still busy
 * with its batches, must end before another epoch starts. */
static int epoch_needs_stop(const fl_procpool *pool) {
    return (pool->epoch_active && pool->next_deliver < pool->n_batches) || pool->error;
}

int fl_procpool_needs_stop(fl_procpool *pool) {
    pthread_mutex_lock(&pool->lock);
    int abandon = epoch_needs_stop(pool);
    pthread_mutex_unlock(&pool->lock);
    return abandon;
}

/* Lock held: waits until no stopper or dispatcher is at work (neither needs what a caller of
 * start_epoch may hold, such as the GIL) and the last epoch's workers are ended if it was cut
 * short. A starter is not waited for: its fork hooks may need what the caller holds, and the
 * workers it forks serve the new epoch as well. */
static void settle_for_start(fl_procpool *pool) {
    for (;;) {
        if (pool->phase == PHASE_STOPPING)
            wait_changed(pool, WAIT_SLICE_S);
        else if (pool->phase == PHASE_RUNNING && epoch_needs_stop(pool))
            end_workers(pool, -1); /* which wakes a dispatcher blocked on a busy worker */
        else if (pool->dispatching) /* it uses the order this start replaces */
            wait_changed(pool, WAIT_SLICE_S);
        else
            return;
    }
}

/* Lock held: makes `order` the epoch's (returning the old one to free) from first_batch on. */
static int64_t *install_epoch(fl_procpool *pool, int64_t *order, uint64_t shard, uint64_t epoch,
                              uint64_t first_batch) {
    int64_t *old = pool->order;
    pool->order = order;
    pool->order_len = shard;
    pool->epoch_seed = fl_sampler_epoch_seed(pool->config.sampler.seed, epoch);
    pool->next_claim = pool->next_deliver = first_batch < pool->n_batches ? first_batch : pool->n_batches;
    pool->error = 0;
    pool->epoch_active = 1;
    pool->generation++;
    pool->starts++;
    pool->stop_requested = 0; /* a stop waiting on a starter gives way to this later start */
    pthread_cond_broadcast(&pool->changed);
    return old;
}

/* The starter, lock held (dropped while forking): forks the workers; they run unless a stop
 * came meanwhile or a fork failed, in which case the starter ends those it forked. */
static int start_workers(fl_procpool *pool) {
    pool->phase = PHASE_STARTING;
    pool->starter = pthread_self();
    pthread_mutex_unlock(&pool->lock);
    int rc = FL_OK;
    for (int w = 0; w < pool->config.workers && rc == FL_OK; w++)
        rc = spawn(pool, w);
    pthread_mutex_lock(&pool->lock);
    if (rc != FL_OK || pool->stop_requested) {
        pool->stop_requested = 0;
        end_workers(pool, -1);
    } else {
        pool->phase = PHASE_RUNNING;
        pthread_cond_broadcast(&pool->changed);
    }
    return rc;
}

int fl_procpool_start_epoch(fl_procpool *pool, uint64_t epoch) { return fl_procpool_start_epoch_at(pool, epoch, 0); }

int fl_procpool_start_epoch_at(fl_procpool *pool, uint64_t epoch, uint64_t first_batch) {
    uint64_t shard = fl_sampler_shard_size(&pool->config.sampler);
    int64_t *order = malloc((shard ? shard : 1) * sizeof *order);
    if (order == NULL || fl_sampler_epoch(&pool->config.sampler, epoch, order) != FL_OK) {
        free(order);
        return FL_ENOMEM;
    }
    pthread_mutex_lock(&pool->lock);
    settle_for_start(pool);
    int64_t *old = install_epoch(pool, order, shard, epoch, first_batch);
    int rc = pool->phase == PHASE_IDLE ? start_workers(pool) : FL_OK;
    pthread_mutex_unlock(&pool->lock);
    free(old);
    return rc;
}

/* Lock held: FL_EWORKER or FL_EEND when next() has nothing more to wait for (the epoch it was
 * called in, `generation`, was replaced or stopped, or has ended), else FL_OK. */
static int epoch_over(const fl_procpool *pool, uint64_t generation) {
    if (pool->error && pool->next_deliver >= pool->error_batch)
        return FL_EWORKER;
    if (pool->generation != generation || !pool->epoch_active || pool->next_deliver >= pool->n_batches)
        return FL_EEND;
    return FL_OK;
}

int fl_procpool_next(fl_procpool *pool, double timeout_s, int *slot_out, size_t *count) {
    pthread_mutex_lock(&pool->lock);
    double deadline = timeout_s < 0 ? -1 : fl_monotonic() + timeout_s;
    uint64_t generation = pool->generation;
    int rc;
    for (int pass = 0;; pass++) {
        if ((rc = epoch_over(pool, generation)) != FL_OK)
            break;
        slot *s = ready_slot(pool, pool->next_deliver);
        if (s != NULL) {
            s->state = SLOT_LENT;
            pool->lent++;
            pool->next_deliver++;
            *slot_out = (int)(s - pool->slots);
            *count = s->count;
            dispatch(pool); /* one fewer ahead: the next batch can start */
            break;
        }
        double left = deadline < 0 ? WAIT_SLICE_S : deadline - fl_monotonic();
        if (pass > 0 && left <= 0) {
            rc = timeout_s == 0 ? FL_EAGAIN : FL_ETIMEDOUT;
            break;
        }
        dispatch(pool);                                           /* keep every worker's queue full */
        collect(pool, left < WAIT_SLICE_S ? left : WAIT_SLICE_S); /* the first pass only looks */
    }
    pthread_mutex_unlock(&pool->lock);
    if (rc == FL_OK && pool->config.metrics != NULL) {
        fl_metrics_add(pool->config.metrics, "loader/samples", (double)*count);
        fl_metrics_add(pool->config.metrics, "loader/batches", 1);
    }
    return rc;
}

const fl_proc_error *fl_procpool_error(fl_procpool *pool) {
    static _Thread_local fl_proc_error copy; /* this thread's, so another's failure cannot tear it */
    pthread_mutex_lock(&pool->lock);
    copy = pool->failure;
    pthread_mutex_unlock(&pool->lock);
    return &copy;
}

const void *fl_procpool_extra(fl_procpool *pool, int s, size_t *len) {
    pthread_mutex_lock(&pool->lock);
    int lent = s >= 0 && s < pool->n_slots && pool->slots[s].state == SLOT_LENT;
    const void *data = lent ? pool->slots[s].extra : NULL;
    *len = data != NULL ? pool->slots[s].extra_len : 0;
    pthread_mutex_unlock(&pool->lock);
    return data;
}

int fl_procpool_set_batches(fl_procpool *pool, const uint64_t *ends, uint64_t n) {
    uint64_t *copy;
    int rc = fl_sampler_copy_ends(&pool->config.sampler, ends, n, &copy);
    if (rc != FL_OK)
        return rc;
    pthread_mutex_lock(&pool->lock);
    if (pool->epoch_active && pool->next_deliver < pool->n_batches) {
        pthread_mutex_unlock(&pool->lock);
        free(copy);
        return fl_error_set(FL_EINVAL, "the batches cannot change while an epoch is in progress");
    }
    uint64_t *old = pool->ends;
    pool->ends = copy;
    pool->n_batches = copy != NULL ? n : fl_sampler_batches(&pool->config.sampler);
    pthread_mutex_unlock(&pool->lock);
    free(old);
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
    pool->epoch_active = 0; /* at once: a waiting next() returns, nothing more is dispatched */
    pool->generation++;
    pthread_cond_broadcast(&pool->changed);
    for (uint64_t starts = pool->starts; pool->starts == starts;) { /* a later start supersedes this */
        if (pool->phase == PHASE_RUNNING) {
            end_workers(pool, -1);
            break;
        }
        if (pool->phase == PHASE_IDLE)
            break;
        if (pool->phase == PHASE_STARTING) {
            pool->stop_requested = 1; /* the starter ends what it forks */
            if (pthread_equal(pool->starter, pthread_self()))
                break; /* called by the starter's own fork hook */
        }
        wait_changed(pool, WAIT_SLICE_S); /* for the starter, or another stopper */
    }
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

uint64_t fl_procpool_batches(const fl_procpool *pool) {
    pthread_mutex_t *lock = (pthread_mutex_t *)&pool->lock; /* const: the pool, not its lock */
    pthread_mutex_lock(lock);
    uint64_t n = pool->n_batches; /* fl_procpool_set_batches may change it from another thread */
    pthread_mutex_unlock(lock);
    return n;
}

void fl_procpool_free(fl_procpool *pool) {
    if (pool == NULL)
        return;
    if (pool->workers != NULL)
        fl_procpool_stop(pool);
    if (pool->region != NULL)
        munmap(pool->region, pool->region_len ? pool->region_len : ALIGN);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->changed);
    for (int s = 0; pool->slots != NULL && s < pool->n_slots; s++)
        free(pool->slots[s].extra);
    free(pool->ends);
    free(pool->order);
    free(pool->slots);
    free(pool->tasks);
    free(pool->workers);
    free(pool->ending);
    free(pool->result_text);
    free(pool->worker_text);
    free(pool->worker_ids);
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
