/* replay_jpeg_header.c - runs the JPEG header fuzz target over every file in the directories
 * given, so the corpus is checked with gcc and ASan/UBSan where libFuzzer is not available. */
#include "fuzz_jpeg_header.c"

#define REPLAY_NAME "replay_jpeg_header"
#include "replay.h"
