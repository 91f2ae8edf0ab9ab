/* image_linked_stderr.c - internal to the linked codecs (fl_image_jpeg.c, fl_image_png.c): the
 * `stderr` that the static libjpeg.a and libpng16.a linked into the wheel refer to.
 *
 * Debian builds those archives as position-independent executables' code, not shared-library
 * code: they read libc's `stderr` PC-relative, which no shared object may do (the linker stops
 * with "relocation R_X86_64_PC32 against symbol stderr"). setup.py renames that one reference
 * in its copies of the archives to fl_codec_stderr (objcopy --redefine-sym), defined here,
 * hidden, and set to the real stream when the library loads. The codecs only write there from
 * their default message handlers, which fastloop replaces. */
#include <stdio.h>

__attribute__((visibility("hidden"))) FILE *fl_codec_stderr;

__attribute__((constructor)) static void codec_stderr_init(void) { fl_codec_stderr = stderr; }
