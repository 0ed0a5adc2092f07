/* SPDX-License-Identifier: MIT */
/*
 * The real-symbol table: the next definition (normally glibc's) of every
 * function fabsock interposes, generated from preload/symbols.def. Everything
 * inside fabsock that needs one of these functions calls it through fs_real,
 * never by name, so that fabsock never re-enters its own wrappers.
 *
 * fs_real_init() is idempotent and is called from the library constructor
 * before any wrapper can run; unit tests call it themselves.
 */
#ifndef FS_PRELOAD_REAL_H
#define FS_PRELOAD_REAL_H

#include <poll.h>
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

struct fs_real_syms {
#define FS_SYM(ret, name, params) ret(*name) params;
#include "preload/symbols.def"
#undef FS_SYM
};

extern struct fs_real_syms fs_real;

/* Resolves every symbol; aborts with a message if one is missing. */
void fs_real_init(void);

#endif
