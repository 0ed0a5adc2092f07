/* SPDX-License-Identifier: MIT */
/*
 * Registered bounce-buffer pools. A pool hands out fixed-size buffers carved
 * from slabs that are registered with the rail's domain once, when the slab
 * is made, with a unique requested key (shm and tcp reject a reused one);
 * every buffer carries its descriptor so providers that need FI_MR_LOCAL
 * (efa) get one on every operation. Pools only grow, up to their limit and
 * the process-wide FABSOCK_POOL_MAX_MB; a slab is returned when the rail
 * closes.
 *
 * A buffer is also the operation context: struct fi_context2 comes first,
 * as FI_CONTEXT/FI_CONTEXT2 providers require.
 */
#ifndef FS_CORE_POOL_H
#define FS_CORE_POOL_H

#include <stdint.h>

#include "core/fabric.h"

struct fs_stream;
struct fs_pool;

/* FS_BUF_RX_COPY: a data message copied out of a shared receive buffer into
 * memory of its own (rxq.c, "shared receives"); it belongs to no pool. */
enum fs_buf_role { FS_BUF_RX_DATA = 1, FS_BUF_RX_CTRL = 2, FS_BUF_TX = 3, FS_BUF_RX_COPY = 4 };

/* A receive buffer holding an FS_MSG_PULL announcement and its payload. */
enum fs_pull_state {
	FS_PULL_NONE = 0,    /* the payload still waits at the sender */
	FS_PULL_POSTED = 1,  /* a receive for it is posted (into the app or this buffer) */
	FS_PULL_DONE = 2,    /* it arrived */
	FS_PULL_FAILED = 3,  /* the receive ended with an error */
};

struct fs_buf {
	struct fi_context2 ctx; /* must stay first */
	struct fs_buf *next;    /* free list or queue link */
	struct fs_pool *pool;
	void *desc;
	uint8_t *mem; /* registered: wire header, then payload */
	uint32_t cap; /* bytes at mem */
	uint32_t len; /* payload bytes */
	uint32_t off; /* rx: payload bytes already read by the application */
	uint32_t seq;
	uint8_t role;  /* enum fs_buf_role */
	uint8_t kind;  /* enum fs_msg_kind */
	uint8_t posted;
	uint8_t pull;      /* rx FS_MSG_PULL entry: enum fs_pull_state */
	uint8_t announced; /* tx: its FS_MSG_PULL went out; the payload goes (went) separately */
	uint8_t held;      /* rx data: a shared receive kept in a stream's queue */
	uint8_t own_mem;   /* rx copy: MEM was allocated apart from the buffer (free it) */
	uint8_t warm;      /* rx data: MEM and DESC are the rail's warm bounce memory, lent by
			    * fs_engine_pull and taken back by fs_engine_repost (rxq.c) */
	uint8_t in_pool;   /* on its pool's free list (fs_pool_put refuses it a second time) */
	uint8_t rail;      /* the rail of its stream (struct fs_stream's rail_ep) it is sent on
			    * (tx) or came by (rx): 0, the home, unless striped */
	uint64_t pull_tag; /* rx FS_MSG_PULL entry: its payload's tag */
	struct fs_stream *stream; /* tx: the sending stream; rx: the owner (NULL: a discard) */
};

struct fs_slab;

struct fs_pool {
	struct fs_rail *rail;
	uint32_t buf_cap;
	uint8_t role;
	unsigned per_slab;
	unsigned total, nfree, max;
	struct fs_buf *free;
	struct fs_slab *slabs;
};

void fs_pool_init(struct fs_pool *pool, struct fs_rail *rail, uint8_t role, uint32_t buf_cap,
		  unsigned per_slab, unsigned max);
/* Takes a buffer, growing by a slab if none is free. NULL when the pool or
 * the process-wide limit is reached, or registration failed. */
struct fs_buf *fs_pool_get(struct fs_pool *pool);
void fs_pool_put(struct fs_buf *buf);
/* Clears the owner of every buffer of POOL still lent out to OWNER (its
 * completion comes after the owner is freed: the handlers take a NULL
 * stream as "nobody's"); returns how many. Walks every slab: for the rare
 * stream freed with sends still posted. */
unsigned fs_pool_disown(struct fs_pool *pool, const void *owner);
void fs_pool_fini(struct fs_pool *pool);

/* Appends BUF to the singly linked queue HEAD..TAIL (next links). */
static inline void fs_buf_append(struct fs_buf **head, struct fs_buf **tail, struct fs_buf *buf)
{
	buf->next = NULL;
	if (*tail)
		(*tail)->next = buf;
	else
		*head = buf;
	*tail = buf;
}

/* Registered bytes in all pools of this process. */
extern uint64_t fs_pool_bytes;

#endif
