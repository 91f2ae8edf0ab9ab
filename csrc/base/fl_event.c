/* fl_event.c - filling event records. */
#include "base/fl_event.h"

#include <string.h>

#include "base/fl_time.h"

void fl_event_init(fl_event *event, fl_event_kind kind, const char *name, double value,
                   int64_t step, int32_t source) {
    memset(event, 0, sizeof *event);
    event->wall_time = fl_wall_time();
    event->value = value;
    event->step = step;
    event->kind = (int32_t)kind;
    event->source = source;
    if (name == NULL)
        return;
    size_t len = strnlen(name, FL_EVENT_NAME_MAX - 1);
    if (name[len] != '\0') /* truncating: never split a UTF-8 sequence */
        while (len > 0 && ((unsigned char)name[len] & 0xC0) == 0x80)
            len--;
    memcpy(event->name, name, len);
}
