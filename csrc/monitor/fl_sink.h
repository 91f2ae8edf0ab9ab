/* fl_sink.h - where monitor records go: CSV, JSON-lines and TensorBoard event files, or a
 * queue that Python threads read (for callbacks).
 *
 * A sink is used by one thread at a time (the monitor's writer thread). It buffers what it
 * formats and writes on fl_sink_flush() (or when 64 KiB are pending). After its first
 * error (disk full, permission denied, ...) a sink writes nothing more and keeps that
 * error, with the path in its message, for its owner to report.
 *
 * The open functions create missing parent directories, then return 0 and set *out, or
 * return an error (detail: the path and the system's reason) with *out NULL.
 */
#ifndef FL_SINK_H
#define FL_SINK_H

#include <stddef.h>
#include <stdint.h>

#include "base/fl_event.h"
#include "base/fl_queue.h"
#include "monitor/fl_summary.h"

typedef struct fl_sink fl_sink;

/* CSV, one row per record under a header "wall_time,step,name,value,kind,source" (written
 * once: appending to a non-empty file adds rows only). Returns 0 or FL_ESYS/FL_ENOMEM. */
int fl_sink_open_csv(const char *path, fl_sink **out);

/* One JSON object per line: {"wall_time":..,"step":..,"name":..,"value":..,"kind":..,
 * "source":..}; NaN and infinities are written as NaN/Infinity, as Python's json does. */
int fl_sink_open_jsonl(const char *path, fl_sink **out);

/* A new events.out.tfevents.<time>.<host>.<pid>.<n> file in `logdir` (created if missing);
 * scalar records become scalar summaries (value as float32); markers are not written. */
int fl_sink_open_tensorboard(const char *logdir, fl_sink **out);

/* Forwards every record to `queue` (of fl_item) without ever waiting: a record that does
 * not fit is dropped and counted. The sink holds a reference on the queue until freed. */
int fl_sink_open_queue(fl_queue *queue, fl_sink **out);

/* Formats n records (buffered). Returns 0, or the sink's first error. */
int fl_sink_write(fl_sink *sink, const fl_event *events, size_t n);

/* Formats one histogram/image/text record: TensorBoard sinks encode it (PNG for images);
 * the others skip it (their rows hold one number each). Returns 0, or the sink's first
 * error (an image zlib cannot encode is one: its message says why). */
int fl_sink_write_summary(fl_sink *sink, const fl_summary *summary);

/* Writes out what is buffered. Returns 0 or the first error. */
int fl_sink_flush(fl_sink *sink);

/* Flushes and closes the file (a queue sink closes its queue, ending its reader's stream).
 * Idempotent. Returns 0 or the first error. */
int fl_sink_close(fl_sink *sink);

/* Closes if needed and frees. NULL is a no-op. */
void fl_sink_free(fl_sink *sink);

/* The first error (0 if none) and its message ("" if none); the text lives with the sink. */
int fl_sink_error(const fl_sink *sink, const char **message);

/* Records not delivered (queue sinks: queue full or closed; file sinks: after an error). */
uint64_t fl_sink_dropped(const fl_sink *sink);

/* The file written ("" for a queue sink). */
const char *fl_sink_path(const fl_sink *sink);

#endif
