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
#include "core/stats.h"
#include "core/util.h"
#include "preload/real.h"

static int fs_runq_fd = -2; /* -2: not opened yet; -3: being opened; -1: cannot */
static long fs_runq_cpus;
static uint64_t fs_runq_next_ns;
static bool fs_runq_busy_host;
/* /proc/self/schedstat, opened by the process that reads it (an fd opened
 * before a fork would show the parent's), and its last sample */
static int fs_runq_self_fd = -1;
static pid_t fs_runq_self_pid;
static uint64_t fs_runq_last_ns, fs_runq_last_delay;
static pid_t fs_runq_sampler; /* the process whose thread samples now, 0: none */
static uint64_t fs_runq_taken_until; /* fs_runq_slice_lost: crowded until then */
static uint64_t fs_runq_taken_ms;    /* the length of that spell */
static uint64_t fs_runq_lost_from, fs_runq_lost_ns; /* the losses' window, and their time in it */

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

/* Our run-queue delay (ns, /proc/self/schedstat's second field: the time
 * the thread group leader spent runnable but not running), or -1. */
static int64_t fs_runq_self_delay(void)
{
	char buf[96], *end;
	unsigned long long delay;
	ssize_t n;

	if (fs_runq_self_pid != fs_self_pid()) {
		if (fs_runq_self_fd >= 0)
			fs_internal_fd_close(fs_runq_self_fd);
		fs_runq_self_fd = open("/proc/self/schedstat", O_RDONLY | O_CLOEXEC);
		if (fs_runq_self_fd >= 0)
			fs_runq_self_fd = fs_internal_fd(fs_runq_self_fd);
		fs_runq_self_pid = fs_self_pid();
		fs_runq_last_ns = 0;
	}
	if (fs_runq_self_fd < 0 || (n = pread(fs_runq_self_fd, buf, sizeof(buf) - 1, 0)) <= 0)
		return -1;
	buf[n] = 0;
	(void)strtoull(buf, &end, 10);
	if (end == buf || *end != ' ')
		return -1;
	delay = strtoull(end + 1, NULL, 10);
	return (int64_t)delay;
}

/* /proc/loadavg's descriptor, opened at the first use (and the CPUs we may
 * run on counted then); -1 when it cannot be read, or while another thread
 * opens it (-3: no lock, so nothing a fork could leave held). */
static int fs_runq_loadavg_fd(void)
{
	int fd = __atomic_load_n(&fs_runq_fd, __ATOMIC_ACQUIRE), unopened = -2;
	cpu_set_t set;

	if (fd != -2)
		return fd == -3 ? -1 : fd;
	if (!__atomic_compare_exchange_n(&fs_runq_fd, &unopened, -3, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return unopened == -3 ? -1 : unopened;
	/* the CPUs this process may run on: a container's share */
	fs_runq_cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
	if (fs_runq_cpus < 1)
		fs_runq_cpus = 1;
	fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
	fd = fd >= 0 ? fs_internal_fd(fd) : -1;
	__atomic_store_n(&fs_runq_fd, fd, __ATOMIC_RELEASE);
	return fd;
}

/* The host's runnable tasks now (/proc/loadavg), or -1. */
static long fs_runq_runnable(void)
{
	char buf[128];
	int fd = fs_runq_loadavg_fd();
	ssize_t n;

	if (fd < 0)
		return -1;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	return n > 0 ? fs_runq_parse(buf, (size_t)n) : -1;
}

bool fs_runq_host_busy_now(uint64_t now)
{
	static uint64_t until_ns; /* the answer below holds until then */
	static bool busy;
	long r;

	if (now < __atomic_load_n(&until_ns, __ATOMIC_ACQUIRE))
		return __atomic_load_n(&busy, __ATOMIC_RELAXED);
	r = fs_runq_runnable();
	__atomic_store_n(&busy, r > 0 && r > fs_runq_cpus, __ATOMIC_RELAXED);
	__atomic_store_n(&until_ns, now + FS_RUNQ_SAMPLE_MS * 1000000ull, __ATOMIC_RELEASE);
	return r > 0 && r > fs_runq_cpus;
}

static void fs_runq_sample(uint64_t now)
{
	long r;
	int64_t delay;
	bool waited;

	if ((r = fs_runq_runnable()) < 0 && fs_runq_loadavg_fd() < 0)
		return; /* (cannot be read: nothing to say) */
	/* Both signs, so that a passing third thread on a quiet host (a
	 * kernel worker, our service thread) does not stop a ping-pong's spin:
	 * more runnable threads than CPUs now, and we ourselves waited for a
	 * CPU more than a twentieth of the time since the last sample. */
	delay = fs_runq_self_delay();
	waited = delay >= 0 && fs_runq_last_ns && now > fs_runq_last_ns &&
		 (uint64_t)delay > fs_runq_last_delay && ((uint64_t)delay - fs_runq_last_delay) * 20 > now - fs_runq_last_ns;
	if (delay >= 0) {
		fs_runq_last_ns = now;
		fs_runq_last_delay = (uint64_t)delay;
	}
	__atomic_store_n(&fs_runq_busy_host, r > fs_runq_cpus && waited, __ATOMIC_RELAXED);
}

void fs_runq_slice_lost(uint64_t now, uint64_t lost_ns)
{
	uint64_t from = __atomic_load_n(&fs_runq_lost_from, __ATOMIC_RELAXED);
	uint64_t lost = __atomic_load_n(&fs_runq_lost_ns, __ATOMIC_RELAXED);
	uint64_t until, ms;

	FS_STAT_INC(spin_slices_lost);
	if (!fs_params.spin_lost_ms)
		return;
	/* the losses of the last FS_RUNQ_LOST_WINDOW_MS: one now and then is
	 * a program's own threads sharing the cores (nginx's workers and
	 * wrk's threads: 10-20 % of the time), not work beside */
	if (!from || now - from > FS_RUNQ_LOST_WINDOW_MS * 1000000ull) {
		from = now - lost_ns;
		lost = 0;
	}
	lost += lost_ns;
	if (lost < FS_RUNQ_LOST_MIN_MS * 1000000ull || lost * 2 < now - from) {
		__atomic_store_n(&fs_runq_lost_from, from, __ATOMIC_RELAXED);
		__atomic_store_n(&fs_runq_lost_ns, lost, __ATOMIC_RELAXED);
		return;
	}
	/* half the time lost: a spell of sleeping waits, twice the last one
	 * when it comes within one spell's length after the last ended (the
	 * work beside is still there); a new window after it. Threads racing
	 * here store one of their answers: a heuristic. */
	__atomic_store_n(&fs_runq_lost_from, 0, __ATOMIC_RELAXED);
	FS_STAT_INC(spin_lost_spells);
	until = __atomic_load_n(&fs_runq_taken_until, __ATOMIC_RELAXED);
	ms = __atomic_load_n(&fs_runq_taken_ms, __ATOMIC_RELAXED);
	if (ms && until && now - until < ms * 1000000ull)
		ms = ms * 2 < FS_RUNQ_TAKEN_MAX_MS ? ms * 2 : FS_RUNQ_TAKEN_MAX_MS;
	else
		ms = fs_params.spin_lost_ms;
	__atomic_store_n(&fs_runq_taken_ms, ms, __ATOMIC_RELAXED);
	__atomic_store_n(&fs_runq_taken_until, now + ms * 1000000ull, __ATOMIC_RELAXED);
}

bool fs_runq_spell_lately(uint64_t now)
{
	uint64_t until = __atomic_load_n(&fs_runq_taken_until, __ATOMIC_RELAXED);

	return until && now < until + FS_RUNQ_SPELL_LATELY_MS * 1000000ull;
}

bool fs_runq_crowded(uint64_t now)
{
	uint64_t next = __atomic_load_n(&fs_runq_next_ns, __ATOMIC_RELAXED);

	if (!fs_params.spin_us)
		return false;
	if (now < __atomic_load_n(&fs_runq_taken_until, __ATOMIC_RELAXED))
		return true;
	if (!fs_params.spin_free_core)
		return false;
	/* one thread samples; the others read what it found */
	if (now >= next && __atomic_compare_exchange_n(&fs_runq_next_ns, &next, now + FS_RUNQ_SAMPLE_MS * 1000000ull,
						      false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
		/* and never two at once (a sampler preempted past the next
		 * slot): the sample reopens a descriptor after a fork. A
		 * sampler of another process is a parent's, forked mid-sample:
		 * the child takes over. */
		pid_t self = fs_self_pid(), owner = 0;

		if (__atomic_compare_exchange_n(&fs_runq_sampler, &owner, self, false, __ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED) ||
		    (owner != self &&
		     __atomic_compare_exchange_n(&fs_runq_sampler, &owner, self, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))) {
			fs_runq_sample(now);
			__atomic_store_n(&fs_runq_sampler, 0, __ATOMIC_RELEASE);
		}
	}
	return __atomic_load_n(&fs_runq_busy_host, __ATOMIC_RELAXED);
}
