/* SPDX-License-Identifier: MIT */
/*
 * What the wrapper files share: the export marker, the one place a core
 * result becomes -1/errno, and the dispatch to the core's receive and send
 * entries. Internal to the preload library (hidden).
 */
#ifndef FS_PRELOAD_WRAPPERS_H
#define FS_PRELOAD_WRAPPERS_H

#include <errno.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "core/fdtable.h"

#define FS_EXPORT __attribute__((visibility("default")))

/* Whether fabsock has any entry for FD: a lock-free look that lets every
 * call on an fd that is none of fabsock's go straight to the kernel. */
static inline int fs_fdt_peek_any(int fd)
{
	return fs_fdt_peek(fd) != NULL;
}

static inline long fs_ret(long ret)
{
	if (ret < 0) {
		errno = (int)-ret;
		return -1;
	}
	return ret;
}

/* The core's receive (SEND false) or send entry for a socket of ours;
 * FS_PASS when the fd is not fabsock's. */
ssize_t fs_msg_entry(int fd, struct msghdr *msg, int flags, bool send);

#endif
