/* SPDX-License-Identifier: MIT */
/*
 * Whether the host has a core free for a spinner (runq.h).
 */
#include "core/runq.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/params.h"
#include "core/fdtable.h"
#include "preload/real.h"

static int fs_runq_fd = -2; /* -2: not opened yet; -1: cannot */
static long fs_runq_cpus;
static uint64_t fs_runq_next_ns;
static bool fs_runq_busy_host;

long fs_runq_parse(const char *buf, size_t len)
{
	unsigned spaces = 0;
	size_t i = 0;
	long r = 0;

	/* skip the three load averages */
	for (; i < len && spaces < 3; i++)
		if (buf[i] == ' ')
			spaces++;
	if (spaces < 3 || i >= len || buf[i] < '0' || buf[i] > '9')
		return -1;
	for (; i < len && buf[i] >= '0' && buf[i] <= '9'; i++) {
		r = r * 10 + (buf[i] - '0');
		if (r > 1000000000L)
			return -1;
	}
	return i < len && buf[i] == '/' ? r : -1;
}

static void fs_runq_sample(void)
{
	char buf[128];
	ssize_t n;
	long r;
	int fd = __atomic_load_n(&fs_runq_fd, __ATOMIC_ACQUIRE);

	if (fd == -2) {
		cpu_set_t set;

		/* the CPUs this process may run on: a container's share */
		fs_runq_cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
		if (fs_runq_cpus < 1)
			fs_runq_cpus = 1;
		fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
		fd = fd >= 0 ? fs_internal_fd(fd) : -1;
		__atomic_store_n(&fs_runq_fd, fd, __ATOMIC_RELEASE);
	}
	if (fd < 0)
		return;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	r = n > 0 ? fs_runq_parse(buf, (size_t)n) : -1;
	/* the global count, against the CPUs we may use: on a host with more
	 * CPUs than our affinity allows this errs towards spinning */
	__atomic_store_n(&fs_runq_busy_host, r > fs_runq_cpus, __ATOMIC_RELAXED);
}

bool fs_runq_crowded(uint64_t now)
{
	uint64_t next = __atomic_load_n(&fs_runq_next_ns, __ATOMIC_RELAXED);

	if (!fs_params.spin_free_core || !fs_params.spin_us)
		return false;
	/* one thread samples; the others read what it found */
	if (now >= next && __atomic_compare_exchange_n(&fs_runq_next_ns, &next, now + FS_RUNQ_SAMPLE_MS * 1000000ull,
						      false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		fs_runq_sample();
	return __atomic_load_n(&fs_runq_busy_host, __ATOMIC_RELAXED);
}
