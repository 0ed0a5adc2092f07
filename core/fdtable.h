/* SPDX-License-Identifier: MIT */
/*
 * The fd table: which application fds fabsock has state for. A flat array of
 * pointers indexed by fd, sized to the hard RLIMIT_NOFILE at start-up and
 * mapped lazily, so reads are one bounds check and one atomic load with no
 * lock. An fd with no entry is none of fabsock's business: every call on it
 * goes straight to the kernel.
 *
 * Entries are struct fs_sock objects (core/sock.h), which are never returned
 * to malloc (they are recycled), so a reader that loaded a pointer may always
 * look at it; fs_sock_get() then takes a reference and re-checks the slot.
 * fabsock's own descriptors (eventfds, the doorbell, probe sockets) are
 * entries too, FS_SOCK_INTERNAL, made by fs_internal_fd.
 */
#ifndef FS_CORE_FDTABLE_H
#define FS_CORE_FDTABLE_H

#include <stddef.h>

struct fs_sock;

extern struct fs_sock **fs_fdt;
extern size_t fs_fdt_size;

/* A zeroed table of COUNT entries of SIZE bytes (one per possible fd),
 * whose pages exist only once touched (MAP_NORESERVE): NULL when it cannot
 * be mapped. The fd table's, and epoll's per-fd tables. */
void *fs_fd_table_map(size_t count, size_t size);

/* Maps the table. Returns 0 or -ENOMEM. Idempotent. */
int fs_fdt_init(void);

static inline struct fs_sock *fs_fdt_peek(int fd)
{
	if (fd < 0 || (size_t)fd >= fs_fdt_size)
		return NULL;
	return __atomic_load_n(&fs_fdt[fd], __ATOMIC_ACQUIRE);
}

/* Installs S at FD (replacing whatever was there, which is returned). */
struct fs_sock *fs_fdt_set(int fd, struct fs_sock *s);
/* Clears FD if it still holds S; returns 1 if it did. */
int fs_fdt_clear(int fd, struct fs_sock *s);

/* Marks fabsock's own descriptors in the fd table: the application never
 * sees them (its close() of such a number gets EBADF). */
#define FS_SOCK_INTERNAL ((struct fs_sock *)1)

/* Moves an fd of fabsock's own to a high number and marks it internal.
 * Returns the new fd (the old one is closed) or FD unchanged on failure. */
int fs_internal_fd(int fd);
void fs_internal_fd_close(int fd);

#endif
