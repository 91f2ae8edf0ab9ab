/* replay_image.c - runs the image fuzz target over every file in the directories given, so
 * the corpus is checked with gcc and ASan/UBSan where libFuzzer is not available. */
#include "fuzz_image.c"

#define REPLAY_NAME "replay_image"
#include "replay.h"
