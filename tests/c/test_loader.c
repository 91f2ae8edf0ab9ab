/* test_loader.c - sampler (every sample once per epoch, disjoint shards), pipeline (equal to
 * the ops it is made of), and the threaded loader: every sample exactly once and in order,
 * batches equal to the source through the pipeline, slots recycled, stop and restart,
 * worker errors naming the file and index. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "base/fl_error.h"
#include "base/fl_size.h"
#include "base/fl_time.h"
#include "data/fl_loader.h"
#include "data/fl_pipeline.h"
#include "data/fl_sampler.h"

static char tmpdir[] = "/tmp/fl_test_loader_XXXXXX";

/* ---- sampler ---- */

static void test_every_index_once_per_epoch_and_shards_partition(void) {
    enum { N = 1000000 };
    static unsigned char seen[N];
    fl_sampler s = {.n = N, .shuffle = 1, .seed = 7, .world_size = 1, .batch_size = 256};
    static int64_t order[N], again[N];
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
        CHECK(fl_sampler_epoch(&s, epoch, order) == FL_OK);
        memset(seen, 0, N);
        int ok = 1;
        for (size_t i = 0; i < N; i++)
            ok &= order[i] >= 0 && order[i] < N && seen[order[i]]++ == 0;
        CHECK(ok);
    }
    CHECK(fl_sampler_epoch(&s, 1, again) == FL_OK && memcmp(order, again, sizeof order) == 0);
    CHECK(fl_sampler_epoch(&s, 2, again) == FL_OK && memcmp(order, again, sizeof order) != 0);
    /* Three ranks, N = 3 * 333333 + 1. Padded (no drop_last): 333334 each, everything at
     * least once, one sample twice. Trimmed (drop_last): 333333 each, disjoint. */
    for (int drop_last = 0; drop_last < 2; drop_last++) {
        memset(seen, 0, N);
        size_t total = 0;
        int ok = 1;
        for (int rank = 0; rank < 3; rank++) {
            fl_sampler shard = s;
            shard.rank = rank;
            shard.world_size = 3;
            shard.drop_last = drop_last;
            uint64_t size = fl_sampler_shard_size(&shard);
            CHECK(size == (drop_last ? 333333u : 333334u));
            CHECK(fl_sampler_epoch(&shard, 5, order) == FL_OK);
            for (size_t i = 0; i < size; i++)
                ok &= ++seen[order[i]] <= (drop_last ? 1 : 2);
            total += size;
        }
        size_t twice = 0, never = 0;
        for (size_t i = 0; i < N; i++)
            twice += seen[i] == 2, never += seen[i] == 0;
        CHECK(ok);
        CHECK(total == (drop_last ? 999999u : 1000002u));
        CHECK(twice == (drop_last ? 0u : 2u) && never == (drop_last ? 1u : 0u));
    }
    fl_sampler bad = s;
    bad.rank = 3;
    bad.world_size = 3;
    CHECK(fl_sampler_check(&bad) == FL_EINVAL);
    s.drop_last = 1;
    CHECK(fl_sampler_batches(&s) == N / 256);
    s.drop_last = 0;
    CHECK(fl_sampler_batches(&s) == N / 256 + 1);
}

/* ---- pipeline ---- */

static fl_pipeline *crop_flip_normalize(void) {
    fl_pipeline *p;
    float mean[3] = {0.5f, 0.4f, 0.3f}, std[3] = {0.2f, 0.25f, 0.3f};
    if (fl_pipeline_new(FL_CHW, &p) != FL_OK || fl_pipeline_crop(p, 6, 5, 0) != FL_OK ||
        fl_pipeline_hflip(p, 0.5) != FL_OK || fl_pipeline_normalize(p, mean, std, 3, FL_CHW) != FL_OK)
        return NULL;
    return p;
}

static void test_pipeline_equals_its_ops(void) {
    fl_pipeline *p = crop_flip_normalize();
    CHECK(p != NULL);
    fl_images in = {4, 9, 8, 3}, out;
    fl_dtype dtype;
    fl_layout layout;
    size_t scratch_per_image;
    CHECK(fl_pipeline_plan(p, in, FL_UINT8, &out, &dtype, &layout, &scratch_per_image) == FL_OK);
    CHECK(out.h == 6 && out.w == 5 && out.c == 3 && dtype == FL_FLOAT32 && layout == FL_CHW);
    unsigned char src[4 * 9 * 8 * 3], cropped[4 * 6 * 5 * 3], flipped[4 * 6 * 5 * 3];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (unsigned char)(i * 7);
    float got[4 * 6 * 5 * 3], want[4 * 6 * 5 * 3];
    unsigned char scratch[4 * 256];
    int64_t ids[4] = {10, 3, 77, 5}, tops[4], lefts[4];
    uint8_t flips[4];
    CHECK(fl_pipeline_run(p, (fl_exec){NULL, 1}, src, in, FL_UINT8, got, scratch, 99, ids) == FL_OK);
    /* the same by hand: each step draws from its own stream of the seed */
    fl_crop_offsets_random(99 ^ 0xD1B54A32D192ED03ULL, ids, 4, 9, 8, 6, 5, tops, lefts);
    CHECK(fl_crop((fl_exec){NULL, 1}, src, cropped, 1, FL_CHW, in, 6, 5, tops, lefts) == FL_OK);
    fl_hflip_draw(99 ^ (0xD1B54A32D192ED03ULL * 2), ids, 0.5, 4, flips);
    fl_images mid = {4, 6, 5, 3};
    fl_hflip((fl_exec){NULL, 1}, cropped, flipped, 1, FL_CHW, mid, flips);
    float mean[3] = {0.5f, 0.4f, 0.3f}, std[3] = {0.2f, 0.25f, 0.3f};
    CHECK(fl_normalize((fl_exec){NULL, 1}, flipped, FL_UINT8, FL_CHW, want, FL_CHW, mid, mean, std) == FL_OK);
    CHECK(memcmp(got, want, sizeof got) == 0);
    fl_images small = {1, 4, 4, 3};
    CHECK(fl_pipeline_plan(p, small, FL_UINT8, &out, &dtype, &layout, &scratch_per_image) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "crop") != NULL);
    fl_images gray = {1, 9, 8, 1};
    CHECK(fl_pipeline_plan(p, gray, FL_UINT8, &out, &dtype, &layout, &scratch_per_image) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "channels") != NULL);
    fl_pipeline_free(p);
}

/* ---- the loader ---- */

enum { SAMPLES = 1000, C = 3, H = 9, W = 8 };
static unsigned char images[SAMPLES][C * H * W];
static int64_t labels[SAMPLES];

static fl_loader *make_loader(int workers, int shuffle, fl_pipeline *p, int rank, int world) {
    fl_field fields[2] = {
        {.base = images, .sample_bytes = C * H * W},
        {.base = labels, .sample_bytes = sizeof(int64_t)},
    };
    fl_loader_config config = {
        .sampler = {.n = SAMPLES, .shuffle = shuffle, .seed = 3, .rank = rank, .world_size = world,
                    .batch_size = 64},
        .workers = workers, .slots = 4, .fields = fields, .n_fields = 2, .pipeline = p,
        .image = {1, H, W, C}, .image_dtype = FL_UINT8,
    };
    fl_loader *l = NULL;
    CHECK(fl_loader_new(&config, &l) == FL_OK);
    return l;
}

/* Runs one epoch; checks order, contents, and marks labels seen. Returns batches. */
static int run_epoch(fl_loader *l, uint64_t epoch, fl_pipeline *p, unsigned char *seen, int hold) {
    CHECK(fl_loader_start_epoch(l, epoch) == FL_OK);
    int slot, batches = 0, held[8], n_held = 0;
    size_t count;
    int rc;
    while ((rc = fl_loader_next(l, 10.0, &slot, &count)) == FL_OK) {
        unsigned char *data = fl_loader_slot(l, slot);
        const int64_t *got_labels = (const int64_t *)(data + fl_loader_field_offset(l, 1));
        for (size_t i = 0; i < count; i++)
            seen[got_labels[i]]++;
        if (p != NULL) { /* field 0 equals the pipeline run on those ids */
            static float want[64 * C * 6 * 5];
            static unsigned char gathered[64 * C * H * W], scratch[64 * 512];
            for (size_t i = 0; i < count; i++)
                memcpy(gathered + i * C * H * W, images[got_labels[i]], C * H * W);
            fl_images in = {count, H, W, C};
            fl_pipeline_run(p, (fl_exec){NULL, 1}, gathered, in, FL_UINT8, want, scratch,
                            fl_sampler_epoch_seed(3, epoch), got_labels);
            CHECK(memcmp(want, data, count * C * 6 * 5 * sizeof(float)) == 0);
        } else {
            for (size_t i = 0; i < count; i++)
                CHECK(memcmp(data + i * C * H * W, images[got_labels[i]], C * H * W) == 0);
        }
        if (n_held < hold)
            held[n_held++] = slot; /* keep some slots lent for a while */
        else
            fl_loader_release(l, slot);
        batches++;
    }
    CHECK(rc == FL_EEND);
    CHECK(fl_loader_lent(l) == n_held);
    for (int i = 0; i < n_held; i++)
        fl_loader_release(l, held[i]);
    return batches;
}

static void test_threaded_loader_delivers_every_sample_once_through_the_pipeline(void) {
    for (int i = 0; i < SAMPLES; i++) {
        labels[i] = i;
        for (int k = 0; k < C * H * W; k++)
            images[i][k] = (unsigned char)(i * 31 + k);
    }
    fl_pipeline *p = crop_flip_normalize();
    for (int workers = 0; workers <= 3; workers++) {
        for (int piped = 0; piped <= 1; piped++) {
            fl_loader *l = make_loader(workers, 1, piped ? p : NULL, 0, 1);
            for (uint64_t epoch = 0; epoch < 3; epoch++) {
                unsigned char seen[SAMPLES] = {0};
                CHECK(run_epoch(l, epoch, piped ? p : NULL, seen, 2) == 16);
                int once = 1;
                for (int i = 0; i < SAMPLES; i++)
                    once &= seen[i] == 1;
                CHECK(once);
            }
            fl_loader_free(l);
        }
    }
    fl_pipeline_free(p);
}

static void test_shards_of_a_loader_partition_the_data(void) {
    unsigned char seen[SAMPLES] = {0};
    for (int rank = 0; rank < 4; rank++) { /* 4 divides SAMPLES: equal shards, no padding */
        fl_loader *l = make_loader(2, 1, NULL, rank, 4);
        run_epoch(l, 4, NULL, seen, 0);
        fl_loader_free(l);
    }
    int once = 1;
    for (int i = 0; i < SAMPLES; i++)
        once &= seen[i] == 1;
    CHECK(once);
}

static void test_stopping_mid_epoch_then_a_new_epoch_works(void) {
    fl_loader *l = make_loader(2, 0, NULL, 0, 1);
    CHECK(fl_loader_start_epoch(l, 0) == FL_OK);
    int slot;
    size_t count;
    CHECK(fl_loader_next(l, 10, &slot, &count) == FL_OK);
    fl_loader_stop(l); /* the consumer walked away; its slot stays lent */
    CHECK(fl_loader_lent(l) == 1);
    fl_loader_release(l, slot);
    unsigned char seen[SAMPLES] = {0};
    CHECK(run_epoch(l, 1, NULL, seen, 0) == 16);
    CHECK(fl_loader_next(l, 0, &slot, &count) == FL_EEND);
    fl_loader_free(l);
}

static void test_an_epoch_started_at_a_batch_skips_the_earlier_ones(void) {
    fl_loader *l = make_loader(2, 1, NULL, 0, 1);
    int64_t want[SAMPLES];
    size_t n = 0, count;
    int slot;
    CHECK(fl_loader_start_epoch(l, 5) == FL_OK); /* the whole epoch, for reference */
    while (fl_loader_next(l, 10, &slot, &count) == FL_OK) {
        const unsigned char *data = fl_loader_slot(l, slot);
        memcpy(want + n, data + fl_loader_field_offset(l, 1), count * sizeof(int64_t));
        n += count;
        fl_loader_release(l, slot);
    }
    CHECK(fl_loader_start_epoch_at(l, 5, 3) == FL_OK); /* resumed at batch 3 of 16 */
    size_t got = 3 * 64;
    while (fl_loader_next(l, 10, &slot, &count) == FL_OK) {
        CHECK(memcmp(want + got, (unsigned char *)fl_loader_slot(l, slot) + fl_loader_field_offset(l, 1),
                     count * sizeof(int64_t)) == 0);
        got += count;
        fl_loader_release(l, slot);
    }
    CHECK(got == n && n == SAMPLES);
    CHECK(fl_loader_start_epoch_at(l, 6, 99) == FL_OK); /* past the end: an empty epoch */
    CHECK(fl_loader_next(l, 10, &slot, &count) == FL_EEND);
    fl_loader_free(l);
}

/* ---- batches shared between threads in chunks ---- */

enum { BIG_SAMPLES = 96, BIG_BYTES = 128 << 10 }; /* 4 samples per 512 KiB chunk */

/* Samples of BIG_BYTES, each filled with its index (mod 251), in memory or in raw files. */
static unsigned char *big_samples(void) {
    unsigned char *data = malloc((size_t)BIG_SAMPLES * BIG_BYTES);
    for (int i = 0; i < BIG_SAMPLES; i++)
        memset(data + (size_t)i * BIG_BYTES, i % 251, BIG_BYTES);
    return data;
}

static void test_batches_split_in_chunks_arrive_whole_in_order(void) {
    unsigned char *data = big_samples();
    fl_field field = {.base = data, .sample_bytes = BIG_BYTES};
    for (int workers = 0; workers <= 3; workers++) {
        fl_loader_config config = {
            .sampler = {.n = BIG_SAMPLES, .world_size = 1, .batch_size = 20, .shuffle = 1, .seed = 5},
            .workers = workers, .slots = 3, .fields = &field, .n_fields = 1,
        };
        fl_loader *l;
        CHECK(fl_loader_new(&config, &l) == FL_OK);
        int64_t order[BIG_SAMPLES];
        CHECK(fl_sampler_epoch(&config.sampler, 2, order) == FL_OK);
        CHECK(fl_loader_start_epoch(l, 2) == FL_OK);
        int slot, whole = 1, batches = 0;
        size_t count, seen = 0;
        while (fl_loader_next(l, 10, &slot, &count) == FL_OK) {
            const unsigned char *batch = fl_loader_slot(l, slot);
            for (size_t i = 0; i < count; i++, seen++) {
                unsigned char want = (unsigned char)(order[seen] % 251);
                whole &= batch[i * BIG_BYTES] == want && batch[i * BIG_BYTES + BIG_BYTES - 1] == want;
            }
            fl_loader_release(l, slot);
            batches++;
        }
        CHECK(whole && seen == BIG_SAMPLES && batches == 5);
        fl_loader_free(l);
    }
    free(data);
}

static void test_a_failing_chunk_drops_its_batch_and_frees_the_slot(void) {
    char paths[BIG_SAMPLES][256];
    const char *list[BIG_SAMPLES];
    unsigned char *data = big_samples();
    for (int i = 0; i < BIG_SAMPLES; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/big%d.raw", tmpdir, i);
        list[i] = paths[i];
        FILE *f = fopen(paths[i], "wb");
        fwrite(data + (size_t)i * BIG_BYTES, 1, i == 45 ? BIG_BYTES / 2 : BIG_BYTES, f); /* 45 is short */
        fclose(f);
    }
    fl_field field = {.paths = list, .raw = 1, .sample_bytes = BIG_BYTES};
    fl_loader_config config = {
        .sampler = {.n = BIG_SAMPLES, .world_size = 1, .batch_size = 20},
        .workers = 3, .slots = 4, .fields = &field, .n_fields = 1,
    };
    fl_loader *l;
    CHECK(fl_loader_new(&config, &l) == FL_OK);
    for (uint64_t epoch = 0; epoch < 2; epoch++) { /* after the failure, a new epoch works */
        CHECK(fl_loader_start_epoch(l, epoch) == FL_OK);
        int slot;
        size_t count;
        for (int b = 0; b < 2; b++) { /* batches 0 and 1 (samples 0..39) come whole */
            CHECK(fl_loader_next(l, 10, &slot, &count) == FL_OK && count == 20);
            CHECK(((unsigned char *)fl_loader_slot(l, slot))[19 * BIG_BYTES] == b * 20 + 19);
            fl_loader_release(l, slot);
        }
        CHECK(fl_loader_next(l, 10, &slot, &count) == FL_EINVAL); /* batch 2 holds sample 45 */
        CHECK(strstr(fl_loader_error(l), "sample 45") && strstr(fl_loader_error(l), "big45.raw"));
        CHECK(fl_loader_next(l, 10, &slot, &count) == FL_EINVAL); /* it stays failed */
        CHECK(fl_loader_lent(l) == 0);
    }
    fl_loader_free(l);
    for (int i = 0; i < BIG_SAMPLES; i++)
        unlink(paths[i]);
    free(data);
}

typedef struct {
    fl_loader *l;
    int rc;
} consumer_arg;

static void *consume_all(void *arg) {
    consumer_arg *c = arg;
    int slot;
    size_t count;
    while ((c->rc = fl_loader_next(c->l, 10, &slot, &count)) == FL_OK)
        fl_loader_release(c->l, slot);
    return NULL;
}

static void test_stop_from_another_thread_while_the_consumer_fills_chunks(void) {
    unsigned char *data = big_samples();
    fl_field field = {.base = data, .sample_bytes = BIG_BYTES};
    for (int workers = 0; workers <= 1; workers++) {
        fl_loader_config config = {
            .sampler = {.n = BIG_SAMPLES, .world_size = 1, .batch_size = 32},
            .workers = workers, .slots = 2, .fields = &field, .n_fields = 1,
        };
        for (int round = 0; round < 20; round++) {
            fl_loader *l;
            CHECK(fl_loader_new(&config, &l) == FL_OK);
            CHECK(fl_loader_start_epoch(l, (uint64_t)round) == FL_OK);
            consumer_arg arg = {l, FL_OK};
            pthread_t consumer;
            pthread_create(&consumer, NULL, consume_all, &arg);
            usleep((useconds_t)(round * 50)); /* paces: stop lands at a different point each round */
            fl_loader_stop(l); /* waits for a chunk the consumer is filling, if any */
            pthread_join(consumer, NULL);
            CHECK(arg.rc == FL_EEND);
            fl_loader_free(l);
        }
    }
    free(data);
}

static void test_a_missing_file_names_the_path_and_sample(void) {
    enum { FILES = 10 };
    char paths[FILES][256];
    const char *list[FILES];
    for (int i = 0; i < FILES; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/sample%d.raw", tmpdir, i);
        list[i] = paths[i];
        if (i != 7) {
            FILE *f = fopen(paths[i], "wb");
            int64_t value = i * 100;
            fwrite(&value, sizeof value, 1, f);
            fclose(f);
        }
    }
    fl_field field = {.paths = list, .raw = 1, .sample_bytes = sizeof(int64_t)};
    fl_loader_config config = {
        .sampler = {.n = FILES, .world_size = 1, .batch_size = 4},
        .workers = 2, .slots = 3, .fields = &field, .n_fields = 1,
    };
    fl_loader *l;
    CHECK(fl_loader_new(&config, &l) == FL_OK);
    CHECK(fl_loader_start_epoch(l, 0) == FL_OK);
    int slot;
    size_t count;
    CHECK(fl_loader_next(l, 10, &slot, &count) == FL_OK && count == 4);
    CHECK(((int64_t *)fl_loader_slot(l, slot))[3] == 300);
    fl_loader_release(l, slot);
    CHECK(fl_loader_next(l, 10, &slot, &count) == FL_ESYS);
    CHECK(strstr(fl_loader_error(l), "sample 7: cannot open") && strstr(fl_loader_error(l), "sample7.raw"));
    fl_loader_free(l);
}

/* The loader driven through its batch-source table, as the Python binding drives it. */
static void test_the_batch_source_table_runs_the_loader(void) {
    fl_loader *l = make_loader(2, 1, NULL, 0, 1);
    fl_batch_source src = fl_loader_source(l);
    CHECK(src.impl == l && !src.ops->start_forks && !src.ops->release_blocks);
    CHECK(src.ops->batches(src.impl) == 16 && src.ops->slots(src.impl) == 4);
    unsigned char seen[SAMPLES] = {0};
    int slot, rc, once = 1;
    size_t count;
    CHECK(src.ops->start_epoch(src.impl, 0, 0) == FL_OK);
    while ((rc = src.ops->next(src.impl, 10, &slot, &count)) == FL_OK) {
        CHECK(src.ops->lent(src.impl) == 1);
        unsigned char *data = src.ops->slot(src.impl, slot);
        const int64_t *got_labels = (const int64_t *)(data + fl_loader_field_offset(l, 1));
        for (size_t i = 0; i < count; i++)
            seen[got_labels[i]]++;
        src.ops->release(src.impl, slot);
    }
    CHECK(rc == FL_EEND && src.ops->lent(src.impl) == 0 && strcmp(src.ops->error(src.impl), "") == 0);
    for (int i = 0; i < SAMPLES; i++)
        once &= seen[i] == 1;
    CHECK(once);
    CHECK(!src.ops->needs_stop(src.impl));
    CHECK(src.ops->start_epoch(src.impl, 1, 15) == FL_OK); /* resumed at the last batch */
    CHECK(src.ops->next(src.impl, 10, &slot, &count) == FL_OK);
    src.ops->release(src.impl, slot);
    CHECK(src.ops->next(src.impl, 10, &slot, &count) == FL_EEND);
    CHECK(src.ops->start_epoch(src.impl, 2, 0) == FL_OK);
    CHECK(src.ops->next(src.impl, 10, &slot, &count) == FL_OK);
    src.ops->release(src.impl, slot);
    CHECK(src.ops->needs_stop(src.impl)); /* cut short */
    src.ops->stop(src.impl);
    CHECK(src.ops->next(src.impl, 0, &slot, &count) == FL_EEND);
    src.ops->free(src.impl);
}

/* Polls fl_loader_ahead until it is `want` (5 s at most); returns the last count. */
static int wait_ahead(fl_loader *l, int want) {
    double deadline = fl_monotonic() + 5;
    int ahead;
    while ((ahead = fl_loader_ahead(l)) != want && fl_monotonic() < deadline)
        nanosleep(&(struct timespec){0, 1000000}, NULL); /* polls a real condition */
    return ahead;
}

static void test_ahead_batches_stay_in_flight_besides_the_ones_held(void) {
    static int64_t values[64];
    for (int i = 0; i < 64; i++)
        values[i] = i;
    fl_field field = {.base = values, .sample_bytes = sizeof(int64_t)};
    fl_loader_config config = {
        .sampler = {.n = 64, .world_size = 1, .batch_size = 4},
        .workers = 2, .slots = 5, .ahead = 3, .fields = &field, .n_fields = 1,
    };
    fl_loader *l;
    CHECK(fl_loader_new(&config, &l) == FL_OK);
    CHECK(fl_loader_start_epoch(l, 0) == FL_OK);
    int held[2];
    size_t count;
    CHECK(fl_loader_next(l, 10, &held[0], &count) == FL_OK);
    CHECK(wait_ahead(l, 3) == 3); /* one held: three made ahead, not four (a free slot is left) */
    CHECK(fl_loader_next(l, 10, &held[1], &count) == FL_OK);
    CHECK(wait_ahead(l, 3) == 3 && fl_loader_lent(l) == 2); /* two held: still three ahead */
    CHECK(((int64_t *)fl_loader_slot(l, held[1]))[0] == 4);
    fl_loader_release(l, held[0]);
    fl_loader_release(l, held[1]);
    config.ahead = 5; /* as many as slots: refused */
    fl_loader *bad = NULL;
    CHECK(fl_loader_new(&config, &bad) == FL_EINVAL && bad == NULL);
    fl_loader_free(l);
}

/* ---- sizes from user input, checked ---- */

static void test_size_helpers_refuse_what_wraps(void) {
    size_t out = 7;
    CHECK(fl_size_mul(SIZE_MAX / 2, 3, "batch_size x sample bytes", &out) == FL_EOVERFLOW && out == 7);
    CHECK(strstr(fl_error_detail(), "batch_size x sample bytes") != NULL);
    CHECK(fl_size_mul((size_t)1 << 62, 2, "x", &out) == FL_EOVERFLOW); /* past PTRDIFF_MAX, not SIZE_MAX */
    CHECK(fl_size_mul(0, SIZE_MAX, "x", &out) == FL_OK && out == 0);
    CHECK(fl_size_add(FL_SIZE_MAX, 1, "x", &out) == FL_EOVERFLOW);
    CHECK(fl_size_align(FL_SIZE_MAX - 3, 64, "x", &out) == FL_EOVERFLOW);
    CHECK(fl_size_align(65, 64, "x", &out) == FL_OK && out == 128);
    CHECK(fl_size_fits_memory(1 << 20, "x") == FL_OK && fl_size_fits_memory(FL_SIZE_MAX, "the slots") == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "the slots") != NULL);
}

static void test_a_batch_size_past_the_data_makes_slots_of_the_data(void) {
    /* batch_size * sample bytes wrapped to a 64-byte slot (2**61 * 64 = 2**67) and the workers
     * wrote past it: a slot now holds the largest batch an epoch makes, here all 10 samples */
    static double data[10][8];
    fl_field f = {.base = data, .sample_bytes = sizeof data[0]};
    fl_loader_config c = {.sampler = {.n = 10, .world_size = 1, .batch_size = (size_t)1 << 61},
                          .workers = 2, .slots = 3, .fields = &f, .n_fields = 1};
    fl_loader *l;
    CHECK(fl_loader_new(&c, &l) == FL_OK);
    CHECK(fl_loader_start_epoch(l, 0) == FL_OK);
    int slot;
    size_t count;
    CHECK(fl_loader_next(l, 10, &slot, &count) == FL_OK && count == 10);
    fl_loader_release(l, slot);
    CHECK(fl_loader_next(l, 10, &slot, &count) == FL_EEND);
    fl_loader_free(l);
    /* a sample size that wraps with the batch: refused before any memory is asked for */
    f.sample_bytes = (size_t)1 << 60;
    c.sampler.batch_size = 16;
    c.sampler.n = 16;
    CHECK(fl_loader_new(&c, &l) == FL_EOVERFLOW && strstr(fl_error_detail(), "batch_size") != NULL);
    f.sample_bytes = (size_t)1 << 36; /* 1 TiB a batch, 3 slots: more than a test machine has */
    int rc = fl_loader_new(&c, &l);
    CHECK(rc == FL_EINVAL || rc == FL_OK);
    if (rc == FL_OK)
        fl_loader_free(l);
    else
        CHECK(strstr(fl_error_detail(), "workers x prefetch") != NULL);
}

static void test_shard_and_batch_counts_do_not_wrap_near_the_top(void) {
    fl_sampler s = {.n = UINT64_MAX, .world_size = 3, .rank = 2, .batch_size = SIZE_MAX};
    CHECK(fl_sampler_shard_size(&s) == UINT64_MAX / 3 && fl_sampler_batches(&s) == 1);
    CHECK(fl_sampler_batch_capacity(&s) == UINT64_MAX / 3);
    CHECK(fl_sampler_check(&s) == FL_EOVERFLOW || fl_sampler_check(&s) == FL_EINVAL); /* its order cannot fit */
    s.drop_last = 1;
    CHECK(fl_sampler_batches(&s) == 0);
}

int main(void) {
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    RUN(test_size_helpers_refuse_what_wraps);
    RUN(test_a_batch_size_past_the_data_makes_slots_of_the_data);
    RUN(test_shard_and_batch_counts_do_not_wrap_near_the_top);
    RUN(test_every_index_once_per_epoch_and_shards_partition);
    RUN(test_pipeline_equals_its_ops);
    RUN(test_threaded_loader_delivers_every_sample_once_through_the_pipeline);
    RUN(test_shards_of_a_loader_partition_the_data);
    RUN(test_stopping_mid_epoch_then_a_new_epoch_works);
    RUN(test_an_epoch_started_at_a_batch_skips_the_earlier_ones);
    RUN(test_a_missing_file_names_the_path_and_sample);
    RUN(test_batches_split_in_chunks_arrive_whole_in_order);
    RUN(test_a_failing_chunk_drops_its_batch_and_frees_the_slot);
    RUN(test_stop_from_another_thread_while_the_consumer_fills_chunks);
    RUN(test_the_batch_source_table_runs_the_loader);
    RUN(test_ahead_batches_stay_in_flight_besides_the_ones_held);
    char cleanup[300];
    snprintf(cleanup, sizeof cleanup, "rm -rf %s", tmpdir);
    return system(cleanup) != 0 || check_failures != 0;
}
