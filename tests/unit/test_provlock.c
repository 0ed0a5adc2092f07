/* SPDX-License-Identifier: MIT */
/*
 * Unit test of fs_prov_spin_lock (core/fabric_shm.c), what the preloaded
 * pthread_spin_lock does inside a provider call: libfabric 1.17's shm region
 * locks are process-shared spin locks, and a holder the scheduler set aside
 * must get a core from the processes waiting for it (seen: two nginx
 * workers spinning for 8 to 40 s on a 2-core VM while the holder waited).
 *   - a free lock is taken at once, with no sleep counted;
 *   - a lock another process holds for 400 ms: the waiter gets it only
 *     after the release, and meanwhile uses little CPU (it sleeps; glibc's
 *     own pthread_spin_lock, measured the same way for comparison, spins);
 *     prov_lock_sleeps counts the wait once;
 *   - the lock word stays glibc's: glibc's trylock and unlock work on a lock
 *     taken this way.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/fabric.h"
#include "core/guard.h"
#include "core/stats.h"
#include "preload/real.h"
#include "tests/unit/check.h"

#define FS_TEST_HOLD_MS 400

static double fs_test_clock(clockid_t c)
{
	struct timespec t;

	clock_gettime(c, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* When the holder released the lock (CLOCK_MONOTONIC, shared memory). */
static volatile double *fs_test_released;

/* A child takes LOCK, says so on a pipe, holds it FS_TEST_HOLD_MS, notes the
 * time, releases it and exits. Returns its pid once it holds the lock. */
static pid_t fs_test_holder(pthread_spinlock_t *lock)
{
	int p[2];
	char c = 0;
	pid_t pid;

	if (pipe(p))
		return -1;
	pid = fork();
	if (pid == 0) {
		pthread_spin_lock(lock);
		if (write(p[1], &c, 1) != 1)
			_exit(2);
		usleep(FS_TEST_HOLD_MS * 1000);
		*fs_test_released = fs_test_clock(CLOCK_MONOTONIC);
		pthread_spin_unlock(lock);
		_exit(0);
	}
	close(p[1]);
	if (pid < 0 || read(p[0], &c, 1) != 1)
		pid = -1;
	close(p[0]);
	return pid;
}

/* Takes LOCK (held by a child for FS_TEST_HOLD_MS) with TAKE; WALL and CPU
 * get the seconds waited and the CPU seconds this thread used meanwhile.
 * Checks that TAKE returned only after the holder's release. Returns TAKE's
 * result, or -1 if the child could not be started. */
static int fs_test_wait(pthread_spinlock_t *lock, int (*take)(pthread_spinlock_t *), double *wall, double *cpu)
{
	double w0, c0;
	int ret, status = 0;
	pid_t pid;

	*fs_test_released = 0;
	pid = fs_test_holder(lock);
	if (pid < 0)
		return -1;
	w0 = fs_test_clock(CLOCK_MONOTONIC);
	c0 = fs_test_clock(CLOCK_THREAD_CPUTIME_ID);
	FS_GUARD_ENTER(); /* as inside a provider call */
	ret = take(lock);
	FS_GUARD_LEAVE();
	*cpu = fs_test_clock(CLOCK_THREAD_CPUTIME_ID) - c0;
	*wall = fs_test_clock(CLOCK_MONOTONIC) - w0;
	CHECK(*fs_test_released > 0 && w0 + *wall >= *fs_test_released);
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	return ret;
}

static int fs_test_glibc_lock(pthread_spinlock_t *lock)
{
	return FS_REAL(pthread_spin_lock)(lock);
}

int main(void)
{
	pthread_spinlock_t *lock = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint64_t sleeps;
	double wall = 0, cpu = 0, gwall = 0, gcpu = 0;

	fs_real_init();
	if (lock != MAP_FAILED)
		fs_test_released = (volatile double *)(void *)((char *)lock + 64);
	if (lock == MAP_FAILED || pthread_spin_init(lock, PTHREAD_PROCESS_SHARED)) {
		fprintf(stderr, "no shared spin lock\n");
		return 1;
	}

	/* free: taken at once, nothing counted; the word is glibc's */
	sleeps = fs_stats.prov_lock_sleeps;
	CHECK(fs_prov_spin_lock(lock) == 0);
	CHECK(fs_stats.prov_lock_sleeps == sleeps);
	CHECK(pthread_spin_trylock(lock) != 0);
	CHECK(pthread_spin_unlock(lock) == 0);
	CHECK(pthread_spin_trylock(lock) == 0);
	CHECK(pthread_spin_unlock(lock) == 0);

	/* held by another process: waits for the release, sleeping */
	sleeps = fs_stats.prov_lock_sleeps;
	CHECK(fs_test_wait(lock, fs_prov_spin_lock, &wall, &cpu) == 0);
	CHECK(wall >= FS_TEST_HOLD_MS / 4000.0); /* it waited (the release itself is checked above) */
	CHECK(cpu < wall * 0.25);
	CHECK(fs_stats.prov_lock_sleeps == sleeps + 1);
	CHECK(pthread_spin_trylock(lock) != 0); /* ours now */
	CHECK(pthread_spin_unlock(lock) == 0);

	/* glibc's, the same way: for comparison only (a loaded machine may
	 * preempt a spinner, so its share is not checked) */
	CHECK(fs_test_wait(lock, fs_test_glibc_lock, &gwall, &gcpu) == 0);
	CHECK(pthread_spin_unlock(lock) == 0);
	printf("waiting %.0f ms for a lock another process held: fs_prov_spin_lock used %.0f%% of a CPU, "
	       "glibc's pthread_spin_lock %.0f%%\n",
	       wall * 1000, wall > 0 ? 100 * cpu / wall : 0, gwall > 0 ? 100 * gcpu / gwall : 0);
	return fs_check_done();
}
