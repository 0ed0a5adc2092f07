/* SPDX-License-Identifier: MIT */
/*
 * The fd table (see fdtable.h). The array is one anonymous mapping with
 * MAP_NORESERVE: a process with a million-fd limit that uses ten sockets
 * touches one page.
 */
#include "core/fdtable.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define FS_FDT_MIN 65536u
#define FS_FDT_MAX (1u << 22)

struct fs_sock **fs_fdt;
size_t fs_fdt_size;

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
	map = mmap(NULL, size * sizeof(*fs_fdt), PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (map == MAP_FAILED)
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
