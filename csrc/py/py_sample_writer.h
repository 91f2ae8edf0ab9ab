/* py_sample_writer.h - a Python sample written straight into a batch slot: what the worker
 * processes (py_fork_child.c) and the worker threads (py_thread_loader.c) of a Loader over a
 * Python dataset share.
 *
 * fl_sample_store() calls the Python `fetch(index[, epoch_seed])` for one sample (a dataset's
 * __getitem__ and Python transforms; with a batch's first sample it gets the epoch seed),
 * checks each field's dtype and shape against the first sample's, and copies it into the
 * slot; field 0 may then go through a C pipeline, one image at a time. A sample that does not
 * fit the slots' fields (fetch returned None, another shape, a value of another kind) makes
 * the batch "raw": nothing more is written into the fields, and the caller has the batch's
 * samples sent whole instead. With a pipeline such a sample is an error, as the pipeline needs
 * field 0 in the slot. Calls Python: the caller holds the GIL (or is attached, free-threaded).
 */
#ifndef FL_PY_SAMPLE_WRITER_H
#define FL_PY_SAMPLE_WRITER_H

#include "fl_module.h"

#include "data/fl_pipeline.h"
#include "py_batch_source.h"

/* What writing a sample needs; set before the first worker starts, read-only after it. The
 * references are borrowed from the loader object that embeds this. */
typedef struct fl_sample_writer {
    fl_module_state *state;
    PyObject *in_descrs, *in_shapes; /* tuples, per field as fetched */
    size_t n_fields;
    size_t in_bytes[FL_SOURCE_MAX_FIELDS], out_bytes[FL_SOURCE_MAX_FIELDS]; /* per sample */
    const size_t *offsets;           /* per field: where its batch starts in a slot */
    const fl_pipeline *pipeline;     /* for field 0, or NULL */
    fl_images image;                 /* field 0's geometry, as fetched */
    fl_dtype image_dtype;
    size_t scratch_per_image;        /* the pipeline's scratch for one image */
    int raw_allowed;                 /* a sample unlike the first may make its batch raw */
} fl_sample_writer;

/* One worker's scratch for the pipeline: one image as fetched, the pipeline's own. */
typedef struct fl_sample_scratch {
    unsigned char *input, *pipeline;
} fl_sample_scratch;

/* Makes the scratch on a worker's first batch (nothing without a pipeline). Returns 0, or -1
 * with MemoryError. */
int fl_sample_scratch_ready(const fl_sample_writer *writer, fl_sample_scratch *scratch);

void fl_sample_scratch_free(fl_sample_scratch *scratch);

/* Fetches sample `index` through `fetch` (with the epoch `seed` when i == 0: a batch starts)
 * and, unless the batch is already `raw`, stores its fields at position i of the batch in
 * `slot`. Returns 0, 1 when the sample does not fit the fields (the batch goes raw), or -1
 * with a Python error. */
int fl_sample_store(const fl_sample_writer *writer, fl_sample_scratch *scratch, PyObject *fetch, int64_t index,
                    uint64_t seed, size_t i, unsigned char *slot, int raw);

/* Field 0 through the pipeline: its geometry in from (descr, shape) of field 0 as fetched,
 * and its dtype and shape out, replacing item 0 of the lists `out_descrs`/`out_shapes`.
 * Returns 0, or -1 with an exception. */
int fl_sample_writer_plan(fl_sample_writer *writer, PyObject *pipeline_obj, PyObject *out_descrs,
                          PyObject *out_shapes);

/* Reads the fields' (dtype, sample shape) pairs (a tuple) into in_descrs/in_shapes and
 * in_bytes, appending each to the lists `descrs`/`shapes` (which become the output's).
 * Returns 0, or -1 with an exception. The tuples it makes are new references the caller
 * keeps (and frees) as its own: *descrs_out and *shapes_out. */
int fl_sample_writer_fields(fl_sample_writer *writer, PyObject *fields, PyObject *descrs, PyObject *shapes,
                            PyObject **descrs_out, PyObject **shapes_out);

/* Each output field's bytes per sample (from the lists `descrs`/`shapes`) into out_bytes.
 * Returns 0, or -1 with an exception. */
int fl_sample_writer_outputs(fl_sample_writer *writer, PyObject *descrs, PyObject *shapes);

#endif
