/* SPDX-License-Identifier: MIT */
/*
 * The log sink: the level in force, the file descriptor lines go to, and
 * fs_log_write(), which formats one line on the stack and hands it to the
 * kernel in a single write so that lines from concurrent threads never
 * interleave. It never allocates, never changes errno, and never calls an
 * interposed function by name: it can run inside any wrapper, in the
 * constructor before fs_real is resolved (it then uses the raw system call),
 * or after a fork.
 */
#include "config/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "config/params.h"
#include "preload/real.h"

#define FS_LOG_LINE_MAX 1024

int fs_log_level = FS_LOG_WARN;

/* Where lines go: 2, or fs_log_owned_fd. Read with relaxed atomics by
 * writers; only fs_log_init changes it. */
static int fs_log_fd = 2;
/* The FABSOCK_LOG_FILE descriptor this module opened and must close when
 * fs_log_init runs again, or -1. */
static int fs_log_owned_fd = -1;

static const char *const fs_log_level_names[] = {
	[FS_LOG_ERROR] = "error",
	[FS_LOG_WARN] = "warn",
	[FS_LOG_INFO] = "info",
	[FS_LOG_DEBUG] = "debug",
};

static ssize_t fs_log_raw_write(int fd, const void *buf, size_t len)
{
	if (fs_real.write)
		return fs_real.write(fd, buf, len);
	return syscall(SYS_write, fd, buf, len);
}

static void fs_log_raw_close(int fd)
{
	if (fs_real.close)
		fs_real.close(fd);
	else
		syscall(SYS_close, fd);
}

/* Not safe against concurrent fs_log_write on the old file: a writer that
 * loaded the old descriptor may write after it is closed. It runs in the
 * constructor (before any thread) and in tests. */
void fs_log_init(void)
{
	const char *path = fs_params.log_file;
	int old = fs_log_owned_fd;
	int fd = 2, open_errno = 0;

	fs_log_level = fs_params.log_level > FS_LOG_DEBUG ? FS_LOG_DEBUG : (int)fs_params.log_level;

	fs_log_owned_fd = -1;
	if (path && path[0]) {
		fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (fd >= 0)
			fs_log_owned_fd = fd;
		else
			open_errno = errno;
	}
	__atomic_store_n(&fs_log_fd, fd < 0 ? 2 : fd, __ATOMIC_RELAXED);
	if (old >= 0)
		fs_log_raw_close(old);
	/* Unconditional, like the parameter warnings that precede fs_log_init:
	 * a configuration mistake shows even with FABSOCK_LOG=error. */
	if (fd < 0)
		fs_log_write(FS_LOG_WARN, "FABSOCK_LOG_FILE=%s cannot be opened (%s); logging to stderr",
			     path, strerror(open_errno));
}

void fs_log_write(int level, const char *fmt, ...)
{
	int saved_errno = errno;
	char line[FS_LOG_LINE_MAX];
	const char *name = level >= FS_LOG_ERROR && level <= FS_LOG_DEBUG
				   ? fs_log_level_names[level] : "log";
	/* The body may use up to sizeof(line) - 2 bytes so that '\n' and the
	 * terminator of vsnprintf always fit. */
	const size_t body_max = sizeof(line) - 2;
	va_list ap;
	int n, m;
	size_t len;

	n = snprintf(line, sizeof(line), "fabsock[%d]: %s: ", (int)getpid(), name);
	if (n < 0)
		goto out;
	len = (size_t)n;
	va_start(ap, fmt);
	m = vsnprintf(line + len, sizeof(line) - 1 - len, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	if ((size_t)m > body_max - len) {
		len = body_max;
		memcpy(line + len - 3, "...", 3);
	} else {
		len += (size_t)m;
	}
	if (len > 0 && line[len - 1] == '\n')
		len--;
	line[len++] = '\n';

	for (;;) {
		ssize_t rc = fs_log_raw_write(__atomic_load_n(&fs_log_fd, __ATOMIC_RELAXED), line, len);
		if (rc >= 0 || errno != EINTR)
			break;
	}
out:
	errno = saved_errno;
}
