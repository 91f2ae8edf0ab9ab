/* fl_dl.c - see fl_dl.h. */
#include "base/fl_dl.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
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

const char *fl_dl_resolve(void *handle, const fl_dl_symbol *table, size_t count) {
    for (size_t i = 0; i < count; i++)
        if ((*table[i].slot = dlsym(handle, table[i].name)) == NULL)
            return table[i].name;
    return NULL;
}

void *fl_dl_open_resolved(const char *path, const char *what, const fl_dl_symbol *table,
                          size_t count, const char *hint) {
    void *handle = fl_dl_open(path, what);
    if (handle == NULL)
        return NULL;
    const char *missing = fl_dl_resolve(handle, table, count);
    if (missing == NULL)
        return handle;
    dlclose(handle);
    fl_error_set(FL_EINVAL, "%s has no symbol %s%s%s%s", path, missing, hint ? " (" : "",
                 hint ? hint : "", hint ? ")" : "");
    return NULL;
}

void fl_dl_why(char *why, size_t why_len, const char *fmt, ...) {
    size_t used = strnlen(why, why_len);
    if (used > 0) {
        if (used + 3 >= why_len)
            return; /* no room for "; " and a character */
        memcpy(why + used, "; ", 3);
        used += 2;
    }
    if (used + 1 >= why_len)
        return;
    va_list args;
    va_start(args, fmt);
    vsnprintf(why + used, why_len - used, fmt, args);
    va_end(args);
}

int fl_dl_found_load(fl_dl_found *found, const void *api, void *(*open_lib)(const char *path),
                     const char *const *candidates, size_t count, char *why, size_t why_len) {
    if (why_len > 0)
        why[0] = '\0';
    pthread_mutex_lock(&found->lock);
    int rc = found->api != NULL ? 0 : -1;
    for (size_t i = 0; rc != 0 && i < count; i++) {
        if (candidates[i] == NULL || candidates[i][0] == '\0')
            continue;
        if (open_lib(candidates[i]) == NULL) {
            fl_dl_why(why, why_len, "%s", fl_error_detail());
            fl_error_clear();
            continue;
        }
        /* loaded: the handle stays open for the life of the process */
        snprintf(found->path, sizeof found->path, "%s", candidates[i]);
        found->api = api;
        rc = 0;
    }
    pthread_mutex_unlock(&found->lock);
    return rc;
}

const void *fl_dl_found_api(fl_dl_found *found) {
    pthread_mutex_lock(&found->lock);
    const void *api = found->api;
    pthread_mutex_unlock(&found->lock);
    return api;
}

const char *fl_dl_found_path(fl_dl_found *found) {
    return fl_dl_found_api(found) ? found->path : ""; /* written once, before api */
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
