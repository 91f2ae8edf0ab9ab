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

int fl_dl_once_load(fl_dl_once *once, int (*resolve)(const char *path), const char *path) {
    pthread_mutex_lock(&once->lock);
    int rc = FL_OK;
    if (!atomic_load_explicit(&once->loaded, memory_order_relaxed)) { /* the lock orders it */
        rc = resolve(path);
        if (rc == FL_OK)
            atomic_store_explicit(&once->loaded, 1, memory_order_release);
    }
    pthread_mutex_unlock(&once->lock);
    return rc;
}

int fl_dl_once_done(fl_dl_once *once) {
    return atomic_load_explicit(&once->loaded, memory_order_acquire);
}
