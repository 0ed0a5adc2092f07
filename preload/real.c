/* SPDX-License-Identifier: MIT */
/*
 * Resolves the real-symbol table (see real.h) with dlsym(RTLD_NEXT), once.
 * A missing symbol means the C library is not one fabsock can sit on top of;
 * that is reported on stderr with the real write and the process is aborted
 * before the application runs, rather than failing later at a random call.
 */

#include "preload/real.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct fs_real_syms fs_real;
int fs_real_done;
static fs_syscall_fn fs_real_syscall;

fs_syscall_fn fs_real_syscall_get(void)
{
	fs_syscall_fn fn = __atomic_load_n(&fs_real_syscall, __ATOMIC_ACQUIRE);

	if (__builtin_expect(!fn, 0)) {
		fn = (fs_syscall_fn)dlsym(RTLD_NEXT, "syscall");
		if (!fn)
			abort(); /* no libc syscall(): nothing to report with */
		__atomic_store_n(&fs_real_syscall, fn, __ATOMIC_RELEASE);
	}
	return fn;
}

static void fs_real_missing(const char *name)
{
	static const char prefix[] = "fabsock: cannot resolve the real ";
	syscall(SYS_write, 2, prefix, sizeof(prefix) - 1);
	syscall(SYS_write, 2, name, strlen(name));
	syscall(SYS_write, 2, "\n", 1);
	abort();
}

/* Two threads may resolve at once (before the constructor): both store the
 * same values, each pointer whole. */
void fs_real_init(void)
{
	if (__atomic_load_n(&fs_real_done, __ATOMIC_ACQUIRE))
		return;
#define FS_SYM(ret, name, params)                                                  \
	do {                                                                       \
		void *sym = dlsym(RTLD_NEXT, #name);                               \
		if (!sym)                                                          \
			fs_real_missing(#name);                                    \
		__atomic_store_n((void **)(void *)&fs_real.name, sym, __ATOMIC_RELAXED); \
	} while (0);
#define FS_ALIAS(name, target)
#include "preload/symbols.def"
#undef FS_ALIAS
#undef FS_SYM
	__atomic_store_n(&fs_real_done, 1, __ATOMIC_RELEASE);
}
