/* SPDX-License-Identifier: MIT */
/*
 * Test of core/pool.c on a real shm rail (this process only, no peer; a
 * fabric, so labelled engine, not unit):
 * pools grow a slab at a time up to their limit and no further; buffers are
 * distinct, do not overlap, have the rounded-up capacity, are 64-byte
 * aligned and carry their slab's descriptor; get after put reuses; a buffer
 * given back twice or while posted is refused (pool_misput); the
 * total/nfree counts and the process-wide fs_pool_bytes follow every step
 * and return to where they were after fs_pool_fini; FABSOCK_POOL_MAX_MB stops
 * growth at the byte limit; closing the rail leaves no shm region of this
 * process in /dev/shm. Exits 77 (skip) only if the shm provider is not usable.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "core/fabric.h"
#include "core/pool.h"
#include "core/stats.h"
#include "preload/real.h"
#include "tests/unit/check.h"

#define FS_TEST_CAP_ASKED 1000u
#define FS_TEST_CAP_ROUNDED 1024u
#define FS_TEST_PER_SLAB 4u
#define FS_TEST_MAX 10u

/* Counts /dev/shm entries named fabsock-*-<our pid>-*. */
static int fs_test_shm_regions_of_this_process(void)
{
	char needle[32];
	DIR *dir = opendir("/dev/shm");
	struct dirent *de;
	int found = 0;

	if (!dir)
		return -1;
	snprintf(needle, sizeof(needle), "-%d-", (int)getpid());
	while ((de = readdir(dir)))
		if (strncmp(de->d_name, "fabsock-", 8) == 0 && strstr(de->d_name, needle))
			found++;
	closedir(dir);
	return found;
}

static int fs_test_by_mem(const void *a, const void *b)
{
	const struct fs_buf *x = *(struct fs_buf *const *)a, *y = *(struct fs_buf *const *)b;

	return x->mem < y->mem ? -1 : x->mem > y->mem;
}

static void fs_test_small_pool(struct fs_rail *rail)
{
	struct fs_pool pool;
	struct fs_buf *bufs[FS_TEST_MAX], *sorted[FS_TEST_MAX], *buf;
	unsigned totals[FS_TEST_MAX];
	uint64_t bytes_before = fs_pool_bytes;
	uint64_t slab_bytes = 4096; /* 4 x 1024, rounded to a page */
	uint64_t last_slab_bytes = 4096; /* 2 x 1024, rounded to a page */
	int overlap = 0, misaligned = 0, bad_fields = 0, desc_mismatch = 0, scribbled = 0;

	fs_pool_init(&pool, rail, FS_BUF_RX_DATA, FS_TEST_CAP_ASKED, FS_TEST_PER_SLAB, FS_TEST_MAX);
	CHECK(pool.buf_cap == FS_TEST_CAP_ROUNDED);
	CHECK(pool.total == 0 && pool.nfree == 0 && pool.free == NULL && pool.slabs == NULL);
	CHECK(fs_pool_bytes == bytes_before); /* init registers nothing */

	/* Growth happens a slab at a time: 4, 8, then the last 2 up to max. */
	for (unsigned i = 0; i < FS_TEST_MAX; i++) {
		bufs[i] = fs_pool_get(&pool);
		totals[i] = pool.total;
		CHECK(bufs[i] != NULL);
		if (!bufs[i])
			return;
		CHECK(pool.nfree == pool.total - (i + 1));
	}
	CHECK(totals[0] == 4 && totals[3] == 4);
	CHECK(totals[4] == 8 && totals[7] == 8);
	CHECK(totals[8] == 10 && totals[9] == 10);
	CHECK(fs_pool_bytes == bytes_before + 2 * slab_bytes + last_slab_bytes);

	/* Beyond max: NULL, nothing changes. */
	CHECK(fs_pool_get(&pool) == NULL);
	CHECK(fs_pool_get(&pool) == NULL);
	CHECK(pool.total == FS_TEST_MAX && pool.nfree == 0);
	CHECK(fs_pool_bytes == bytes_before + 2 * slab_bytes + last_slab_bytes);

	for (unsigned i = 0; i < FS_TEST_MAX; i++) {
		buf = bufs[i];
		if (buf->cap < FS_TEST_CAP_ASKED || buf->cap % 64 || buf->cap != pool.buf_cap)
			bad_fields++;
		if ((uintptr_t)buf->mem % 64)
			misaligned++;
		if (buf->pool != &pool || buf->role != FS_BUF_RX_DATA || buf->next || buf->len || buf->off ||
		    buf->seq || buf->kind || buf->posted || buf->stream)
			bad_fields++;
		/* fi_context2 must be first: the buffer is the operation context */
		if ((void *)&buf->ctx != (void *)buf)
			bad_fields++;
		/* Buffers of one slab (got between two growths) share its descriptor,
		 * which a provider needing FI_MR_LOCAL must supply. */
		if (rail->mr_local && !buf->desc)
			desc_mismatch++;
		if (i % FS_TEST_PER_SLAB && buf->desc != bufs[i - i % FS_TEST_PER_SLAB]->desc)
			desc_mismatch++;
		sorted[i] = buf;
	}
	CHECK(bad_fields == 0);
	CHECK(misaligned == 0);
	CHECK(desc_mismatch == 0);

	/* Distinct and non-overlapping: sort by address, neighbours must not meet. */
	qsort(sorted, FS_TEST_MAX, sizeof(sorted[0]), fs_test_by_mem);
	for (unsigned i = 1; i < FS_TEST_MAX; i++)
		if (sorted[i - 1]->mem + sorted[i - 1]->cap > sorted[i]->mem || sorted[i - 1] == sorted[i])
			overlap++;
	CHECK(overlap == 0);

	/* Every byte of every buffer is usable and private to it (ASan sees
	 * any write past the slab). */
	for (unsigned i = 0; i < FS_TEST_MAX; i++)
		memset(bufs[i]->mem, (int)(i + 1), bufs[i]->cap);
	for (unsigned i = 0; i < FS_TEST_MAX; i++)
		for (uint32_t j = 0; j < bufs[i]->cap; j++)
			if (bufs[i]->mem[j] != (uint8_t)(i + 1))
				scribbled++;
	CHECK(scribbled == 0);

	/* put then get reuses the buffer (and resets its per-use fields) */
	bufs[5]->len = 77;
	bufs[5]->off = 3;
	bufs[5]->seq = 9;
	bufs[5]->kind = 1;
	bufs[5]->posted = 2; /* an inject: done at its post */
	fs_pool_put(bufs[5]);
	CHECK(pool.nfree == 1 && pool.total == FS_TEST_MAX);
	/* given back a second time, or while the provider holds it (posted
	 * 1): refused and counted, never on the free list twice */
	{
		uint64_t misput = fs_stats.pool_misput;

		fs_pool_put(bufs[5]);
		CHECK(pool.nfree == 1 && pool.free == bufs[5] && bufs[5]->next == NULL);
		bufs[6]->posted = 1;
		fs_pool_put(bufs[6]);
		CHECK(pool.nfree == 1 && pool.free == bufs[5]);
		CHECK(fs_stats.pool_misput == misput + 2);
		bufs[6]->posted = 0;
	}
	buf = fs_pool_get(&pool);
	CHECK(buf == bufs[5]);
	CHECK(buf && !buf->len && !buf->off && !buf->seq && !buf->kind && !buf->posted && !buf->next);
	CHECK(pool.nfree == 0 && pool.total == FS_TEST_MAX);
	CHECK(fs_pool_get(&pool) == NULL);

	/* Return everything: nfree == total, and no new slab on the next gets. */
	for (unsigned i = 0; i < FS_TEST_MAX; i++)
		fs_pool_put(bufs[i]);
	CHECK(pool.nfree == FS_TEST_MAX && pool.total == FS_TEST_MAX);
	for (unsigned i = 0; i < FS_TEST_MAX; i++) {
		struct fs_buf *again = fs_pool_get(&pool);
		int known = 0;

		for (unsigned j = 0; j < FS_TEST_MAX; j++)
			known |= again == bufs[j];
		CHECK(known);
	}
	CHECK(pool.nfree == 0 && pool.total == FS_TEST_MAX);
	CHECK(fs_pool_bytes == bytes_before + 2 * slab_bytes + last_slab_bytes);

	fs_pool_fini(&pool);
	CHECK(pool.total == 0 && pool.nfree == 0 && pool.slabs == NULL && pool.free == NULL);
	CHECK(fs_pool_bytes == bytes_before);
}

/* A pool of zero max never grows; per_slab 0 means 1. */
static void fs_test_degenerate(struct fs_rail *rail)
{
	struct fs_pool pool;
	uint64_t bytes_before = fs_pool_bytes;
	struct fs_buf *a, *b;

	fs_pool_init(&pool, rail, FS_BUF_TX, 64, 8, 0);
	CHECK(fs_pool_get(&pool) == NULL);
	CHECK(pool.total == 0 && fs_pool_bytes == bytes_before);
	fs_pool_fini(&pool);

	fs_pool_init(&pool, rail, FS_BUF_RX_CTRL, 1, 0, 2);
	CHECK(pool.per_slab == 1);
	CHECK(pool.buf_cap == 64);
	a = fs_pool_get(&pool);
	CHECK(a && pool.total == 1 && a->role == FS_BUF_RX_CTRL);
	b = fs_pool_get(&pool);
	CHECK(b && pool.total == 2 && b != a);
	CHECK(fs_pool_get(&pool) == NULL);
	CHECK(fs_pool_bytes == bytes_before + 2 * 4096);
	fs_pool_fini(&pool);
	CHECK(fs_pool_bytes == bytes_before);
}

/* FABSOCK_POOL_MAX_MB=4: 256 KiB buffers two to a slab stop at 4 MiB of
 * registered memory in this process, whatever the pool's own max says. */
static void fs_test_process_limit(struct fs_rail *rail)
{
	const uint32_t cap = 256u << 10;
	const uint64_t slab = 2ull * cap, limit = 4ull << 20;
	struct fs_pool pool, second;
	uint64_t bytes_before;
	unsigned got = 0, expect;

	setenv("FABSOCK_POOL_MAX_MB", "4", 1);
	CHECK(fs_params_load() == 0);
	CHECK(fs_params.pool_max_mb == 4);
	bytes_before = fs_pool_bytes;
	CHECK(bytes_before < limit);
	expect = (unsigned)((limit - bytes_before) / slab) * 2;

	fs_pool_init(&pool, rail, FS_BUF_TX, cap, 2, 1000);
	for (unsigned i = 0; i < 1000; i++) {
		struct fs_buf *buf = fs_pool_get(&pool);

		if (!buf)
			break;
		buf->mem[0] = 1;
		buf->mem[cap - 1] = 2;
		got++;
	}
	printf("pool limit: %u buffers of %u KiB (%llu KiB registered) before FABSOCK_POOL_MAX_MB=4 stopped growth\n",
	       got, cap >> 10, (unsigned long long)(fs_pool_bytes >> 10));
	CHECK(got == expect);
	CHECK(got == pool.total && pool.nfree == 0);
	CHECK(fs_pool_bytes <= limit);
	CHECK(fs_pool_bytes + slab > limit); /* stopped near, not far below, the limit */
	CHECK(fs_pool_bytes == bytes_before + (uint64_t)got * cap);

	/* The limit is process-wide: another pool gets nothing more... */
	fs_pool_init(&second, rail, FS_BUF_TX, 4096, 1, 10);
	CHECK(fs_pool_get(&second) == NULL);
	CHECK(second.total == 0);
	/* ...until the first gives its slabs back. */
	fs_pool_fini(&pool);
	CHECK(fs_pool_bytes == bytes_before);
	CHECK(fs_pool_get(&second) != NULL);
	fs_pool_fini(&second);
	CHECK(fs_pool_bytes == bytes_before);

	unsetenv("FABSOCK_POOL_MAX_MB");
	fs_params_load();
}

int main(void)
{
	struct fs_rail rail;
	char why[256] = "";
	uint64_t bytes_start;
	int ret;

	fs_real_init();
	fs_params_load();
	fs_log_init();

	ret = fs_rail_open(&rail, FS_PROV_SHM, NULL, 0, why, sizeof(why));
	if (ret && strstr(why, "not usable"))
		return fs_check_skip(why);
	if (ret)
		fprintf(stderr, "fs_rail_open(shm) failed: %d: %s\n", ret, why);
	CHECK(ret == 0);
	if (ret)
		return fs_check_done();
	printf("shm rail: addr %s, mr_local %d, inject %zu, tx %zu, rx %zu\n", (const char *)rail.addr,
	       rail.mr_local, rail.inject_size, rail.tx_depth, rail.rx_depth);
	CHECK(fs_test_shm_regions_of_this_process() >= 1);

	bytes_start = fs_pool_bytes;
	fs_test_small_pool(&rail);
	fs_test_degenerate(&rail);
	fs_test_process_limit(&rail);
	CHECK(fs_pool_bytes == bytes_start);

	fs_rail_close(&rail);
	CHECK(rail.info == NULL);
	fs_rail_close(&rail); /* a closed rail closes again harmlessly */
	ret = fs_test_shm_regions_of_this_process();
	if (ret)
		fprintf(stderr, "%d shm region(s) of pid %d left in /dev/shm after fs_rail_close\n", ret,
			(int)getpid());
	CHECK(ret == 0);
	return fs_check_done();
}
