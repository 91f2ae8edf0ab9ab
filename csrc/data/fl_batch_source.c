/* fl_batch_source.c - what both batch sources share: the slot layout, every size checked. */
#include "data/fl_batch_source.h"

#include "base/fl_error.h"
#include "base/fl_size.h"

int fl_batch_layout(const size_t *sample_bytes, size_t n_fields, size_t batch, size_t *offsets,
                    size_t *slot_bytes) {
    size_t offset = 0;
    for (size_t f = 0; f < n_fields; f++) {
        size_t field_batch;
        int rc = fl_size_mul(sample_bytes[f], batch, "batch_size x sample bytes", &field_batch);
        offsets[f] = offset;
        if (rc == FL_OK)
            rc = fl_size_add(offset, field_batch, "batch_size x sample bytes", &offset);
        if (rc == FL_OK)
            rc = fl_size_align(offset, FL_SLOT_ALIGN, "batch_size x sample bytes", &offset);
        if (rc != FL_OK)
            return rc;
    }
    *slot_bytes = offset ? offset : FL_SLOT_ALIGN;
    return FL_OK;
}
