/* py_image.h - internal to the binding: the image geometry spec shared by py_image.c and
 * py_loader.c. */
#ifndef FL_PY_IMAGE_H
#define FL_PY_IMAGE_H

#include "data/fl_pipeline_image.h"

/* Parses ("resized_crop", out_h, out_w, scale0, scale1, ratio0, ratio1, dct) or
 * ("resize", out_h, out_w, resize_h, resize_w (0: shorter side), dct). Returns 0, or -1
 * with ValueError/TypeError set. */
int fl_parse_geometry(PyObject *spec, fl_image_geometry *g);

#endif
