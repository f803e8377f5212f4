/*
 * common/fs.h — small file helpers with kl_err reporting.
 * All functions fill err (with the path as file context) on failure and never print.
 */
#ifndef KL_COMMON_FS_H
#define KL_COMMON_FS_H

#include "common/err.h"

#include <stddef.h>
#include <stdint.h>

/* Reads a whole regular file (at most max_bytes) into a NUL-terminated kl_malloc'd buffer.
 * *out is owned by the caller (kl_free).  KL_E_IO, KL_E_FORMAT (too large, not a regular
 * file) or KL_E_NOMEM. */
/* Opens path read-only (O_NONBLOCK while opening, so a FIFO cannot block; the flag stays set,
 * which regular files ignore) and refuses anything but a regular file (FILE-NOT-REGULAR).
 * Returns the descriptor and the size, or a negative KL_E_* code (FILE-OPEN, naming the path). */
int kl_open_regular(const char *path, uint64_t *size, kl_err *err);
int kl_read_file(const char *path, size_t max_bytes, char **out, size_t *len, kl_err *err);

/* Bytes of path now in the page cache (mincore over a read-only mapping, 1 GiB at a time) and
 * the file's size.  0, or a KL_E_* code (FILE-OPEN, FILE-NOT-REGULAR, KL_E_IO). */
int kl_file_resident(const char *path, uint64_t *resident, uint64_t *size, kl_err *err);

/* Writes all n bytes at the current position, retrying short writes and EINTR. */
int kl_write_all(int fd, const void *buf, size_t n, const char *path, kl_err *err);

/* pwrite of all n bytes at off, retrying short writes and EINTR. */
int kl_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path, kl_err *err);

/* pread of exactly n bytes at off; KL_E_FORMAT with rule "FILE-SHORT" if the file ends first. */
int kl_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path, kl_err *err);

/* Joins dir and name with one '/' into out (size n); KL_E_USAGE if it does not fit. */
int kl_path_join(char *out, size_t n, const char *dir, const char *name, kl_err *err);

/* Writes the directory holding path into out (size n), trailing slashes ignored: "a/b/" and
 * "a/b" -> "a", "b" -> ".", "/b" -> "/".  KL_E_USAGE if it does not fit. */
int kl_path_parent(char *out, size_t n, const char *path, kl_err *err);

/* Writes data to dir/name atomically: dir/.name.tmp, fsync, rename, fsync(dir). */
int kl_write_file_atomic(const char *dir, const char *name, const void *data, size_t n,
                         kl_err *err);

/* Creates a directory (and its parents); ok if it exists. */
int kl_mkdir_p(const char *path, kl_err *err);

/* Lists the entries of dir whose names end in suffix (e.g. ".safetensors"), sorted by name
 * (strcmp order), skipping names that start with '.' and entries that are directories
 * (symlinks are followed; a dangling link is listed, so opening it reports the problem).
 * *names is a kl_malloc'd array of *n kl_malloc'd names (without dir); free it with
 * kl_free_name_list.  An empty result is not an error (*names NULL, *n 0).
 * KL_E_IO if dir cannot be read, KL_E_NOMEM. */
int kl_list_files_with_suffix(const char *dir, const char *suffix, char ***names, size_t *n,
                              kl_err *err);
void kl_free_name_list(char **names, size_t n);  /* NULL ok */

#endif
