/* test_jpeg_plan.c - the nvJPEG decoder's host decisions (cuda/fl_jpeg_plan.h) without nvJPEG:
 * per-image routing, demotion only on engine errors and never for good, the double-buffered
 * states (waited before reuse, initialized once per batch size, pre-allocated as sizes grow),
 * and decode="auto"'s rule. */
#include "check.h"
#include "fl_jpeg_plan.h"

/* A stand-in for nvjpegDecodeBatchedSupportedEx: answers from two flags, counts the asks. */
typedef struct fake_engine {
    int region_ok, whole_ok, asked;
} fake_engine;

static int ask_fake(void *context, int region) {
    fake_engine *f = (fake_engine *)context;
    f->asked++;
    return region ? f->region_ok : f->whole_ok;
}

static void test_each_image_is_routed_on_its_own_answer(void) {
    fake_engine yes = {1, 1, 0}, whole_only = {0, 1, 0}, no = {0, 0, 0};
    CHECK(fl_jpeg_route(FL_JPEG_STAGED_ENGINE, 0, 1, 1, ask_fake, &yes) == FL_JPEG_ENGINE_REGION);
    CHECK(yes.asked == 1);
    CHECK(fl_jpeg_route(FL_JPEG_STAGED_ENGINE, 0, 1, 1, ask_fake, &whole_only) == FL_JPEG_ENGINE_WHOLE);
    CHECK(whole_only.asked == 2);
    CHECK(fl_jpeg_route(FL_JPEG_STAGED_ENGINE, 0, 1, 1, ask_fake, &no) == FL_JPEG_FALLBACK);
    /* regions off: the whole image is asked about, once */
    fake_engine once = {1, 1, 0};
    CHECK(fl_jpeg_route(FL_JPEG_STAGED_ENGINE, 0, 1, 0, ask_fake, &once) == FL_JPEG_ENGINE_WHOLE);
    CHECK(once.asked == 1);
    /* no engine, other routes, failed images: nothing asked */
    fake_engine never = {1, 1, 0};
    CHECK(fl_jpeg_route(FL_JPEG_STAGED_ENGINE, 0, 0, 1, ask_fake, &never) == FL_JPEG_FALLBACK);
    CHECK(fl_jpeg_route(FL_JPEG_STAGED_FALLBACK, 0, 1, 1, ask_fake, &never) == FL_JPEG_FALLBACK);
    CHECK(fl_jpeg_route(FL_JPEG_STAGED_PIXELS, 0, 1, 1, ask_fake, &never) == FL_JPEG_PIXELS);
    CHECK(fl_jpeg_route(FL_JPEG_STAGED_ENGINE, 1, 1, 1, ask_fake, &never) == FL_JPEG_LEFT_OUT);
    CHECK(never.asked == 0);
}

static void test_a_batch_with_one_refused_image_keeps_the_others_on_the_engine(void) {
    fake_engine answers[8];
    int to_engine = 0, to_fallback = 0;
    for (int i = 0; i < 8; i++) {
        answers[i] = (fake_engine){i != 5, i != 5, 0};
        fl_jpeg_dest d = fl_jpeg_route(FL_JPEG_STAGED_ENGINE, 0, 1, 1, ask_fake, &answers[i]);
        to_engine += d == FL_JPEG_ENGINE_REGION;
        to_fallback += d == FL_JPEG_FALLBACK;
    }
    CHECK(to_engine == 7 && to_fallback == 1);
}

static void test_refusals_never_demote_the_engine(void) {
    fl_jpeg_engine e;
    fl_jpeg_engine_init(&e, 1);
    fake_engine no = {0, 0, 0};
    for (int batch = 0; batch < 1000; batch++) {
        fl_jpeg_engine_begin_batch(&e);
        /* every image refused: nothing reaches the engine, so no result is reported */
        CHECK(fl_jpeg_route(FL_JPEG_STAGED_ENGINE, 0, fl_jpeg_engine_usable(&e), fl_jpeg_engine_regions(&e),
                            ask_fake, &no) == FL_JPEG_FALLBACK);
    }
    CHECK(fl_jpeg_engine_usable(&e) && fl_jpeg_engine_regions(&e) && e.demotions == 0);
}

static void test_engine_errors_demote_regions_then_the_engine_and_a_success_resets(void) {
    fl_jpeg_engine e;
    fl_jpeg_engine_init(&e, 1);
    fl_jpeg_engine_begin_batch(&e);
    CHECK(fl_jpeg_engine_result(&e, 0) == 0);
    CHECK(fl_jpeg_engine_result(&e, 0) == 0);
    CHECK(fl_jpeg_engine_result(&e, 1) == 0); /* a success in between: the count starts again */
    CHECK(fl_jpeg_engine_result(&e, 0) == 0);
    CHECK(fl_jpeg_engine_result(&e, 0) == 0);
    CHECK(fl_jpeg_engine_regions(&e));
    CHECK(fl_jpeg_engine_result(&e, 0) == 1); /* three in a row */
    CHECK(!fl_jpeg_engine_regions(&e) && fl_jpeg_engine_usable(&e));
    for (int i = 0; i < FL_JPEG_ERRORS_TO_DEMOTE; i++)
        fl_jpeg_engine_result(&e, 0);
    CHECK(!fl_jpeg_engine_usable(&e) && !fl_jpeg_engine_regions(&e));
    CHECK(e.demotions == 2 && e.errors_total == 8);
}

static void test_a_demoted_engine_is_tried_again_after_a_growing_backoff(void) {
    fl_jpeg_engine e;
    fl_jpeg_engine_init(&e, 1);
    fl_jpeg_engine_begin_batch(&e);
    for (int i = 0; i < 2 * FL_JPEG_ERRORS_TO_DEMOTE; i++)
        fl_jpeg_engine_result(&e, 0);
    CHECK(!fl_jpeg_engine_usable(&e));
    /* regions waited 100 batches, the engine 200 */
    int batches = 0;
    while (!fl_jpeg_engine_usable(&e) && batches < 100000)
        fl_jpeg_engine_begin_batch(&e), batches++;
    CHECK(batches == 2 * FL_JPEG_FIRST_BACKOFF);
    CHECK(fl_jpeg_engine_regions(&e)); /* regions came back at 100 */
    /* on probation: one error demotes again (regions first), for longer */
    CHECK(fl_jpeg_engine_result(&e, 0) == 1);
    CHECK(fl_jpeg_engine_usable(&e) && !fl_jpeg_engine_regions(&e));
    batches = 0;
    while (!fl_jpeg_engine_regions(&e) && batches < 100000)
        fl_jpeg_engine_begin_batch(&e), batches++;
    CHECK(batches == 4 * FL_JPEG_FIRST_BACKOFF);
    /* the backoff stops growing at its cap */
    for (int i = 0; i < 20; i++) {
        fl_jpeg_engine_result(&e, 0);
        fl_jpeg_engine_result(&e, 0);
        fl_jpeg_engine_result(&e, 0);
    }
    CHECK(e.backoff == FL_JPEG_MAX_BACKOFF);
}

static void test_no_engine_is_never_used(void) {
    fl_jpeg_engine e;
    fl_jpeg_engine_init(&e, 0);
    for (int i = 0; i < 1000; i++)
        fl_jpeg_engine_begin_batch(&e);
    CHECK(!fl_jpeg_engine_usable(&e) && !fl_jpeg_engine_regions(&e));
}

static void test_states_alternate_and_are_waited_before_reuse(void) {
    fl_jpeg_states s;
    fl_jpeg_states_init(&s);
    fl_jpeg_state_step a, b, c, d;
    fl_jpeg_states_next(&s, 64, 500, 375, 1, &a);
    CHECK(a.slot == 0 && !a.wait && a.initialize && a.preallocate);
    CHECK(a.batch == 64 && a.width == 512 && a.height == 512);
    fl_jpeg_states_queued(&s, a.slot);
    fl_jpeg_states_next(&s, 64, 500, 375, 1, &b);
    CHECK(b.slot == 1 && !b.wait && b.initialize && b.preallocate);
    fl_jpeg_states_queued(&s, b.slot);
    /* the third batch reuses slot 0: wait its event, no initialize, no pre-allocation */
    fl_jpeg_states_next(&s, 64, 400, 300, 1, &c);
    CHECK(c.slot == 0 && c.wait && !c.initialize && !c.preallocate);
    fl_jpeg_states_queued(&s, c.slot);
    /* a bigger image grows the pre-allocation only */
    fl_jpeg_states_next(&s, 64, 800, 300, 1, &d);
    CHECK(d.slot == 1 && d.wait && !d.initialize && d.preallocate && d.width == 1024 && d.height == 512);
}

static void test_a_state_is_initialized_once_per_batch_size(void) {
    fl_jpeg_states s;
    fl_jpeg_states_init(&s);
    fl_jpeg_state_step step;
    int initializes = 0;
    for (int i = 0; i < 100; i++) {
        fl_jpeg_states_next(&s, 256, 640, 480, 1, &step);
        initializes += step.initialize;
        CHECK(step.wait == (i >= 2));
        fl_jpeg_states_queued(&s, step.slot);
    }
    CHECK(initializes == 2); /* once per state */
    /* a smaller last batch: that state again (waited first), and pre-allocated again */
    fl_jpeg_states_next(&s, 17, 640, 480, 1, &step);
    CHECK(step.wait && step.initialize && step.batch == 17 && step.preallocate);
    /* without the pre-allocation entry point nothing is pre-allocated */
    fl_jpeg_states_next(&s, 17, 4000, 3000, 0, &step);
    CHECK(step.initialize && !step.preallocate);
}

static void test_a_forgotten_state_is_initialized_again(void) {
    fl_jpeg_states s;
    fl_jpeg_states_init(&s);
    fl_jpeg_state_step step;
    fl_jpeg_states_next(&s, 8, 100, 100, 1, &step);
    fl_jpeg_states_queued(&s, step.slot);
    fl_jpeg_states_forget(&s, step.slot);
    fl_jpeg_states_next(&s, 8, 100, 100, 1, &step); /* slot 1 */
    fl_jpeg_states_next(&s, 8, 100, 100, 1, &step); /* slot 0 again */
    CHECK(step.slot == 0 && step.wait && step.initialize && step.preallocate);
}

static void test_auto_picks_the_engine_else_the_faster_of_fallback_and_workers(void) {
    CHECK(fl_jpeg_auto_gpu(1, 64, 1000, 0) == 1);
    CHECK(fl_jpeg_auto_gpu(0, 2, 400, 1500) == 1);  /* 1500 > 800 */
    CHECK(fl_jpeg_auto_gpu(0, 4, 400, 1500) == 0);  /* 1500 < 1600 */
    CHECK(fl_jpeg_auto_gpu(0, 0, 400, 300) == 0);   /* no workers: the main thread, 400 > 300 */
    CHECK(fl_jpeg_auto_gpu(0, 1, 0, 1500) == 0);    /* unknown: the CPU */
    CHECK(fl_jpeg_auto_gpu(0, 1, 400, -1) == 0);
}

static void test_interpolated_upsampling_only_from_nvjpeg_12_1(void) {
    CHECK(fl_jpeg_handle_flags(12, 1) == 32 && fl_jpeg_handle_flags(12, 8) == 32);
    CHECK(fl_jpeg_handle_flags(13, 0) == 32);
    CHECK(fl_jpeg_handle_flags(12, 0) == 0 && fl_jpeg_handle_flags(11, 9) == 0);
    CHECK(fl_jpeg_handle_flags(-1, -1) == 0);
}

int main(void) {
    RUN(test_each_image_is_routed_on_its_own_answer);
    RUN(test_a_batch_with_one_refused_image_keeps_the_others_on_the_engine);
    RUN(test_refusals_never_demote_the_engine);
    RUN(test_engine_errors_demote_regions_then_the_engine_and_a_success_resets);
    RUN(test_a_demoted_engine_is_tried_again_after_a_growing_backoff);
    RUN(test_no_engine_is_never_used);
    RUN(test_states_alternate_and_are_waited_before_reuse);
    RUN(test_a_state_is_initialized_once_per_batch_size);
    RUN(test_a_forgotten_state_is_initialized_again);
    RUN(test_auto_picks_the_engine_else_the_faster_of_fallback_and_workers);
    RUN(test_interpolated_upsampling_only_from_nvjpeg_12_1);
    return check_failures != 0;
}
