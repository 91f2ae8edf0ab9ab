/* fl_event.h - the fixed-size records that C threads put on queues, and the tagged item
 * that lets one fastloop.Queue carry both those records and Python objects.
 *
 * A record is plain data (no pointers), so a C thread fills and queues it without the GIL
 * and without allocating; the Python layer turns it into a fastloop.Event when a Python
 * thread takes it off the queue.
 */
#ifndef FL_EVENT_H
#define FL_EVENT_H

#include <stdint.h>

enum { FL_EVENT_NAME_MAX = 48 }; /* bytes in fl_event.name, the NUL included */

/* What a record means; the Python layer names these "scalar" and "marker". */
typedef enum fl_event_kind {
    FL_EVENT_SCALAR = 1, /* a metric: `value` of `name` at `step` */
    FL_EVENT_MARKER = 2, /* a named point in time (epoch end, checkpoint written, ...) */
} fl_event_kind; /* negative kinds are internal to the component that queued them */

typedef struct fl_event {
    double wall_time; /* seconds since the Unix epoch, when the record was made */
    double value;
    int64_t step;
    int32_t kind;                 /* fl_event_kind */
    int32_t source;               /* who made it: worker index, GPU index, ...; -1 for none */
    char name[FL_EVENT_NAME_MAX]; /* NUL-terminated, truncated to fit */
} fl_event;

/* Fills *event with the current wall time, kind, value, step and source, and name cut to
 * FL_EVENT_NAME_MAX - 1 bytes at a UTF-8 character boundary. Never fails. */
void fl_event_init(fl_event *event, fl_event_kind kind, const char *name, double value,
                   int64_t step, int32_t source);

/* What one fastloop.Queue slot holds: an opaque pointer owned by the layer that put it (the
 * Python binding stores a PyObject* there), or an event record put by C code. */
typedef enum fl_item_tag { FL_ITEM_POINTER = 1, FL_ITEM_EVENT = 2 } fl_item_tag;

typedef struct fl_item {
    uint32_t tag; /* fl_item_tag */
    uint32_t reserved;
    union {
        void *pointer;
        fl_event event;
    } as;
} fl_item;

#endif
