/* SPDX-License-Identifier: MIT */
/*
 * Unit test of core/fdtable.c: the table is sized to at least 65536 fds,
 * fs_fdt_peek/set/clear refuse fds outside it, set returns what it replaced,
 * clear only removes the entry it was told about, and init is idempotent.
 * Then four threads hammer the table with fixed seeds: each owns some fds
 * (only it writes there, so it must always read back its own last store) and
 * all share others, where every peeked value must be one that some thread
 * stored at that fd (no torn or invented pointers), and where the set/clear
 * results must account for the final content exactly (each pointer installed
 * was removed exactly once, by a later set or a matching clear, or is the
 * one left). The table only stores pointers, so the "sockets" are addresses
 * of static bytes.
 */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "config/log.h"
#include "config/params.h"
#include "core/fdtable.h"
#include "preload/real.h"
#include "tests/unit/check.h"

#define FS_TEST_THREADS 4
#define FS_TEST_ITERATIONS 200000
#define FS_TEST_SHARED_FDS 4
#define FS_TEST_OWN_VALUES 4
#define FS_TEST_SHARED_VALUES 16

/* Shared values: one set for all threads; owned values: a set per thread. */
static char fs_test_shared_obj[FS_TEST_SHARED_VALUES];
static char fs_test_own_obj[FS_TEST_THREADS][FS_TEST_OWN_VALUES];
static char fs_test_foreign_obj;

static int fs_test_shared_fd[FS_TEST_SHARED_FDS];

static struct fs_sock *fs_test_sock(char *obj)
{
	return (struct fs_sock *)(void *)obj;
}

static uint64_t fs_test_rand(uint64_t *state)
{
	uint64_t x = *state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545f4914f6cdd1dull;
}

static int fs_test_is_shared_value(const struct fs_sock *s)
{
	const char *p = (const char *)s;

	return p >= fs_test_shared_obj && p < fs_test_shared_obj + FS_TEST_SHARED_VALUES;
}

static int fs_test_is_own_value(unsigned t, const struct fs_sock *s)
{
	const char *p = (const char *)s;

	return p >= fs_test_own_obj[t] && p < fs_test_own_obj[t] + FS_TEST_OWN_VALUES;
}

struct fs_test_worker {
	unsigned index;
	uint64_t seed;
	int own_fd;
	/* results, read after join */
	unsigned long bad_shared_peek, bad_own_peek, bad_set_result, bad_clear_result;
	/* per shared fd: pointers installed, and pointers removed (by a set
	 * returning them or a clear that succeeded) */
	long installed[FS_TEST_SHARED_FDS], removed[FS_TEST_SHARED_FDS];
};

static void *fs_test_worker_main(void *arg)
{
	struct fs_test_worker *w = arg;
	uint64_t rng = w->seed;
	struct fs_sock *mine = NULL; /* what this thread last stored at own_fd */

	for (unsigned long i = 0; i < FS_TEST_ITERATIONS; i++) {
		uint64_t r = fs_test_rand(&rng);
		unsigned op = (unsigned)(r % 6);

		if (op < 3) {
			/* shared fd: set / clear / peek */
			unsigned k = (unsigned)((r >> 8) % FS_TEST_SHARED_FDS);
			int fd = fs_test_shared_fd[k];
			struct fs_sock *v = fs_test_sock(&fs_test_shared_obj[(r >> 16) % FS_TEST_SHARED_VALUES]);

			if (op == 0) {
				struct fs_sock *old = fs_fdt_set(fd, v);

				w->installed[k]++;
				if (old) {
					w->removed[k]++;
					if (!fs_test_is_shared_value(old))
						w->bad_set_result++;
				}
			} else if (op == 1) {
				struct fs_sock *seen = fs_fdt_peek(fd);

				/* clear what we just saw: succeeds only if nobody replaced it */
				if (seen && fs_fdt_clear(fd, seen))
					w->removed[k]++;
			} else {
				struct fs_sock *seen = fs_fdt_peek(fd);

				if (seen && !fs_test_is_shared_value(seen))
					w->bad_shared_peek++;
			}
		} else {
			/* own fd: only this thread writes it */
			struct fs_sock *v = fs_test_sock(&fs_test_own_obj[w->index][(r >> 16) % FS_TEST_OWN_VALUES]);
			struct fs_sock *seen = fs_fdt_peek(w->own_fd);

			if (seen != mine || (seen && !fs_test_is_own_value(w->index, seen)))
				w->bad_own_peek++;
			if (op == 3) {
				if (fs_fdt_set(w->own_fd, v) != mine)
					w->bad_set_result++;
				mine = v;
			} else if (op == 4) {
				/* a stale pointer must not clear it */
				if (fs_fdt_clear(w->own_fd, fs_test_sock(&fs_test_foreign_obj)))
					w->bad_clear_result++;
				if (mine && fs_fdt_clear(w->own_fd, mine) != 1)
					w->bad_clear_result++;
				mine = NULL;
			}
		}
	}
	if (fs_fdt_peek(w->own_fd) != mine)
		w->bad_own_peek++;
	fs_fdt_clear(w->own_fd, mine);
	return NULL;
}

static void fs_test_bounds(void)
{
	static char a, b;
	struct fs_sock *sa = fs_test_sock(&a), *sb = fs_test_sock(&b);
	int top = (int)fs_fdt_size - 1;

	CHECK(fs_fdt != NULL);
	CHECK(fs_fdt_size >= 65536);

	CHECK(fs_fdt_peek(-1) == NULL);
	CHECK(fs_fdt_peek(INT_MIN) == NULL);
	CHECK(fs_fdt_peek((int)fs_fdt_size) == NULL);
	CHECK(fs_fdt_peek(INT_MAX) == NULL);
	CHECK(fs_fdt_set(-1, sa) == NULL);
	CHECK(fs_fdt_set((int)fs_fdt_size, sa) == NULL);
	CHECK(fs_fdt_set(INT_MAX, sa) == NULL);
	CHECK(fs_fdt_peek((int)fs_fdt_size) == NULL);
	CHECK(fs_fdt_clear(-1, sa) == 0);
	CHECK(fs_fdt_clear(INT_MAX, NULL) == 0);

	/* a fresh table is empty */
	CHECK(fs_fdt_peek(0) == NULL);
	CHECK(fs_fdt_peek(7) == NULL);
	CHECK(fs_fdt_peek(top) == NULL);

	/* set returns what it replaced */
	CHECK(fs_fdt_set(7, sa) == NULL);
	CHECK(fs_fdt_peek(7) == sa);
	CHECK(fs_fdt_set(7, sb) == sa);
	CHECK(fs_fdt_peek(7) == sb);
	CHECK(fs_fdt_set(7, sb) == sb);
	CHECK(fs_fdt_peek(8) == NULL); /* neighbours untouched */
	CHECK(fs_fdt_peek(6) == NULL);

	/* clear only when the expected pointer matches */
	CHECK(fs_fdt_clear(7, sa) == 0);
	CHECK(fs_fdt_peek(7) == sb);
	CHECK(fs_fdt_clear(7, NULL) == 0); /* NULL is not "whatever is there" */
	CHECK(fs_fdt_peek(7) == sb);
	CHECK(fs_fdt_clear(7, sb) == 1);
	CHECK(fs_fdt_peek(7) == NULL);
	CHECK(fs_fdt_clear(7, sb) == 0); /* already gone */
	/* set(NULL) also clears, returning the old entry */
	CHECK(fs_fdt_set(7, sa) == NULL);
	CHECK(fs_fdt_set(7, NULL) == sa);
	CHECK(fs_fdt_peek(7) == NULL);

	/* the last slot works like any other */
	CHECK(fs_fdt_set(top, sa) == NULL);
	CHECK(fs_fdt_peek(top) == sa);
	CHECK(fs_fdt_clear(top, sa) == 1);
	CHECK(fs_fdt_peek(top) == NULL);
	CHECK(fs_fdt_peek(0) == NULL);

	/* idempotent: a second init keeps the same table and its entries */
	{
		struct fs_sock **table = fs_fdt;
		size_t size = fs_fdt_size;

		CHECK(fs_fdt_set(3, sa) == NULL);
		CHECK(fs_fdt_init() == 0);
		CHECK(fs_fdt == table);
		CHECK(fs_fdt_size == size);
		CHECK(fs_fdt_peek(3) == sa);
		CHECK(fs_fdt_clear(3, sa) == 1);
	}
}

static void fs_test_threads(void)
{
	struct fs_test_worker workers[FS_TEST_THREADS] = { 0 };
	pthread_t tids[FS_TEST_THREADS];
	unsigned long bad_shared = 0, bad_own = 0, bad_set = 0, bad_clear = 0;
	int started = 0;

	/* shared fds include both ends of the table */
	fs_test_shared_fd[0] = 0;
	fs_test_shared_fd[1] = 5;
	fs_test_shared_fd[2] = 40000;
	fs_test_shared_fd[3] = (int)fs_fdt_size - 1;

	for (unsigned t = 0; t < FS_TEST_THREADS; t++) {
		workers[t].index = t;
		workers[t].seed = 0x9e3779b97f4a7c15ull * (t + 1) + 12345;
		/* neighbouring slots, some in the same cache line as each other */
		workers[t].own_fd = 100 + (int)t;
		if (pthread_create(&tids[t], NULL, fs_test_worker_main, &workers[t]) == 0)
			started++;
	}
	CHECK(started == FS_TEST_THREADS);
	for (int t = 0; t < started; t++)
		pthread_join(tids[t], NULL);

	for (int t = 0; t < started; t++) {
		bad_shared += workers[t].bad_shared_peek;
		bad_own += workers[t].bad_own_peek;
		bad_set += workers[t].bad_set_result;
		bad_clear += workers[t].bad_clear_result;
	}
	if (bad_shared || bad_own || bad_set || bad_clear)
		fprintf(stderr, "torn/foreign shared peeks %lu, own-fd mismatches %lu, bad set results %lu, "
				"bad clear results %lu\n",
			bad_shared, bad_own, bad_set, bad_clear);
	CHECK(bad_shared == 0);
	CHECK(bad_own == 0);
	CHECK(bad_set == 0);
	CHECK(bad_clear == 0);

	/* Exact accounting per shared fd: installs - removals = what is left. */
	for (unsigned k = 0; k < FS_TEST_SHARED_FDS; k++) {
		long installed = 0, removed = 0;
		struct fs_sock *left = fs_fdt_peek(fs_test_shared_fd[k]);

		for (int t = 0; t < started; t++) {
			installed += workers[t].installed[k];
			removed += workers[t].removed[k];
		}
		CHECK(installed > 1000); /* the mix really exercised every shared fd */
		CHECK(left == NULL || fs_test_is_shared_value(left));
		if (installed - removed != (left ? 1 : 0))
			fprintf(stderr, "fd %d: %ld installed, %ld removed, %s left\n", fs_test_shared_fd[k],
				installed, removed, left ? "one" : "none");
		CHECK(installed - removed == (left ? 1 : 0));
		if (left)
			CHECK(fs_fdt_clear(fs_test_shared_fd[k], left) == 1);
	}
	for (unsigned t = 0; t < FS_TEST_THREADS; t++)
		CHECK(fs_fdt_peek(100 + (int)t) == NULL);
}

int main(void)
{
	fs_real_init();
	fs_params_load();
	fs_log_init();

	CHECK(fs_fdt_init() == 0);
	if (!fs_fdt)
		return fs_check_done();
	fs_test_bounds();
	fs_test_threads();
	return fs_check_done();
}
