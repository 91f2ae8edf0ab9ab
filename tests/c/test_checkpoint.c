/* test_checkpoint.c - the checkpointer: published files are complete and pruned to `keep`,
 * concurrent savers take turns, write errors are kept for the owner, close writes what is
 * pending. (numpy.load() reading the files is checked from Python.) */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "checkpoint/fl_checkpoint.h"
#include "base/fl_error.h"

static char tmpdir[] = "/tmp/fl_test_ckpt_XXXXXX";

static int exists(const char *dir, int64_t step) {
    char path[4096];
    fl_checkpoint_path(dir, step, path, sizeof path);
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

/* Snapshots one float array of `count` values, all equal to `value`, as `step`. */
static int save(fl_checkpointer *c, int64_t step, size_t count, float value) {
    fl_npz_entry *entries;
    unsigned char *data;
    int rc = fl_checkpointer_begin(c, 1, count * sizeof(float), -1, &entries, &data);
    if (rc != FL_OK)
        return rc;
    entries[0] = (fl_npz_entry){"weights", "'<f4'", 1, {(int64_t)count}, 0, count * sizeof(float)};
    for (size_t i = 0; i < count; i++)
        memcpy(data + i * sizeof(float), &value, sizeof value);
    fl_checkpointer_commit(c, step);
    return FL_OK;
}

static void test_checkpoints_are_published_and_pruned(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/run/ckpts", tmpdir); /* created on demand */
    fl_checkpointer *c;
    CHECK(fl_checkpointer_new(dir, 2, &c) == FL_OK);
    for (int64_t step = 10; step <= 40; step += 10)
        CHECK(save(c, step, 1000, (float)step) == FL_OK);
    CHECK(fl_checkpointer_wait(c, 10) == FL_OK);
    CHECK(!exists(dir, 10) && !exists(dir, 20) && exists(dir, 30) && exists(dir, 40));
    fl_checkpoint_stats stats;
    fl_checkpointer_stats(c, &stats);
    CHECK(stats.written == 4 && stats.last_step == 40 && stats.bytes == 4 * 4000);
    char message[512];
    CHECK(fl_checkpointer_take_error(c, message, sizeof message) == 0);
    fl_checkpointer_close(c, 1);
    fl_npz_entry *e;
    unsigned char *d;
    CHECK(fl_checkpointer_begin(c, 1, 4, 0, &e, &d) == FL_ECLOSED);
    fl_checkpointer_release(c);
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
    char dir[256];
    snprintf(dir, sizeof dir, "%s/concurrent", tmpdir);
    fl_checkpointer *c;
    CHECK(fl_checkpointer_new(dir, 3, &c) == FL_OK);
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
    fl_checkpointer_close(c, 1); /* the last pending snapshot is still written */
    fl_checkpoint_stats stats;
    fl_checkpointer_stats(c, &stats);
    CHECK(stats.written == 60);
    fl_checkpointer_release(c);
}

static void test_write_errors_are_kept_for_the_owner(void) {
    char dir[256], cmd[300];
    snprintf(dir, sizeof dir, "%s/vanishing", tmpdir);
    fl_checkpointer *c;
    CHECK(fl_checkpointer_new(dir, 1, &c) == FL_OK);
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
    CHECK(fl_checkpointer_new(dir, 1, &c) == FL_ESYS && c == NULL);
    CHECK(strstr(fl_error_detail(), dir) != NULL);
    CHECK(fl_checkpointer_new(tmpdir, 0, &c) == FL_EINVAL);
}

int main(void) {
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    RUN(test_checkpoints_are_published_and_pruned);
    RUN(test_concurrent_savers_take_turns);
    RUN(test_write_errors_are_kept_for_the_owner);
    char cleanup[300];
    snprintf(cleanup, sizeof cleanup, "rm -rf %s", tmpdir);
    return system(cleanup) != 0 || check_failures != 0;
}
