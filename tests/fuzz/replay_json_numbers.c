/* replay_json_numbers.c - runs the JSON fast path's fuzz target over every file in the
 * directories given, so the corpus is checked with gcc and ASan/UBSan where libFuzzer is not
 * available. */
#include "fuzz_json_numbers.c"

#define REPLAY_NAME "replay_json_numbers"
#include "replay.h"
