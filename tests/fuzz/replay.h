/* replay.h - the main() of the replay_* programs: runs LLVMFuzzerTestOneInput (defined by the
 * fuzz target included before this file) over every file in the directories given, each from
 * an exact-size heap buffer (ASan sees over-reads), so a corpus is checked with gcc and
 * ASan/UBSan where libFuzzer is not available. REPLAY_NAME names the program. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    unsigned char *buf = len >= 0 ? malloc(len > 0 ? (size_t)len : 1) : NULL;
    int ok =
        buf != NULL && fseek(f, 0, SEEK_SET) == 0 && fread(buf, 1, (size_t)len, f) == (size_t)len;
    fclose(f);
    if (ok)
        LLVMFuzzerTestOneInput(buf, (size_t)len);
    free(buf);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    int count = 0;
    for (int i = 1; i < argc; i++) {
        DIR *dir = opendir(argv[i]);
        if (dir == NULL) {
            fprintf(stderr, REPLAY_NAME ": cannot open directory %s\n", argv[i]);
            return 1;
        }
        for (struct dirent *e; (e = readdir(dir)) != NULL;) {
            char path[4096];
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (replay_file(path) != 0) {
                fprintf(stderr, REPLAY_NAME ": cannot read %s\n", path);
                closedir(dir);
                return 1;
            }
            count++;
        }
        closedir(dir);
    }
    printf(REPLAY_NAME ": %d inputs replayed, all invariants hold\n", count);
    return count == 0;
}
