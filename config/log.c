/* SPDX-License-Identifier: MIT */
/*
 * The log sink: the level in force, the file descriptor lines go to, and
 * fs_log_write(), which formats one line on the stack and hands it to the
 * kernel in a single write so that lines from concurrent threads never
 * interleave. It never allocates, never changes errno, and never calls an
 * interposed function by name: it can run inside any wrapper, in the
 * constructor before fs_real is resolved (it then uses the raw system call),
 * or after a fork.
 *
 * The descriptor is the application's to close too: programs close every fd
 * above 2 (ssh, sshd, daemons), and the number is then reused, maybe for a
 * TCP connection. So before each line the sink checks that the descriptor is
 * still the file it opened (device and inode; reopened if not), never writes
 * into a socket (stderr may be the connection itself: inetd-style servers),
 * and never writes past RLIMIT_FSIZE (the kernel would kill the process with
 * SIGXFSZ: sshd's sandboxed child has a limit of 0).
 */
#include "config/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "config/params.h"
#include "preload/real.h"

/* room for the exit's stats line (core/stats.c), the longest there is */
#define FS_LOG_LINE_MAX 4096

int fs_log_level = FS_LOG_WARN;

/* Where lines go: 2, or fs_log_owned_fd. Read with relaxed atomics by
 * writers; only fs_log_init changes it. */
static int fs_log_fd = 2;
/* The FABSOCK_LOG_FILE descriptor this module opened and must close when
 * fs_log_init runs again, or -1; and the file it is (device, inode). */
static int fs_log_owned_fd = -1;
static dev_t fs_log_dev;
static ino_t fs_log_ino;
static int fs_log_reopening;

void (*fs_log_fd_hook)(int fd);

/* Opens FABSOCK_LOG_FILE on a high descriptor (out of the way of programs
 * that expect the lowest free numbers), hands it to fs_log_fd_hook (core
 * marks it as fabsock's own: an application's close-all loop skips it).
 * Returns the fd or -1 with errno set. */
static int fs_log_open(const char *path)
{
	struct stat st;
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644), high;

	if (fd < 0)
		return -1;
	high = fs_real.fcntl ? fs_real.fcntl(fd, F_DUPFD_CLOEXEC, 200) : (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 200);
	if (high >= 0) {
		fs_real_or_sys_close(fd);
		fd = high;
	}
	if (fstat(fd, &st) == 0) {
		fs_log_dev = st.st_dev;
		fs_log_ino = st.st_ino;
	}
	if (fs_log_fd_hook)
		fs_log_fd_hook(fd);
	return fd;
}

static const char *const fs_log_level_names[] = {
	[FS_LOG_ERROR] = "error",
	[FS_LOG_WARN] = "warn",
	[FS_LOG_INFO] = "info",
	[FS_LOG_DEBUG] = "debug",
};

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
		fd = fs_log_open(path);
		if (fd >= 0)
			fs_log_owned_fd = fd;
		else
			open_errno = errno;
	}
	__atomic_store_n(&fs_log_fd, fd < 0 ? 2 : fd, __ATOMIC_RELAXED);
	if (old >= 0)
		fs_real_or_sys_close(old);
	/* Unconditional, like the parameter warnings that precede fs_log_init:
	 * a configuration mistake shows even with FABSOCK_LOG=error. */
	if (fd < 0)
		fs_log_write(FS_LOG_WARN, "FABSOCK_LOG_FILE=%s cannot be opened (%s); logging to stderr",
			     path, strerror(open_errno));
}

/* The descriptor a line of LEN bytes may go to now, or -1 to drop it (see
 * the top of this file). */
static int fs_log_target(size_t len)
{
	int fd = __atomic_load_n(&fs_log_fd, __ATOMIC_RELAXED);
	bool owned = fd == __atomic_load_n(&fs_log_owned_fd, __ATOMIC_RELAXED) && fd >= 0;
	struct rlimit lim;
	struct stat st;

	if (owned && (fstat(fd, &st) || st.st_dev != fs_log_dev || st.st_ino != fs_log_ino)) {
		/* closed behind our back, and perhaps reused: open the file anew
		 * (the old number is not ours to close any more) */
		int fresh;

		if (__atomic_exchange_n(&fs_log_reopening, 1, __ATOMIC_ACQUIRE))
			return -1;
		fresh = fs_params.log_file[0] ? fs_log_open(fs_params.log_file) : -1;
		if (fresh >= 0) {
			__atomic_store_n(&fs_log_owned_fd, fresh, __ATOMIC_RELAXED);
			__atomic_store_n(&fs_log_fd, fresh, __ATOMIC_RELAXED);
		}
		__atomic_store_n(&fs_log_reopening, 0, __ATOMIC_RELEASE);
		fd = fresh;
		if (fd < 0 || fstat(fd, &st))
			return -1;
	} else if (!owned && fstat(fd, &st)) {
		return -1;
	}
	if (S_ISSOCK(st.st_mode))
		return -1;
	if (S_ISREG(st.st_mode) && getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
	    (rlim_t)st.st_size + len > lim.rlim_cur)
		return -1;
	return fd;
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

	{
		int fd = fs_log_target(len);

		for (;;) {
			ssize_t rc = fd >= 0 ? fs_real_or_sys_write(fd, line, len) : 0;

			if (rc >= 0 || errno != EINTR)
				break;
		}
	}
out:
	errno = saved_errno;
}
