/* SPDX-License-Identifier: MIT */
/*
 * The engine (see engine.h for the flow-control rules): lifecycle, rails,
 * the stream table, posting receives and sends, and completion processing.
 * The application-facing operations on a stream (send, recv, wait, close)
 * are in stream.c.
 */
#include "core/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "core/bell.h"
#include "core/guard.h"
#include "core/handback.h"
#include "core/sigs.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/stream_internal.h"
#include "preload/real.h"

#define FS_CTRL_BUF 64u
/* Control receives a rail keeps posted, shared by all its streams: a CREDIT
 * is handled and its buffer re-posted in the progress round it lands in. */
#define FS_CTRL_POSTED 64u
#define FS_CQ_BATCH 16

static pthread_mutex_t fs_engine_create_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fs_engine *fs_engine_cur;
/* The process is ending and its engine has been shut down: no new streams. */
static int fs_engine_ended;

/* ---- small helpers ------------------------------------------------------ */

pid_t fs_pid_cache;

/* Called by fs_core_init and first thing in a forked child: the cache is
 * never 0 after start-up, so a vfork child (which runs no fork handlers and
 * shares this memory with its parent) never writes its own pid into it. */
void fs_self_pid_refresh(void)
{
	__atomic_store_n(&fs_pid_cache, getpid(), __ATOMIC_RELAXED);
}

pid_t fs_self_pid_slow(void)
{
	pid_t pid = getpid();

	__atomic_store_n(&fs_pid_cache, pid, __ATOMIC_RELAXED);
	return pid;
}

uint64_t fs_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fs_read_host_id(uint8_t out[16])
{
	char text[64] = "";
	int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
	unsigned j = 0;

	memset(out, 0, 16);
	if (fd >= 0) {
		ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
		(void)n;
		fs_real.close(fd);
	}
	for (unsigned i = 0; text[i] && j < 32; i++) {
		char c = text[i];
		int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;

		if (v < 0)
			continue;
		out[j / 2] |= (uint8_t)(v << ((j % 2) ? 0 : 4));
		j++;
	}
}

struct fs_engine *fs_engine_peek(void)
{
	struct fs_engine *e = __atomic_load_n(&fs_engine_cur, __ATOMIC_ACQUIRE);

	return e && e->pid == fs_self_pid() ? e : NULL;
}

/* The eventfd deep sleepers wait on; internal: an application's close-all
 * loop must not free the number for a file we would then write to. */
static void fs_engine_deep_fd_open(struct fs_engine *e)
{
	int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

	e->deep_fd = fd >= 0 ? fs_internal_fd(fd) : -1;
}

struct fs_engine *fs_engine_get(void)
{
	struct fs_engine *e = fs_engine_peek();

	if (e)
		return e;
	pthread_mutex_lock(&fs_engine_create_lock);
	e = fs_engine_peek();
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (e) {
			pthread_mutex_init(&e->lock, NULL);
			e->pid = fs_self_pid();
			e->next_id = 1;
			/* made with the engine, not at the first deep sleep: a
			 * sleepy process sleeps deeply within its first requests,
			 * and its descriptors stay what they were after the first
			 * connection (e2e_perrequest) */
			e->deep_fd = -1;
			fs_engine_deep_fd_open(e);
			e->active_ns = fs_now_ns();
			fs_dlist_init(&e->pending);
			fs_dlist_init(&e->unpulled);
			fs_dlist_init(&e->sleeping);
			fs_dlist_init(&e->switching);
			fs_dlist_init(&e->credit_retry);
			fs_dlist_init(&e->grown);
			fs_dlist_init(&e->starved);
			e->budget.cap = (uint64_t)fs_params.rx_budget_mb << 20;
			fs_read_host_id(e->host_id);
			if (fs_handback_page_create(e))
				FS_WARN("cannot create the hand-back page: processes forked later cannot use "
					"this one's offloaded sockets");
			__atomic_store_n(&fs_engine_cur, e, __ATOMIC_RELEASE);
		}
	}
	pthread_mutex_unlock(&fs_engine_create_lock);
	/* none after the process's end has been handled (fs_engine_shutdown) */
	return __atomic_load_n(&fs_engine_ended, __ATOMIC_ACQUIRE) ? NULL : e;
}

void fs_engine_forget_after_fork(void)
{
	/* The child must not close, progress or free the parent's objects: they
	 * stay allocated (and mapped) but unreachable. */
	struct fs_engine *e = __atomic_load_n(&fs_engine_cur, __ATOMIC_ACQUIRE);

	if (e && e->pid != getpid()) {
		__atomic_store_n(&fs_engine_cur, NULL, __ATOMIC_RELEASE);
		pthread_mutex_init(&fs_engine_create_lock, NULL);
	}
}

/* shm provider calls are announced to the service thread, which releases a
 * lock a dead process left taken under one that does not return (fabric.h).
 * PID: the peer whose region a send enters; -1 for calls on our own. */
#define FS_PROV_ENTER(er, pid)                                      \
	do {                                                        \
		if ((er)->rail.kind == FS_PROV_SHM)                 \
			fs_prov_call_begin((pid) ? (pid) : -1);     \
	} while (0)
#define FS_PROV_LEAVE(er)                                \
	do {                                             \
		if ((er)->rail.kind == FS_PROV_SHM)      \
			fs_prov_call_end();              \
	} while (0)

unsigned fs_fault_post_eagain;

/* ---- receives ---------------------------------------------------------- */

static int fs_post_recv(struct fs_engine_rail *er, struct fs_buf *buf)
{
	uint64_t cls = buf->role == FS_BUF_RX_CTRL ? FS_CLASS_CTRL : FS_CLASS_DATA;
	ssize_t ret;

	buf->stream = NULL;
	buf->len = buf->off = 0;
	buf->kind = 0;
	buf->pull = FS_PULL_NONE;
	buf->held = 0;
	if (!er->open)
		return -FI_ECANCELED; /* closed at exit while a thread still ran */
	FS_GUARD_ENTER();
	FS_PROV_ENTER(er, -1);
	for (int tries = 0; tries < 1000; tries++) {
		/* Each class is a queue of its own (core/wire.h): data
		 * untagged, control tagged with its one tag, nothing ignored. */
		if (cls == FS_CLASS_CTRL)
			ret = fi_trecv(er->rail.ep, buf->mem, buf->cap, buf->desc, FI_ADDR_UNSPEC, FS_TAG_CTRL_ALL,
				       0, buf);
		else
			ret = fi_recv(er->rail.ep, buf->mem, buf->cap, buf->desc, FI_ADDR_UNSPEC, buf);
		if (ret != -FI_EAGAIN)
			break;
		/* the receive queue is momentarily full: let the provider drain */
		(void)fi_cq_read(er->rail.cq, NULL, 0);
	}
	FS_PROV_LEAVE(er);
	FS_GUARD_LEAVE();
	if (ret) {
		FS_WARN_ONCE("posting a receive on the %s rail failed: %s",
			     fs_fabric_prov_name(er->rail.kind), fs_fi.strerror((int)-ret));
		return (int)ret;
	}
	buf->posted = 1;
	if (cls == FS_CLASS_CTRL)
		er->posted_ctrl++;
	else
		er->posted_data++;
	return 0;
}

/* A catch-all receive completed (or was cancelled): it left the provider. */
static void fs_recv_landed(struct fs_engine_rail *er, struct fs_buf *buf)
{
	buf->posted = 0;
	if (buf->role == FS_BUF_RX_CTRL)
		er->posted_ctrl--;
	else
		er->posted_data--;
}

/* Posts receives from POOL until POSTED reaches TARGET. Returns 0 or
 * -ENOSPC (pool or memory limit) / -EIO. */
static int fs_post_more(struct fs_engine_rail *er, struct fs_pool *pool, unsigned *posted, unsigned target)
{
	while (*posted < target) {
		struct fs_buf *buf = fs_pool_get(pool);

		if (!buf)
			return -ENOSPC;
		if (fs_post_recv(er, buf)) {
			fs_pool_put(buf);
			return -EIO;
		}
	}
	return 0;
}

/* How many data receives the rail keeps posted now: a window's worth per
 * stream, up to RX_POSTED (clamped to the provider's receive queue). */
static unsigned fs_data_want(const struct fs_engine_rail *er)
{
	uint64_t want = ((uint64_t)er->streams + 1) * (unsigned)fs_params.window;

	return want < er->data_target ? (unsigned)want : er->data_target;
}

/* A receive buffer the engine or a reader is done with: a copy is freed, a
 * shared data receive goes back to the provider while the rail wants it
 * (else to its pool), a control receive goes back. */
void fs_engine_repost(struct fs_engine_rail *er, struct fs_buf *buf)
{
	if (buf->role == FS_BUF_RX_COPY) {
		if (buf->own_mem)
			free(buf->mem);
		free(buf);
		return;
	}
	if (buf->held) {
		buf->held = 0;
		er->held_data--;
	}
	if (buf->role == FS_BUF_RX_DATA && er->posted_data >= fs_data_want(er)) {
		fs_pool_put(buf);
		return;
	}
	if (fs_post_recv(er, buf))
		fs_pool_put(buf); /* could not re-post: the buffer leaves the posted set */
}

/* BUF, a shared data receive that just completed with a message for a
 * stream, is about to go into the stream's queue. Returns what goes there:
 * BUF itself (kept, and a fresh receive posted in its place), or a copy of
 * its BYTES in memory of its own (BUF re-posted), once RX_POSTED shared
 * buffers are kept already. NULL: no memory for a copy (BUF re-posted, the
 * message is lost). */
static struct fs_buf *fs_rx_keep(struct fs_engine_rail *er, struct fs_buf *buf, size_t bytes)
{
	struct fs_buf *copy;

	if (er->held_data < er->data_target) {
		buf->held = 1;
		er->held_data++;
		(void)fs_post_more(er, &er->rx_data, &er->posted_data, fs_data_want(er));
		return buf;
	}
	copy = malloc(sizeof(*copy) + bytes);
	if (copy) {
		*copy = *buf;
		copy->pool = NULL;
		copy->desc = NULL;
		copy->mem = (uint8_t *)(copy + 1);
		copy->cap = (uint32_t)bytes;
		copy->role = FS_BUF_RX_COPY;
		copy->held = copy->own_mem = 0;
		copy->next = NULL;
		memcpy(copy->mem, buf->mem, bytes);
		FS_STAT_INC(rx_copied);
	}
	fs_engine_repost(er, buf);
	return copy;
}

/* ---- pulls --------------------------------------------------------------- */

int fs_engine_pull(struct fs_engine_rail *er, struct fs_buf *buf, void *dst)
{
	void *desc = dst ? NULL : buf->desc;
	ssize_t ret = -FI_ECANCELED;

	if (!er->open)
		return -FI_ECANCELED;
	if (!dst && buf->cap < FS_WIRE_MSG_PREFIX + (size_t)buf->len) {
		/* a copied-out announcement gets room for its payload now; only
		 * providers without FI_MR_LOCAL pull (fs_engine_pull_shift) */
		uint8_t *mem = buf->role == FS_BUF_RX_COPY && !er->rail.mr_local
				       ? malloc(FS_WIRE_MSG_PREFIX + (size_t)buf->len)
				       : NULL;

		if (!mem)
			return -FI_ENOMEM;
		memcpy(mem, buf->mem, FS_WIRE_MSG_PREFIX);
		if (buf->own_mem)
			free(buf->mem);
		buf->mem = mem;
		buf->cap = FS_WIRE_MSG_PREFIX + buf->len;
		buf->own_mem = 1;
		desc = NULL;
	}
	if (!dst)
		dst = buf->mem + FS_WIRE_MSG_PREFIX;
	FS_GUARD_ENTER();
	FS_PROV_ENTER(er, -1);
	for (int tries = 0; tries < 1000; tries++) {
		ret = fi_trecv(er->rail.ep, dst, buf->len, desc, FI_ADDR_UNSPEC, buf->pull_tag, 0, buf);
		if (ret != -FI_EAGAIN)
			break;
		(void)fi_cq_read(er->rail.cq, NULL, 0);
	}
	FS_PROV_LEAVE(er);
	FS_GUARD_LEAVE();
	if (!ret) {
		buf->pull = FS_PULL_POSTED;
		er->pulls_posted++;
	}
	return (int)ret;
}

void fs_engine_pull_cancel(struct fs_stream *s, struct fs_buf *buf)
{
	if (!s->erail->open)
		return;
	FS_GUARD_ENTER();
	FS_PROV_ENTER(s->erail, -1);
	(void)fi_cancel(&s->erail->rail.ep->fid, buf);
	FS_PROV_LEAVE(s->erail);
	FS_GUARD_LEAVE();
}

void fs_stream_unpulled_inc(struct fs_engine *e, struct fs_stream *s)
{
	if (!s->unpulled++)
		fs_dlist_add(&e->unpulled, &s->pull_link);
}

void fs_stream_unpulled_dec(struct fs_engine *e, struct fs_stream *s)
{
	if (s->unpulled && !--s->unpulled)
		fs_dlist_del(&s->pull_link);
}

void fs_engine_pull_stale(struct fs_engine *e)
{
	for (struct fs_dlist *n = e->unpulled.next, *next; n != &e->unpulled; n = next) {
		struct fs_stream *s = fs_stream_of(n, pull_link);

		next = n->next; /* pulling them all unlinks S */
		/* the reader consumed nothing, nothing arrived: nobody is reading */
		if (s->pulling || s->credit.freed != s->stale_mark[0] || s->rx_msgs != s->stale_mark[1]) {
			s->stale_mark[0] = s->credit.freed;
			s->stale_mark[1] = s->rx_msgs;
			continue;
		}
		for (struct fs_buf *buf = s->rxq_head; buf; buf = buf->next)
			if (buf->kind == FS_MSG_PULL && buf->pull == FS_PULL_NONE && !fs_engine_pull(s->erail, buf, NULL))
				fs_stream_unpulled_dec(e, s);
	}
}

void fs_engine_rx_discard(struct fs_engine_rail *er, struct fs_buf *buf)
{
	if (buf->kind == FS_MSG_PULL && buf->pull == FS_PULL_POSTED) {
		buf->stream = NULL; /* pulling in the background: reused when it lands */
		return;
	}
	/* An unpulled payload would wait at the provider (and hold its
	 * sender's buffer) forever: receive it, then reuse the buffer. */
	if (buf->kind == FS_MSG_PULL && buf->pull == FS_PULL_NONE) {
		buf->stream = NULL;
		if (!fs_engine_pull(er, buf, NULL))
			return;
	}
	fs_engine_repost(er, buf);
}

/* The receive for a pulled payload completed (ERR: libfabric error). */
static void fs_rx_pulled(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf, size_t bytes, int err)
{
	struct fs_stream *s = buf->stream;

	if (er->pulls_posted)
		er->pulls_posted--;
	if (!s) {
		fs_engine_repost(er, buf); /* a discard */
		return;
	}
	if (err == FI_ECANCELED) {
		buf->pull = FS_PULL_NONE; /* the payload still waits */
		fs_stream_unpulled_inc(e, s);
	} else if (err || bytes != buf->len)
		buf->pull = FS_PULL_FAILED;
	else
		buf->pull = FS_PULL_DONE;
	fs_stream_changed(e, s);
}

/* Opens endpoint ER of KIND (its rail, pools and first receives). */
static int fs_engine_ep_open(struct fs_engine_rail *er, unsigned kind, const struct sockaddr *local, char *why,
			     size_t whylen)
{
	uint32_t chunk = (uint32_t)fs_params.chunk_size;
	int ret;

	ret = fs_rail_open(&er->rail, kind, local, why, whylen);
	if (ret)
		return ret;
	/* from now on a signal that ends the process delivers first */
	fs_sigs_exit_install();
	if (er->rail.max_msg_size && chunk + FS_WIRE_MSG_PREFIX > er->rail.max_msg_size)
		chunk = (uint32_t)(er->rail.max_msg_size - FS_WIRE_MSG_PREFIX);
	/* exactly CHUNK_SIZE (buffers are rounded up): with a power of two,
	 * payloads line up with the application's reads, so that they can be
	 * pulled straight into its buffer */
	er->chunk = chunk;
	/* The provider's receive queue holds the posted data and control
	 * receives; the data pool, those posted and as many kept by streams. */
	er->data_target = (unsigned)fs_params.rx_posted;
	if (er->rail.rx_depth < FS_CTRL_POSTED + 2)
		er->data_target = 1;
	else if (er->data_target > er->rail.rx_depth - FS_CTRL_POSTED - 1)
		er->data_target = (unsigned)er->rail.rx_depth - FS_CTRL_POSTED - 1;
	er->held_data = 0;
	fs_pool_init(&er->rx_data, &er->rail, FS_BUF_RX_DATA, chunk + FS_WIRE_MSG_PREFIX, 16, 2 * er->data_target);
	fs_pool_init(&er->rx_ctrl, &er->rail, FS_BUF_RX_CTRL, FS_CTRL_BUF, 64, FS_CTRL_POSTED);
	fs_pool_init(&er->tx_data, &er->rail, FS_BUF_TX, chunk + FS_WIRE_MSG_PREFIX, 16, 1u << 20);
	fs_pool_init(&er->tx_ctrl, &er->rail, FS_BUF_TX, FS_CTRL_BUF, 64, 1u << 20);
	er->open = true;
	if (fs_post_more(er, &er->rx_ctrl, &er->posted_ctrl,
			 er->rail.rx_depth < FS_CTRL_POSTED + 2 ? 1 : FS_CTRL_POSTED)) {
		snprintf(why, whylen, "%s rail: cannot post receives", fs_fabric_prov_name(kind));
		fs_pool_fini(&er->rx_data);
		fs_pool_fini(&er->rx_ctrl);
		fs_pool_fini(&er->tx_data);
		fs_pool_fini(&er->tx_ctrl);
		fs_rail_close(&er->rail);
		er->open = false;
		er->posted_ctrl = 0;
		return -EIO;
	}
	return 0;
}

int fs_engine_rail(struct fs_engine *e, unsigned kind, const struct sockaddr *local,
		   struct fs_engine_rail **out, char *why, size_t whylen)
{
	struct fs_engine_rail *er;
	int ret;

	if (kind <= FS_PROV_NONE || kind >= FS_PROV_MAX_)
		return -EINVAL;
	er = &e->rails[kind];
	if (!er->open) {
		ret = fs_engine_ep_open(er, kind, local, why, whylen);
		if (ret)
			return ret;
	}
	*out = er;
	return 0;
}

int fs_engine_rail_for(struct fs_engine *e, unsigned kind, const struct sockaddr *local, const void *peer,
		       size_t peer_len, struct fs_engine_rail **out, char *why, size_t whylen)
{
	struct fs_engine_rail *first, *er, *last = NULL;
	int ret = fs_engine_rail(e, kind, local, &first, why, whylen);

	if (ret)
		return ret;
	*out = first;
	/* the peer's endpoint, if one of ours knows it: no new slot, and its
	 * streams keep to one pair of regions */
	for (er = first; er && peer; er = er->next_ep)
		if (fs_rail_av_knows(&er->rail, peer, peer_len)) {
			*out = er;
			return 0;
		}
	for (er = first; er; er = er->next_ep) {
		if (fs_rail_av_room(&er->rail, er->hello_pending)) {
			*out = er;
			return 0;
		}
		last = er;
	}
	/* All full. Refused here, before the HELLO or the ACK names an
	 * endpoint: a client that found no slot after the server's ACK could
	 * only reset the connection. */
	if (last->ep_index + 1 >= FS_ENGINE_MAX_EPS) {
		snprintf(why, whylen, "all %u endpoints of the %s rail hold their most peers (%u each)",
			 FS_ENGINE_MAX_EPS, fs_fabric_prov_name(kind), last->rail.av_max);
		return -ENOSPC;
	}
	er = calloc(1, sizeof(*er));
	if (!er) {
		snprintf(why, whylen, "out of memory for another endpoint");
		return -ENOSPC;
	}
	/* Its own region, named like the first with a fresh nonce. */
	if (fs_engine_ep_open(er, kind, local, why, whylen)) {
		free(er);
		return -ENOSPC;
	}
	er->ep_index = last->ep_index + 1;
	last->next_ep = er;
	FS_STAT_INC(endpoints_extra);
	FS_INFO("opened endpoint %u of the %s rail: the address vectors of the first %u hold %u peers each",
		er->ep_index, fs_fabric_prov_name(kind), er->ep_index, last->rail.av_max);
	*out = er;
	return 0;
}

struct fs_engine_rail *fs_engine_ep_first(struct fs_engine *e)
{
	for (unsigned kind = FS_PROV_SHM; kind < FS_PROV_MAX_; kind++)
		if (e->rails[kind].open)
			return &e->rails[kind];
	return NULL;
}

struct fs_engine_rail *fs_engine_ep_next(struct fs_engine *e, struct fs_engine_rail *er)
{
	if (er->next_ep)
		return er->next_ep;
	for (unsigned kind = er->rail.kind + 1; kind < FS_PROV_MAX_; kind++)
		if (e->rails[kind].open)
			return &e->rails[kind];
	return NULL;
}

/* ---- streams ----------------------------------------------------------- */

static uint32_t fs_engine_alloc_id(struct fs_engine *e, struct fs_stream *s)
{
	if (e->live_streams + 1 >= FS_STREAM_ID_MAX)
		return 0;
	if (e->live_streams + 1 >= e->streams_cap && e->streams_cap < FS_STREAM_ID_MAX + 1) {
		uint32_t cap = e->streams_cap ? e->streams_cap * 2 : 256;
		struct fs_stream **grown;

		if (cap > FS_STREAM_ID_MAX + 1)
			cap = FS_STREAM_ID_MAX + 1;
		grown = realloc(e->streams, cap * sizeof(*grown));
		if (!grown)
			return 0;
		memset(grown + e->streams_cap, 0, (cap - e->streams_cap) * sizeof(*grown));
		e->streams = grown;
		e->streams_cap = cap;
	}
	/* Ids are handed out round-robin so a closed stream's id is not reused
	 * soon; the token in every tag catches the rest. */
	for (uint32_t n = 0; n < e->streams_cap; n++) {
		uint32_t id = e->next_id;

		e->next_id = e->next_id + 1 >= e->streams_cap ? 1 : e->next_id + 1;
		if (id && !e->streams[id]) {
			e->streams[id] = s;
			e->live_streams++;
			return id;
		}
	}
	return 0;
}

struct fs_stream *fs_stream_create(struct fs_engine *e, struct fs_engine_rail *er, uint64_t token, int *nak)
{
	struct fs_stream *s = calloc(1, sizeof(*s));
	unsigned window = (unsigned)fs_params.window;

	*nak = FS_NAK_RESOURCES;
	if (!s)
		return NULL;
	s->ooo = calloc(window, sizeof(*s->ooo));
	if (!s->ooo) {
		free(s);
		return NULL;
	}
	s->id = fs_engine_alloc_id(e, s);
	if (!s->id) {
		free(s->ooo);
		free(s);
		return NULL;
	}
	er->streams++;
	er->hello_pending++;
	s->av_pending = true;
	/* Receives are shared (engine.h): a new stream only tops them up. A
	 * rail that cannot post any data receive takes no stream. */
	if (fs_post_more(er, &er->rx_data, &er->posted_data, fs_data_want(er)) && !er->posted_data) {
		FS_WARN_ONCE("no receive can be posted on the %s rail; new streams stay on TCP",
			     fs_fabric_prov_name(er->rail.kind));
		er->streams--;
		er->hello_pending--;
		e->streams[s->id] = NULL;
		e->live_streams--;
		free(s->ooo);
		free(s);
		return NULL;
	}
	s->erail = er;
	s->window = window;
	s->budget = &e->budget;
	fs_credit_rx_init(&s->credit, (unsigned)fs_params.window_min, window, er->chunk);
	s->token = token;
	s->state = FS_STREAM_HELLO;
	s->rx_expect = 1;
	s->ctl_fd = -1;
	s->app_fd = -1;
	s->wake_fd = -1;
	s->hb_fd = -1;
	s->fork_gen = fs_handback_fork_gen();
	s->peer_addr = FI_ADDR_UNSPEC;
	/* Until the peer's HELLO-ACK says otherwise, queued sends are cut to a
	 * size every peer accepts (FABSOCK_CHUNK_SIZE is at least this). */
	s->peer_chunk = FS_PRE_ACK_CHUNK;
	s->app_ref = true;
	*nak = FS_NAK_NONE;
	return s;
}

unsigned fs_engine_pull_shift(const struct fs_engine_rail *er)
{
	unsigned shift = FS_WIRE_PULL_SHIFT_MIN;

	/* A pull lands in the application's memory, which a provider that
	 * wants every buffer registered (efa) cannot take: such a receiver
	 * would pull into its bounce buffer and gain nothing. */
	if (!fs_params.pull_min || er->rail.mr_local)
		return 0;
	while (shift < FS_WIRE_PULL_SHIFT_MAX && (1ull << shift) < fs_params.pull_min)
		shift++;
	return shift;
}

int fs_stream_connect(struct fs_engine *e, struct fs_stream *s, uint32_t peer_id, unsigned peer_window,
		      uint32_t peer_chunk, unsigned peer_pull_shift, const void *addr, size_t addr_len)
{
	struct fs_engine_rail *er = s->erail;
	int ret;

	if (s->av_pending) {
		s->av_pending = false;
		er->hello_pending--;
	}
	if (!peer_id || peer_id > FS_STREAM_ID_MAX || peer_window < 1 || peer_window > FS_WIRE_WINDOW_MAX ||
	    peer_chunk < 1)
		return -EPROTO;
	ret = fs_rail_av_insert(&er->rail, addr, addr_len, &s->peer_addr);
	if (ret)
		return ret;
	if (peer_chunk < FS_PRE_ACK_CHUNK)
		return -EPROTO;
	s->peer_id = peer_id;
	s->peer_pid = er->rail.kind == FS_PROV_SHM ? fs_shm_addr_pid(addr, addr_len) : 0;
	s->peer_limit = peer_window; /* the first grant: messages 1 to window */
	s->peer_chunk = peer_chunk;
	if (s->peer_chunk + FS_WIRE_MSG_PREFIX > er->tx_data.buf_cap)
		s->peer_chunk = er->tx_data.buf_cap - FS_WIRE_MSG_PREFIX;
	/* The announcement goes by inject: it must fit. */
	if (peer_pull_shift >= FS_WIRE_PULL_SHIFT_MIN && peer_pull_shift <= FS_WIRE_PULL_SHIFT_MAX &&
	    er->rail.inject_size >= FS_WIRE_MSG_PREFIX)
		s->peer_pull_min = 1u << peer_pull_shift;
	s->state = FS_STREAM_OPEN;
	fs_engine_note_activity(e); /* and the new stream is not armed */
	fs_stream_flush(e, s); /* what the application wrote before the ACK */
	return 0;
}

/* Returns every buffer the stream holds to its rail and frees it. */
static void fs_stream_destroy(struct fs_engine *e, struct fs_stream *s)
{
	struct fs_engine_rail *er = s->erail;
	struct fs_buf *buf, *next;

	if (s->av_pending) {
		s->av_pending = false;
		er->hello_pending--;
	}
	for (buf = s->rxq_head; buf; buf = next) {
		next = buf->next;
		fs_engine_rx_discard(er, buf);
	}
	for (unsigned i = 0; i < s->window; i++)
		if (s->ooo[i])
			fs_engine_rx_discard(er, s->ooo[i]);
	for (buf = s->txq_head; buf; buf = next) {
		next = buf->next;
		fs_pool_put(buf);
	}
	if (s->txq_head) {
		e->pending_tx--;
		fs_dlist_del(&s->pending_link);
	}
	if (fs_dlist_linked(&s->sleep_link))
		fs_dlist_del(&s->sleep_link);
	if (fs_dlist_linked(&s->credit_link))
		fs_dlist_del(&s->credit_link);
	if (fs_dlist_linked(&s->grant_link))
		fs_dlist_del(&s->grant_link);
	if (fs_dlist_linked(&s->starve_link))
		fs_dlist_del(&s->starve_link);
	fs_credit_rx_release(&s->credit, s->budget);
	if (s->unpulled) {
		s->unpulled = 0;
		fs_dlist_del(&s->pull_link);
	}
	if (fs_dlist_linked(&s->hb_link))
		fs_dlist_del(&s->hb_link);
	for (buf = s->hb_ret_head; buf; buf = next) {
		next = buf->next;
		fs_engine_repost(er, buf);
	}
	for (buf = s->hb_held_head; buf; buf = next) {
		next = buf->next;
		fs_pool_put(buf);
	}
	s->hb_ret_head = s->hb_ret_tail = s->hb_held_head = s->hb_held_tail = NULL;
	s->hb_held_count = 0;
	if (s->hb_fd >= 0)
		fs_internal_fd_close(s->hb_fd);
	s->hb_fd = -1;
	/* Buffers still posted for this stream's sends complete later and are
	 * returned by the completion handler, which tolerates a NULL stream. */
	er->streams--;
	if (s->id < e->streams_cap && e->streams[s->id] == s) {
		e->streams[s->id] = NULL;
		e->live_streams--;
	}
	if (s->ctl_fd >= 0)
		fs_real.close(s->ctl_fd);
	if (s->peer_addr != FI_ADDR_UNSPEC)
		fs_rail_av_release(&er->rail, s->peer_addr);
	if (s->wake_queued) {
		for (struct fs_stream **link = &e->wake_list; *link; link = &(*link)->wake_next)
			if (*link == s) {
				*link = s->wake_next;
				break;
			}
	}
	if (s->wake_fd >= 0)
		fs_internal_fd_close(s->wake_fd);
	s->wake_fd = -1;
	s->ctl_fd = -1;
	s->dead = true;
	if (s->peer_id)
		FS_STAT_INC(streams_freed); /* it was connected: offloaded */
	free(s->ooo);
	s->ooo = NULL;
	if (!s->app_ref)
		free(s);
}

void fs_engine_retire(struct fs_engine *e, struct fs_stream *s)
{
	fs_stream_destroy(e, s);
}

void fs_stream_drop_app(struct fs_stream *s)
{
	struct fs_engine *e = fs_engine_peek();

	if (!e)
		return; /* the engine is gone with its streams (exit) */
	pthread_mutex_lock(&e->lock);
	s->app_ref = false;
	while (s->watchers) /* none should be left: their members held the socket */
		fs_stream_watch_del(s->watchers);
	if (s->dead)
		free(s);
	pthread_mutex_unlock(&e->lock);
}

int fs_stream_take_queued(struct fs_engine *e, struct fs_stream *s, int (*sink)(void *arg, const void *data, size_t len),
			  void *arg)
{
	int ret = 0;

	for (struct fs_buf *buf = s->txq_head; buf && !ret; buf = buf->next)
		if (buf->kind == FS_MSG_DATA && buf->len)
			ret = sink(arg, buf->mem + FS_WIRE_MSG_PREFIX, buf->len);
	return ret;
}

void fs_stream_abandon(struct fs_engine *e, struct fs_stream *s)
{
	s->ctl_fd = -1;
	s->app_ref = false; /* a half-made stream is only seen under the socket lock */
	fs_stream_destroy(e, s);
}

/* ---- waking sleepers ---------------------------------------------------- */

uint64_t fs_wait_slice_cap_us(uint64_t waited_ns)
{
	if (fs_params.idle_after_ms && waited_ns >= fs_params.idle_after_ms * 1000000ull &&
	    fs_params.idle_sleep_us > fs_params.sleep_max_us)
		return fs_params.idle_sleep_us;
	return fs_params.sleep_max_us;
}

void fs_engine_note_activity(struct fs_engine *e)
{
	e->active_ns = fs_now_ns();
	/* waiters poll at the normal pace until the service thread has seen
	 * IDLE_AFTER_MS of quiet again and re-armed */
	__atomic_store_n(&e->armed_all, false, __ATOMIC_RELAXED);
	if (e->deep_waiters)
		e->deep_wanted = true;
}

/* Nothing of ours in flight and nothing to flush: a ring will announce
 * whatever happens next. */
static bool fs_engine_settled(struct fs_engine *e)
{
	if (!fs_params.doorbell || !e->live_streams)
		return false;
	for (struct fs_engine_rail *er = fs_engine_ep_first(e); er; er = fs_engine_ep_next(e, er))
		if (er->tx_posted || er->pulls_posted)
			return false; /* its completion comes without a ring */
	return !fs_engine_busy(e);
}

bool fs_engine_waiters_arm(struct fs_engine *e)
{
	return fs_engine_arms_early(e) && fs_engine_settled(e);
}

bool fs_engine_quiet(struct fs_engine *e, uint64_t now)
{
	/* Completions are counted on the data path, the clock is read here:
	 * the service thread dates the last change of the count. */
	if (e->completions != e->completions_seen) {
		e->completions_seen = e->completions;
		e->active_ns = now;
	}
	if (!fs_params.idle_after_ms || now - e->active_ns < fs_params.idle_after_ms * 1000000ull)
		return false;
	return fs_engine_settled(e);
}

bool fs_engine_deep_idle(struct fs_engine *e)
{
	/* armed_all is set only once the engine was quiet, and cleared by any
	 * arriving message, new stream or ring: no clock needed here */
	return __atomic_load_n(&e->armed_all, __ATOMIC_RELAXED) && fs_engine_settled(e);
}

/* The sleepiness score: a late wait adds FS_SLEEPY_LATE, a quick one takes
 * one off, within 0..FS_SLEEPY_MAX. Sleepy from FS_SLEEPY_AT (two late
 * waits in a row) until it is back at 0: waits are mostly late when more
 * than one in five is. A busy server whose waits are late now and then
 * (redis under 1,000 clients: 3 %) stays awake: its every message would
 * otherwise ask for a ring, and its peer's every message send one. So does
 * a wait that brought more than FS_SLEEPY_EVENTS events, late or not
 * (redis-benchmark -c 1000: 465 per epoll_wait): one wait serves many
 * messages, so its polling costs little per message, while a ring would be
 * asked for on each. */
#define FS_SLEEPY_LATE 4u
#define FS_SLEEPY_MAX 16u
#define FS_SLEEPY_AT 8u
#define FS_SLEEPY_EVENTS 2

void fs_engine_wait_done(struct fs_engine *e, bool late, int events)
{
	unsigned v;

	if (!e)
		return;
	v = __atomic_load_n(&e->wait_score, __ATOMIC_RELAXED);
	if (late && events <= FS_SLEEPY_EVENTS) {
		FS_STAT_INC(waits_late);
		v = v + FS_SLEEPY_LATE < FS_SLEEPY_MAX ? v + FS_SLEEPY_LATE : FS_SLEEPY_MAX;
		if (v >= FS_SLEEPY_AT && !__atomic_load_n(&e->sleepy, __ATOMIC_RELAXED)) {
			__atomic_store_n(&e->sleepy, true, __ATOMIC_RELAXED);
			FS_STAT_INC(sleepy_spells);
		}
	} else {
		if (!v)
			return;
		if (--v == 0)
			__atomic_store_n(&e->sleepy, false, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&e->wait_score, (uint8_t)v, __ATOMIC_RELAXED);
}

uint64_t fs_wait_spin_end(const struct fs_engine *e, uint64_t now)
{
	if (e && fs_params.spin_us > FS_SLEEPY_SPIN_US && fs_engine_arms_early(e))
		return now + FS_SLEEPY_SPIN_US * 1000ull;
	return fs_spin_end(now);
}

bool fs_engine_arms_early(const struct fs_engine *e)
{
	return fs_params.doorbell && (fs_params.wait_arm || __atomic_load_n(&e->sleepy, __ATOMIC_RELAXED));
}

bool fs_engine_wait_deep(struct fs_engine *e, bool checked)
{
	bool was_armed = __atomic_load_n(&e->armed_all, __ATOMIC_RELAXED);

	if (!was_armed && fs_engine_arms_early(e) && fs_engine_settled(e)) {
		fs_bell_arm_all(e);
		/* A message that came after the caller last looked (and disarmed
		 * its stream) is counted as seen in this ARM: no ring will come
		 * for it. Only a caller that looked under this lock may sleep;
		 * the others look once more first (armed_all, cleared by any
		 * arrival, tells them then). */
		if (!checked)
			return false;
	}
	return fs_engine_deep_idle(e);
}

bool fs_engine_bell_watched(const struct fs_engine *e)
{
	return e->deep_waiters || !__atomic_load_n(&e->service_bell_off, __ATOMIC_RELAXED);
}

int fs_engine_deep_begin(struct fs_engine *e)
{
	if (e->deep_fd < 0)
		fs_engine_deep_fd_open(e); /* its making at engine creation failed */
	if (e->deep_fd >= 0)
		e->deep_waiters++;
	return e->deep_fd;
}

void fs_engine_deep_end(struct fs_engine *e)
{
	if (--e->deep_waiters == 0 && e->deep_rung) {
		uint64_t v;
		ssize_t n = fs_real.read(e->deep_fd, &v, sizeof(v));

		(void)n;
		e->deep_rung = false;
	}
	if (!e->deep_waiters)
		e->deep_wanted = false;
}

int fs_engine_deep_sleep(struct pollfd *fds, nfds_t n, uint64_t deadline_ns, const sigset_t *sigmask,
			 bool *slept)
{
	struct fs_engine *e = fs_engine_peek();
	uint64_t now, ns = FS_BELL_SLICE_MS * 1000000ull;
	struct timespec ts;
	bool was_armed, armed_now;
	int ret, err;

	*slept = false;
	/* a lock-free look first: without waiters' arming, busy engines are
	 * never armed */
	if (!e || (!fs_engine_arms_early(e) && !__atomic_load_n(&e->armed_all, __ATOMIC_RELAXED)))
		return 0;
	now = fs_now_ns();
	pthread_mutex_lock(&e->lock);
	was_armed = __atomic_load_n(&e->armed_all, __ATOMIC_RELAXED);
	fds[n].fd = fs_engine_wait_deep(e, false) ? fs_engine_deep_begin(e) : -1;
	armed_now = !was_armed && __atomic_load_n(&e->armed_all, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&e->lock);
	if (fds[n].fd < 0)
		return armed_now ? -EAGAIN : 0;
	fds[n].events = POLLIN;
	fds[n].revents = 0;
	fds[n + 1].fd = fs_bell_fd();
	fds[n + 1].events = POLLIN;
	fds[n + 1].revents = 0;
	if (deadline_ns && deadline_ns - now < ns)
		ns = deadline_ns > now ? deadline_ns - now : 0;
	ts.tv_sec = (time_t)(ns / 1000000000ull);
	ts.tv_nsec = (long)(ns % 1000000000ull);
	ret = fs_real.ppoll(fds, n + 2, &ts, sigmask);
	err = errno;
	pthread_mutex_lock(&e->lock);
	fs_engine_deep_end(e);
	pthread_mutex_unlock(&e->lock);
	*slept = true;
	if (ret < 0)
		return -err;
	if (fds[n + 1].revents)
		fs_bell_drain(e); /* a ring: read it here, not through the service thread */
	return ret - (fds[n].revents ? 1 : 0) - (fds[n + 1].revents ? 1 : 0);
}

/* Wakes the deep sleepers once; the fd stays readable until the last of
 * them has left, so none misses it. */
static void fs_engine_deep_wake(struct fs_engine *e)
{
	uint64_t one = 1;

	e->deep_wanted = false;
	if (e->deep_waiters && !e->deep_rung) {
		ssize_t n = fs_real.write(e->deep_fd, &one, sizeof(one));

		(void)n;
		e->deep_rung = true;
	}
}

void fs_stream_watch_add(struct fs_stream *s, struct fs_stream_watch *w)
{
	w->next = s->watchers;
	s->watchers = w;
	__atomic_store_n(&w->stream, s, __ATOMIC_RELAXED);
}

void fs_stream_watch_del(struct fs_stream_watch *w)
{
	struct fs_stream *s = w->stream;

	if (!s)
		return;
	for (struct fs_stream_watch **p = &s->watchers; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			break;
		}
	w->next = NULL;
	__atomic_store_n(&w->stream, NULL, __ATOMIC_RELAXED);
}

void fs_stream_changed(struct fs_engine *e, struct fs_stream *s)
{
	s->ev_gen++;
	for (struct fs_stream_watch *w = s->watchers; w; w = w->next)
		w->fn(w);
	if (e->deep_waiters)
		e->deep_wanted = true;
	if (s->sleepers && !s->wake_queued) {
		s->wake_queued = true;
		s->wake_next = e->wake_list;
		e->wake_list = s;
	}
}

static void fs_stream_ring(struct fs_stream *s)
{
	uint64_t one = 1;

	if (s->wake_fd >= 0) {
		ssize_t n = fs_real.write(s->wake_fd, &one, sizeof(one));
		(void)n;
	}
}

/* After a progress round: ring the streams that changed while someone slept. */
static void fs_engine_ring(struct fs_engine *e)
{
	while (e->wake_list) {
		struct fs_stream *s = e->wake_list;

		e->wake_list = s->wake_next;
		s->wake_queued = false;
		fs_stream_ring(s);
	}
}

void fs_engine_wake_all(struct fs_engine *e)
{
	for (struct fs_dlist *n = e->sleeping.next; n != &e->sleeping; n = n->next)
		fs_stream_ring(fs_stream_of(n, sleep_link));
}

void fs_stream_sleep_begin(struct fs_engine *e, struct fs_stream *s)
{
	if (!s->sleepers++ && !s->dead)
		fs_dlist_add(&e->sleeping, &s->sleep_link);
}

/* Tolerates a stream destroyed meanwhile (destroy unlinks it). */
void fs_stream_sleep_end(struct fs_engine *e, struct fs_stream *s)
{
	if (!--s->sleepers && fs_dlist_linked(&s->sleep_link))
		fs_dlist_del(&s->sleep_link);
}

/* ---- sending ----------------------------------------------------------- */

static inline bool fs_seq_after(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) > 0;
}

unsigned fs_stream_credits(const struct fs_stream *s)
{
	return fs_credit_tx_avail(s->peer_limit, s->tx_seq);
}

/* The head of S's send queue could go now: credit is there, or it is the
 * payload of a sent announcement, which needs none. */
static bool fs_stream_can_post(const struct fs_stream *s)
{
	return s->txq_head && (s->txq_head->announced || fs_stream_credits(s));
}

/* Sends BYTES at DATA (inside BUF) to S's peer: tagged with TAG if TAGGED,
 * else untagged; by inject when it fits (BUF->posted 2: done, no completion
 * will come), else with BUF as the context (posted 1). Returns 0,
 * -FI_EAGAIN (try later) or another error. */
static int fs_post(struct fs_stream *s, struct fs_buf *buf, const void *data, size_t bytes, bool tagged,
		   uint64_t tag)
{
	struct fs_rail *rail = &s->erail->rail;
	bool inject = bytes <= rail->inject_size;
	struct fs_engine *e;
	ssize_t ret;

	/* Nobody watches the doorbell (fs_engine_bell_watched): an ARM for
	 * this stream may be waiting there, and this message must ring. */
	if (!s->peer_armed && (e = fs_engine_peek()) && !fs_engine_bell_watched(e))
		fs_bell_take_arms(e);

	if (!s->erail->open)
		return -FI_ECANCELED; /* the rail closed at exit under a still running thread */
	if (__builtin_expect(fs_fault_post_eagain != 0, 0)) {
		fs_fault_post_eagain--;
		return -FI_EAGAIN;
	}
	FS_GUARD_ENTER();
	FS_PROV_ENTER(s->erail, s->peer_pid);
	if (tagged)
		ret = inject ? fi_tinject(rail->ep, data, bytes, s->peer_addr, tag)
			     : fi_tsend(rail->ep, data, bytes, buf->desc, s->peer_addr, tag, buf);
	else
		ret = inject ? fi_inject(rail->ep, data, bytes, s->peer_addr)
			     : fi_send(rail->ep, data, bytes, buf->desc, s->peer_addr, buf);
	FS_PROV_LEAVE(s->erail);
	FS_GUARD_LEAVE();
	if (ret == -FI_EAGAIN && s->peer_armed) {
		/* The provider may need the peer to make progress first (shm
		 * maps a new peer only when the receiver polls): a peer asleep
		 * on its doorbell would never let this through. */
		fs_bell_ring(s);
	}
	if (ret)
		return (int)ret;
	buf->posted = inject ? 2 : 1;
	if (!inject)
		s->erail->tx_posted++;
	if (s->peer_armed)
		fs_bell_ring(s); /* the peer sleeps until told */
	return 0;
}

/* Whether S's next message may carry our ARM (FS_MSG_ARM), which saves a
 * waiter of a sleepy engine its ARM datagram: both ends have a doorbell,
 * the stream is not armed yet, and our reader has taken every message that
 * came (the peer takes the header's freed as what we have seen: with
 * messages unread it would ring at once for nothing). */
static bool fs_stream_arm_inline(const struct fs_stream *s)
{
	struct fs_engine *e = fs_engine_peek();

	return !s->armed && s->credit.freed == s->rx_msgs && s->bell_addr.sin6_port && e && fs_engine_arms_early(e) &&
	       s->state != FS_STREAM_HELLO && fs_bell_fd() >= 0;
}

/* Posts BUF (its tag, header and payload) as one message of class CLS, or,
 * if ANNOUNCE, only its tag and header as the FS_MSG_PULL that announces
 * its payload (which fs_stream_flush sends next, by fs_post). */
static int fs_post_msg(struct fs_stream *s, struct fs_buf *buf, unsigned cls, bool announce)
{
	unsigned kind = announce ? FS_MSG_PULL : buf->kind;
	bool arm = fs_stream_arm_inline(s);
	int ret;

	fs_wire_ctrl_tag_encode(fs_tag_make(cls, kind | (arm ? FS_MSG_ARM : 0), s->peer_id, s->token), buf->mem);
	ret = fs_post(s, buf, buf->mem, FS_WIRE_MSG_PREFIX + (announce ? 0 : buf->len), cls == FS_CLASS_CTRL,
		      FS_TAG_CTRL_ALL);
	if (!ret && arm) {
		s->armed = true;
		FS_STAT_INC(bell_arms);
		FS_STAT_INC(bell_arms_inline);
	}
	return ret;
}

/* Writes BUF's header; returns the advertised limit before it (for
 * fs_credit_rx_undo if BUF does not go). */
static uint32_t fs_fill_header(struct fs_stream *s, struct fs_buf *buf, uint32_t seq)
{
	struct fs_wire_msg_hdr hdr = {
		.seq = seq,
		.ctrl_ack = s->ctrl_processed,
		.len = buf->len,
	};
	unsigned grant;
	uint32_t old = fs_credit_rx_advertise(&s->credit, s->budget, &hdr.freed, &grant);

	hdr.grant = grant;
	fs_wire_hdr_encode(&hdr, buf->mem + FS_WIRE_CTRL_TAG_LEN);
	return old;
}

/* Takes the head of S's send queue off it. */
static struct fs_buf *fs_txq_pop(struct fs_stream *s)
{
	struct fs_buf *buf = s->txq_head;

	s->txq_head = buf->next;
	if (!s->txq_head)
		s->txq_tail = NULL;
	s->txq_count--;
	buf->next = NULL;
	return buf;
}

/* Posts queued messages while credits last. A payload of at least the
 * peer's pull size goes in two parts: the announcement, which takes the
 * seq and the credit, then the payload itself, tagged for the peer to
 * pull when its application reads. Engine lock held. */
void fs_stream_flush(struct fs_engine *e, struct fs_stream *s)
{
	bool had_queue = s->txq_head != NULL;
	unsigned queued = s->txq_count;

	while (s->txq_head && !s->error) {
		struct fs_buf *buf = s->txq_head;
		int ret;

		if (!buf->announced) {
			bool pull = s->peer_pull_min && buf->kind == FS_MSG_DATA && buf->len >= s->peer_pull_min;

			uint32_t old_limit;

			if (!fs_stream_credits(s))
				break;
			old_limit = fs_fill_header(s, buf, s->tx_seq + 1);
			ret = fs_post_msg(s, buf, FS_CLASS_DATA, pull);
			if (ret == -FI_EAGAIN) {
				/* Not sent: what its header offered was not told. (A
				 * later header may offer less, the grant having
				 * shrunk: the peer must never be thought to know more
				 * than it was sent, or neither side would move.) */
				fs_credit_rx_undo(&s->credit, s->budget, old_limit);
				break;
			}
			if (ret)
				goto failed;
			s->tx_seq++;
			if (buf->kind == FS_MSG_DATA)
				FS_STAT_ADD(fabric_tx_bytes, buf->len);
			buf->seq = s->tx_seq;
			buf->announced = pull;
		}
		if (buf->announced) {
			/* The announcement is out: the payload must follow, credit or not. */
			ret = fs_post(s, buf, buf->mem + FS_WIRE_MSG_PREFIX, buf->len, true,
				      fs_tag_pull(s->peer_id, buf->seq, s->token));
			if (ret == -FI_EAGAIN)
				break;
			if (ret)
				goto failed;
		}
		fs_txq_pop(s);
		if (buf->posted == 2) {
			if (buf->kind == FS_MSG_FIN)
				s->fin_done = true;
			fs_pool_put(buf);
		} else {
			s->tx_inflight++;
		}
		continue;
failed:
		FS_WARN("stream %u: sending on the %s rail failed: %s; resetting it", s->id,
			fs_fabric_prov_name(s->erail->rail.kind), fs_fi.strerror(-ret));
		fs_pool_put(fs_txq_pop(s));
		s->error = -ECONNRESET;
		fs_stream_changed(e, s);
		FS_STAT_INC(resets);
		break;
	}
	if (s->error) {
		struct fs_buf *buf, *next;

		for (buf = s->txq_head; buf; buf = next) {
			next = buf->next;
			fs_pool_put(buf);
		}
		s->txq_head = s->txq_tail = NULL;
		s->txq_count = 0;
	}
	if (had_queue && !s->txq_head) {
		e->pending_tx--;
		fs_dlist_del(&s->pending_link);
	}
	/* Room in the send queue is writability (POLLOUT): a change the
	 * application's wait or edge-triggered epoll must see. It also comes
	 * from retries of sends the provider refused for a moment (-FI_EAGAIN),
	 * long after the credit that allowed them; without this nginx, told
	 * "not writable", waited for an EPOLLOUT that never came. */
	if (s->txq_count < queued)
		fs_stream_changed(e, s);
}

bool fs_engine_busy(struct fs_engine *e)
{
	/* Closing streams with bytes still to deliver need prompt progress;
	 * ones that only wait for the peer's FIN do not. */
	for (struct fs_stream *s = e->orphans; s; s = s->orphan_next)
		if (!s->error && (s->txq_head || s->tx_inflight))
			return true;
	/* bytes for TCP on the way back, which the kernel socket takes now */
	for (struct fs_dlist *n = e->switching.next; n != &e->switching; n = n->next) {
		struct fs_stream *s = fs_stream_of(n, hb_link);

		if (!s->hb_out_blocked && (s->hb_ret_head || (s->hb_peer_end && s->hb_held_head)))
			return true;
	}
	/* Only a send that could go now (credit there, the provider said
	 * "again") needs fast polling; one waiting for credit or for the
	 * HELLO-ACK waits for a message, which slower polling also finds. */
	for (struct fs_dlist *n = e->pending.next; n != &e->pending; n = n->next) {
		struct fs_stream *s = fs_stream_of(n, pending_link);

		if (s->state != FS_STREAM_HELLO && fs_stream_can_post(s))
			return true;
	}
	return false;
}

/* Queues an empty FIN after the data. */
int fs_stream_queue_fin(struct fs_engine *e, struct fs_stream *s)
{
	struct fs_buf *buf;

	if (s->fin_queued)
		return 0;
	buf = fs_pool_get(&s->erail->tx_data);
	if (!buf)
		return -ENOBUFS;
	buf->kind = FS_MSG_FIN;
	buf->stream = s;
	fs_stream_enqueue(e, s, buf);
	s->fin_queued = true;
	fs_stream_flush(e, s);
	return 0;
}

void fs_stream_enqueue(struct fs_engine *e, struct fs_stream *s, struct fs_buf *buf)
{
	if (!s->txq_head) {
		e->pending_tx++;
		fs_dlist_add(&e->pending, &s->pending_link);
	}
	buf->next = NULL;
	if (s->txq_tail)
		s->txq_tail->next = buf;
	else
		s->txq_head = buf;
	s->txq_tail = buf;
	s->txq_count++;
}

/* The budget refused S more: the service thread looks at it again
 * (fs_engine_grants_idle), since other streams may give some back while
 * S's reader waits without consuming. */
static void fs_stream_starved(struct fs_engine *e, struct fs_stream *s)
{
	FS_STAT_INC(credit_denied);
	if (!fs_dlist_linked(&s->starve_link))
		fs_dlist_add(&e->starved, &s->starve_link);
}

void fs_stream_consumed(struct fs_engine *e, struct fs_stream *s)
{
	unsigned grant = s->credit.grant;
	bool denied;

	fs_credit_rx_consume(&s->credit, s->budget, 1, s->rx_msgs, s->rx_bytes, &denied);
	if (s->credit.grant > grant) {
		FS_STAT_INC(credit_grows);
		if (!fs_dlist_linked(&s->grant_link))
			fs_dlist_add(&e->grown, &s->grant_link);
	}
	if (denied)
		fs_stream_starved(e, s);
}

/* Messages arrived on S: if they used up the peer's credit, the grant
 * grows (budget permitting), or, at the window, more is offered when what
 * waits unread is small (core/credit.h); so a writer that closes and exits
 * has delivered what the window holds, and a reader that waits for more
 * bytes without consuming is not stuck. */
static void fs_stream_arrived(struct fs_engine *e, struct fs_stream *s)
{
	unsigned grant = s->credit.grant;
	bool denied;

	if (s->state != FS_STREAM_OPEN)
		return;
	if (fs_credit_rx_arrived(&s->credit, s->budget, s->rx_msgs, s->rx_bytes, &denied)) {
		if (s->credit.grant > grant) {
			FS_STAT_INC(credit_grows);
			if (!fs_dlist_linked(&s->grant_link))
				fs_dlist_add(&e->grown, &s->grant_link);
		}
		fs_stream_maybe_credit(e, s);
	}
	if (denied)
		fs_stream_starved(e, s);
}

void fs_engine_grants_idle(struct fs_engine *e)
{
	for (struct fs_dlist *n = e->grown.next, *next; n != &e->grown; n = next) {
		struct fs_stream *s = fs_stream_of(n, grant_link);
		unsigned grant = s->credit.grant;

		next = n->next;
		if (fs_credit_rx_idle(&s->credit, s->budget, s->rx_msgs))
			continue;
		fs_dlist_del(&s->grant_link);
		if (s->credit.grant < grant)
			FS_STAT_INC(credit_shrinks);
	}
	/* then the streams the budget refused, with what was given back */
	for (struct fs_dlist *n = e->starved.next, *next; n != &e->starved; n = next) {
		struct fs_stream *s = fs_stream_of(n, starve_link);

		next = n->next;
		fs_dlist_del(&s->starve_link);
		fs_stream_arrived(e, s); /* relinks it if refused again */
	}
}

/* Sends a CREDIT when one is due (core/credit.h: the peer is short of
 * credit and the report moves its limit by half the grant or more) and no
 * earlier CREDIT is unacknowledged. Fewer freed messages are not worth a
 * message of their own: they travel piggybacked on the next data of this
 * direction (in a request/response protocol, the response). A sender that
 * used every credit always gets one once the reader consumed what it sent.
 * (Until issue 5, draining the queue always sent a CREDIT, which doubled
 * the messages of every request/response exchange.) Engine lock held. */
void fs_stream_maybe_credit(struct fs_engine *e, struct fs_stream *s)
{
	struct fs_buf *buf;
	uint32_t old_limit;
	int ret;

	/* a closed stream on its way back to TCP still takes the peer's last
	 * messages (RETURN, RETURN_END): they need room too */
	if ((s->state != FS_STREAM_OPEN && s->hb != FS_HB_SWITCHING) || s->error || s->peer_gone)
		return;
	if (!fs_credit_rx_due(&s->credit, s->rx_msgs))
		return;
	if (s->ctrl_sent != s->ctrl_acked) {
		s->credit_pending = true;
		return;
	}
	buf = fs_pool_get(&s->erail->tx_ctrl);
	if (!buf)
		return;
	buf->kind = FS_MSG_CREDIT;
	buf->len = 0;
	buf->stream = s;
	old_limit = fs_fill_header(s, buf, s->ctrl_sent + 1);
	ret = fs_post_msg(s, buf, FS_CLASS_CTRL, false);
	if (ret) {
		/* Not sent (a full transmit queue): the credits stay unreported,
		 * and every progress round retries (fs_engine_retry_credits).
		 * The peer may be waiting for them before it sends anything, so
		 * no header of its would come to retry it, and the reader may
		 * be asleep in epoll_wait, not in a read. */
		fs_credit_rx_undo(&s->credit, s->budget, old_limit);
		s->credit_pending = true;
		if (!fs_dlist_linked(&s->credit_link))
			fs_dlist_add(&e->credit_retry, &s->credit_link);
		fs_pool_put(buf);
		return;
	}
	s->ctrl_sent++;
	s->credit_pending = false;
	if (fs_dlist_linked(&s->credit_link))
		fs_dlist_del(&s->credit_link);
	if (buf->posted == 2)
		fs_pool_put(buf);
}

/* Retries the CREDITs whose post failed; a stream leaves the list once its
 * CREDIT went out or it can no longer send one. Engine lock held. */
static void fs_engine_retry_credits(struct fs_engine *e)
{
	for (struct fs_dlist *n = e->credit_retry.next, *next; n != &e->credit_retry; n = next) {
		struct fs_stream *s = fs_stream_of(n, credit_link);

		next = n->next; /* a CREDIT that goes out unlinks S */
		if (s->credit_pending && s->ctrl_sent == s->ctrl_acked)
			fs_stream_maybe_credit(e, s);
		if (fs_dlist_linked(&s->credit_link) &&
		    (!s->credit_pending || s->error || s->peer_gone ||
		     (s->state != FS_STREAM_OPEN && s->hb != FS_HB_SWITCHING)))
			fs_dlist_del(&s->credit_link);
	}
}

/* ---- completions ------------------------------------------------------- */

static void fs_orphan_check(struct fs_engine *e, struct fs_stream *s);

/* A send of ours completed (or failed). */
static void fs_tx_done(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf)
{
	struct fs_stream *s = buf->stream;

	if (buf->posted == 1 && er->tx_posted)
		er->tx_posted--;
	buf->posted = 0;
	if (s && buf->role == FS_BUF_TX && buf->kind != FS_MSG_CREDIT) {
		fs_stream_changed(e, s);
		s->tx_inflight--;
		if (buf->kind == FS_MSG_FIN)
			s->fin_done = true;
		if (s->state == FS_STREAM_CLOSED)
			fs_orphan_check(e, s);
	}
	fs_pool_put(buf);
}

static struct fs_stream *fs_rx_stream(struct fs_engine *e, struct fs_engine_rail *er, uint64_t tag,
				      fi_addr_t src)
{
	uint32_t id = fs_tag_stream(tag);
	struct fs_stream *s = id < e->streams_cap ? e->streams[id] : NULL;

	if (!s || s->erail != er || (uint32_t)s->token != fs_tag_token(tag))
		return NULL;
	/* Once the peer's address is known, only that endpoint may speak. */
	if (er->rail.source && s->peer_addr != FI_ADDR_UNSPEC && src != FI_ADDR_NOTAVAIL &&
	    src != s->peer_addr)
		return NULL;
	return s;
}

/* The header of a message on S; ARM: it carries the peer's ARM. */
static void fs_rx_header_common(struct fs_engine *e, struct fs_stream *s, const struct fs_wire_msg_hdr *hdr,
				bool arm)
{
	fs_stream_changed(e, s);
	if (s->armed) {
		s->armed = false; /* the peer rang, or will not: it has posted */
		__atomic_store_n(&e->armed_all, false, __ATOMIC_RELAXED);
	}
	fs_credit_tx_update(&s->peer_limit, hdr->freed, hdr->grant, s->tx_seq, FS_WIRE_WINDOW_MAX);
	if (fs_seq_after(hdr->ctrl_ack, s->ctrl_acked) && !fs_seq_after(hdr->ctrl_ack, s->ctrl_sent))
		s->ctrl_acked = hdr->ctrl_ack;
	if (arm)
		fs_bell_armed_by(s, hdr->freed, hdr->ctrl_ack);
	if (s->txq_head)
		fs_stream_flush(e, s);
	if (s->credit_pending && s->ctrl_sent == s->ctrl_acked)
		fs_stream_maybe_credit(e, s);
}

/* BUF is S's next message in sequence order: where it goes. */
static void fs_rx_deliver(struct fs_engine *e, struct fs_engine_rail *er, struct fs_stream *s, struct fs_buf *buf)
{
	switch (buf->kind) {
	case FS_MSG_RETURN:
		/* bytes of ours the peer's reader will not read: to our kernel
		 * socket, first (handback.c); only after the peer switched */
		if (s->hb != FS_HB_SWITCHING)
			goto consume;
		if (s->hb_ret_tail)
			s->hb_ret_tail->next = buf;
		else
			s->hb_ret_head = buf;
		s->hb_ret_tail = buf;
		return;
	case FS_MSG_RETURN_END:
		s->hb_peer_end = true;
		goto consume;
	case FS_MSG_SWITCH:
		fs_handback_peer_switch(e, s);
		if (s->state == FS_STREAM_CLOSED && !s->hb_frozen) {
			s->hb_rx_done = true; /* nobody reads: rx is over */
			goto consume;
		}
		break; /* in order behind what a frozen reader returns */
	default:
		/* (a frozen reader's bytes go back to the peer: queued) */
		if (s->state == FS_STREAM_CLOSED && !(s->hb == FS_HB_SWITCHING && s->hb_frozen)) {
			/* The application is gone: consume it so the peer is not
			 * stalled, and note the peer's FIN, which lets the orphan go. */
			if (buf->kind == FS_MSG_FIN)
				s->peer_fin = true;
			goto consume;
		}
		break;
	}
	if (s->rxq_tail)
		s->rxq_tail->next = buf;
	else
		s->rxq_head = buf;
	s->rxq_tail = buf;
	s->rx_bytes += buf->len;
	if (buf->kind == FS_MSG_FIN)
		s->peer_fin = true;
	else if (buf->kind == FS_MSG_PULL)
		fs_stream_unpulled_inc(e, s);
	return;
consume:
	fs_stream_consumed(e, s);
	fs_engine_rx_discard(er, buf);
}

static void fs_rx_data(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf, size_t bytes,
		       fi_addr_t src)
{
	uint64_t tag = bytes >= FS_WIRE_MSG_PREFIX ? fs_wire_ctrl_tag_decode(buf->mem) : 0;
	struct fs_stream *s = NULL;
	struct fs_wire_msg_hdr hdr;
	unsigned kind = fs_tag_kind(tag) & ~FS_MSG_ARM;
	bool arm = fs_tag_kind(tag) & FS_MSG_ARM;
	uint32_t slot;

	if (bytes >= FS_WIRE_MSG_PREFIX && fs_tag_class(tag) == FS_CLASS_DATA)
		s = fs_rx_stream(e, er, tag, src);
	if (!s || kind < FS_MSG_DATA || kind > FS_MSG_RETURN_END || kind == FS_MSG_CREDIT)
		goto drop;
	fs_wire_hdr_decode(buf->mem + FS_WIRE_CTRL_TAG_LEN, &hdr);
	if (kind == FS_MSG_PULL) {
		/* prefix only; the payload must fit a receive buffer (a pull that
		 * cannot go to the application lands in one), and only a
		 * receiver that asked for pulls gets announcements */
		if (bytes != FS_WIRE_MSG_PREFIX || !hdr.len || hdr.len > buf->cap - FS_WIRE_MSG_PREFIX ||
		    !fs_engine_pull_shift(er))
			goto drop;
	} else if (hdr.len != bytes - FS_WIRE_MSG_PREFIX ||
		   ((kind == FS_MSG_FIN || kind == FS_MSG_SWITCH || kind == FS_MSG_RETURN_END) && hdr.len) ||
		   (kind == FS_MSG_RETURN && !hdr.len)) {
		goto drop;
	}
	/* Credits bound what may arrive: anything beyond what we advertised,
	 * or outside the window, is not ours. */
	if (fs_seq_after(s->rx_expect, hdr.seq) || hdr.seq - s->rx_expect >= s->window ||
	    !fs_credit_rx_allows(&s->credit, hdr.seq))
		goto drop;
	slot = hdr.seq % s->window;
	if (s->ooo[slot])
		goto drop;
	buf = fs_rx_keep(er, buf, bytes);
	if (!buf) {
		/* no memory to copy it out: the byte stream has a hole */
		if (!s->error) {
			FS_WARN("stream %u: no memory for a received message; resetting it", s->id);
			s->error = -ECONNRESET;
			FS_STAT_INC(resets);
		}
		fs_stream_changed(e, s);
		return;
	}
	s->rx_msgs++;
	fs_rx_header_common(e, s, &hdr, arm);
	buf->len = hdr.len;
	buf->off = 0;
	buf->seq = hdr.seq;
	buf->kind = (uint8_t)kind;
	buf->pull_tag = fs_tag_pull(s->id, hdr.seq, s->token);
	buf->stream = s;
	buf->posted = 0;
	s->ooo[slot] = buf;
	FS_STAT_ADD(fabric_rx_bytes, hdr.len);
	/* Deliver in sequence order. */
	while (s->ooo[s->rx_expect % s->window]) {
		struct fs_buf *next = s->ooo[s->rx_expect % s->window];

		s->ooo[s->rx_expect % s->window] = NULL;
		s->rx_expect++;
		next->next = NULL;
		fs_rx_deliver(e, er, s, next);
		fs_stream_changed(e, s);
	}
	fs_stream_arrived(e, s);
	return;
drop:
	FS_STAT_INC(msgs_dropped);
	FS_DBG("dropped a data message for stream %u (tag %#llx, %zu bytes)", fs_tag_stream(tag),
	       (unsigned long long)tag, bytes);
	fs_engine_repost(er, buf);
}

static void fs_rx_ctrl(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf, size_t bytes,
		       fi_addr_t src)
{
	struct fs_stream *s = NULL;
	struct fs_wire_msg_hdr hdr;
	uint64_t tag = 0;

	if (bytes >= FS_WIRE_MSG_PREFIX) {
		tag = fs_wire_ctrl_tag_decode(buf->mem);
		if (fs_tag_class(tag) == FS_CLASS_CTRL)
			s = fs_rx_stream(e, er, tag, src);
	}
	if (!s || (fs_tag_kind(tag) & ~FS_MSG_ARM) != FS_MSG_CREDIT) {
		FS_STAT_INC(msgs_dropped);
		fs_engine_repost(er, buf);
		return;
	}
	fs_wire_hdr_decode(buf->mem + FS_WIRE_CTRL_TAG_LEN, &hdr);
	fs_engine_repost(er, buf);
	s->ctrl_processed++;
	fs_rx_header_common(e, s, &hdr, fs_tag_kind(tag) & FS_MSG_ARM);
}

static void fs_cq_error(struct fs_engine *e, struct fs_engine_rail *er)
{
	struct fi_cq_err_entry err = { 0 };
	struct fs_buf *buf;

	if (fi_cq_readerr(er->rail.cq, &err, 0) != 1)
		return;
	buf = err.op_context;
	if (!buf)
		return;
	if (buf->role == FS_BUF_TX) {
		struct fs_stream *s = buf->stream;

		if (s && buf->kind != FS_MSG_CREDIT && !s->error) {
			FS_WARN("stream %u: send failed on the %s rail: %s", s->id,
				fs_fabric_prov_name(er->rail.kind), fs_fi.strerror(err.err));
			s->error = -ECONNRESET;
			fs_stream_changed(e, s);
			FS_STAT_INC(resets);
		}
		fs_tx_done(e, er, buf);
		return;
	}
	if (buf->pull == FS_PULL_POSTED) {
		if (err.err != FI_ECANCELED)
			FS_WARN_ONCE("pulling a payload on the %s rail failed: %s", fs_fabric_prov_name(er->rail.kind),
				     fs_fi.strerror(err.err));
		fs_rx_pulled(e, er, buf, 0, err.err);
		return;
	}
	if (err.err != FI_ECANCELED)
		FS_WARN_ONCE("a receive failed on the %s rail: %s", fs_fabric_prov_name(er->rail.kind),
			     fs_fi.strerror(err.err));
	fs_recv_landed(er, buf);
	if (err.err == FI_ECANCELED)
		fs_pool_put(buf);
	else
		fs_engine_repost(er, buf);
}

int fs_engine_progress(struct fs_engine *e)
{
	int handled = 0;

	for (struct fs_engine_rail *er = fs_engine_ep_first(e); er; er = fs_engine_ep_next(e, er)) {
		struct fi_cq_tagged_entry ent[FS_CQ_BATCH];
		fi_addr_t src[FS_CQ_BATCH];
		ssize_t n;

		for (int rounds = 0; rounds < 8; rounds++) {
			FS_GUARD_ENTER();
			FS_PROV_ENTER(er, -1);
			if (er->rail.source)
				n = fi_cq_readfrom(er->rail.cq, ent, FS_CQ_BATCH, src);
			else
				n = fi_cq_read(er->rail.cq, ent, FS_CQ_BATCH);
			FS_PROV_LEAVE(er);
			FS_GUARD_LEAVE();
			if (n == -FI_EAVAIL) {
				fs_cq_error(e, er);
				handled++;
				continue;
			}
			if (n <= 0)
				break;
			for (ssize_t i = 0; i < n; i++) {
				struct fs_buf *buf = ent[i].op_context;
				fi_addr_t from = er->rail.source ? src[i] : FI_ADDR_NOTAVAIL;

				if (!buf)
					continue;
				if (buf->role == FS_BUF_TX) {
					fs_tx_done(e, er, buf);
					continue;
				}
				if (buf->pull == FS_PULL_POSTED) {
					fs_rx_pulled(e, er, buf, ent[i].len, 0);
					continue;
				}
				fs_recv_landed(er, buf);
				if (buf->role == FS_BUF_RX_CTRL)
					fs_rx_ctrl(e, er, buf, ent[i].len, from);
				else
					fs_rx_data(e, er, buf, ent[i].len, from);
			}
			handled += (int)n;
			if (n < FS_CQ_BATCH)
				break;
		}
	}
	/* Sends the provider refused for now (-FI_EAGAIN: shm maps a new peer
	 * lazily, queues fill) are retried on every round. */
	for (struct fs_dlist *n = e->pending.next, *next; n != &e->pending; n = next) {
		struct fs_stream *s = fs_stream_of(n, pending_link);

		next = n->next; /* a flush that empties the queue unlinks S */
		if (fs_stream_can_post(s))
			fs_stream_flush(e, s);
	}
	if (e->credit_retry.next != &e->credit_retry)
		fs_engine_retry_credits(e);
	if (e->switching.next != &e->switching)
		fs_handback_progress(e);
	if (e->orphans)
		fs_engine_reap(e);
	if (e->wake_list)
		fs_engine_ring(e);
	e->completions += (unsigned)handled;
	if (e->deep_wanted)
		fs_engine_deep_wake(e);
	return handled;
}

void fs_engine_progress_locked(void)
{
	struct fs_engine *e = fs_engine_peek();

	if (!e)
		return;
	pthread_mutex_lock(&e->lock);
	fs_engine_progress(e);
	pthread_mutex_unlock(&e->lock);
}

/* ---- orphans ----------------------------------------------------------- */

/* An orphan's kernel socket closes once its FIN is out: the peer's control
 * connection then reports EOF, the way TCP would report our FIN. */
static void fs_orphan_check(struct fs_engine *e, struct fs_stream *s)
{
	if (s->ctl_fd >= 0 && ((s->fin_done && !s->tx_inflight) || s->error)) {
		fs_real.close(s->ctl_fd);
		s->ctl_fd = -1;
	}
}

void fs_engine_add_orphan(struct fs_engine *e, struct fs_stream *s)
{
	s->orphan_next = e->orphans;
	e->orphans = s;
	fs_orphan_check(e, s);
}

/* Frees orphans that are done: our FIN delivered and the peer's FIN seen,
 * or the peer gone, or their linger time over. */
/* True once the process of S's peer (on this host: shm, same PID namespace)
 * no longer exists; looked at most every 100 ms per stream. */
static bool fs_orphan_peer_exited(struct fs_stream *s, uint64_t now)
{
	if (s->peer_pid <= 0 || now < s->peer_check_ns)
		return false;
	s->peer_check_ns = now + 100000000ull;
	return kill((pid_t)s->peer_pid, 0) < 0 && errno == ESRCH;
}

void fs_engine_reap(struct fs_engine *e)
{
	uint64_t now = fs_now_ns();
	struct fs_stream **link = &e->orphans;

	while (*link) {
		struct fs_stream *s = *link;
		bool sent = (s->fin_done && !s->tx_inflight) || s->error;
		bool heard = s->peer_fin || s->peer_gone || s->error;

		if (s->txq_head)
			fs_stream_flush(e, s);
		fs_orphan_check(e, s);
		if (s->users || (s->hb == FS_HB_SWITCHING && now < s->close_deadline_ns)) {
			/* a thread is still inside send/recv on it, or it is on its
			 * way back to TCP (handback.c ends it) */
			link = &s->orphan_next;
			continue;
		}
		if (s->hb == FS_HB_DONE)
			sent = heard = true;
		/* Heard the peer out, and its process on this host has exited:
		 * what we still owe it and could not post (our FIN, on shm into
		 * a region nobody drains any more) can never be delivered, and
		 * the application is done with it. The kernel drops such a
		 * socket too. (Sends already posted must complete first: their
		 * completions name the stream.) */
		if (heard && !sent && !s->tx_inflight && fs_orphan_peer_exited(s, now))
			sent = true;
		if ((sent && heard && !s->tx_inflight) || now >= s->close_deadline_ns) {
			*link = s->orphan_next;
			if (!sent)
				FS_WARN("stream %u: closed with undelivered data after FABSOCK_LINGER_SEC; dropped",
					s->id);
			fs_stream_destroy(e, s);
			FS_STAT_INC(orphans_reaped);
			continue;
		}
		link = &s->orphan_next;
	}
}

/* True if the kernel socket FD says the peer closed or died. */
static bool fs_ctl_closed(int fd)
{
	char byte;
	ssize_t n;

	if (fd < 0)
		return true;
	n = fs_real.recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

int fs_mutex_lock_until(pthread_mutex_t *m, uint64_t deadline_ns)
{
	struct timespec real;
	uint64_t now = fs_now_ns(), left = deadline_ns > now ? deadline_ns - now : 0, at;

	clock_gettime(CLOCK_REALTIME, &real);
	at = (uint64_t)real.tv_sec * 1000000000ull + (uint64_t)real.tv_nsec + left;
	real.tv_sec = (time_t)(at / 1000000000ull);
	real.tv_nsec = (long)(at % 1000000000ull);
	return pthread_mutex_timedlock(m, &real) ? -ETIMEDOUT : 0;
}

/* Takes the engine lock, waiting until DEADLINE_NS at most: the exit paths
 * may run in a signal handler or in _exit() called from one, whose own
 * thread may be the holder. Returns 0 or -ETIMEDOUT. */
static int fs_engine_lock_until(struct fs_engine *e, uint64_t deadline_ns)
{
	return fs_mutex_lock_until(&e->lock, deadline_ns);
}

bool fs_stream_holds(struct fs_stream *s, uint64_t deadline_ns)
{
	struct fs_engine *e = fs_engine_peek();
	bool held;

	if (!e || fs_engine_lock_until(e, deadline_ns))
		return false;
	held = s->txq_head != NULL;
	pthread_mutex_unlock(&e->lock);
	return held;
}

void fs_engine_shutdown(void)
{
	struct fs_engine *e = fs_engine_peek();
	uint64_t deadline;

	if (!e || __atomic_exchange_n(&fs_engine_ended, 1, __ATOMIC_ACQ_REL))
		return;
	deadline = fs_now_ns() + fs_params.linger_sec * 1000000000ull;
	if (fs_engine_lock_until(e, deadline)) {
		/* held by the thread this exit interrupted, or stuck: the peers
		 * see the control connections end without a FIN, a reset */
		FS_WARN("process ending: the engine stayed busy for FABSOCK_LINGER_SEC; unsent bytes are lost");
		return;
	}
	fs_engine_progress(e);
	/* Streams the application never closed end like TCP at exit: a FIN
	 * after the data already written, unless the peer is gone already. */
	for (uint32_t id = 1; id < e->streams_cap; id++) {
		struct fs_stream *s = e->streams[id];

		if (!s || s->state != FS_STREAM_OPEN)
			continue;
		s->state = FS_STREAM_CLOSED;
		s->close_deadline_ns = deadline;
		/* A child forked after the offload may go on with the socket:
		 * no FIN, back to TCP for it (handback.h). */
		if (s->hb == FS_HB_NONE && !s->error && s->app_fd >= 0 &&
		    fs_handback_maybe_shared(s->fork_gen, s->app_fd) && !fs_handback_start(e, s, s->app_fd))
			FS_INFO("stream %u: process ending while a child may hold its socket", s->id);
		if (s->hb != FS_HB_NONE) {
			fs_engine_add_orphan(e, s);
			continue;
		}
		s->peer_gone = true; /* do not wait for the peer's FIN at exit */
		if (s->error || fs_ctl_closed(s->app_fd))
			s->error = s->error ? s->error : -ECONNRESET;
		else
			fs_stream_queue_fin(e, s);
		fs_engine_add_orphan(e, s);
	}
	for (struct fs_stream *s = e->orphans; s; s = s->orphan_next) {
		if (s->hb == FS_HB_SWITCHING)
			continue; /* its peer answers the hand-back */
		s->peer_gone = true;
		/* an orphan whose peer vanished cannot deliver anything more */
		if (s->ctl_fd >= 0 && !s->error && fs_ctl_closed(s->ctl_fd))
			s->error = -ECONNRESET;
	}
	while (e->orphans && fs_now_ns() < deadline) {
		bool deliverable = false;

		fs_engine_progress(e);
		/* A stream whose peer is gone (error set) can deliver nothing
		 * more, and its posted sends may never complete: do not wait
		 * out FABSOCK_LINGER_SEC for it (the rails close below). */
		for (struct fs_stream *s = e->orphans; s && !deliverable; s = s->orphan_next)
			deliverable = !s->error;
		if (!deliverable)
			break;
		pthread_mutex_unlock(&e->lock);
		usleep(50);
		if (fs_engine_lock_until(e, deadline))
			return;
	}
	for (unsigned kind = FS_PROV_SHM; kind < FS_PROV_MAX_; kind++) {
		struct fs_engine_rail *er = &e->rails[kind];

		while (er && er->open) {
			struct fs_engine_rail *next = er->next_ep;

			/* Closing an endpoint removes its shm region from /dev/shm.
			 * (The extra ones stay allocated: a stream left behind
			 * still points at its endpoint, which says closed.) */
			fs_rail_close(&er->rail);
			er->open = false;
			er = next;
		}
	}
	pthread_mutex_unlock(&e->lock);
}

void fs_engine_debug_dump(struct fs_engine *e, uint64_t now)
{
	static uint64_t last_ns;

	if (fs_log_level < FS_LOG_DEBUG || now - last_ns < 1000000000ull)
		return;
	last_ns = now;
	for (uint32_t id = 1; id < e->streams_cap; id++) {
		struct fs_stream *s = e->streams[id];
		unsigned rxq = 0;

		if (!s)
			continue;
		for (struct fs_buf *b = s->rxq_head; b; b = b->next)
			rxq++;
		FS_DBG("dump stream %u->%u st %d tx_seq %u peer_limit %u txq %u inflight %u head_ann %d | "
		       "rx_expect %u freed %u limit %u grant %u rxq %u rx_bytes %zu unpulled %u pulling %d head_kind %d "
		       "head_pull %d | ctrl sent %u acked %u processed %u pending %d | fin q%d d%d peer_fin %d gone %d "
		       "err %d users %u sleepers %u",
		       s->id, s->peer_id, s->state, s->tx_seq, s->peer_limit, s->txq_count, s->tx_inflight,
		       s->txq_head ? s->txq_head->announced : -1, s->rx_expect, s->credit.freed, s->credit.limit,
		       (unsigned)s->credit.grant, rxq,
		       s->rx_bytes, s->unpulled, s->pulling, s->rxq_head ? s->rxq_head->kind : -1,
		       s->rxq_head ? s->rxq_head->pull : -1, s->ctrl_sent, s->ctrl_acked, s->ctrl_processed,
		       s->credit_pending, s->fin_queued, s->fin_done, s->peer_fin, s->peer_gone, s->error, s->users,
		       s->sleepers);
	}
}
