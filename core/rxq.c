/* SPDX-License-Identifier: MIT */
/*
 * The receive queue's rules, all of them: the shared receives a rail keeps
 * posted (and posts again), whether an arriving message is kept in its
 * shared buffer or copied out, the per-message path of a completion (whose
 * stream, its header's credit and ARM, sequence order, where each kind
 * goes), pulls of announced payloads (posted, cancelled, started for a
 * reader that does not read), and the consuming side: copying out to the
 * application, pulling into its buffer, taking the head off. A stream's
 * rxq_head and rxq_tail are written here only.
 *
 * Who calls in: engine.c (each progress round hands in completed receives
 * and pulls, fs_rx_data, fs_rx_ctrl, fs_rx_pulled, fs_recv_landed; a new
 * endpoint or stream tops up the receives with fs_post_more; destroy
 * discards what a stream held), stream.c (recv copies out with
 * fs_recv_copy and takes a SWITCH off the head), handback.c (a frozen or
 * closed reader's queue goes back or is dropped, through
 * fs_stream_consume_head and the pulls) and the service thread
 * (fs_engine_pull_stale). The credit a consumed message frees goes back
 * through txq.c. Engine lock held throughout; fs_recv_copy and the pull
 * waits release it while they sleep, as the wait loop does.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config/log.h"
#include "config/params.h"
#include "core/bell.h"
#include "core/engine.h"
#include "core/guard.h"
#include "core/handback.h"
#include "core/tcpfirst.h"
#include "core/stats.h"
#include "core/stream_internal.h"

/* ---- shared receives --------------------------------------------------- */

static int fs_post_recv(struct fs_engine_rail *er, struct fs_buf *buf)
{
	uint64_t cls = buf->role == FS_BUF_RX_CTRL ? FS_CLASS_CTRL : FS_CLASS_DATA;
	int ret;

	buf->stream = NULL;
	buf->len = buf->off = 0;
	buf->kind = 0;
	buf->pull = FS_PULL_NONE;
	buf->held = 0;
	if (!er->open)
		return -ECANCELED; /* closed at exit while a thread still ran */
	FS_GUARD_ENTER();
	FS_PROV_ENTER(er, -1);
	/* Each class is a queue of its own (core/wire.h): data untagged,
	 * control tagged with its one tag, nothing ignored. */
	ret = fs_rail_recv(&er->rail, buf->mem, buf->cap, buf->desc, cls == FS_CLASS_CTRL, FS_TAG_CTRL_ALL, buf);
	FS_PROV_LEAVE(er);
	FS_GUARD_LEAVE();
	if (ret) {
		FS_WARN_ONCE("posting a receive on the %s rail failed: %s",
			     fs_fabric_prov_name(er->rail.kind), strerror(-ret));
		return ret;
	}
	buf->posted = 1;
	if (cls == FS_CLASS_CTRL)
		er->posted_ctrl++;
	else
		er->posted_data++;
	return 0;
}

/* A catch-all receive completed (or was cancelled): it left the provider. */
void fs_recv_landed(struct fs_engine_rail *er, struct fs_buf *buf)
{
	buf->posted = 0;
	if (buf->role == FS_BUF_RX_CTRL)
		er->posted_ctrl--;
	else
		er->posted_data--;
}

/* Posts receives from POOL until POSTED reaches TARGET. Returns 0 or
 * -ENOSPC (pool or memory limit) / -EIO. */
int fs_post_more(struct fs_engine_rail *er, struct fs_pool *pool, unsigned *posted, unsigned target)
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
unsigned fs_data_want(const struct fs_engine_rail *er)
{
	uint64_t want = ((uint64_t)er->streams + 1) * (unsigned)fs_params.window;

	return want < er->data_target ? (unsigned)want : er->data_target;
}

/* Exchanges the memory (and its registration's descriptor) of A and B,
 * two buffers of one pool (same capacity), neither posted. */
static void fs_rx_swap_mem(struct fs_buf *a, struct fs_buf *b)
{
	uint8_t *mem = a->mem;
	void *desc = a->desc;

	a->mem = b->mem;
	a->desc = b->desc;
	b->mem = mem;
	b->desc = desc;
}

/* BUF, a shared data receive about to take a pull's bounce part, borrows
 * the rail's warm memory (struct fs_engine_rail.warm) if it is free.
 *
 * Why (issue 27, a new process's first transfer): the posted receives are
 * matched in turn, so a payload's bounce part (the bytes past what the
 * reader asked for: curl reads 100 KiB of 128 KiB payloads, a stale pull
 * all of them) landed in the next receive buffer, one the process had never
 * touched while the ring's first round lasted: a page fault per 4 KiB, 16 us
 * each on this project's VM, ~220 of them (3.5 ms of CPU) in a curl process
 * fetching 4 MB. The warm buffer's pages are touched once and reused; one
 * buffer is lent at a time, the others take the old path. Returns whether
 * BUF borrowed it. */
static bool fs_rx_warm_lend(struct fs_engine_rail *er, struct fs_buf *buf)
{
	if (buf->role != FS_BUF_RX_DATA || buf->own_mem || buf->warm || buf->pool != &er->rx_data || er->warm_lent)
		return false;
	if (!er->warm && !(er->warm = fs_pool_get(&er->rx_data)))
		return false;
	fs_rx_swap_mem(buf, er->warm);
	/* the header stays readable where it was */
	memcpy(buf->mem, er->warm->mem, FS_WIRE_MSG_PREFIX);
	buf->warm = 1;
	er->warm_lent = true;
	return true;
}

/* BUF is done with (consumed, discarded): the warm memory it borrowed goes
 * back, and BUF gets its own again. */
static void fs_rx_warm_return(struct fs_engine_rail *er, struct fs_buf *buf)
{
	if (!buf->warm || !er->warm)
		return;
	fs_rx_swap_mem(buf, er->warm);
	buf->warm = 0;
	er->warm_lent = false;
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
	fs_rx_warm_return(er, buf);
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

/* ---- pulls ------------------------------------------------------------- */

int fs_engine_pull(struct fs_engine_rail *er, struct fs_buf *buf, void *dst, size_t dst_len)
{
	void *desc = buf->desc;
	/* the part of the payload that lands in BUF: all of it without DST, the
	 * rest after DST_LEN bytes with it (a split pull), none with all of it */
	size_t bounce = !dst ? buf->len : dst_len < buf->len ? buf->len - dst_len : 0;
	int ret;

	if (!er->open)
		return -ECANCELED;
	if (bounce && buf->cap < FS_WIRE_MSG_PREFIX + (size_t)buf->len) {
		/* a copied-out announcement gets room for its payload now; only
		 * providers without FI_MR_LOCAL pull (fs_engine_pull_shift) */
		uint8_t *mem = buf->role == FS_BUF_RX_COPY && !er->rail.mr_local
				       ? malloc(FS_WIRE_MSG_PREFIX + (size_t)buf->len)
				       : NULL;

		if (!mem)
			return -ENOMEM;
		memcpy(mem, buf->mem, FS_WIRE_MSG_PREFIX);
		if (buf->own_mem)
			free(buf->mem);
		buf->mem = mem;
		buf->cap = FS_WIRE_MSG_PREFIX + buf->len;
		buf->own_mem = 1;
		desc = NULL;
	}
	if (bounce && fs_params.pull_warm && fs_rx_warm_lend(er, buf))
		desc = buf->desc;
	FS_GUARD_ENTER();
	FS_PROV_ENTER(er, -1);
	if (!dst) {
		ret = fs_rail_recv(&er->rail, buf->mem + FS_WIRE_MSG_PREFIX, buf->len, desc, true, buf->pull_tag, buf);
	} else if (!bounce) {
		ret = fs_rail_recv(&er->rail, dst, buf->len, NULL, true, buf->pull_tag, buf);
	} else {
		/* The bounce part sits where it would after a whole bounce pull,
		 * so BUF reads on from offset DST_LEN (fs_recv_copy). */
		struct iovec iov[2] = {
			{ .iov_base = dst, .iov_len = dst_len },
			{ .iov_base = buf->mem + FS_WIRE_MSG_PREFIX + dst_len, .iov_len = bounce },
		};
		void *descs[2] = { NULL, desc };

		ret = fs_rail_trecvv(&er->rail, iov, descs, 2, buf->pull_tag, buf);
	}
	FS_PROV_LEAVE(er);
	FS_GUARD_LEAVE();
	if (!ret) {
		buf->pull = FS_PULL_POSTED;
		er->pulls_posted++;
	}
	return ret;
}

bool fs_engine_pull_splits(const struct fs_engine_rail *er)
{
	return fs_params.pull_split && er->rail.rx_iov_limit >= 2;
}

/* Asks the provider to cancel the pull BUF posted; its completion still
 * comes. */
static void fs_engine_pull_cancel(struct fs_stream *s, struct fs_buf *buf)
{
	struct fs_engine_rail *er = fs_stream_rail(s, buf->rail); /* the pull's */

	if (!er->open)
		return;
	FS_GUARD_ENTER();
	FS_PROV_ENTER(er, -1);
	fs_rail_cancel(&er->rail, buf);
	FS_PROV_LEAVE(er);
	FS_GUARD_LEAVE();
}

/* BUF's announcement rejoins the unpulled set of S. */
static void fs_stream_unpulled_inc(struct fs_engine *e, struct fs_stream *s)
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
			if (buf->kind == FS_MSG_PULL && buf->pull == FS_PULL_NONE &&
			    !fs_engine_pull(fs_stream_rail(s, buf->rail), buf, NULL, 0))
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
		if (!fs_engine_pull(er, buf, NULL, 0))
			return;
	}
	fs_engine_repost(er, buf);
}

/* The receive for a pulled payload completed (ERR: libfabric error). */
void fs_rx_pulled(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf, size_t bytes, int err)
{
	struct fs_stream *s = buf->stream;

	if (er->pulls_posted)
		er->pulls_posted--;
	if (!s) {
		fs_engine_repost(er, buf); /* a discard */
		return;
	}
	if (err == -ECANCELED) {
		buf->pull = FS_PULL_NONE; /* the payload still waits */
		fs_stream_unpulled_inc(e, s);
	} else if (err || bytes != buf->len)
		buf->pull = FS_PULL_FAILED;
	else
		buf->pull = FS_PULL_DONE;
	fs_stream_changed(e, s);
}

/* ---- arriving messages ------------------------------------------------- */

static inline bool fs_seq_after(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) > 0;
}

/* The stream a message on ER is for, and which of its rails ER is (*RAIL):
 * any of them (striping), not only its home. */
static struct fs_stream *fs_rx_stream(struct fs_engine *e, struct fs_engine_rail *er, uint64_t tag,
				      fi_addr_t src, unsigned *rail)
{
	uint32_t id = fs_tag_stream(tag);
	struct fs_stream *s = id < e->streams_cap ? e->streams[id] : NULL;
	fi_addr_t peer;
	int r;

	if (!s || (uint32_t)s->token != fs_tag_token(tag) || (r = fs_stripe_rail_of(s, er)) < 0)
		return NULL;
	/* Once the peer's address there is known, only that endpoint may speak. */
	peer = fs_stream_rail_peer(s, (unsigned)r);
	if (er->rail.source && peer != FI_ADDR_UNSPEC && src != FI_ADDR_NOTAVAIL && src != peer)
		return NULL;
	*rail = (unsigned)r;
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
	/* A server writes as soon as it sent its HELLO-ACK; its first message
	 * may come before this client took the ACK and joined (another
	 * thread's progress). Its grant must not let anything post what the
	 * application wrote meanwhile: the stream has no peer address yet
	 * (shm crashed in fi_inject: e2e_reset, one run in 30, from this
	 * header's flush and from the next progress round's). A stream before
	 * its join keeps no credit (peer_limit 0, so nothing posts); the join
	 * gives it the first grant, and later headers carry their grants
	 * whole. A peer that asks to be rung is rung by our first post after
	 * the join (nothing of ours is posted yet: as fs_bell's ARM datagram
	 * in the handshake). */
	if (s->state == FS_STREAM_HELLO) {
		if (arm)
			s->peer_armed = true;
		return;
	}
	fs_credit_tx_update(&s->peer_limit, hdr->freed, hdr->grant, s->tx_seq, FS_WIRE_WINDOW_MAX);
	s->peer_grant = hdr->grant; /* (striping: more than one message in flight, stripe.c) */
	if (fs_seq_after(hdr->ctrl_ack, s->ctrl_acked) && !fs_seq_after(hdr->ctrl_ack, s->ctrl_sent))
		s->ctrl_acked = hdr->ctrl_ack;
	if (arm)
		fs_bell_armed_by(s, hdr->freed, hdr->ctrl_ack);
	if (s->txq_head)
		fs_stream_flush(e, s);
	if (s->credit_pending && s->ctrl_sent == s->ctrl_acked)
		fs_stream_maybe_credit(e, s);
	if (s->closing_pending && s->ctrl_sent == s->ctrl_acked)
		fs_stream_maybe_closing(e, s);
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
		fs_buf_append(&s->hb_ret_head, &s->hb_ret_tail, buf);
		return;
	case FS_MSG_RETURN_END:
		s->hb_peer_end = true;
		goto consume;
	case FS_MSG_ONTO:
		/* TCP first: where the peer's TCP bytes end (tcpfirst.h) */
		if (!fs_tcpfirst_rx_onto(e, s, buf))
			goto consume;
		if (s->state == FS_STREAM_CLOSED) {
			fs_tf_set(&s->tf_rx_tcp, false); /* nobody reads: what follows is consumed */
			goto consume;
		}
		break;
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
	fs_buf_append(&s->rxq_head, &s->rxq_tail, buf);
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

void fs_rx_data(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf, size_t bytes,
		fi_addr_t src)
{
	uint64_t tag = bytes >= FS_WIRE_MSG_PREFIX ? fs_wire_ctrl_tag_decode(buf->mem) : 0;
	struct fs_stream *s = NULL;
	struct fs_wire_msg_hdr hdr = { 0 };
	unsigned kind = fs_tag_kind(tag) & ~FS_MSG_ARM;
	bool arm = fs_tag_kind(tag) & FS_MSG_ARM, in_order;
	unsigned rail = 0;
	uint32_t slot;

	if (bytes >= FS_WIRE_MSG_PREFIX && fs_tag_class(tag) == FS_CLASS_DATA)
		s = fs_rx_stream(e, er, tag, src, &rail);
	if (!s || kind < FS_MSG_DATA || (kind > FS_MSG_RETURN_END && kind != FS_MSG_ONTO) || kind == FS_MSG_CREDIT)
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
		   (kind == FS_MSG_RETURN && !hdr.len) || (kind == FS_MSG_ONTO && hdr.len != FS_WIRE_ONTO_LEN)) {
		goto drop;
	}
	/* Credits bound what may arrive: anything beyond what we advertised,
	 * or outside the window, is not ours. */
	if (fs_seq_after(s->rx_expect, hdr.seq) || hdr.seq - s->rx_expect >= s->ooo_slots ||
	    !fs_credit_rx_allows(&s->credit, hdr.seq))
		goto drop;
	/* Messages come in order as a rule (shm keeps it): the one expected
	 * goes straight to delivery, and the out-of-order ring is allocated
	 * for the first that comes early (efa does not order), so an idle or
	 * in-order stream holds none. */
	in_order = hdr.seq == s->rx_expect;
	slot = hdr.seq % s->ooo_slots;
	if (!in_order && !s->ooo && !(s->ooo = calloc(s->ooo_slots, sizeof(*s->ooo)))) {
		fs_engine_repost(er, buf);
		buf = NULL;
	} else if (!in_order && s->ooo[slot]) {
		goto drop;
	} else {
		/* it goes back to ER when consumed: held_data is ER's */
		buf->rail = (uint8_t)rail;
		buf = fs_rx_keep(er, buf, bytes);
	}
	if (!buf) {
		/* no memory to copy it out or to keep it aside: the byte stream
		 * has a hole */
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
	FS_STAT_ADD(fabric_rx_bytes, hdr.len);
	if (!in_order) {
		s->ooo[slot] = buf;
		FS_STAT_INC(rx_early);
	} else {
		/* in sequence order: this one, then what came early behind it */
		for (;;) {
			s->rx_expect++;
			buf->next = NULL;
			fs_rx_deliver(e, er, s, buf);
			fs_stream_changed(e, s);
			if (!s->ooo || !(buf = s->ooo[s->rx_expect % s->ooo_slots]))
				break;
			s->ooo[s->rx_expect % s->ooo_slots] = NULL;
		}
	}
	fs_stream_arrived(e, s);
	return;
drop:
	if (!s && fs_tag_class(tag) == FS_CLASS_DATA &&
	    fs_engine_freed_recently(e, fs_tag_stream(tag), fs_tag_token(tag))) {
		FS_STAT_INC(msgs_late);
		fs_engine_repost(er, buf);
		return;
	}
	FS_STAT_INC(msgs_dropped);
	if (s)
		FS_DBG("dropped a data message for stream %u (tag %#llx, %zu bytes): seq %u len %u, expected %u, "
		       "limit %u, state %d", s->id, (unsigned long long)tag, bytes, hdr.seq, hdr.len, s->rx_expect,
		       s->credit.limit, s->state);
	else
		FS_DBG("dropped a data message for stream %u (tag %#llx, %zu bytes): no such stream",
		       fs_tag_stream(tag), (unsigned long long)tag, bytes);
	fs_engine_repost(er, buf);
}

void fs_rx_ctrl(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf, size_t bytes,
		fi_addr_t src)
{
	struct fs_stream *s = NULL;
	struct fs_wire_msg_hdr hdr;
	uint64_t tag = 0;
	unsigned kind, rail;

	if (bytes >= FS_WIRE_MSG_PREFIX) {
		tag = fs_wire_ctrl_tag_decode(buf->mem);
		if (fs_tag_class(tag) == FS_CLASS_CTRL)
			s = fs_rx_stream(e, er, tag, src, &rail);
	}
	kind = fs_tag_kind(tag) & ~FS_MSG_ARM;
	if (!s && fs_tag_class(tag) == FS_CLASS_CTRL && fs_msg_is_ctrl(kind) &&
	    fs_engine_freed_recently(e, fs_tag_stream(tag), fs_tag_token(tag))) {
		FS_STAT_INC(msgs_late); /* (msgs_late: engine.h) */
		fs_engine_repost(er, buf);
		return;
	}
	if (!s || !fs_msg_is_ctrl(kind)) {
		FS_STAT_INC(msgs_dropped);
		FS_DBG("dropped a control message for stream %u (tag %#llx, kind %u, %zu bytes)", fs_tag_stream(tag),
		       (unsigned long long)tag, kind, bytes);
		fs_engine_repost(er, buf);
		return;
	}
	fs_wire_hdr_decode(buf->mem + FS_WIRE_CTRL_TAG_LEN, &hdr);
	fs_engine_repost(er, buf);
	s->ctrl_processed++;
	fs_rx_header_common(e, s, &hdr, fs_tag_kind(tag) & FS_MSG_ARM);
	/* The peer closed with HDR.len messages waiting for credit: take them
	 * (credit.h), as many as our own send queue may hold beside a FIN. */
	if (kind == FS_MSG_CLOSING && fs_credit_rx_closing(&s->credit, s->budget, hdr.len, fs_stream_closing_cap())) {
		FS_STAT_INC(closing_taken);
		fs_stream_maybe_credit(e, s);
	}
}

/* ---- consuming --------------------------------------------------------- */

void fs_stream_consume_head(struct fs_engine *e, struct fs_stream *s)
{
	struct fs_buf *buf = s->rxq_head;

	s->rxq_head = buf->next;
	if (!s->rxq_head)
		s->rxq_tail = NULL;
	fs_stream_consumed(e, s);
	fs_engine_repost(fs_stream_rail(s, buf->rail), buf);
}

static bool fs_pull_settled(struct fs_stream *s, void *arg)
{
	struct fs_buf *buf = arg;

	return buf->pull != FS_PULL_POSTED;
}

/* Waits until the provider is done with BUF's pull receive, whose target
 * may be the application's memory: a signal does not end the wait, and a
 * broken or closed stream ends it only through a cancel, whose completion
 * comes like any other. */
static void fs_pull_wait(struct fs_engine *e, struct fs_stream *s, struct fs_buf *buf, int ctl_fd)
{
	bool cancelled = false;
	unsigned step = 0;

	while (buf->pull == FS_PULL_POSTED) {
		if (!cancelled) {
			int ret = fs_stream_wait(e, s, fs_pull_settled, buf, 0, ctl_fd);

			if (ret && ret != -EINTR) {
				fs_engine_pull_cancel(s, buf);
				cancelled = true;
			}
			continue;
		}
		fs_engine_progress(e);
		if (buf->pull != FS_PULL_POSTED)
			break;
		fs_engine_unlock(e);
		fs_spin_relax(&step);
		pthread_mutex_lock(&e->lock);
	}
}

/* Pulls the payload that BUF (an FS_MSG_PULL entry of the receive queue)
 * announces, into DST or, when DST is NULL, into BUF, which then becomes an
 * ordinary data entry; with DST_LEN short of the payload, its first DST_LEN
 * bytes into DST and the rest into BUF (fs_engine_pull). A pull the service
 * thread started already (into BUF: fs_engine_pull_stale) is waited for
 * instead. Returns 0, or a negative errno when the stream broke or was
 * closed meanwhile (the entry then stays unpulled, or empty if its payload
 * was lost). */
static int fs_recv_pull(struct fs_engine *e, struct fs_stream *s, struct fs_buf *buf, void *dst, size_t dst_len,
			int ctl_fd)
{
	int ret = 0;

	if (dst && dst_len > buf->len)
		dst_len = buf->len;
	if (buf->pull == FS_PULL_NONE) {
		/* on the announcement's rail: the payload comes there */
		ret = fs_engine_pull(fs_stream_rail(s, buf->rail), buf, dst, dst_len);
		if (!ret)
			fs_stream_unpulled_dec(e, s);
	} else {
		dst = NULL; /* the service thread's pull lands in BUF */
	}
	if (!ret && buf->pull == FS_PULL_POSTED) {
		s->pulling = true;
		fs_pull_wait(e, s, buf, ctl_fd);
		s->pulling = false;
		fs_stream_changed(e, s); /* readers that waited for the head */
	}
	if (!ret && buf->pull == FS_PULL_DONE) {
		buf->pull = FS_PULL_NONE;
		buf->kind = FS_MSG_DATA;
		if (!dst) {
			FS_STAT_ADD(pull_bounce_bytes, buf->len);
		} else if (dst_len < buf->len) {
			FS_STAT_INC(pulls_split);
			FS_STAT_ADD(pull_direct_bytes, dst_len);
			FS_STAT_ADD(pull_bounce_bytes, buf->len - dst_len);
		} else {
			FS_STAT_ADD(pull_direct_bytes, buf->len);
		}
		return 0;
	}
	if (!ret && buf->pull == FS_PULL_NONE)
		return s->error ? s->error : -EBADF; /* cancelled: it stays announced */
	/* The payload is lost (the peer died under the pull, or the receive
	 * could not be posted): the stream cannot go on. */
	buf->pull = FS_PULL_NONE;
	buf->kind = FS_MSG_DATA;
	s->rx_bytes -= buf->len - buf->off;
	buf->len = buf->off = 0;
	if (!s->error) {
		FS_WARN("stream %u: a payload could not be received; resetting it", s->id);
		s->error = -ECONNRESET;
		FS_STAT_INC(resets);
	}
	fs_stream_changed(e, s);
	return s->error;
}

/* Copies from the receive queue into the iovec starting at byte DONE.
 * Consumes unless PEEK. An announced payload is pulled straight into the
 * application's buffer when this read takes all of it into one iovec
 * element. When it does not fit, a read that already has bytes (and may
 * return short: SHORT_OK) stops before it, so that the next read starts
 * with it, unless the peer's FIN is in (then a short read would say "no
 * more bytes"); otherwise what fits this iovec element is pulled straight
 * into it and only the rest into the bounce buffer, in one pull (where the
 * rail splits pulls; else all of it into the bounce buffer first).
 *
 * Why split (issue 27, curl through nginx proxy_pass): curl reads 100 KiB,
 * the chunk is 128 KiB, so every payload went through a bounce buffer:
 * a third copy, and the provider's copy (shm: the reader's CMA read, under
 * its region lock, which the writer needs to post) landed in a receive
 * buffer this process had never touched (the rail's posted receives are
 * used in turn), page faults and all: 616 us per 128 KiB at the median
 * against 23 us per 64 KiB into the reader's own, warm buffer.
 * Returns bytes copied. */
size_t fs_recv_copy(struct fs_engine *e, struct fs_stream *s, const struct iovec *iov, int iovcnt,
		    size_t done, size_t total, bool peek, bool short_ok, int ctl_fd)
{
	size_t copied = 0;
	struct fs_buf *buf = s->rxq_head;
	uint32_t peek_off = buf ? buf->off : 0;
	int i = 0;
	size_t iov_off = done;

	if (s->pulling)
		return 0; /* another reader is pulling the head */
	while (i < iovcnt && iov_off >= iov[i].iov_len) {
		iov_off -= iov[i].iov_len;
		i++;
	}
	while (buf && (buf->kind == FS_MSG_DATA || buf->kind == FS_MSG_PULL) && done + copied < total &&
	       i < iovcnt) {
		size_t space = iov[i].iov_len - iov_off, avail, n;
		bool direct = false; /* the payload is in the application's buffer already */
		uint32_t off;

		if (buf->kind == FS_MSG_PULL) {
			bool ours = !peek && buf == s->rxq_head && buf->pull == FS_PULL_NONE;
			/* what fits goes to the application, the rest to BUF */
			bool split = ours && space && space < buf->len &&
				     fs_engine_pull_splits(fs_stream_rail(s, buf->rail));

			direct = ours && space >= buf->len;
			/* Stopping short is only safe before the peer's FIN: after
			 * it (POLLRDHUP reported), a read shorter than asked means
			 * "drained" to a reader, as the kernel never returns less
			 * than it holds; haproxy then takes the FIN as reached and
			 * dropped the rest of a response (issue 26). */
			if (!direct && !peek && short_ok && done + copied && !s->peer_fin)
				break;
			if (fs_recv_pull(e, s, buf, direct || split ? (char *)iov[i].iov_base + iov_off : NULL, space,
					 ctl_fd))
				break;
			/* its first SPACE bytes are in the application's buffer:
			 * the copy below counts them and moves BUF's offset past */
			direct |= split;
			if (!buf->len)
				break; /* lost: the stream's error says why */
		}
		off = peek ? peek_off : buf->off;
		avail = buf->len - off;
		n = avail < space ? avail : space;

		if (!direct)
			memcpy((char *)iov[i].iov_base + iov_off, buf->mem + FS_WIRE_MSG_PREFIX + off, n);
		copied += n;
		iov_off += n;
		if (iov_off == iov[i].iov_len) {
			i++;
			iov_off = 0;
		}
		if (peek) {
			peek_off += (uint32_t)n;
			if (peek_off == buf->len) {
				buf = buf->next;
				peek_off = 0;
			}
			continue;
		}
		buf->off += (uint32_t)n;
		s->rx_bytes -= n;
		if (buf->off == buf->len) {
			fs_stream_consume_head(e, s);
			buf = s->rxq_head;
		}
	}
	/* Zero-length data messages never happen, but never let one stall us. */
	while (!peek && s->rxq_head && s->rxq_head->kind == FS_MSG_DATA && s->rxq_head->off == s->rxq_head->len)
		fs_stream_consume_head(e, s);
	return copied;
}

void fs_recv_skip(struct fs_engine *e, struct fs_stream *s, size_t n)
{
	while (n && s->rxq_head && s->rxq_head->kind == FS_MSG_DATA) {
		struct fs_buf *buf = s->rxq_head;
		size_t avail = buf->len - buf->off, k = avail < n ? avail : n;

		buf->off += (uint32_t)k;
		s->rx_bytes -= k;
		n -= k;
		if (buf->off == buf->len)
			fs_stream_consume_head(e, s);
	}
}
