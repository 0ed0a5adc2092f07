/* SPDX-License-Identifier: MIT */
/*
 * The fd table (see fdtable.h). The array is one anonymous mapping with
 * MAP_NORESERVE: a process with a million-fd limit that uses ten sockets
 * touches one page. Also fabsock's own descriptors: moved out of the
 * application's way and marked internal in the table.
 */
#include "core/fdtable.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "preload/real.h"

#define FS_FDT_MIN 65536u
#define FS_FDT_MAX (1u << 22)

struct fs_sock **fs_fdt;
size_t fs_fdt_size;

void *fs_fd_table_map(size_t count, size_t size)
{
	void *map = mmap(NULL, count * size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
			 0);

	return map == MAP_FAILED ? NULL : map;
}

int fs_fdt_init(void)
{
	struct rlimit lim;
	size_t size = FS_FDT_MIN;
	void *map;

	if (fs_fdt)
		return 0;
	if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_max != RLIM_INFINITY && lim.rlim_max > size)
		size = lim.rlim_max;
	if (size > FS_FDT_MAX)
		size = FS_FDT_MAX;
	map = fs_fd_table_map(size, sizeof(*fs_fdt));
	if (!map)
		return -ENOMEM;
	fs_fdt = map;
	__atomic_store_n(&fs_fdt_size, size, __ATOMIC_RELEASE);
	return 0;
}

struct fs_sock *fs_fdt_set(int fd, struct fs_sock *s)
{
	if (fd < 0 || (size_t)fd >= fs_fdt_size)
		return NULL;
	return __atomic_exchange_n(&fs_fdt[fd], s, __ATOMIC_ACQ_REL);
}

int fs_fdt_clear(int fd, struct fs_sock *s)
{
	struct fs_sock *expected = s;

	if (fd < 0 || (size_t)fd >= fs_fdt_size)
		return 0;
	return __atomic_compare_exchange_n(&fs_fdt[fd], &expected, NULL, 0, __ATOMIC_ACQ_REL,
					   __ATOMIC_ACQUIRE);
}

int fs_internal_fd(int fd)
{
	static int cached_high; /* one getrlimit per process, not per close() */
	int high = __atomic_load_n(&cached_high, __ATOMIC_RELAXED), moved;

	if (!high) {
		struct rlimit lim;

		high = 512;
		if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && (rlim_t)high >= lim.rlim_cur)
			high = (int)(lim.rlim_cur / 2);
		__atomic_store_n(&cached_high, high, __ATOMIC_RELAXED);
	}
	moved = fs_real.fcntl(fd, F_DUPFD_CLOEXEC, high);
	if (moved < 0 && errno == EINVAL) {
		/* the limit was lowered since: ask again next time */
		__atomic_store_n(&cached_high, 0, __ATOMIC_RELAXED);
		return fd;
	}
	if (moved < 0)
		return fd;
	fs_real.close(fd);
	fs_fdt_set(moved, FS_SOCK_INTERNAL);
	return moved;
}

void fs_internal_fd_close(int fd)
{
	fs_fdt_clear(fd, FS_SOCK_INTERNAL);
	fs_real.close(fd);
}
