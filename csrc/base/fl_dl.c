/* fl_dl.c - see fl_dl.h. */
#include "base/fl_dl.h"

#include <dlfcn.h>
#include <string.h>

#include "base/fl_error.h"

static void *open_with(const char *path, const char *what, int scope) {
    void *handle = dlopen(path, RTLD_NOW | scope);
    if (handle == NULL) {
        const char *why = dlerror();
        fl_error_set(FL_EINVAL, "cannot load %s%s%s: %s", what ? what : "", what ? " " : "", path,
                     why ? why : "dlopen failed");
    }
    return handle;
}

void *fl_dl_open(const char *path, const char *what) {
    return open_with(path, what, RTLD_LOCAL);
}

void *fl_dl_open_global(const char *path, const char *what) {
    return open_with(path, what, RTLD_GLOBAL);
}

const char *fl_dl_base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}
