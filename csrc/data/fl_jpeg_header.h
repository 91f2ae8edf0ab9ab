/* fl_jpeg_header.h - reading a JPEG's markers up to its first scan, and choosing the decoder
 * that can take it: nvJPEG's hardware engine, nvJPEG's CUDA decoder, or only the CPU one.
 *
 * Loader threads call this on each file's bytes before a batch goes to nvJPEG. The parser is
 * as strict as ITU-T T.81 (and libjpeg where T.81 leaves a choice): a refusal (FL_EDECODE) means
 * "do not hand these bytes to nvJPEG"; the caller gives them to the CPU decoder, which has the
 * last word on whether the file is corrupt (libjpeg also reads some files refused here, such as
 * stray bytes between segments, only warning). Nothing here allocates, blocks or needs Python;
 * the calls are pure apart from the thread-local error detail, so any thread may call them.
 */
#ifndef FL_JPEG_HEADER_H
#define FL_JPEG_HEADER_H

#include <stddef.h>
#include <stdint.h>

typedef enum fl_jpeg_process {
    FL_JPEG_BASELINE,     /* SOF0: 8-bit Huffman, sequential */
    FL_JPEG_EXTENDED,     /* SOF1: extended sequential Huffman (8 or 12 bit) */
    FL_JPEG_PROGRESSIVE,  /* SOF2 */
    FL_JPEG_LOSSLESS,     /* SOF3 */
    FL_JPEG_HIERARCHICAL, /* SOF5-7, SOF13-15 (differential), or any frame after a DHP marker */
    FL_JPEG_ARITHMETIC,   /* SOF9-11 */
} fl_jpeg_process;

enum { FL_JPEG_MAX_COMPONENTS = 4 };

typedef struct fl_jpeg_header {
    uint32_t width, height; /* 1..65535 each */
    int components;         /* 1..4 */
    int precision;          /* bits per sample: 8 (SOF0); 8 or 12 (other lossy); 2..16 */
    fl_jpeg_process process;
    uint8_t component_id[FL_JPEG_MAX_COMPONENTS]; /* as in the frame header */
    uint8_t h_sampling[FL_JPEG_MAX_COMPONENTS], v_sampling[FL_JPEG_MAX_COMPONENTS]; /* 1..4 */
    int adobe_transform; /* -1: no Adobe APP14 segment; else its transform byte (0: none, 1: YCbCr,
                          * 2: YCCK) */
    int jfif;            /* 1 when an APP0 JFIF segment came before the scan (libjpeg's test) */
    size_t frame_offset; /* byte offset of the SOF marker (its 0xFF) */
    size_t scan_offset;  /* byte offset of the first SOS marker; its entropy-coded data follows
                          * the scan header, which ends inside the data */
} fl_jpeg_header;

/* Walks the markers of `data` through the frame header (SOF) to the header of the first scan
 * (SOS), so that tables and APPn segments placed after the frame header (an Adobe APP14 there
 * changes the colour space) count. Returns 0 with *out, or FL_EDECODE with a detail naming the
 * cause and byte offset ("not a JPEG: no SOI marker", "truncated at byte N ...", "bad segment
 * length L at byte N", "scan before the frame header at byte N", "frame of W x 0 pixels at byte N
 * (a height defined by a DNL marker is not supported)", "5 components in the frame header at
 * byte N", "sampling factor 0 for component i ...", "unknown marker 0xFFF7 at byte N", ...);
 * *out is left as it was. Never reads outside [data, data + len); data may be NULL when len is
 * 0. Fill bytes (0xFF runs) before a marker and standalone markers (TEM, RST0-7) are skipped as
 * libjpeg does; any other byte where a marker must start is refused. Never blocks. */
int fl_jpeg_header_parse(const void *data, size_t len, fl_jpeg_header *out);

typedef enum fl_jpeg_route {
    FL_JPEG_ROUTE_HARDWARE = 0, /* nvJPEG's hardware engine (A100/H100/H200) can take it */
    FL_JPEG_ROUTE_CUDA = 1,     /* nvJPEG's CUDA (hybrid) decoder can, the engine cannot */
    FL_JPEG_ROUTE_CPU = 2,      /* only the CPU decoder (libjpeg-turbo) */
} fl_jpeg_route;

/* Which decoder can take a parsed image, and in *why (static text; `why` may be NULL) the
 * reason it is not the hardware engine ("" for the engine). The engine takes 8-bit baseline
 * (SOF0) frames of 1 component, or 3 YCbCr components at 4:4:4, 4:2:2, 4:2:0 or 4:4:0; the CUDA
 * decoder also 8-bit extended (SOF1) frames and 4:1:1 / 4:1:0; everything else goes to the CPU:
 * progressive, lossless, hierarchical, arithmetic, 12-bit, 2 or 4 components, RGB stored without
 * colour transform (as libjpeg decides it: no JFIF, and Adobe transform 0 or component ids
 * 'R','G','B'), and sampling factors outside nvJPEG's list. Never fails. */
fl_jpeg_route fl_jpeg_route_of(const fl_jpeg_header *h, const char **why);

#endif
