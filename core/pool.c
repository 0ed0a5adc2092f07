/* SPDX-License-Identifier: MIT */
/*
 * Registered bounce-buffer pools (see pool.h). Slabs are page aligned and
 * registered as one region; the buffer headers live outside the registered
 * memory so the provider never sees them.
 */
#include "core/pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "config/log.h"
#include "config/params.h"
#include "core/stats.h"

struct fs_slab {
	struct fs_slab *next;
	struct fid_mr *mr;
	void *mem;
	size_t bytes;
	unsigned count; /* bufs[] */
	struct fs_buf bufs[];
};

uint64_t fs_pool_bytes;

void fs_pool_init(struct fs_pool *pool, struct fs_rail *rail, uint8_t role, uint32_t buf_cap,
		  unsigned per_slab, unsigned max)
{
	memset(pool, 0, sizeof(*pool));
	pool->rail = rail;
	pool->role = role;
	pool->buf_cap = (buf_cap + 63u) & ~63u;
	pool->per_slab = per_slab ? per_slab : 1;
	pool->max = max;
}

/* Providers that pin memory (efa) are bound by RLIMIT_MEMLOCK; say so once,
 * clearly, instead of failing registrations one by one. */
static int fs_pool_check_memlock(struct fs_pool *pool, size_t bytes)
{
	struct rlimit lim;

	if (pool->rail->kind != FS_PROV_EFA)
		return 0;
	if (getrlimit(RLIMIT_MEMLOCK, &lim) || lim.rlim_cur == RLIM_INFINITY)
		return 0;
	if (fs_pool_bytes + bytes <= lim.rlim_cur)
		return 0;
	FS_WARN_ONCE("RLIMIT_MEMLOCK is %llu KiB but fabsock needs %llu KiB of pinned buffers; "
		     "raise it (ulimit -l) or lower FABSOCK_WINDOW/FABSOCK_CHUNK_SIZE",
		     (unsigned long long)lim.rlim_cur / 1024,
		     (unsigned long long)(fs_pool_bytes + bytes) / 1024);
	return -ENOMEM;
}

static int fs_pool_grow(struct fs_pool *pool)
{
	unsigned n = pool->per_slab;
	size_t bytes;
	struct fs_slab *slab;

	if (pool->total + n > pool->max)
		n = pool->max - pool->total;
	if (!n)
		return -ENOSPC;
	bytes = (size_t)n * pool->buf_cap;
	bytes = (bytes + 4095) & ~(size_t)4095;
	if (fs_pool_bytes + bytes > fs_params.pool_max_mb << 20) {
		FS_WARN_ONCE("buffer pools reached FABSOCK_POOL_MAX_MB=%llu; new streams stay on TCP",
			     (unsigned long long)fs_params.pool_max_mb);
		return -ENOSPC;
	}
	if (fs_pool_check_memlock(pool, bytes))
		return -ENOMEM;
	slab = calloc(1, sizeof(*slab) + n * sizeof(struct fs_buf));
	if (!slab)
		return -ENOMEM;
	slab->mem = aligned_alloc(4096, bytes);
	if (!slab->mem) {
		free(slab);
		return -ENOMEM;
	}
	slab->bytes = bytes;
	slab->count = n;
	if (fs_rail_mr_reg(pool->rail, slab->mem, bytes, &slab->mr)) {
		FS_WARN_ONCE("registering %zu bytes with the %s rail failed", bytes,
			     fs_fabric_prov_name(pool->rail->kind));
		free(slab->mem);
		free(slab);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < n; i++) {
		struct fs_buf *buf = &slab->bufs[i];

		buf->pool = pool;
		buf->mem = (uint8_t *)slab->mem + (size_t)i * pool->buf_cap;
		buf->cap = pool->buf_cap;
		buf->role = pool->role;
		buf->desc = fi_mr_desc(slab->mr);
		buf->in_pool = 1;
		buf->next = pool->free;
		pool->free = buf;
	}
	slab->next = pool->slabs;
	pool->slabs = slab;
	pool->total += n;
	pool->nfree += n;
	fs_pool_bytes += bytes;
	return 0;
}

struct fs_buf *fs_pool_get(struct fs_pool *pool)
{
	struct fs_buf *buf;

	if (!pool->free && fs_pool_grow(pool))
		return NULL;
	buf = pool->free;
	pool->free = buf->next;
	pool->nfree--;
	buf->next = NULL;
	buf->in_pool = 0;
	buf->len = buf->off = buf->seq = 0;
	buf->kind = 0;
	buf->posted = 0;
	buf->pull = FS_PULL_NONE;
	buf->announced = 0;
	buf->rail = 0;
	buf->stream = NULL;
	return buf;
}

void fs_pool_put(struct fs_buf *buf)
{
	struct fs_pool *pool = buf->pool;

	/* A buffer the provider still owns (a posted send or receive) or one
	 * on the free list already would be handed out to two owners: a
	 * payload overwritten before its reader pulled it. Never: counted,
	 * said once, and kept out of the list (a buffer lost is a smaller
	 * harm than bytes changed). */
	if (__builtin_expect(buf->in_pool || buf->posted == 1, 0)) {
		FS_STAT_INC(pool_misput);
		FS_WARN_ONCE("internal error: a %s buffer was given back %s; kept out of its pool",
			     buf->role == FS_BUF_TX ? "send" : "receive",
			     buf->in_pool ? "twice" : "while the provider still held it");
		return;
	}
	buf->in_pool = 1;
	buf->stream = NULL;
	buf->next = pool->free;
	pool->free = buf;
	pool->nfree++;
}

unsigned fs_pool_disown(struct fs_pool *pool, const void *owner)
{
	unsigned n = 0;

	for (struct fs_slab *slab = pool->slabs; slab; slab = slab->next) {
		for (unsigned i = 0; i < slab->count; i++)
			if (!slab->bufs[i].in_pool && slab->bufs[i].stream == owner) {
				slab->bufs[i].stream = NULL;
				n++;
			}
	}
	return n;
}

void fs_pool_fini(struct fs_pool *pool)
{
	struct fs_slab *slab, *next;

	for (slab = pool->slabs; slab; slab = next) {
		next = slab->next;
		fi_close(&slab->mr->fid);
		fs_pool_bytes -= slab->bytes;
		free(slab->mem);
		free(slab);
	}
	pool->slabs = NULL;
	pool->free = NULL;
	pool->total = pool->nfree = 0;
}
