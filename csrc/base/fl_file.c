/* fl_file.c - error-checked writes, fsync and atomic publication. */
#include "base/fl_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fl_error.h"

static int fail(const char *what, const char *path) {
    return fl_error_sys("%s %s", what, path);
}

int fl_file_write_all(int fd, const void *data, size_t len, const char *path) {
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fail("cannot write", path);
        if (n == 0) {
            errno = ENOSPC;
            return fail("cannot write", path);
        }
        p += n;
        len -= (size_t)n;
    }
    return FL_OK;
}

int fl_file_sync(int fd, const char *path) {
    return fsync(fd) == 0 ? FL_OK : fail("cannot fsync", path);
}

int fl_file_sync_parent(const char *path) {
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) > 0 ? (int)(slash - path) : 1, path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return fail("cannot open directory", dir);
    int rc = fsync(fd) == 0 ? FL_OK : fail("cannot fsync directory", dir);
    close(fd);
    return rc;
}

int fl_file_publish(const char *from, const char *to) {
    if (rename(from, to) != 0)
        return fl_error_sys("cannot rename %s to %s", from, to);
    return fl_file_sync_parent(to);
}

int fl_file_make_dirs(const char *dir) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return fl_error_set(FL_EINVAL, "path too long: %s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return fail("cannot create directory", path);
        *p = '/';
    }
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return fail("cannot create directory", path);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return fail("not a directory:", path);
    }
    return FL_OK;
}
