/* replay_npy.c - runs the .npy fuzz target over every file in the directories given, so the
 * corpus is checked with gcc and ASan/UBSan where libFuzzer is not available. */
#include "fuzz_npy.c"

#define REPLAY_NAME "replay_npy"
#include "replay.h"
