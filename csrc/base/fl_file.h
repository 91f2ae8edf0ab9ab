/* fl_file.h - writing files so that errors are never lost and nothing is left torn:
 * full writes that retry short writes, fsync, atomic publication (write a temp file in the
 * same directory, fsync it, rename it over the final name, fsync the directory).
 *
 * Every function returns 0 or FL_ESYS with a detail naming the path and errno's message
 * (fl_error_detail()). All may block on disk I/O; none needs Python.
 */
#ifndef FL_FILE_H
#define FL_FILE_H

#include <stddef.h>

/* Writes all len bytes to fd (retrying short writes and EINTR); path is for the message. */
int fl_file_write_all(int fd, const void *data, size_t len, const char *path);

/* fsync(fd), with the path in the message on failure. */
int fl_file_sync(int fd, const char *path);

/* fsync of the directory holding `path`, so a rename or unlink in it is durable. */
int fl_file_sync_parent(const char *path);

/* rename(from, to), then fsync of the directory. */
int fl_file_publish(const char *from, const char *to);

/* Creates `dir` and its parents (mode 0777 & ~umask); fine when it exists. */
int fl_file_make_dirs(const char *dir);

#endif
