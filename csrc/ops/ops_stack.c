/* ops_stack.c - fl_stack(): gathering equal-sized buffers into one batch.
 *
 * The work is cut into blocks of at most BLOCK bytes, so one huge sample still spreads
 * over several threads and many small ones are grouped by the grain.
 */
#include <string.h>

#include "ops/fl_ops.h"

enum { BLOCK = 256 * 1024 };

typedef struct stack_job {
    const void *const *srcs;
    unsigned char *dst;
    size_t nbytes;
    size_t blocks_per_item;
} stack_job;

static void stack_range(void *ctx, size_t begin, size_t end) {
    const stack_job *job = ctx;
    for (size_t unit = begin; unit < end; unit++) {
        size_t item = unit / job->blocks_per_item;
        size_t offset = (unit % job->blocks_per_item) * BLOCK;
        size_t bytes = job->nbytes - offset < BLOCK ? job->nbytes - offset : BLOCK;
        memcpy(job->dst + item * job->nbytes + offset,
               (const unsigned char *)job->srcs[item] + offset, bytes);
    }
}

void fl_stack(fl_exec exec, const void *const *srcs, size_t count, size_t nbytes, void *dst) {
    if (count == 0 || nbytes == 0)
        return;
    stack_job job = {srcs, dst, nbytes, (nbytes + BLOCK - 1) / BLOCK};
    size_t unit_bytes = nbytes < BLOCK ? nbytes : BLOCK;
    fl_exec_run(exec, count * job.blocks_per_item, (1 << 20) / unit_bytes + 1, stack_range, &job);
}
