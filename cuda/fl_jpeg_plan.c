/* fl_jpeg_plan.c - the nvJPEG decoder's host-side decisions (fl_jpeg_plan.h). */
#include "fl_jpeg_plan.h"

#include <string.h>

/* ---- routing ---- */

fl_jpeg_dest fl_jpeg_route(int staged_route, int failed, int engine, int regions, fl_jpeg_ask ask,
                           void *context) {
    if (failed)
        return FL_JPEG_LEFT_OUT;
    if (staged_route == FL_JPEG_STAGED_PIXELS)
        return FL_JPEG_PIXELS;
    if (staged_route != FL_JPEG_STAGED_ENGINE || !engine)
        return FL_JPEG_FALLBACK;
    if (regions && ask(context, 1))
        return FL_JPEG_ENGINE_REGION;
    return ask(context, 0) ? FL_JPEG_ENGINE_WHOLE : FL_JPEG_FALLBACK;
}

/* ---- the engine's health ---- */

void fl_jpeg_engine_init(fl_jpeg_engine *e, int present) {
    memset(e, 0, sizeof *e);
    e->present = present != 0;
    e->engine_on = e->regions_on = e->present;
    e->backoff = FL_JPEG_FIRST_BACKOFF;
}

void fl_jpeg_engine_begin_batch(fl_jpeg_engine *e) {
    e->batch++;
    if (!e->present)
        return;
    /* a feature back from demotion is on probation: one error demotes it again */
    if (!e->engine_on && e->batch >= e->engine_back_at)
        e->engine_on = 1, e->errors = FL_JPEG_ERRORS_TO_DEMOTE - 1;
    if (!e->regions_on && e->batch >= e->regions_back_at)
        e->regions_on = 1, e->errors = FL_JPEG_ERRORS_TO_DEMOTE - 1;
}

int fl_jpeg_engine_usable(const fl_jpeg_engine *e) { return e->present && e->engine_on; }

int fl_jpeg_engine_regions(const fl_jpeg_engine *e) { return fl_jpeg_engine_usable(e) && e->regions_on; }

int fl_jpeg_engine_result(fl_jpeg_engine *e, int ok) {
    if (ok) {
        e->errors = 0;
        return 0;
    }
    e->errors_total++;
    if (++e->errors < FL_JPEG_ERRORS_TO_DEMOTE)
        return 0;
    e->errors = 0;
    if (e->regions_on)
        e->regions_on = 0, e->regions_back_at = e->batch + e->backoff;
    else
        e->engine_on = 0, e->engine_back_at = e->batch + e->backoff;
    e->backoff = e->backoff * 2 > FL_JPEG_MAX_BACKOFF ? FL_JPEG_MAX_BACKOFF : e->backoff * 2;
    e->demotions++;
    return 1;
}

/* ---- double-buffered decoder states ---- */

void fl_jpeg_states_init(fl_jpeg_states *s) { memset(s, 0, sizeof *s); }

static int round_up(int n) {
    return n <= 0 ? 0 : (n + FL_JPEG_PREALLOCATE_ROUND - 1) / FL_JPEG_PREALLOCATE_ROUND * FL_JPEG_PREALLOCATE_ROUND;
}

void fl_jpeg_states_next(fl_jpeg_states *s, int batch, int max_w, int max_h, int can_preallocate,
                         fl_jpeg_state_step *step) {
    fl_jpeg_state_slot *slot = &s->slot[s->next];
    memset(step, 0, sizeof *step);
    step->slot = s->next;
    s->next ^= 1;
    step->wait = slot->pending;
    step->initialize = slot->batch != batch;
    const int width = round_up(max_w), height = round_up(max_h);
    const int grows = width > slot->width || height > slot->height;
    if (width > slot->width)
        slot->width = width;
    if (height > slot->height)
        slot->height = height;
    /* an initialize may drop the buffers: pre-allocate again after one */
    step->preallocate = can_preallocate && slot->width > 0 && slot->height > 0 && (step->initialize || grows);
    step->batch = batch;
    step->width = slot->width, step->height = slot->height;
    slot->batch = batch;
}

void fl_jpeg_states_queued(fl_jpeg_states *s, int slot) { s->slot[slot & 1].pending = 1; }

void fl_jpeg_states_forget(fl_jpeg_states *s, int slot) {
    fl_jpeg_state_slot *st = &s->slot[slot & 1];
    st->batch = 0, st->width = 0, st->height = 0;
}

/* ---- handle flags ---- */

unsigned fl_jpeg_handle_flags(int major, int minor) {
    return major > 12 || (major == 12 && minor >= 1) ? 32u : 0u;
}

/* ---- decode="auto" ---- */

int fl_jpeg_auto_gpu(int has_engine, int workers, double cpu_rate, double fallback_rate) {
    if (has_engine)
        return 1;
    if (cpu_rate <= 0 || fallback_rate <= 0)
        return 0;
    return fallback_rate > (workers < 1 ? 1 : workers) * cpu_rate;
}
