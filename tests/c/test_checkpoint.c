/* test_checkpoint.c - the checkpointer and the safetensors writer: published files are
 * complete safetensors files (header padded to 8 bytes, escaped names, metadata and the data's
 * CRC-32) pruned to `keep`; every committed snapshot is written, in order, up to max_pending
 * staged at once; entries a reader would refuse are refused; concurrent savers take turns;
 * write errors are kept for the owner; close writes what is pending. (The safetensors package
 * reading the files is checked from Python.) */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "base/fl_crc.h"
#include "base/fl_error.h"
#include "base/fl_time.h"
#include "checkpoint/fl_checkpoint.h"
#include "checkpoint/fl_safetensors.h"

static char tmpdir[] = "/tmp/fl_test_ckpt_XXXXXX";

static int exists(const char *dir, int64_t step) {
    char path[4096];
    fl_checkpoint_path(dir, step, path, sizeof path);
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

/* Snapshots one float tensor `name` of `count` values, all equal to `value`, as `step`. */
static int save_named(fl_checkpointer *c, int64_t step, const char *name, size_t count, float value) {
    fl_st_entry *entries;
    unsigned char *data;
    int rc = fl_checkpointer_begin(c, 1, count * sizeof(float), -1, &entries, &data);
    if (rc != FL_OK)
        return rc;
    entries[0] = (fl_st_entry){"", "F32", 1, {(int64_t)count}, 0, count * sizeof(float)};
    snprintf(entries[0].name, sizeof entries[0].name, "%s", name);
    for (size_t i = 0; i < count; i++)
        memcpy(data + i * sizeof(float), &value, sizeof value);
    fl_st_meta meta[] = {{"format", "np"}, {"note", "a \"quoted\"\\path\n"}};
    return fl_checkpointer_commit(c, step, meta, 2);
}

static int save(fl_checkpointer *c, int64_t step, size_t count, float value) {
    return save_named(c, step, "weights", count, value);
}

/* The whole file at `path` (caller frees), its size in *len. */
static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(*len + 1);
    if (buf != NULL && fread(buf, 1, *len, f) != *len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf != NULL)
        buf[*len] = '\0';
    return buf;
}

static void test_a_file_is_a_padded_safetensors_header_then_the_data(void) {
    char dir[256], path[4096];
    snprintf(dir, sizeof dir, "%s/format", tmpdir);
    fl_checkpointer *c;
    CHECK(fl_checkpointer_new(dir, 1, 1, &c) == FL_OK);
    CHECK(save_named(c, 3, "model.\"odd\"\\name\x01", 3, 1.5f) == FL_OK);
    fl_checkpointer_close(c, 1);
    fl_checkpointer_release(c);
    fl_checkpoint_path(dir, 3, path, sizeof path);
    size_t len;
    unsigned char *file = slurp(path, &len);
    CHECK(file != NULL && len > 8);
    if (file == NULL)
        return;
    uint64_t n;
    memcpy(&n, file, 8);
    CHECK(n % 8 == 0 && 8 + n + 12 == len);
    float expected[3] = {1.5f, 1.5f, 1.5f};
    char crc[64];
    snprintf(crc, sizeof crc, "\"fastloop.crc32\":\"%08x\"", (unsigned)fl_crc32(0, expected, sizeof expected));
    const char *header = (const char *)file + 8;
    const char *meta = "{\"__metadata__\":{\"format\":\"np\",\"note\":\"a \\\"quoted\\\"\\\\path\\u000a\",";
    CHECK(strncmp(header, meta, strlen(meta)) == 0);
    CHECK(strstr(header, crc) != NULL);
    CHECK(strstr(header, "\"model.\\\"odd\\\"\\\\name\\u0001\":{\"dtype\":\"F32\",\"shape\":[3],"
                         "\"data_offsets\":[0,12]}}") != NULL);
    CHECK(file[8 + n - 1] == ' ' || file[8 + n - 1] == '}');
    CHECK(memcmp(file + 8 + n, expected, sizeof expected) == 0);
    free(file);
}

static void test_checkpoints_are_published_and_pruned(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/run/ckpts", tmpdir); /* created on demand */
    fl_checkpointer *c;
    CHECK(fl_checkpointer_new(dir, 2, 1, &c) == FL_OK);
    for (int64_t step = 10; step <= 40; step += 10)
        CHECK(save(c, step, 1000, (float)step) == FL_OK);
    CHECK(fl_checkpointer_wait(c, 10) == FL_OK);
    CHECK(!exists(dir, 10) && !exists(dir, 20) && exists(dir, 30) && exists(dir, 40));
    fl_checkpoint_stats stats;
    fl_checkpointer_stats(c, &stats);
    CHECK(stats.written == 4 && stats.last_step == 40 && stats.bytes == 4 * 4000);
    CHECK(stats.pending == 0 && stats.pending_step == -1);
    char message[512];
    CHECK(fl_checkpointer_take_error(c, message, sizeof message) == 0);
    fl_checkpointer_close(c, 1);
    fl_st_entry *e;
    unsigned char *d;
    CHECK(fl_checkpointer_begin(c, 1, 4, 0, &e, &d) == FL_ECLOSED);
    fl_checkpointer_release(c);
}

static void test_every_snapshot_is_written_in_order_with_max_pending_staged(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/ring", tmpdir);
    fl_checkpointer *c;
    CHECK(fl_checkpointer_new(dir, 1000, 4, &c) == FL_OK);
    fl_checkpoint_stats stats;
    for (int64_t step = 1; step <= 50; step++) {
        CHECK(save(c, step, 20000, (float)step) == FL_OK);
        fl_checkpointer_stats(c, &stats);
        CHECK(stats.pending >= 1 || stats.last_step == step); /* this one is pending or written */
        CHECK(stats.pending <= 4);
        CHECK(stats.last_step <= step && stats.last_step >= (step > 4 ? step - 4 : -1)); /* in order */
    }
    CHECK(fl_checkpointer_wait(c, 30) == FL_OK);
    fl_checkpointer_stats(c, &stats);
    CHECK(stats.written == 50 && stats.last_step == 50 && stats.pending == 0);
    for (int64_t step = 1; step <= 50; step++)
        CHECK(exists(dir, step));
    fl_checkpointer_close(c, 1);
    fl_checkpointer_release(c);
    CHECK(fl_checkpointer_new(dir, 1, 0, &c) == FL_EINVAL && c == NULL);
    CHECK(fl_checkpointer_new(dir, 1, FL_CHECKPOINT_MAX_PENDING + 1, &c) == FL_EINVAL);
}

static void test_one_snapshot_is_filled_at_a_time(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/filling", tmpdir);
    fl_checkpointer *c;
    CHECK(fl_checkpointer_new(dir, 1, 8, &c) == FL_OK);
    fl_st_entry *e;
    unsigned char *d;
    CHECK(fl_checkpointer_begin(c, 1, 4, 0, &e, &d) == FL_OK);
    CHECK(fl_checkpointer_begin(c, 1, 4, 0, &e, &d) == FL_EAGAIN);
    CHECK(fl_checkpointer_begin(c, 1, 4, 0.01, &e, &d) == FL_ETIMEDOUT);
    fl_checkpointer_abort(c);
    CHECK(fl_checkpointer_begin(c, 1, 4, 0, &e, &d) == FL_OK);
    fl_checkpointer_abort(c);
    fl_checkpoint_stats stats;
    fl_checkpointer_stats(c, &stats);
    CHECK(stats.pending == 0);
    fl_checkpointer_close(c, 1);
    fl_checkpointer_release(c);
}

/* commit refuses what fl_st_check refuses and gives the area back. */
static int commit_one(fl_checkpointer *c, fl_st_entry entry, size_t reserved) {
    fl_st_entry *e;
    unsigned char *d;
    if (fl_checkpointer_begin(c, 1, reserved, 0, &e, &d) != FL_OK)
        return 1;
    memset(d, 0, reserved);
    e[0] = entry;
    return fl_checkpointer_commit(c, 1, NULL, 0);
}

static void test_entries_a_reader_would_refuse_are_refused(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/refused", tmpdir);
    fl_checkpointer *c;
    CHECK(fl_checkpointer_new(dir, 1, 1, &c) == FL_OK);
    CHECK(commit_one(c, (fl_st_entry){"w", "F128", 1, {2}, 0, 8}, 8) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "'w': unknown safetensors dtype") != NULL);
    CHECK(commit_one(c, (fl_st_entry){"w", "F32", 1, {3}, 0, 8}, 8) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "8 bytes, its shape and dtype make 12") != NULL);
    CHECK(commit_one(c, (fl_st_entry){"w", "F32", 1, {2}, 4, 8}, 12) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "not right after") != NULL);
    CHECK(commit_one(c, (fl_st_entry){"w", "F32", 1, {4}, 0, 16}, 8) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "16 bytes, 8 were reserved") != NULL);
    CHECK(commit_one(c, (fl_st_entry){"w", "U8", 3, {1LL << 40, 1LL << 40, 0}, 0, 0}, 8) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "overflows") != NULL);
    CHECK(commit_one(c, (fl_st_entry){"w", "U8", 1, {-1}, 0, 0}, 8) == FL_EINVAL);
    CHECK(commit_one(c, (fl_st_entry){"__metadata__", "U8", 1, {1}, 0, 1}, 8) == FL_EINVAL);
    CHECK(commit_one(c, (fl_st_entry){"\xc3\x28", "U8", 1, {1}, 0, 1}, 8) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "UTF-8") != NULL);
    CHECK(commit_one(c, (fl_st_entry){"\xed\xa0\x80", "U8", 1, {1}, 0, 1}, 8) == FL_EINVAL); /* a surrogate */
    CHECK(commit_one(c, (fl_st_entry){"", "U8", 1, {1}, 0, 1}, 8) == FL_EINVAL);
    CHECK(commit_one(c, (fl_st_entry){"caf\xc3\xa9", "U8", 1, {1}, 0, 1}, 8) == FL_OK);
    fl_st_entry twice[2] = {{"a", "U8", 1, {1}, 0, 1}, {"a", "U8", 1, {1}, 1, 1}};
    size_t total;
    CHECK(fl_st_check(twice, 2, &total) == FL_EINVAL && strstr(fl_error_detail(), "'a' appears twice"));
    twice[1].name[0] = 'b';
    CHECK(fl_st_check(twice, 2, &total) == FL_OK && total == 2);
    CHECK(fl_checkpointer_wait(c, 10) == FL_OK);
    fl_checkpoint_stats stats;
    fl_checkpointer_stats(c, &stats);
    CHECK(stats.written == 1); /* only the good one */
    fl_checkpointer_close(c, 1);
    fl_checkpointer_release(c);
}

/* Entries of odd sizes around the 4 MiB chunks (a zero-size one among them) land intact. */
static void test_the_copy_over_threads_lands_every_byte(void) {
    enum { N = 6 };
    const size_t sizes[N] = {3, (4u << 20) - 1, 0, (9u << 20) + 5, 1, 4u << 20};
    fl_st_entry entries[N];
    unsigned char *sources[N];
    size_t total = 0;
    for (int i = 0; i < N; i++) {
        entries[i] = (fl_st_entry){"t", "U8", 1, {(int64_t)sizes[i]}, total, sizes[i]};
        sources[i] = malloc(sizes[i] + 1);
        for (size_t k = 0; k < sizes[i]; k++)
            sources[i][k] = (unsigned char)(k * 7 + (size_t)i);
        total += sizes[i];
    }
    fl_pool *pool;
    CHECK(fl_pool_new(&pool) == FL_OK);
    for (int threads = 1; threads <= 3; threads++) {
        unsigned char *data = calloc(total, 1);
        fl_checkpoint_copy((fl_exec){pool, threads}, entries, N, (const void *const *)sources, data);
        for (int i = 0; i < N; i++)
            CHECK(memcmp(data + entries[i].offset, sources[i], sizes[i]) == 0);
        free(data);
    }
    fl_pool_free(pool);
    for (int i = 0; i < N; i++)
        free(sources[i]);
}

typedef struct saver {
    fl_checkpointer *c;
    int index;
    int ok;
} saver;

static void *save_many(void *arg) {
    saver *s = arg;
    s->ok = 1;
    for (int i = 0; i < 20; i++)
        s->ok &= save(s->c, s->index * 100 + i, 5000, (float)i) == FL_OK;
    return NULL;
}

static void test_concurrent_savers_take_turns(void) {
    for (int max_pending = 1; max_pending <= 3; max_pending += 2) {
        char dir[256];
        snprintf(dir, sizeof dir, "%s/concurrent%d", tmpdir, max_pending);
        fl_checkpointer *c;
        CHECK(fl_checkpointer_new(dir, 3, max_pending, &c) == FL_OK);
        pthread_t threads[3];
        saver args[3];
        for (int i = 0; i < 3; i++) {
            args[i] = (saver){c, i + 1, 0};
            pthread_create(&threads[i], NULL, save_many, &args[i]);
        }
        for (int i = 0; i < 3; i++) {
            pthread_join(threads[i], NULL);
            CHECK(args[i].ok);
        }
        fl_checkpointer_close(c, 1); /* the pending snapshots are still written */
        fl_checkpoint_stats stats;
        fl_checkpointer_stats(c, &stats);
        CHECK(stats.written == 60);
        fl_checkpointer_release(c);
    }
}

static void test_write_errors_are_kept_for_the_owner(void) {
    char dir[256], cmd[300];
    snprintf(dir, sizeof dir, "%s/vanishing", tmpdir);
    fl_checkpointer *c;
    CHECK(fl_checkpointer_new(dir, 1, 1, &c) == FL_OK);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0); /* the directory disappears under the checkpointer */
    CHECK(save(c, 5, 10, 1.0f) == FL_OK);
    CHECK(fl_checkpointer_wait(c, 10) == FL_OK);
    char message[1024];
    CHECK(fl_checkpointer_take_error(c, message, sizeof message) == 1);
    CHECK(strstr(message, "checkpoint 5 not written") && strstr(message, dir));
    CHECK(fl_checkpointer_take_error(c, message, sizeof message) == 0);
    fl_checkpointer_close(c, 0); /* returns at once; the writer frees itself */
    fl_checkpointer_release(c);
    snprintf(dir, sizeof dir, "%s/a-file", tmpdir);
    FILE *f = fopen(dir, "w");
    fclose(f);
    CHECK(fl_checkpointer_new(dir, 1, 1, &c) == FL_ESYS && c == NULL);
    CHECK(strstr(fl_error_detail(), dir) != NULL);
    CHECK(fl_checkpointer_new(tmpdir, 0, 1, &c) == FL_EINVAL);
}

/* ---- temp files and other writers ---- */

/* 1 when `dir` holds a temp file (".ckpt-..."). */
static int has_temp(const char *dir) {
    DIR *d = opendir(dir);
    int found = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL && !found)
        found = strncmp(e->d_name, ".ckpt-", 6) == 0;
    if (d != NULL)
        closedir(d);
    return found;
}

/* A new checkpointer removes the temp files no writer holds (a dead one's) and leaves those
 * a writer holds locked, even when their names carry this process's pid: another
 * checkpointer of this process may be writing it. */
static void test_a_new_checkpointer_removes_only_temp_files_nobody_writes(void) {
    char dir[256], held[512], dead[512];
    snprintf(dir, sizeof dir, "%s/temps", tmpdir);
    mkdir(dir, 0777);
    snprintf(held, sizeof held, "%s/.ckpt-000000000001.safetensors.tmp.%d", dir, (int)getpid());
    snprintf(dead, sizeof dead, "%s/.ckpt-000000000002.safetensors.tmp.%d", dir, (int)getpid());
    int writing = open(held, O_CREAT | O_WRONLY, 0644);
    CHECK(writing >= 0 && flock(writing, LOCK_EX | LOCK_NB) == 0); /* a writer at work */
    close(open(dead, O_CREAT | O_WRONLY, 0644));                    /* a writer gone */
    fl_checkpointer *c;
    CHECK(fl_checkpointer_new(dir, 1, 1, &c) == FL_OK);
    CHECK(access(held, F_OK) == 0 && access(dead, F_OK) != 0);
    fl_checkpointer_close(c, 1);
    fl_checkpointer_release(c);
    close(writing); /* the writer is gone now: the next checkpointer cleans up after it */
    CHECK(fl_checkpointer_new(dir, 1, 1, &c) == FL_OK);
    CHECK(access(held, F_OK) != 0);
    fl_checkpointer_close(c, 1);
    fl_checkpointer_release(c);
}

/* Two checkpointers of one process on one directory: one saves 8 MB snapshots while the
 * other is opened again and again, each opening catching a write in flight (its temp file
 * there). Every save still publishes, without an error (the second once deleted the first's
 * temp file: "cannot rename"). */
static void test_a_second_checkpointer_leaves_the_first_ones_write_alone(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/shared", tmpdir);
    fl_checkpointer *first;
    CHECK(fl_checkpointer_new(dir, 100, 1, &first) == FL_OK);
    int caught = 0, saves = (int)(8 * test_scale()) + 1;
    for (int step = 1; step <= saves; step++) {
        CHECK(save(first, step, 2 << 20, (float)step) == FL_OK);
        fl_checkpoint_stats stats;
        do { /* until its temp file shows, or the write is done */
            fl_checkpointer_stats(first, &stats);
        } while (!has_temp(dir) && stats.written < (uint64_t)step);
        caught += stats.written < (uint64_t)step;
        fl_checkpointer *second;
        CHECK(fl_checkpointer_new(dir, 100, 1, &second) == FL_OK);
        fl_checkpointer_close(second, 1);
        fl_checkpointer_release(second);
        CHECK(fl_checkpointer_wait(first, 30) == FL_OK);
        char message[1024] = "";
        CHECK(fl_checkpointer_take_error(first, message, sizeof message) == 0);
        if (message[0])
            fprintf(stderr, "  %s\n", message);
        CHECK(exists(dir, step));
    }
    CHECK(caught > 0);
    fl_checkpointer_close(first, 1);
    fl_checkpointer_release(first);
}

/* ---- closing from many threads ---- */

enum { CLOSERS = 8, SAVERS = 2 };

typedef struct close_race {
    fl_checkpointer *c;
    pthread_barrier_t *start;
    int wait;
    int written_at_return; /* what a waiting closer found written when it returned */
    int pending_at_return;
    int saved; /* a saver's snapshots committed */
} close_race;

static void *close_checkpointer(void *arg) {
    close_race *r = arg;
    pthread_barrier_wait(r->start);
    fl_checkpointer_close(r->c, r->wait);
    fl_checkpoint_stats stats;
    fl_checkpointer_stats(r->c, &stats);
    r->written_at_return = (int)stats.written;
    r->pending_at_return = stats.pending;
    return NULL;
}

static void *save_until_closed(void *arg) {
    close_race *r = arg;
    pthread_barrier_wait(r->start);
    int rc;
    while ((rc = save(r->c, 1000 + r->saved, 256, 1.0f)) == FL_OK)
        r->saved++;
    CHECK(rc == FL_ECLOSED);
    return NULL;
}

/* 8 threads close one checkpointer at once (half waiting, half not), while the writer is
 * busy with an 8 MB snapshot and 2 threads save: every waiting closer returns only once
 * every committed snapshot is written, savers get FL_ECLOSED, and (TSan) nothing races. A
 * second waiting close once returned at once while the first joined the writer. */
static void test_closing_from_8_threads_waits_for_the_writer_every_time(void) {
    int rounds = (int)(10 * test_scale()) + 1;
    for (int round = 0; round < rounds; round++) {
        char dir[256];
        snprintf(dir, sizeof dir, "%s/closing", tmpdir);
        fl_checkpointer *c;
        CHECK(fl_checkpointer_new(dir, 1, 2, &c) == FL_OK);
        CHECK(save(c, 1, 2 << 20, 1.0f) == FL_OK); /* keeps the writer busy */
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, CLOSERS + SAVERS);
        pthread_t threads[CLOSERS + SAVERS];
        close_race races[CLOSERS + SAVERS];
        for (int i = 0; i < CLOSERS + SAVERS; i++) {
            races[i] = (close_race){c, &start, (i + round) % 2, 0, 0, 0};
            pthread_create(&threads[i], NULL, i < CLOSERS ? close_checkpointer : save_until_closed,
                           &races[i]);
        }
        for (int i = 0; i < CLOSERS + SAVERS; i++)
            pthread_join(threads[i], NULL);
        int committed = 1 + races[CLOSERS].saved + races[CLOSERS + 1].saved;
        for (int i = 0; i < CLOSERS; i++)
            CHECK(!races[i].wait ||
                  (races[i].written_at_return == committed && races[i].pending_at_return == 0));
        pthread_barrier_destroy(&start);
        fl_checkpointer_release(c);
    }
}

int main(void) {
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    RUN(test_a_file_is_a_padded_safetensors_header_then_the_data);
    RUN(test_checkpoints_are_published_and_pruned);
    RUN(test_every_snapshot_is_written_in_order_with_max_pending_staged);
    RUN(test_one_snapshot_is_filled_at_a_time);
    RUN(test_entries_a_reader_would_refuse_are_refused);
    RUN(test_the_copy_over_threads_lands_every_byte);
    RUN(test_concurrent_savers_take_turns);
    RUN(test_write_errors_are_kept_for_the_owner);
    RUN(test_a_new_checkpointer_removes_only_temp_files_nobody_writes);
    RUN(test_a_second_checkpointer_leaves_the_first_ones_write_alone);
    RUN(test_closing_from_8_threads_waits_for_the_writer_every_time);
    char cleanup[300];
    snprintf(cleanup, sizeof cleanup, "rm -rf %s", tmpdir);
    return system(cleanup) != 0 || check_failures != 0;
}
