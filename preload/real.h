/* SPDX-License-Identifier: MIT */
/*
 * The real-symbol table: the next definition (normally glibc's) of every
 * function fabsock interposes, generated from preload/symbols.def. Everything
 * inside fabsock that needs one of these functions calls it through fs_real,
 * never by name, so that fabsock never re-enters its own wrappers.
 *
 * fs_real_init() is idempotent; the library constructor calls it, and so
 * does the first wrapper that runs before the constructor (FS_REAL); unit
 * tests call it themselves.
 */
#ifndef FS_PRELOAD_REAL_H
#define FS_PRELOAD_REAL_H

#include <aio.h>
#include <poll.h>
#include <pty.h>
#include <spawn.h>
#include <stdio.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <time.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>
#include <unistd.h>

struct fs_real_syms {
#define FS_SYM(ret, name, params) ret(*name) params;
#define FS_ALIAS(name, target) /* shares TARGET's real function */
#include "preload/symbols.def"
#undef FS_ALIAS
#undef FS_SYM
};

extern struct fs_real_syms fs_real;
extern int fs_real_done;
/* libc's syscall(), outside the table: fabsock exports a syscall() of its
 * own (wrappers.c) and its own raw calls (below, real.c) go through it, so
 * it is resolved by itself, first, without the table (fs_real_syscall_get). */
typedef long (*fs_syscall_fn)(long number, ...);
fs_syscall_fn fs_real_syscall_get(void);

/* Resolves every symbol; aborts with a message if one is missing. */
void fs_real_init(void);

/* Wrappers run whenever the application calls them, which may be before
 * fabsock's constructor: another library's constructor (libcap-ng's reads
 * a file in postgres and sshd), or a program's own early code. Every
 * wrapper reaches the real function through FS_REAL(name), which resolves
 * the table on first use. After that it costs one predictable branch. */
static inline void fs_real_ensure(void)
{
	if (__builtin_expect(!__atomic_load_n(&fs_real_done, __ATOMIC_ACQUIRE), 0))
		fs_real_init();
}
#define FS_REAL(name) (fs_real_ensure(), fs_real.name)

/* For code that runs before the table may be resolved (config/: the log
 * file and FABSOCK_RULES=@FILE are opened at start-up): the real function
 * once it is known, the raw system call until then. */
static inline ssize_t fs_real_or_sys_read(int fd, void *buf, size_t len)
{
	return fs_real.read ? fs_real.read(fd, buf, len) : syscall(SYS_read, fd, buf, len);
}
static inline ssize_t fs_real_or_sys_write(int fd, const void *buf, size_t len)
{
	return fs_real.write ? fs_real.write(fd, buf, len) : syscall(SYS_write, fd, buf, len);
}
static inline void fs_real_or_sys_close(int fd)
{
	if (fs_real.close)
		fs_real.close(fd);
	else
		syscall(SYS_close, fd);
}

#endif
