/* test_monitor.c - metrics, sinks, TensorBoard framing, GPU fallbacks and the monitor's
 * threads: exact totals under contention, formats byte by byte, errors reported. */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/fl_buf.h"
#include "base/fl_crc.h"
#include "base/fl_error.h"
#include "base/fl_metrics.h"
#include "monitor/fl_monitor.h"
#include "monitor/fl_sink.h"
#include "monitor/fl_sysstats.h"
#include "base/fl_time.h"

static char tmpdir[] = "/tmp/fl_test_monitor_XXXXXX";

static size_t read_file(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return n;
}

static size_t count_lines(const char *text, const char *containing) {
    size_t n = 0;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char copy[512];
        snprintf(copy, sizeof copy, "%.*s", (int)len, line);
        n += strstr(copy, containing) != NULL;
        line += len + (end != NULL);
    }
    return n;
}

/* Waits until `rounds` whole sampling rounds have run after the call: the round in
 * progress when it is called (counted when it ends) may have started before, so it does
 * not count. Polls the count, never a fixed sleep; returns 0 after 30 s without. */
static int wait_for_rounds(fl_monitor *m, uint64_t rounds) {
    fl_monitor_stats stats;
    fl_monitor_stats_get(m, &stats);
    uint64_t target = stats.samples + 1 + rounds;
    for (double deadline = fl_monotonic() + 30; fl_monotonic() < deadline;) {
        fl_monitor_stats_get(m, &stats);
        if (stats.samples >= target)
            return 1;
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL); /* paces the polling */
    }
    return 0;
}

/* ---- metrics ---- */

typedef struct adder {
    fl_metrics *metrics;
    int index;
} adder;

static void *add_many(void *arg) {
    adder *a = arg;
    char own[32];
    snprintf(own, sizeof own, "thread%d", a->index);
    for (int i = 0; i < 100000; i++) {
        fl_metrics_add(a->metrics, "total", 1.0);
        fl_metrics_add(a->metrics, own, (double)i);
    }
    return NULL;
}

static void test_metrics_8_threads_1e5_updates_exact(void) {
    fl_metrics *m;
    CHECK(fl_metrics_new(&m) == FL_OK);
    pthread_t threads[8];
    adder args[8];
    for (int i = 0; i < 8; i++) {
        args[i] = (adder){m, i};
        pthread_create(&threads[i], NULL, add_many, &args[i]);
    }
    for (int i = 0; i < 8; i++)
        pthread_join(threads[i], NULL);
    fl_metric total, one;
    CHECK(fl_metrics_get(m, "total", &total) == FL_OK);
    CHECK(total.count == 800000 && total.sum == 800000.0 && total.min == 1 && total.max == 1);
    CHECK(fl_metrics_get(m, "thread3", &one) == FL_OK);
    CHECK(one.count == 100000 && one.min == 0 && one.max == 99999 &&
          one.sum == 99999.0 * 100000 / 2);
    CHECK(fl_metrics_count(m) == 9);
    CHECK(fl_metrics_get(m, "missing", &one) == FL_EINVAL);
    CHECK(fl_metrics_add(m, "", 1) == FL_EINVAL);
    CHECK(fl_metrics_add(m, "a-name-that-is-far-too-long-for-a-metric-record-x", 1) == FL_EINVAL);
    fl_metrics_reset(m);
    CHECK(fl_metrics_count(m) == 0);
    CHECK(fl_metrics_add(m, "again", 2) == FL_OK);
    fl_metrics_free(m);
}

/* ---- sinks ---- */

static void test_csv_and_jsonl_format_records(void) {
    char csv[512], jsonl[512], text[4096];
    snprintf(csv, sizeof csv, "%s/m.csv", tmpdir);
    snprintf(jsonl, sizeof jsonl, "%s/m.jsonl", tmpdir);
    fl_event events[3];
    fl_event_init(&events[0], FL_EVENT_SCALAR, "loss", 0.1, 7, -1);
    fl_event_init(&events[1], FL_EVENT_SCALAR, "odd,\"name\"", NAN, 8, 2);
    fl_event_init(&events[2], FL_EVENT_MARKER, "epoch_end", 0, 9, -1);
    for (int round = 0; round < 2; round++) { /* the second open appends: no second header */
        fl_sink *c, *j;
        CHECK(fl_sink_open_csv(csv, &c) == FL_OK);
        CHECK(fl_sink_open_jsonl(jsonl, &j) == FL_OK);
        CHECK(fl_sink_write(c, events, 3) == FL_OK && fl_sink_write(j, events, 3) == FL_OK);
        CHECK(fl_sink_close(c) == FL_OK && fl_sink_close(j) == FL_OK);
        fl_sink_free(c);
        fl_sink_free(j);
    }
    read_file(csv, text, sizeof text);
    CHECK(strncmp(text, "wall_time,step,name,value,kind,source\n", 38) == 0);
    CHECK(count_lines(text, "wall_time") == 1);
    CHECK(count_lines(text, ",7,loss,0.1,scalar,-1") == 2);
    CHECK(count_lines(text, ",8,\"odd,\"\"name\"\"\",nan,scalar,2") == 2);
    CHECK(count_lines(text, ",9,epoch_end,0,marker,-1") == 2);
    read_file(jsonl, text, sizeof text);
    CHECK(count_lines(text, "\"step\": 7, \"name\": \"loss\", \"value\": 0.1, \"kind\": \"scalar\"") == 2);
    CHECK(count_lines(text, "\"name\": \"odd,\\\"name\\\"\", \"value\": NaN") == 2);
}

static void test_sink_errors_name_the_path(void) {
    fl_sink *s;
    CHECK(fl_sink_open_csv("/dev/null/x.csv", &s) == FL_ESYS && s == NULL); /* not a dir */
    CHECK(strstr(fl_error_detail(), "/dev/null") != NULL);
    CHECK(fl_sink_open_jsonl("/dev/full", &s) == FL_OK); /* every write fails: ENOSPC */
    fl_event e;
    fl_event_init(&e, FL_EVENT_SCALAR, "x", 1, 1, -1);
    fl_sink_write(s, &e, 1);
    CHECK(fl_sink_flush(s) == FL_ESYS);
    const char *message;
    CHECK(fl_sink_error(s, &message) == FL_ESYS);
    CHECK(strstr(message, "/dev/full") && strstr(message, strerror(ENOSPC)));
    fl_sink_write(s, &e, 1);
    CHECK(fl_sink_dropped(s) == 1);
    fl_sink_free(s);
}

/* Walks TFRecord framing, checking both CRCs of every record; returns the record count. */
static int check_tfrecords(const unsigned char *p, size_t n, const char *must_contain) {
    int records = 0, found = 0;
    while (n >= 12) {
        uint64_t len;
        uint32_t len_crc, data_crc;
        memcpy(&len, p, 8);
        memcpy(&len_crc, p + 8, 4);
        if (len_crc != fl_crc32c_masked(p, 8) || n < 16 + len)
            return -1;
        memcpy(&data_crc, p + 12 + len, 4);
        if (data_crc != fl_crc32c_masked(p + 12, len))
            return -1;
        found |= memmem(p + 12, len, must_contain, strlen(must_contain)) != NULL;
        p += 16 + len;
        n -= 16 + len;
        records++;
    }
    return n == 0 && found ? records : -1;
}

/* Known answers (the "check" values of the CRC catalogue), then the eight-bytes-at-a-time path
 * against a bit-at-a-time reference at every length and alignment up to 64 bytes. */
static uint32_t crc32c_bitwise(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1)));
    }
    return ~crc;
}

static void test_crc32c_and_crc32_known_answers(void) {
    CHECK(fl_crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(fl_crc32(0, "123456789", 9) == 0xCBF43926u);
    CHECK(fl_crc32c(fl_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u); /* continued */
    CHECK(fl_crc32c(0, "", 0) == 0);
    CHECK(fl_crc32c_masked("123456789", 9) == 0xC78AB0E5u); /* rotr 15 + 0xa282ead8 */
    unsigned char bytes[80];
    for (int i = 0; i < 80; i++)
        bytes[i] = (unsigned char)(i * 37 + 11);
    for (int start = 0; start < 8; start++)
        for (size_t n = 0; n <= 64; n++)
            CHECK(fl_crc32c(0, bytes + start, n) == crc32c_bitwise(0, bytes + start, n));
}

static void test_tensorboard_file_is_framed_with_valid_crcs(void) {
    char logdir[512];
    snprintf(logdir, sizeof logdir, "%s/tb/run1", tmpdir);
    fl_sink *s;
    CHECK(fl_sink_open_tensorboard(logdir, &s) == FL_OK);
    CHECK(strstr(fl_sink_path(s), "/events.out.tfevents.") != NULL);
    fl_event events[2];
    fl_event_init(&events[0], FL_EVENT_SCALAR, "train/loss", 0.5, 3, -1);
    fl_event_init(&events[1], FL_EVENT_MARKER, "not written", 0, 3, -1);
    CHECK(fl_sink_write(s, events, 2) == FL_OK && fl_sink_flush(s) == FL_OK);
    static unsigned char bytes[4096];
    FILE *f = fopen(fl_sink_path(s), "rb");
    size_t n = f ? fread(bytes, 1, sizeof bytes, f) : 0;
    if (f)
        fclose(f);
    CHECK(check_tfrecords(bytes, n, "brain.Event:2") == 2);
    CHECK(check_tfrecords(bytes, n, "train/loss") == 2);
    CHECK(memmem(bytes, n, "not written", 11) == NULL);
    fl_sink_free(s);
}

/* NaN, inf and numbers beyond int64 (a NaN loss) format without undefined casts, in every sink. */
static const double nonfinite[] = {NAN, INFINITY, -INFINITY, 1e300, -1e300, 9007199254740992.0,
                                   -9223372036854775808.0, 1e19};
static const char *const nonfinite_csv[] = {"nan", "inf", "-inf", "1e+300", "-1e+300",
                                            "9007199254740992", "-9.223372036854776e+18", "1e+19"};
static const char *const nonfinite_json[] = {"NaN", "Infinity", "-Infinity", "1e+300", "-1e+300",
                                             "9007199254740992", "-9.223372036854776e+18", "1e+19"};
enum { N_NONFINITE = sizeof nonfinite / sizeof nonfinite[0] };

static void test_buf_formats_nonfinite_and_huge_doubles(void) {
    for (int i = 0; i < N_NONFINITE; i++) {
        fl_buf b = {0};
        fl_buf_double(&b, nonfinite[i]);
        fl_buf_append(&b, "", 1);
        CHECK(!b.failed && strcmp((char *)b.data, nonfinite_csv[i]) == 0);
        fl_buf_free(&b);
    }
    const double seconds[] = {NAN, INFINITY, -INFINITY, 1e300, -1};
    const char *const written[] = {"0.000000", "18446744073709.551615", "0.000000",
                                   "18446744073709.551615", "0.000000"};
    for (int i = 0; i < 5; i++) {
        fl_buf b = {0};
        fl_buf_seconds(&b, seconds[i]);
        fl_buf_append(&b, "", 1);
        CHECK(!b.failed && strcmp((char *)b.data, written[i]) == 0);
        fl_buf_free(&b);
    }
}

static void test_every_sink_writes_nan_inf_and_1e300(void) {
    char csv[512], jsonl[512], logdir[512], text[8192], want[128];
    snprintf(csv, sizeof csv, "%s/nonfinite.csv", tmpdir);
    snprintf(jsonl, sizeof jsonl, "%s/nonfinite.jsonl", tmpdir);
    snprintf(logdir, sizeof logdir, "%s/tb/nonfinite", tmpdir);
    fl_event events[N_NONFINITE];
    for (int i = 0; i < N_NONFINITE; i++)
        fl_event_init(&events[i], FL_EVENT_SCALAR, "loss", nonfinite[i], i, -1);
    fl_sink *c, *j, *t;
    CHECK(fl_sink_open_csv(csv, &c) == FL_OK && fl_sink_open_jsonl(jsonl, &j) == FL_OK);
    CHECK(fl_sink_open_tensorboard(logdir, &t) == FL_OK);
    CHECK(fl_sink_write(c, events, N_NONFINITE) == FL_OK);
    CHECK(fl_sink_write(j, events, N_NONFINITE) == FL_OK);
    CHECK(fl_sink_write(t, events, N_NONFINITE) == FL_OK && fl_sink_flush(t) == FL_OK);
    CHECK(fl_sink_close(c) == FL_OK && fl_sink_close(j) == FL_OK);
    read_file(csv, text, sizeof text);
    for (int i = 0; i < N_NONFINITE; i++) {
        snprintf(want, sizeof want, ",%d,loss,%s,scalar,-1", i, nonfinite_csv[i]);
        CHECK(count_lines(text, want) == 1);
    }
    read_file(jsonl, text, sizeof text);
    for (int i = 0; i < N_NONFINITE; i++) {
        snprintf(want, sizeof want, "\"step\": %d, \"name\": \"loss\", \"value\": %s,", i,
                 nonfinite_json[i]);
        CHECK(count_lines(text, want) == 1);
    }
    static unsigned char bytes[8192];
    FILE *f = fopen(fl_sink_path(t), "rb");
    size_t n = f ? fread(bytes, 1, sizeof bytes, f) : 0;
    if (f)
        fclose(f);
    CHECK(check_tfrecords(bytes, n, "loss") == 1 + N_NONFINITE); /* file version + scalars */
    for (int i = 0; i < 2; i++) /* simple_value is field 2, fixed32: key byte 0x15 */
        CHECK(memmem(bytes, n, (unsigned char[]){0x15, 0, 0, 0x80, (unsigned char)(i ? 0xff : 0x7f)}, 5) != NULL);
    fl_sink_free(c);
    fl_sink_free(j);
    fl_sink_free(t);
}

/* ---- GPU sources ---- */

static void test_gpu_falls_back_to_nvidia_smi_then_to_none(void) {
    fl_gpu *gpu;
    CHECK(fl_gpu_open("libno-such-nvml.so", "printf '1024, 81920, 37\\n2048, 81920, 5\\n'; true",
                      &gpu) == FL_OK);
    CHECK(fl_gpu_source_of(gpu) == FL_GPU_SMI);
    CHECK(strstr(fl_gpu_reason(gpu), "libno-such-nvml.so") != NULL);
    fl_gpu_stats stats[4];
    int count;
    CHECK(fl_gpu_sample(gpu, stats, 4, &count) == FL_OK && count == 2);
    CHECK(stats[0].memory_used_bytes == 1024.0 * 1048576 && stats[1].utilization_percent == 5);
    fl_gpu_close(gpu);
    CHECK(fl_gpu_open("libno-such-nvml.so", "false", &gpu) == FL_OK);
    CHECK(fl_gpu_source_of(gpu) == FL_GPU_NONE);
    CHECK(strstr(fl_gpu_reason(gpu), "host metrics only") != NULL);
    CHECK(fl_gpu_sample(gpu, stats, 4, &count) == FL_OK && count == 0);
    fl_gpu_close(gpu);
}

/* ---- the monitor ---- */

typedef struct producer {
    fl_monitor *monitor;
    int index;
} producer;

static void *put_scalars(void *arg) {
    producer *p = arg;
    for (int i = 0; i < 2500; i++) {
        fl_event e;
        fl_event_init(&e, FL_EVENT_SCALAR, "worker/value", i, i, p->index);
        double deadline = fl_monotonic() + 30; /* a full queue drains; a stuck writer fails */
        while (fl_monitor_put(p->monitor, &e, 0.01) != FL_OK && fl_monotonic() < deadline)
            ;
    }
    return NULL;
}

static void test_monitor_writes_every_record_and_samples(void) {
    char csv[512], text[1 << 20];
    snprintf(csv, sizeof csv, "%s/monitor.csv", tmpdir);
    fl_sink *sinks[2];
    fl_queue *forward;
    CHECK(fl_sink_open_csv(csv, &sinks[0]) == FL_OK);
    CHECK(fl_queue_new(0, sizeof(fl_item), &forward) == FL_OK);
    CHECK(fl_sink_open_queue(forward, &sinks[1]) == FL_OK);
    fl_gpu *gpu;
    fl_gpu_open("libno-such-nvml.so", "printf '100, 200, 50\\n'", &gpu);
    fl_metrics *metrics;
    fl_metrics_new(&metrics);
    fl_monitor_config config = {.interval_s = 0.02, .flush_interval_s = 0.05, .queue_size = 64,
                                .sample_host = 1};
    fl_monitor *m;
    CHECK(fl_monitor_new(&config, sinks, 2, gpu, &m) == FL_OK);
    CHECK(fl_monitor_watch(m, metrics) == FL_OK);
    fl_metrics_free(metrics); /* the monitor keeps its own reference */
    pthread_t threads[4];
    producer args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (producer){m, i};
        pthread_create(&threads[i], NULL, put_scalars, &args[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    int err;
    uint64_t ticket = fl_monitor_request_flush(m, -1, &err);
    CHECK(ticket > 0 && fl_monitor_flushed(m, ticket, 5.0) == FL_OK);
    read_file(csv, text, sizeof text);
    CHECK(count_lines(text, ",worker/value,") == 10000);
    CHECK(wait_for_rounds(m, 2)); /* two rounds that start with the queue drained */
    fl_monitor_close(m, 0); /* returns at once; the writer finishes on its own */
    CHECK(fl_monitor_wait_closed(m, 5.0) == FL_OK);
    read_file(csv, text, sizeof text);
    CHECK(count_lines(text, ",host/rss_bytes,") >= 2);
    CHECK(count_lines(text, ",gpu0/memory_used_bytes,104857600,scalar,0") >= 1);
    CHECK(count_lines(text, ",monitor/dropped,") >= 1);
    fl_monitor_stats stats;
    fl_monitor_stats_get(m, &stats);
    CHECK(stats.records >= 10000 && stats.samples >= 2);
    CHECK(fl_queue_size(forward) + fl_sink_dropped(sinks[1]) == stats.records);
    char message[256];
    CHECK(fl_monitor_take_error(m, message, sizeof message) == 0);
    fl_event late;
    fl_event_init(&late, FL_EVENT_SCALAR, "late", 1, 1, -1);
    CHECK(fl_monitor_put(m, &late, 0) == FL_ECLOSED);
    fl_monitor_release(m);
    fl_queue_free(forward);
}

static void *add_new_names(void *arg) {
    fl_metrics *metrics = arg;
    char name[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(name, sizeof name, "m%d", i);
        fl_metrics_add(metrics, name, 1.0);
        if (i % 8 == 0)
            sched_yield(); /* let the sampler copy the table between additions */
    }
    return NULL;
}

static void *put_summaries(void *arg) {
    fl_monitor *m = arg;
    for (int i = 0; i < 100; i++) {
        fl_summary *text = fl_summary_new(FL_SUMMARY_TEXT, 5);
        memcpy(text->tag, "notes", 6);
        memcpy(text->payload, "hello", 5);
        text->count = 5;
        fl_summary *histogram = fl_summary_new(FL_SUMMARY_HISTOGRAM, 4 * sizeof(double));
        memcpy(histogram->tag, "h", 2);
        double values[4] = {1, 2, 3, i};
        memcpy(histogram->payload, values, sizeof values);
        histogram->count = 4;
        histogram->bins = 3;
        fl_summary *image = fl_summary_new(FL_SUMMARY_IMAGE, 2 * 3 * 3);
        memcpy(image->tag, "img", 4);
        image->height = 2, image->width = 3, image->channels = 3;
        memset(image->payload, 7, 2 * 3 * 3);
        fl_summary *all[3] = {text, histogram, image};
        for (int k = 0; k < 3; k++)
            if (fl_monitor_put_summary(m, all[k], 5.0) != FL_OK)
                free(all[k]);
    }
    return NULL;
}

/* Histograms, images and text from two threads reach the TensorBoard file, each encoded and
 * freed by the writer (ASan: no leak, no use after free); bad images are refused. */
static void test_summaries_are_encoded_by_the_writer_and_freed(void) {
    char dir[512], text[1 << 20];
    snprintf(dir, sizeof dir, "%s/summaries", tmpdir);
    fl_sink *sink;
    CHECK(fl_sink_open_tensorboard(dir, &sink) == FL_OK);
    char path[600];
    snprintf(path, sizeof path, "%s", fl_sink_path(sink));
    fl_monitor_config config = {.interval_s = 0, .flush_interval_s = 0.05, .queue_size = 16};
    fl_monitor *m;
    CHECK(fl_monitor_new(&config, &sink, 1, NULL, &m) == FL_OK);
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, put_summaries, m);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    fl_monitor_close(m, 1);
    fl_monitor_stats stats;
    fl_monitor_stats_get(m, &stats);
    CHECK(stats.records == 600);
    size_t n = read_file(path, text, sizeof text);
    CHECK(memmem(text, n, "\x89PNG\r\n", 6) != NULL && memmem(text, n, "hello", 5) != NULL);
    char message[256];
    CHECK(fl_monitor_take_error(m, message, sizeof message) == 0);
    fl_monitor_release(m);
    fl_buf png = {0};
    unsigned char pixel[4] = {0};
    CHECK(fl_png_encode(&png, pixel, 1, 1, 2) == FL_EINVAL && png.len == 0);
    CHECK(fl_png_encode(&png, pixel, 1, 1, 4) == FL_OK && png.len > 8);
    fl_buf_free(&png);
}

/* Names added while the sampler copies the table: it must copy exactly what it counted
 * (it once read past its copy, writing garbage names; ASan calls that an overflow). */
static void test_sampling_a_table_that_grows_reads_only_real_names(void) {
    char csv[512];
    static char text[1 << 22];
    snprintf(csv, sizeof csv, "%s/growing.csv", tmpdir);
    fl_sink *sink;
    CHECK(fl_sink_open_csv(csv, &sink) == FL_OK);
    fl_metrics *metrics;
    fl_metrics_new(&metrics);
    fl_monitor_config config = {.interval_s = 1e-5, .flush_interval_s = 0.05, .queue_size = 1 << 16};
    fl_monitor *m;
    CHECK(fl_monitor_new(&config, &sink, 1, NULL, &m) == FL_OK);
    CHECK(fl_monitor_watch(m, metrics) == FL_OK);
    pthread_t adder_thread;
    pthread_create(&adder_thread, NULL, add_new_names, metrics);
    pthread_join(adder_thread, NULL);
    CHECK(wait_for_rounds(m, 1)); /* a whole round after the last name was added */
    fl_monitor_close(m, 1);
    read_file(csv, text, sizeof text);
    size_t rates = count_lines(text, "/per_s,"), real = 0;
    for (const char *line = strstr(text, ",m"); line != NULL; line = strstr(line + 1, ",m")) {
        int index, used = 0;
        real += sscanf(line, ",m%d/per_s,%n", &index, &used) == 1 && used > 0 && index >= 0 && index < 3000;
    }
    CHECK(rates > 0 && real == rates);
    fl_metrics_free(metrics);
    fl_monitor_release(m);
}

static void test_monitor_reports_a_failing_sink_once(void) {
    fl_sink *sink;
    CHECK(fl_sink_open_csv("/dev/full", &sink) == FL_OK || sink == NULL);
    if (sink == NULL) /* the header write failed at open: also a reported error */
        return;
    fl_monitor_config config = {.interval_s = 0, .flush_interval_s = 0.01, .queue_size = 16};
    fl_monitor *m;
    CHECK(fl_monitor_new(&config, &sink, 1, NULL, &m) == FL_OK);
    fl_event e;
    fl_event_init(&e, FL_EVENT_SCALAR, "x", 1, 1, -1);
    CHECK(fl_monitor_put(m, &e, 1.0) == FL_OK);
    fl_monitor_close(m, 1);
    char message[256];
    CHECK(fl_monitor_take_error(m, message, sizeof message) == 1);
    CHECK(strstr(message, "/dev/full") != NULL);
    CHECK(fl_monitor_take_error(m, message, sizeof message) == 0);
    fl_monitor_release(m);
}

/* More errors than the list holds: each report past the room is refused and counted, the
 * next message taken says how many were dropped, and a sink failing while the list is full
 * writes nothing past it (it once did: 32 reported errors, then a sink's, overran the array,
 * a SIGSEGV). Taking errors makes room again, however many came before (the list wraps). */
static void test_errors_past_the_room_are_counted_and_the_list_wraps(void) {
    fl_sink *sink;
    CHECK(fl_sink_open_jsonl("/dev/full", &sink) == FL_OK); /* fails at its first write */
    fl_monitor_config config = {.interval_s = 0, .flush_interval_s = 0.01, .queue_size = 16};
    fl_monitor *m;
    CHECK(fl_monitor_new(&config, &sink, 1, NULL, &m) == FL_OK);
    char message[FL_MONITOR_ERROR_MAX];
    for (int i = 0; i < FL_MONITOR_MAX_SINKS; i++) {
        snprintf(message, sizeof message, "reported %d", i);
        CHECK(fl_monitor_report_error(m, message) == FL_OK);
    }
    CHECK(fl_monitor_report_error(m, "one too many") == FL_EAGAIN);
    fl_event e;
    fl_event_init(&e, FL_EVENT_SCALAR, "x", 1, 1, -1);
    CHECK(fl_monitor_put(m, &e, 1.0) == FL_OK);
    int err;
    uint64_t ticket = fl_monitor_request_flush(m, 5.0, &err); /* the sink fails: a third error */
    CHECK(ticket > 0 && fl_monitor_flushed(m, ticket, 30.0) == FL_OK);
    CHECK(fl_monitor_take_error(m, message, sizeof message) == 1);
    CHECK(strstr(message, "reported 0") == message);
    CHECK(strstr(message, "2 more errors were dropped") != NULL);
    for (int i = 1; i < FL_MONITOR_MAX_SINKS; i++) {
        CHECK(fl_monitor_take_error(m, message, sizeof message) == 1);
        CHECK(strstr(message, "dropped") == NULL);
    }
    CHECK(fl_monitor_take_error(m, message, sizeof message) == 0 && !fl_monitor_has_error(m));
    for (int i = 0; i < 3 * FL_MONITOR_MAX_SINKS; i++) { /* round and round the list */
        char expected[32];
        snprintf(expected, sizeof expected, "again %d", i);
        CHECK(fl_monitor_report_error(m, expected) == FL_OK);
        CHECK(fl_monitor_report_error(m, "and one") == FL_OK);
        CHECK(fl_monitor_take_error(m, message, sizeof message) == 1);
        CHECK(strcmp(message, expected) == 0);
        CHECK(fl_monitor_take_error(m, message, sizeof message) == 1);
        CHECK(strcmp(message, "and one") == 0);
    }
    CHECK(fl_monitor_take_error(m, message, sizeof message) == 0);
    fl_monitor_close(m, 1);
    fl_monitor_release(m);
}

/* ---- closing from many threads ---- */

enum { CLOSERS = 8, LOGGERS = 2 };

typedef struct close_race {
    fl_monitor *monitor;
    pthread_barrier_t *start;
    int wait;
    int done_at_return; /* a waiting close found the writer finished when it returned */
    int closed_seen;    /* a logger saw FL_ECLOSED */
} close_race;

static void *close_monitor(void *arg) {
    close_race *r = arg;
    pthread_barrier_wait(r->start);
    fl_monitor_close(r->monitor, r->wait);
    r->done_at_return = fl_monitor_wait_closed(r->monitor, 0) == FL_OK;
    return NULL;
}

static void *log_until_closed(void *arg) {
    close_race *r = arg;
    pthread_barrier_wait(r->start);
    fl_event e;
    fl_event_init(&e, FL_EVENT_SCALAR, "racing", 1, -1, -1);
    while (fl_monitor_put(r->monitor, &e, 0.001) != FL_ECLOSED)
        ;
    r->closed_seen = 1;
    return NULL;
}

/* 8 threads close one monitor at once (half waiting, half not) while 2 log into it: one
 * closer takes the threads, every waiting closer returns only once the writer is done,
 * the loggers get FL_ECLOSED, and (TSan) nothing races. */
static void test_closing_from_8_threads_while_2_log(void) {
    int rounds = (int)(50 * test_scale()) + 1;
    for (int round = 0; round < rounds; round++) {
        char csv[512];
        snprintf(csv, sizeof csv, "%s/race.csv", tmpdir);
        fl_sink *sink;
        CHECK(fl_sink_open_csv(csv, &sink) == FL_OK);
        fl_monitor_config config = {.interval_s = 0.001, .flush_interval_s = 0.01,
                                    .queue_size = 64};
        fl_monitor *m;
        CHECK(fl_monitor_new(&config, &sink, 1, NULL, &m) == FL_OK);
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, CLOSERS + LOGGERS);
        pthread_t threads[CLOSERS + LOGGERS];
        close_race races[CLOSERS + LOGGERS];
        for (int i = 0; i < CLOSERS + LOGGERS; i++) {
            races[i] = (close_race){m, &start, (i + round) % 2, 0, 0};
            pthread_create(&threads[i], NULL, i < CLOSERS ? close_monitor : log_until_closed,
                           &races[i]);
        }
        for (int i = 0; i < CLOSERS + LOGGERS; i++)
            pthread_join(threads[i], NULL);
        for (int i = 0; i < CLOSERS; i++)
            CHECK(!races[i].wait || races[i].done_at_return);
        for (int i = CLOSERS; i < CLOSERS + LOGGERS; i++)
            CHECK(races[i].closed_seen);
        CHECK(fl_monitor_wait_closed(m, 30) == FL_OK);
        pthread_barrier_destroy(&start);
        fl_monitor_release(m);
    }
}

/* A sample put from outside the sampler (an attached stats() source) is stamped with the
 * latest step and never waits: a full queue drops it as a sampled record, not the owner's. */
static void test_put_sample_stamps_the_latest_step_and_a_full_queue_drops_it(void) {
    fl_queue *forward;
    fl_sink *sink;
    CHECK(fl_queue_new(0, sizeof(fl_item), &forward) == FL_OK);
    CHECK(fl_sink_open_queue(forward, &sink) == FL_OK);
    fl_monitor_config config = {.interval_s = 0, .flush_interval_s = 0.05, .queue_size = 1};
    fl_monitor *m;
    CHECK(fl_monitor_new(&config, &sink, 1, NULL, &m) == FL_OK);
    fl_event scalar;
    fl_event_init(&scalar, FL_EVENT_SCALAR, "loss", 0.5, 42, -1);
    CHECK(fl_monitor_put(m, &scalar, 5.0) == FL_OK);
    for (int i = 0; i < 2000; i++) /* far more than the one slot holds: some are dropped */
        fl_monitor_put_sample(m, "loader/batches", i);
    fl_monitor_close(m, 1);
    fl_monitor_stats stats;
    fl_monitor_stats_get(m, &stats);
    CHECK(stats.dropped_records == 0 && stats.dropped_samples > 0);
    CHECK(stats.records == 1 + 2000 - stats.dropped_samples);
    size_t samples = 0;
    fl_item item;
    while (fl_queue_get(forward, &item, 0) == FL_OK) {
        if (strcmp(item.as.event.name, "loader/batches") == 0) {
            CHECK(item.as.event.step == 42 && item.as.event.kind == FL_EVENT_SCALAR);
            samples++;
        }
    }
    CHECK(samples == 2000 - stats.dropped_samples);
    fl_monitor_release(m);
    fl_queue_free(forward);
}

int main(void) {
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    RUN(test_metrics_8_threads_1e5_updates_exact);
    RUN(test_csv_and_jsonl_format_records);
    RUN(test_sink_errors_name_the_path);
    RUN(test_crc32c_and_crc32_known_answers);
    RUN(test_tensorboard_file_is_framed_with_valid_crcs);
    RUN(test_buf_formats_nonfinite_and_huge_doubles);
    RUN(test_every_sink_writes_nan_inf_and_1e300);
    RUN(test_gpu_falls_back_to_nvidia_smi_then_to_none);
    RUN(test_monitor_writes_every_record_and_samples);
    RUN(test_monitor_reports_a_failing_sink_once);
    RUN(test_sampling_a_table_that_grows_reads_only_real_names);
    RUN(test_summaries_are_encoded_by_the_writer_and_freed);
    RUN(test_errors_past_the_room_are_counted_and_the_list_wraps);
    RUN(test_closing_from_8_threads_while_2_log);
    RUN(test_put_sample_stamps_the_latest_step_and_a_full_queue_drops_it);
    char cleanup[600];
    snprintf(cleanup, sizeof cleanup, "rm -rf %s", tmpdir);
    return system(cleanup) != 0 || check_failures != 0;
}
