/* fl_loader.c - slots, worker threads and in-order delivery.
 *
 *   slot states:  FREE --a filler opens batch b--> FILLING --its last chunk returns--> READY
 *                 READY --next() delivers b in order--> LENT --release()--> FREE
 *
 * A FILLING batch is handed out in chunks (runs of samples, ~512 KiB of output each): a
 * worker takes the next chunk of the earliest batch that has one left, else opens the next
 * batch in a free slot. The consumer, while it waits in next() for batch b, fills chunks of
 * b too when there is a CPU to spare: the first batch arrives sooner, and with 0 workers it
 * fills every batch itself.
 * Stopping waits for one chunk at most, not for a whole batch.
 *
 * `lock` guards every slot's state and counters, the epoch (order, cursors), `stopping`,
 * `joining`, `helping`, the error and `lent`; `changed` is broadcast when a batch completes, a
 * slot is freed, an epoch starts or stops. A chunk's bytes are written only by the thread
 * holding it, and read by the consumer after the slot is READY.
 *
 * Stopping: the first stop sets `joining` under the lock and is the only one to join the
 * workers; every other stop, and every start_epoch, waits on `changed` until it clears, so a
 * thread is never joined twice and an epoch never starts into a stop's tail.
 */
#include "data/fl_loader.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fl_error.h"
#include "base/fl_size.h"
#include "base/fl_thread.h"
#include "base/fl_time.h"

/* CHUNK_BYTES: output per chunk: big enough that the lock is rare, small enough to split a
 * batch between several threads. */
enum { ALIGN = FL_SLOT_ALIGN, ERROR_TEXT = 1024, CHUNK_BYTES = 512 << 10 };

typedef enum slot_state { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_LENT } slot_state;

typedef struct slot {
    slot_state state;
    uint64_t batch;
    size_t count;            /* samples in the batch */
    const int64_t *ids;      /* their indices, in the epoch's order */
    size_t claimed, finished; /* FILLING: samples handed out, samples returned */
    int failed;              /* a chunk failed: the batch is dropped when all have returned */
    unsigned char *data;
    uint8_t *dropped;        /* skip_errors: dropped[i] for a sample that failed (chunk-owned) */
    size_t n_dropped;        /* guarded by the lock */
} slot;

/* A run of samples of one batch, filled by one thread without the lock. */
typedef struct chunk {
    slot *s;
    size_t first, n;
} chunk;

/* What one filling thread needs besides a slot: field 0's raw sample read from a file,
 * the pipeline's scratch, and for encoded images its decoder and the encoded bytes. */
typedef struct scratch {
    unsigned char *input;
    unsigned char *pipeline;
    fl_decoder *decoder;
    unsigned char *encoded;
    size_t encoded_capacity;
} scratch;

/* What each worker thread starts with. */
typedef struct worker_arg {
    fl_loader *loader;
    int id;
} worker_arg;

struct fl_loader {
    fl_loader_config config;
    fl_loader_filler filler; /* config.filler points here when set */
    worker_arg *worker_args;
    fl_field *fields;
    size_t *field_offset, *field_bytes; /* per field: offset in a slot, output bytes per sample */
    size_t slot_bytes;
    fl_images out_image;
    fl_dtype out_dtype;
    fl_layout out_layout;
    size_t scratch_per_image;
    slot *slots;
    pthread_t *threads;
    int running; /* workers started */
    size_t chunk_samples;     /* samples per chunk */
    int consumer_helps;       /* next() fills chunks: no workers, or a CPU to spare for it */
    scratch consumer_scratch; /* for the chunks next() fills */

    pthread_mutex_t lock;
    pthread_cond_t changed;
    int stopping;
    int joining; /* a stop owns the join now: other stops and start_epoch wait for it */
    atomic_int cancel; /* a stop asked the fillers to return early: read without the lock */
    int helping; /* chunks the consumer is filling now: stop() waits for them */
    int starting; /* workers not yet through their start (a filler's thread_start) */
    int epoch_active;
    uint64_t epoch_seed;
    int64_t *order;
    uint64_t order_len, n_batches, next_claim, next_deliver;
    uint64_t *ends; /* fl_loader_set_batches: where each batch ends in the order, or NULL */
    int error;
    uint64_t error_batch; /* the earliest batch that failed: delivered up to it, then the error */
    char error_text[ERROR_TEXT];
    int error_errno;
    int lent;
    uint64_t skipped;               /* skip_errors: samples dropped */
    char skipped_text[ERROR_TEXT];  /* the first one's message */
};

/* The loader whose worker the calling thread is (NULL on any other thread), and whether that
 * loader was freed by code the worker ran (see fl_loader_free). */
static _Thread_local fl_loader *worker_of;
static _Thread_local int orphaned;

/* ---- reading one sample ---- */

/* Reads exactly len bytes of a raw per-sample file. */
static int read_raw(const char *path, void *dst, size_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fl_error_sys("cannot open %s", path);
    size_t done = 0;
    int rc = FL_OK;
    while (done < len && rc == FL_OK) {
        ssize_t n = pread(fd, (char *)dst + done, len - done, (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = fl_error_sys("cannot read %s", path);
        else if (n == 0)
            rc = fl_error_set(FL_EINVAL, "%s holds %zu bytes, expected %zu", path, done, len);
        else
            done += (size_t)n;
    }
    close(fd);
    return rc;
}

/* Reads the encoded bytes of sample `index` into scr->encoded (grown as needed); *len. */
static int read_encoded(const fl_field *f, int64_t index, const char *path, scratch *scr, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fl_error_sys("cannot open %s", path);
    int64_t offset = f->offsets[index], want = f->lengths[index];
    struct stat st;
    int rc = FL_OK, grow = want >= 0 && (uint64_t)want + 1 > scr->encoded_capacity;
    if (want < -1 || offset < 0) /* only -1 means "to the end of the file" */
        rc = fl_error_set(FL_EINVAL, "%s: %lld bytes at offset %lld", path, (long long)want, (long long)offset);
    else if ((want < 0 || grow) && fstat(fd, &st) != 0)
        rc = fl_error_sys("cannot stat %s", path);
    else if (want < 0)
        want = st.st_size > offset ? st.st_size - offset : 0;
    else if (grow && want > st.st_size - offset) /* before a buffer that size is asked for */
        rc = fl_error_set(FL_EINVAL, "%s ends at byte %lld, before the image's %lld bytes at offset %lld", path,
                          (long long)st.st_size, (long long)want, (long long)offset);
    if (rc == FL_OK && (size_t)want + 1 > scr->encoded_capacity) {
        unsigned char *grown = realloc(scr->encoded, (size_t)want + 1);
        if (grown == NULL)
            rc = FL_ENOMEM;
        else
            scr->encoded = grown, scr->encoded_capacity = (size_t)want + 1;
    }
    size_t done = 0;
    while (rc == FL_OK && done < (size_t)want) {
        ssize_t n = pread(fd, scr->encoded + done, (size_t)want - done, (off_t)(offset + (int64_t)done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = fl_error_sys("cannot read %s", path);
        else if (n == 0)
            rc = fl_error_set(FL_EINVAL, "%s ends at byte %lld, before the image's %lld bytes at offset %lld",
                              path, (long long)(offset + (int64_t)done), (long long)want, (long long)offset);
        else
            done += (size_t)n;
    }
    close(fd);
    *len = done;
    return rc;
}

/* Reads, decodes and crops/resizes encoded image `index` into dst (sample_bytes). */
static int decode_sample(const fl_loader *l, const fl_field *f, int64_t index, void *dst, scratch *scr) {
    const char *path = f->paths[f->file_index[index]];
    size_t len = 0;
    int rc = read_encoded(f, index, path, scr, &len);
    if (rc == FL_OK)
        rc = fl_image_transform(scr->decoder, f->geometry, scr->encoded, len, l->epoch_seed, index, dst);
    if (rc != FL_OK && rc != FL_ESYS)
        return fl_error_prefix(rc, "%s", path);
    return rc;
}

/* Reads encoded image `index` and stages it for the GPU decoder into `entry`. */
static int stage_sample(const fl_loader *l, const fl_field *f, int64_t index, uint8_t *entry, scratch *scr) {
    const char *path = f->paths[f->file_index[index]];
    size_t len = 0;
    int rc = read_encoded(f, index, path, scr, &len);
    fl_gpu_stage_job job = {.geometry = f->geometry, .flips = l->config.pipeline, .decoder = scr->decoder,
                            .pixels = scr->input, .pipeline_scratch = scr->pipeline,
                            .entry_bytes = f->gpu_entry_bytes, .seed = l->epoch_seed, .id = index};
    if (rc == FL_OK)
        rc = fl_gpu_stage(&job, scr->encoded, len, entry);
    if (rc != FL_OK && rc != FL_ESYS)
        return fl_error_prefix(rc, "%s", path);
    return rc;
}

static int read_sample(const fl_loader *l, const fl_field *f, int64_t index, void *dst, scratch *scr) {
    if (f->geometry != NULL)
        return decode_sample(l, f, index, dst, scr);
    if (f->paths == NULL) {
        memcpy(dst, (const unsigned char *)f->base + (size_t)index * f->sample_bytes,
               f->sample_bytes);
        return FL_OK;
    }
    const char *path = f->paths[index];
    if (f->raw)
        return read_raw(path, dst, f->sample_bytes);
    size_t got;
    int rc = fl_npy_read_file(path, &f->expect, dst, f->sample_bytes, &got);
    if (rc == FL_OK && got != f->sample_bytes)
        rc = fl_error_set(FL_EINVAL, "%s holds %zu bytes of data, expected %zu", path, got,
                          f->sample_bytes);
    return rc;
}

/* Runs the pipeline on one sample into dst. One image at a time keeps the scratch small
 * (cache-resident, nothing fresh to page in on the first batch) and reads in-memory samples
 * in place, without gathering the batch first. */
static int pipe_sample(fl_loader *l, const fl_field *field, int64_t id, void *dst, scratch *scr) {
    const void *src = (const unsigned char *)field->base + (size_t)id * field->sample_bytes;
    if (field->paths != NULL) {
        int rc = read_sample(l, field, id, scr->input, scr);
        if (rc != FL_OK)
            return rc;
        src = scr->input;
    }
    fl_images one = l->config.image;
    one.n = 1;
    return fl_pipeline_run(l->config.pipeline, (fl_exec){NULL, 1}, src, one, l->config.image_dtype,
                           dst, scr->pipeline, l->epoch_seed, &id);
}

/* Marks sample i of the chunk's slot dropped and notes the first message (skip_errors). */
static void drop_sample(fl_loader *l, const chunk *c, size_t i) {
    c->s->dropped[i] = 1;
    pthread_mutex_lock(&l->lock);
    if (l->skipped++ == 0)
        snprintf(l->skipped_text, sizeof l->skipped_text, "%s", fl_error_detail());
    pthread_mutex_unlock(&l->lock);
}

/* Fills the chunk's samples of its slot; called without the lock. With skip_errors a sample
 * that fails (for any reason but memory) is marked dropped instead. */
static int fill(fl_loader *l, const chunk *c, scratch *scr) {
    const int64_t *ids = c->s->ids;
    for (size_t f = 0; f < l->config.n_fields; f++) {
        const fl_field *field = &l->fields[f];
        int piped = f == 0 && l->config.pipeline != NULL;
        unsigned char *dst = c->s->data + l->field_offset[f];
        for (size_t i = c->first; i < c->first + c->n; i++) {
            if (c->s->dropped != NULL && c->s->dropped[i])
                continue;
            int rc = field->gpu_entry_bytes ? stage_sample(l, field, ids[i], dst + i * l->field_bytes[f], scr)
                     : piped ? pipe_sample(l, field, ids[i], dst + i * l->field_bytes[f], scr)
                             : read_sample(l, field, ids[i], dst + i * field->sample_bytes, scr);
            if (rc != FL_OK)
                rc = fl_error_prefix(rc, "sample %lld", (long long)ids[i]);
            if (rc != FL_OK && l->config.skip_errors && rc != FL_ENOMEM)
                drop_sample(l, c, i);
            else if (rc != FL_OK)
                return rc;
        }
    }
    return FL_OK;
}

/* Moves the samples that were not dropped to the front of every field: the batch shrinks. */
static size_t compact(fl_loader *l, slot *s) {
    size_t kept = 0;
    for (size_t f = 0; f < l->config.n_fields; f++) {
        unsigned char *base = s->data + l->field_offset[f];
        size_t bytes = l->field_bytes[f];
        kept = 0;
        for (size_t i = 0; i < s->count; i++)
            if (!s->dropped[i]) {
                if (kept != i)
                    memmove(base + kept * bytes, base + i * bytes, bytes);
                kept++;
            }
    }
    return kept;
}

static int scratch_alloc(fl_loader *l, scratch *scr) {
    for (size_t f = 0; f < l->config.n_fields; f++)
        if (l->fields[f].geometry != NULL && scr->decoder == NULL && fl_decoder_new(&scr->decoder) != FL_OK)
            return FL_ENOMEM;
    if (l->config.pipeline == NULL)
        return FL_OK;
    scr->input = malloc(l->fields[0].sample_bytes + 1);
    scr->pipeline = malloc(l->scratch_per_image + 1);
    return scr->input && scr->pipeline ? FL_OK : FL_ENOMEM;
}

static void scratch_free(scratch *scr) {
    free(scr->input);
    free(scr->pipeline);
    fl_decoder_free(scr->decoder);
    free(scr->encoded);
    *scr = (scratch){0};
}

/* ---- handing out work and delivering (called with the lock held) ---- */

static slot *free_slot(fl_loader *l) {
    for (int i = 0; i < l->config.slots; i++)
        if (l->slots[i].state == SLOT_FREE)
            return &l->slots[i];
    return NULL;
}

/* Batches filling or ready: made ahead of the consumer. */
static int batches_ahead(const fl_loader *l) {
    int n = 0;
    for (int i = 0; i < l->config.slots; i++)
        n += l->slots[i].state == SLOT_FILLING || l->slots[i].state == SLOT_READY;
    return n;
}

/* Where batch b starts in the epoch's order, and its samples. */
static void batch_span(const fl_loader *l, uint64_t b, size_t *start, size_t *count) {
    if (l->ends != NULL) { /* a batch sampler's batches */
        *start = (size_t)(b > 0 ? l->ends[b - 1] : 0);
        *count = (size_t)(l->ends[b] - *start);
        return;
    }
    *start = (size_t)(b * l->config.sampler.batch_size);
    size_t left = (size_t)l->order_len - *start;
    *count = left < l->config.sampler.batch_size ? left : l->config.sampler.batch_size;
}

/* Opens the next batch in a free slot; NULL when none can open now (no slot, or `ahead`
 * batches already in flight). */
static slot *open_batch(fl_loader *l) {
    if (l->stopping || !l->epoch_active || l->next_claim >= l->n_batches ||
        (l->error && l->next_claim >= l->error_batch))
        return NULL;
    if (l->config.ahead > 0 && batches_ahead(l) >= l->config.ahead)
        return NULL;
    slot *s = free_slot(l);
    if (s == NULL)
        return NULL;
    uint64_t b = l->next_claim++;
    size_t start, count;
    batch_span(l, b, &start, &count);
    *s = (slot){.state = SLOT_FILLING,
                .batch = b,
                .count = count,
                .ids = l->order + start,
                .data = s->data,
                .dropped = s->dropped};
    if (s->dropped != NULL)
        memset(s->dropped, 0, s->count);
    return s;
}

/* The FILLING slot of batch b (any batch when b is UINT64_MAX: the earliest) that still has
 * samples to hand out; NULL if none. */
static slot *open_slot(fl_loader *l, uint64_t b) {
    slot *best = NULL;
    for (int i = 0; i < l->config.slots; i++) {
        slot *s = &l->slots[i];
        if (s->state == SLOT_FILLING && s->claimed < s->count && (b == UINT64_MAX || s->batch == b) &&
            (best == NULL || s->batch < best->batch))
            best = s;
    }
    return best;
}

/* Hands out the next chunk of s into *c; 0 if s is NULL or has none left. */
static int take_chunk(fl_loader *l, slot *s, chunk *c) {
    if (s == NULL || l->stopping || s->claimed >= s->count)
        return 0;
    size_t n = s->count - s->claimed;
    *c = (chunk){s, s->claimed, n < l->chunk_samples ? n : l->chunk_samples};
    s->claimed += c->n;
    return 1;
}

/* Work for a worker: the earliest open batch's next chunk, else a newly opened batch's. */
static int worker_chunk(fl_loader *l, chunk *c) {
    return take_chunk(l, open_slot(l, UINT64_MAX), c) || take_chunk(l, open_batch(l), c);
}

/* Work for the consumer waiting for batch next_deliver: a chunk of that batch only. */
static int consumer_chunk(fl_loader *l, chunk *c) {
    if (!l->consumer_helps)
        return 0;
    slot *s = open_slot(l, l->next_deliver);
    if (s == NULL && l->next_claim == l->next_deliver)
        s = open_batch(l);
    return take_chunk(l, s, c);
}

/* Records a failure of `batch`, keeping the earliest failing batch's error. */
static void record_error(fl_loader *l, int rc, uint64_t batch, const char *text) {
    if (l->error && l->error_batch <= batch)
        return;
    l->error = rc;
    l->error_batch = batch;
    l->error_errno = fl_error_errno(); /* the filling thread's; 0 unless a system call failed */
    snprintf(l->error_text, sizeof l->error_text, "%s", text);
}

/* Takes back a filled chunk. A failure drops its batch: no more of it is handed out, and the
 * slot is freed once the chunks already out return. The last chunk makes the batch READY. */
static void chunk_done(fl_loader *l, const chunk *c, int rc) {
    slot *s = c->s;
    s->finished += c->n;
    if (rc != FL_OK && !s->failed) {
        s->failed = 1;
        if (!(rc == FL_ECLOSED && l->stopping)) /* a filler cut short by a stop failed nothing */
            record_error(l, rc, s->batch, fl_error_detail());
        s->finished += s->count - s->claimed;
        s->claimed = s->count;
    }
    if (s->finished == s->count) {
        s->state = s->failed ? SLOT_FREE : SLOT_READY;
        pthread_cond_broadcast(&l->changed);
    }
}

/* Fills a chunk, releasing the lock meanwhile (a filler's chunk is a whole batch). Returns 0,
 * or -1, without the lock, when the filler's code freed the loader (fl_loader_orphaned). */
static int fill_chunk(fl_loader *l, const chunk *c, scratch *scr, int worker) {
    pthread_mutex_unlock(&l->lock);
    const fl_loader_filler *f = l->config.filler;
    int rc = f == NULL ? fill(l, c, scr)
                       : f->fill(f->ctx, worker, c->s->batch, l->epoch_seed, c->s->ids, c->s->count,
                                 (int)(c->s - l->slots), c->s->data);
    if (orphaned)
        return -1;
    pthread_mutex_lock(&l->lock);
    chunk_done(l, c, rc);
    return 0;
}

/* A worker's own state: the readers' scratch, or what the filler sets up on its thread. */
static int worker_begin(fl_loader *l, int worker, scratch *scr) {
    const fl_loader_filler *f = l->config.filler;
    if (f == NULL)
        return scratch_alloc(l, scr) == FL_OK ? FL_OK : fl_error_set(FL_ENOMEM, "out of memory for a worker's scratch");
    return f->thread_start != NULL ? f->thread_start(f->ctx, worker) : FL_OK;
}

static void *worker_main(void *arg) {
    const worker_arg *w = arg;
    fl_loader *l = w->loader;
    int worker = w->id;
    worker_of = l;
    fl_thread_name(l->config.filler != NULL ? "fl-loader-py" : "fl-loader");
    scratch scr = {0};
    int rc = worker_begin(l, worker, &scr);
    pthread_mutex_lock(&l->lock);
    if (rc != FL_OK) /* the epoch's first batch fails with it: start_epoch waited for this */
        record_error(l, rc, l->next_deliver, fl_error_detail());
    l->starting--;
    pthread_cond_broadcast(&l->changed);
    while (!l->stopping && rc == FL_OK) {
        chunk c;
        if (!worker_chunk(l, &c))
            pthread_cond_wait(&l->changed, &l->lock);
        else if (fill_chunk(l, &c, &scr, worker) < 0)
            return NULL; /* the loader is gone, this thread detached: touch nothing of it */
    }
    pthread_mutex_unlock(&l->lock);
    if (rc == FL_OK && l->config.filler != NULL && l->config.filler->thread_end != NULL)
        l->config.filler->thread_end(l->config.filler->ctx, worker);
    scratch_free(&scr);
    worker_of = NULL;
    return NULL;
}

/* ---- owner API ---- */

/* Field f's output bytes per sample (field 0 as the pipeline makes it, or staged for a GPU
 * decoder: an entry of gpu_entry_bytes, the pipeline then flips only). */
static int field_bytes(fl_loader *l, size_t f, size_t *bytes) {
    const fl_field *field = &l->fields[f];
    if (field->gpu_entry_bytes > 0 && (f != 0 || field->geometry == NULL))
        return fl_error_set(FL_EINVAL, "only field 0 holding encoded images can be staged for a GPU decoder");
    if (f > 0 || l->config.pipeline == NULL) {
        *bytes = field->gpu_entry_bytes > 0 ? field->gpu_entry_bytes : field->sample_bytes;
        return FL_OK;
    }
    int flip, rc = fl_pipeline_plan(l->config.pipeline, l->config.image, l->config.image_dtype, &l->out_image,
                                    &l->out_dtype, &l->out_layout, &l->scratch_per_image);
    if (rc == FL_OK && field->gpu_entry_bytes > 0) {
        if (fl_pipeline_draw_flip(l->config.pipeline, 0, 0, &flip) != FL_OK)
            return fl_error_prefix(FL_EINVAL, "staging for a GPU decoder");
        *bytes = field->gpu_entry_bytes;
        return FL_OK;
    }
    return rc == FL_OK ? fl_pipeline_image_bytes(l->out_image, l->out_dtype, bytes) : rc;
}

/* Checks that each filling thread's scratch (scratch_alloc: a sample of field 0 and the
 * pipeline's intermediate images) fits in memory, for the workers and the consumer. */
static int plan_scratch(const fl_loader *l) {
    const char *what = "the pipeline's scratch per thread (a sample of source[0] and its steps' images)";
    size_t one, all;
    int rc = fl_size_add(l->fields[0].sample_bytes, l->scratch_per_image, what, &one);
    if (rc == FL_OK)
        rc = fl_size_mul(one, (size_t)l->config.workers + 1, what, &all);
    return rc == FL_OK ? fl_size_fits_memory(all, what) : rc;
}

/* Output bytes per sample of each field and the slot layout, every size checked: a slot holds
 * the largest batch the epoch makes (batch_size, or the shard when smaller), and all of the
 * slots must fit in memory. */
static int plan(fl_loader *l) {
    size_t sample_bytes = 0, batch = fl_sampler_batch_capacity(&l->config.sampler);
    int rc = FL_OK;
    for (size_t f = 0; f < l->config.n_fields && rc == FL_OK; f++) {
        rc = field_bytes(l, f, &l->field_bytes[f]);
        if (rc == FL_OK)
            rc = fl_size_add(sample_bytes, l->field_bytes[f], "sample bytes (its fields' shapes)", &sample_bytes);
    }
    if (rc == FL_OK)
        rc = fl_batch_layout(l->field_bytes, l->config.n_fields, batch, l->field_offset, &l->slot_bytes);
    const char *slots = "the batch slots ((workers x prefetch + 2) x batch_size x sample bytes)";
    size_t per_slot = 0, all = 0; /* the slot, its bookkeeping and skip_errors' flags */
    if (rc == FL_OK)
        rc = fl_size_add(l->slot_bytes, sizeof(slot), slots, &per_slot);
    if (rc == FL_OK)
        rc = fl_size_add(per_slot, batch, slots, &per_slot);
    if (rc == FL_OK)
        rc = fl_size_mul((size_t)l->config.slots, per_slot, slots, &all);
    if (rc == FL_OK)
        rc = fl_size_fits_memory(all, slots);
    if (rc == FL_OK && l->config.pipeline != NULL)
        rc = plan_scratch(l);
    if (rc != FL_OK)
        return rc;
    l->chunk_samples = CHUNK_BYTES / (sample_bytes ? sample_bytes : 1);
    l->chunk_samples = l->chunk_samples < 1 ? 1 : l->chunk_samples > batch ? batch : l->chunk_samples;
    if (l->config.filler != NULL) /* a filler keeps per-batch state: one thread fills a batch */
        l->chunk_samples = batch;
    return FL_OK;
}

int fl_loader_new(const fl_loader_config *config, fl_loader **out) {
    *out = NULL;
    int rc = fl_sampler_check(&config->sampler);
    if (rc != FL_OK)
        return rc;
    if (config->slots < 2 || config->workers < 0 || config->n_fields == 0 || config->ahead < 0 ||
        config->ahead >= config->slots)
        return fl_error_set(FL_EINVAL, "a loader needs >= 2 slots, >= 0 workers, >= 1 field, "
                                       "0 <= ahead < slots");
    if (config->filler != NULL && (config->workers < 1 || config->pipeline != NULL || config->skip_errors ||
                                   config->filler->fill == NULL))
        return fl_error_set(FL_EINVAL, "a filler needs >= 1 worker, a fill function, no pipeline and no "
                                       "skip_errors");
    fl_loader *l = calloc(1, sizeof *l);
    if (l == NULL)
        return FL_ENOMEM;
    l->config = *config;
    if (config->filler != NULL) {
        l->filler = *config->filler;
        l->config.filler = &l->filler;
    }
    /* with a worker per CPU, a helping consumer would only preempt one mid-chunk; a filler's
     * batches are filled on its workers only */
    l->consumer_helps = config->filler == NULL && (config->workers == 0 || config->workers < fl_thread_cpus());
    l->fields = malloc(config->n_fields * sizeof *l->fields);
    l->field_offset = malloc(config->n_fields * sizeof *l->field_offset);
    l->field_bytes = malloc(config->n_fields * sizeof *l->field_bytes);
    l->threads = calloc((size_t)(config->workers ? config->workers : 1), sizeof *l->threads);
    l->worker_args = calloc((size_t)(config->workers ? config->workers : 1), sizeof *l->worker_args);
    pthread_mutex_init(&l->lock, NULL);
    rc = fl_cond_init(&l->changed);
    if (!l->fields || !l->field_offset || !l->field_bytes || !l->threads || !l->worker_args)
        rc = FL_ENOMEM;
    for (int w = 0; rc == FL_OK && w < config->workers; w++)
        l->worker_args[w] = (worker_arg){l, w};
    if (rc == FL_OK) {
        memcpy(l->fields, config->fields, config->n_fields * sizeof *l->fields);
        l->config.fields = l->fields;
        l->n_batches = fl_sampler_batches(&config->sampler);
        rc = plan(l); /* checks that the slots fit in memory before any is made */
    }
    if (rc == FL_OK && (l->slots = calloc((size_t)config->slots, sizeof *l->slots)) == NULL)
        rc = FL_ENOMEM;
    for (int i = 0; rc == FL_OK && i < config->slots; i++) {
        if ((l->slots[i].data = aligned_alloc(ALIGN, l->slot_bytes)) == NULL)
            rc = FL_ENOMEM;
        if (config->skip_errors && (l->slots[i].dropped = calloc(fl_sampler_batch_capacity(&config->sampler), 1)) == NULL)
            rc = FL_ENOMEM;
    }
    if (rc == FL_OK)
        rc = scratch_alloc(l, &l->consumer_scratch);
    if (rc != FL_OK) {
        fl_loader_free(l);
        return rc;
    }
    *out = l;
    return FL_OK;
}

/* Starts the workers and waits until each is through its start, so a worker that cannot
 * start (a filler's thread_start failing) is the epoch's error from its first batch on;
 * called with the lock held and none running. On failure joins the ones that started. */
static int start_workers(fl_loader *l) {
    int started = 0;
    l->starting = l->config.workers;
    while (started < l->config.workers &&
           fl_thread_start(&l->threads[started], worker_main, &l->worker_args[started]) == FL_OK)
        started++;
    if (started == l->config.workers) {
        l->running = 1;
        while (l->starting > 0)
            pthread_cond_wait(&l->changed, &l->lock);
        return FL_OK;
    }
    l->stopping = 1;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
    for (int i = 0; i < started; i++)
        pthread_join(l->threads[i], NULL);
    pthread_mutex_lock(&l->lock);
    l->stopping = 0;
    l->epoch_active = 0;
    return fl_error_set(FL_ESYS, "could not start loader worker %d", started);
}

int fl_loader_start_epoch(fl_loader *l, uint64_t epoch) { return fl_loader_start_epoch_at(l, epoch, 0); }

/* 1 when the last epoch was cut short or failed, or a stop was asked for on a worker: its
 * workers and batches must go first. Called with the lock held. */
static int cut_short_locked(const fl_loader *l) {
    return (l->epoch_active && (l->next_deliver < l->n_batches || l->error)) || l->stopping;
}

static int cut_short(fl_loader *l) {
    pthread_mutex_lock(&l->lock);
    int abandon = cut_short_locked(l) || l->joining || l->error;
    pthread_mutex_unlock(&l->lock);
    return abandon;
}

int fl_loader_start_epoch_at(fl_loader *l, uint64_t epoch, uint64_t first_batch) {
    if (worker_of == l) /* it would wait for its own end */
        return fl_error_set(FL_EINVAL, "a loader's worker cannot start an epoch of that loader");
    uint64_t shard = fl_sampler_shard_size(&l->config.sampler);
    int64_t *order = malloc((shard ? shard : 1) * sizeof *order);
    if (order == NULL || fl_sampler_epoch(&l->config.sampler, epoch, order) != FL_OK) {
        free(order);
        return FL_ENOMEM;
    }
    pthread_mutex_lock(&l->lock);
    while (l->joining || cut_short_locked(l)) { /* no epoch starts into a stop, or over a live one */
        if (l->joining) {
            pthread_cond_wait(&l->changed, &l->lock);
            continue;
        }
        pthread_mutex_unlock(&l->lock);
        fl_loader_stop(l);
        pthread_mutex_lock(&l->lock);
    }
    free(l->order);
    l->order = order;
    l->order_len = shard;
    l->epoch_seed = fl_sampler_epoch_seed(l->config.sampler.seed, epoch);
    l->next_claim = l->next_deliver = first_batch < l->n_batches ? first_batch : l->n_batches;
    l->epoch_active = 1;
    l->error = 0;
    l->error_text[0] = '\0';
    pthread_cond_broadcast(&l->changed);
    int rc = l->running ? FL_OK : start_workers(l); /* persistent across finished epochs */
    pthread_mutex_unlock(&l->lock);
    return rc;
}

/* The READY slot holding batch b, or NULL. */
static slot *ready_slot(fl_loader *l, uint64_t b) {
    for (int i = 0; i < l->config.slots; i++)
        if (l->slots[i].state == SLOT_READY && l->slots[i].batch == b)
            return &l->slots[i];
    return NULL;
}

int fl_loader_next(fl_loader *l, double timeout_s, int *slot_out, size_t *count) {
    pthread_mutex_lock(&l->lock);
    struct timespec until = fl_deadline_after(timeout_s);
    int rc = FL_OK;
    for (;;) {
        if (l->error && l->next_deliver >= l->error_batch) {
            rc = fl_error_set(l->error, "%s", l->error_text);
            fl_error_set_errno(l->error_errno);
            break;
        }
        if (!l->epoch_active || l->next_deliver >= l->n_batches) {
            rc = FL_EEND;
            break;
        }
        slot *s = ready_slot(l, l->next_deliver);
        size_t dropped = 0;
        for (size_t i = 0; s != NULL && s->dropped != NULL && i < s->count; i++)
            dropped += s->dropped[i];
        if (s != NULL && dropped == s->count) { /* every sample dropped: nothing to deliver */
            s->state = SLOT_FREE;
            l->next_deliver++;
            pthread_cond_broadcast(&l->changed);
            continue;
        }
        if (s != NULL) {
            s->state = SLOT_LENT;
            l->lent++;
            l->next_deliver++;
            *slot_out = (int)(s - l->slots);
            *count = s->count;
            s->n_dropped = dropped;
            if (l->config.ahead > 0) /* one fewer ahead: a worker held back by the cap may open one */
                pthread_cond_broadcast(&l->changed);
            break;
        }
        chunk c;
        if (consumer_chunk(l, &c)) { /* rather than wait idle, help fill the batch we want */
            l->helping++;
            fill_chunk(l, &c, &l->consumer_scratch, -1); /* never a filler's: it cannot free l */
            if (--l->helping == 0 && l->stopping)
                pthread_cond_broadcast(&l->changed);
            continue;
        }
        if (timeout_s == 0) {
            rc = FL_EAGAIN;
            break;
        }
        if (fl_cond_wait_until(&l->changed, &l->lock, timeout_s < 0 ? NULL : &until) != FL_OK) {
            rc = FL_ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&l->lock);
    slot *lent = rc == FL_OK ? &l->slots[*slot_out] : NULL;
    size_t dropped = lent != NULL ? lent->n_dropped : 0;
    if (dropped > 0) /* the slot is lent to this caller: compacting it needs no lock */
        *count = compact(l, lent);
    if (rc == FL_OK && l->config.metrics != NULL) {
        fl_metrics_add(l->config.metrics, "loader/samples", (double)*count);
        fl_metrics_add(l->config.metrics, "loader/batches", 1);
        if (dropped > 0)
            fl_metrics_add(l->config.metrics, "loader/skipped", (double)dropped);
    }
    return rc;
}

void fl_loader_release(fl_loader *l, int slot_index) {
    pthread_mutex_lock(&l->lock);
    if (slot_index >= 0 && slot_index < l->config.slots &&
        l->slots[slot_index].state == SLOT_LENT) {
        l->slots[slot_index].state = SLOT_FREE;
        l->lent--;
        pthread_cond_broadcast(&l->changed);
    }
    pthread_mutex_unlock(&l->lock);
}

/* Asks the workers to end after the batch in hand and ends the epoch for next(); called with
 * the lock held. The stop that joins them clears it. */
static void ask_to_stop(fl_loader *l) {
    l->stopping = 1;
    l->epoch_active = 0; /* a next() waiting on another thread returns FL_EEND */
    atomic_store_explicit(&l->cancel, 1, memory_order_relaxed); /* a flag: orders nothing */
    pthread_cond_broadcast(&l->changed);
}

void fl_loader_stop(fl_loader *l) {
    pthread_mutex_lock(&l->lock);
    if (worker_of == l || l->joining) { /* this thread cannot join itself; or another one joins */
        ask_to_stop(l);
        while (worker_of != l && l->joining)
            pthread_cond_wait(&l->changed, &l->lock);
        pthread_mutex_unlock(&l->lock);
        return;
    }
    l->joining = 1;
    int running = l->running;
    ask_to_stop(l);
    pthread_mutex_unlock(&l->lock);
    for (int i = 0; running && i < l->config.workers; i++)
        pthread_join(l->threads[i], NULL);
    pthread_mutex_lock(&l->lock);
    while (l->helping > 0) /* a consumer in next() on another thread is finishing a chunk */
        pthread_cond_wait(&l->changed, &l->lock);
    for (int i = 0; i < l->config.slots; i++)
        if (l->slots[i].state == SLOT_READY || l->slots[i].state == SLOT_FILLING)
            l->slots[i].state = SLOT_FREE;
    l->running = 0;
    l->stopping = 0;
    l->joining = 0;
    atomic_store_explicit(&l->cancel, 0, memory_order_relaxed);
    pthread_cond_broadcast(&l->changed); /* the stops and start_epochs waiting for this one */
    pthread_mutex_unlock(&l->lock);
}

void fl_loader_request_stop(fl_loader *l) {
    pthread_mutex_lock(&l->lock);
    ask_to_stop(l);
    pthread_mutex_unlock(&l->lock);
}

int fl_loader_cancelled(const fl_loader *l) {
    return atomic_load_explicit(&((fl_loader *)l)->cancel, memory_order_relaxed);
}

int fl_loader_orphaned(void) { return orphaned; }

int fl_loader_set_batches(fl_loader *l, const uint64_t *ends, uint64_t n) {
    uint64_t *copy;
    int rc = fl_sampler_copy_ends(&l->config.sampler, ends, n, &copy);
    if (rc != FL_OK)
        return rc;
    pthread_mutex_lock(&l->lock);
    if (l->epoch_active && l->next_deliver < l->n_batches) {
        pthread_mutex_unlock(&l->lock);
        free(copy);
        return fl_error_set(FL_EINVAL, "the batches cannot change while an epoch is in progress");
    }
    free(l->ends);
    l->ends = copy;
    l->n_batches = copy != NULL ? n : fl_sampler_batches(&l->config.sampler);
    pthread_mutex_unlock(&l->lock);
    return FL_OK;
}

const char *fl_loader_error(fl_loader *l) { return l->error_text; }

uint64_t fl_loader_skipped(fl_loader *l, char *buf, size_t n) {
    pthread_mutex_lock(&l->lock);
    uint64_t skipped = l->skipped;
    snprintf(buf, n, "%s", l->skipped_text);
    pthread_mutex_unlock(&l->lock);
    return skipped;
}

void *fl_loader_slot(fl_loader *l, int s) { return l->slots[s].data; }

size_t fl_loader_field_offset(const fl_loader *l, size_t f) { return l->field_offset[f]; }

size_t fl_loader_field_sample_bytes(const fl_loader *l, size_t f) { return l->field_bytes[f]; }

void fl_loader_output_image(const fl_loader *l, fl_images *dims, fl_dtype *dtype,
                            fl_layout *layout) {
    *dims = l->out_image;
    *dtype = l->out_dtype;
    *layout = l->out_layout;
}

int fl_loader_lent(fl_loader *l) {
    pthread_mutex_lock(&l->lock);
    int lent = l->lent;
    pthread_mutex_unlock(&l->lock);
    return lent;
}

int fl_loader_slots(const fl_loader *l) { return l->config.slots; }

int fl_loader_ahead(fl_loader *l) {
    pthread_mutex_lock(&l->lock);
    int ahead = batches_ahead(l);
    pthread_mutex_unlock(&l->lock);
    return ahead;
}

uint64_t fl_loader_batches(const fl_loader *l) { return l->n_batches; }

/* fl_loader_free on one of l's workers: joins the others, detaches this one, and marks it
 * orphaned so it returns without touching l (see fl_loader_orphaned). */
static void free_from_own_worker(fl_loader *l) {
    pthread_mutex_lock(&l->lock);
    ask_to_stop(l);
    int running = l->running;
    pthread_mutex_unlock(&l->lock);
    pthread_t self = pthread_self();
    for (int i = 0; running && i < l->config.workers; i++)
        if (!pthread_equal(l->threads[i], self))
            pthread_join(l->threads[i], NULL);
    pthread_detach(self);
    orphaned = 1;
    worker_of = NULL;
}

static void free_memory(fl_loader *l);

typedef struct later {
    fl_loader *loader;
    void (*then)(void *arg);
    void *arg;
} later;

static void *free_and_then(void *p) {
    later *job = p;
    fl_thread_name("fl-loader-free");
    fl_loader_free(job->loader);
    job->then(job->arg);
    free(job);
    return NULL;
}

int fl_loader_free_later(fl_loader *l, void (*then)(void *arg), void *arg) {
    later *job = malloc(sizeof *job);
    pthread_t thread;
    if (job == NULL)
        return fl_error_set(FL_ESYS, "no memory to free the loader on a thread of its own");
    *job = (later){l, then, arg};
    fl_loader_request_stop(l); /* the workers end their batch meanwhile */
    if (fl_thread_start(&thread, free_and_then, job) != FL_OK) {
        free(job);
        return fl_error_set(FL_ESYS, "could not start a thread to free the loader");
    }
    pthread_detach(thread);
    return FL_OK;
}

void fl_loader_free(fl_loader *l) {
    if (l == NULL)
        return;
    if (worker_of == l)
        free_from_own_worker(l);
    else if (l->threads != NULL && l->slots != NULL) /* else fl_loader_new failed: no worker ran */
        fl_loader_stop(l);
    free_memory(l);
}

static void free_memory(fl_loader *l) {
    for (int i = 0; l->slots && i < l->config.slots; i++) {
        free(l->slots[i].data);
        free(l->slots[i].dropped);
    }
    scratch_free(&l->consumer_scratch);
    pthread_cond_destroy(&l->changed);
    pthread_mutex_destroy(&l->lock);
    free(l->order);
    free(l->ends);
    free(l->slots);
    free(l->threads);
    free(l->worker_args);
    free(l->field_bytes);
    free(l->field_offset);
    free(l->fields);
    free(l);
}

/* ---- the batch-source table (fl_batch_source.h): the typed API above, behind void * ---- */

static int source_start_epoch(void *l, uint64_t epoch, uint64_t first_batch) {
    return fl_loader_start_epoch_at(l, epoch, first_batch);
}
static int source_needs_stop(void *l) { return cut_short(l); }
static int source_next(void *l, double timeout_s, int *slot, size_t *count) {
    return fl_loader_next(l, timeout_s, slot, count);
}
static void source_release(void *l, int slot) { fl_loader_release(l, slot); }
static void source_stop(void *l) { fl_loader_stop(l); }
static void source_request_stop(void *l) { fl_loader_request_stop(l); }
static int source_free_later(void *l, void (*then)(void *), void *arg) { return fl_loader_free_later(l, then, arg); }
static void *source_slot(void *l, int slot) { return fl_loader_slot(l, slot); }
static int source_ahead(void *l) { return fl_loader_ahead(l); }
static int source_lent(void *l) { return fl_loader_lent(l); }
static int source_slots(const void *l) { return fl_loader_slots(l); }
static uint64_t source_batches(const void *l) { return fl_loader_batches(l); }
static const char *source_error(void *l) { return fl_loader_error(l); }
static void source_free(void *l) { fl_loader_free(l); }

static const fl_batch_source_ops loader_source_ops = {
    .name = "threads", .start_forks = 0, .release_blocks = 0,
    .start_epoch = source_start_epoch, .needs_stop = source_needs_stop, .next = source_next,
    .release = source_release, .stop = source_stop, .request_stop = source_request_stop,
    .free_later = source_free_later, .slot = source_slot, .lent = source_lent,
    .ahead = source_ahead, .slots = source_slots, .batches = source_batches, .error = source_error,
    .free = source_free,
};

fl_batch_source fl_loader_source(fl_loader *l) { return (fl_batch_source){&loader_source_ops, l}; }
