/* SPDX-License-Identifier: MIT */
/*
 * The send queue's rules, all of them: what goes into a stream's queue
 * (writes coalesced into DATA buffers of up to the peer's chunk, FIN,
 * bytes handed back), how it is posted (credit, inline ARMs, the two parts
 * of a pulled payload, a provider's -EAGAIN), what the credit reports
 * in the other direction send (headers, CREDIT messages and their
 * retries, the grant moving through core/credit.c), and what a send's
 * completion does.
 *
 * Who calls in: stream.c (send appends with fs_txq_append, shutdown and
 * close queue the FIN, recv reports what its reader consumed), handback.c
 * (SWITCH, RETURN and RETURN_END messages), negotiate.c (bytes queued
 * before a handshake that failed, fs_stream_take_queued), engine.c (a
 * stream's connect flushes what waited for the HELLO-ACK; each progress
 * round retries refused sends and CREDITs and hands in send completions),
 * rxq.c (an arriving header moves the peer's limit and flushes) and the
 * service thread (fs_engine_grants_idle). Engine lock held throughout.
 */
#include <errno.h>
#include <string.h>

#include "config/log.h"
#include "config/params.h"
#include "core/bell.h"
#include "core/engine.h"
#include "core/ring.h"
#include "core/guard.h"
#include "core/handback.h"
#include "core/tcpfirst.h"
#include "core/stats.h"
#include "core/stream_internal.h"

unsigned fs_fault_post_eagain;

/* ---- the queue and its posting ----------------------------------------- */

/* Messages S may send before its peer grants more. */
static unsigned fs_stream_credits(const struct fs_stream *s)
{
	/* (A stream still in its handshake has no peer address to send to:
	 * it has no credit either, peer_limit 0 until the join; rxq.c's
	 * fs_rx_header_common takes no grant before it.) */
	return fs_credit_tx_avail(s->peer_limit, s->tx_seq);
}

/* A corked stream's last DATA message, not full and not announced, waits
 * for more (engine.h, cork_kept): FS_CORK_HOLD_NS from the first flush
 * that held it, the kernel's own ceiling for a corked partial frame. */
#define FS_CORK_HOLD_NS (200ull * 1000000ull)

static bool fs_cork_tail(const struct fs_stream *s, const struct fs_buf *buf)
{
	return (s->corked || s->more) && buf == s->txq_tail && buf->kind == FS_MSG_DATA && !buf->announced &&
	       buf->len < s->peer_chunk;
}

bool fs_stream_cork_holds(const struct fs_stream *s)
{
	return s->txq_head && fs_cork_tail(s, s->txq_head) &&
	       (!s->cork_held_ns || fs_now_ns() - s->cork_held_ns < FS_CORK_HOLD_NS);
}

/* Whether the flush holds BUF, S's tail, for now (and dates the hold). */
static bool fs_cork_hold(struct fs_stream *s, const struct fs_buf *buf)
{
	uint64_t now;

	if (!fs_cork_tail(s, buf))
		return false;
	now = fs_now_ns();
	if (!s->cork_held_ns)
		s->cork_held_ns = now;
	return now - s->cork_held_ns < FS_CORK_HOLD_NS;
}

/* The head of S's send queue could go now: credit is there, or it is the
 * payload of a sent announcement, which needs none; not a corked tail. */
bool fs_stream_can_post(const struct fs_stream *s)
{
	return s->txq_head && (s->txq_head->announced || fs_stream_credits(s)) && !fs_stream_cork_holds(s);
}

/* Sends BYTES at DATA (inside BUF) to S's peer, on BUF's rail (its pool's:
 * the home unless striped; a pulled payload on its announcement's): tagged
 * with TAG if TAGGED, else untagged; HEADER: a message with a header (not a
 * pulled payload);
 * by inject when it fits (BUF->posted 2: done, no completion will come),
 * else with BUF as the context (posted 1). Returns 0,
 * -EAGAIN (try later) or another negative errno. */
static int fs_post(struct fs_stream *s, struct fs_buf *buf, const void *data, size_t bytes, bool tagged,
		   uint64_t tag, bool header)
{
	struct fs_engine_rail *er = fs_stream_rail(s, buf->rail);
	struct fs_rail *rail = &er->rail;
	bool inject = bytes <= rail->inject_size;
	struct fs_engine *e = NULL;
	bool arms_after = false;
	int ret;

	/* Nobody watches the doorbell (fs_engine_bell_watched): an ARM for
	 * this stream may be waiting there, and this message must ring. A
	 * local peer with a page of sleepers is asked after the post instead:
	 * an ARM datagram goes before its sender counts itself asleep, so
	 * with nobody asleep there (a peer that spins: nginx's answers to a
	 * wrk that has not slept yet) nothing waits for a ring, and the
	 * doorbell's read, a system call per answer, is saved. */
	if (!s->peer_armed && (e = fs_engine_peek()) && !fs_engine_bell_watched(e)) {
		if (fs_ring_peer_paged(s))
			arms_after = true;
		else
			fs_bell_take_arms(e);
	}

	if (!er->open)
		return -ECANCELED; /* the rail closed at exit under a still running thread */
	if (s->peer_ended)
		return -EPIPE; /* no address: nothing is ever queued for it (fs_stream_peer_ended) */
	/* The provider's transmit depth (fi_info tx_attr->size) is a cap:
	 * past it a post is refused here as the provider would refuse it
	 * (EAGAIN, which every caller handles: the send waits for a
	 * completion), without a call that relies on the provider checking
	 * (FI_RM_ENABLED is a request; efa in 1.17 queues some posts past
	 * its device queue in memory of its own). */
	if (!inject && rail->tx_depth && er->tx_posted >= rail->tx_depth)
		return -EAGAIN;
	if (__builtin_expect(fs_fault_post_eagain != 0, 0)) {
		fs_fault_post_eagain--;
		return -EAGAIN;
	}
	FS_GUARD_ENTER();
	FS_PROV_ENTER(er, s->peer_pid);
	ret = fs_rail_send(rail, data, bytes, buf->desc, fs_stream_rail_peer(s, buf->rail), tagged, tag, inject, buf);
	FS_PROV_LEAVE(er);
	FS_GUARD_LEAVE();
	if (ret == -EAGAIN && arms_after) {
		/* (its ARM may be waiting: read it before the ring below) */
		fs_bell_take_arms(e);
		arms_after = false;
	}
	if (ret == -EAGAIN && s->peer_armed) {
		/* The provider may need the peer to make progress first (shm
		 * maps a new peer only when the receiver polls): a peer asleep
		 * on its doorbell would never let this through. */
		fs_bell_ring(s);
	}
	if (ret)
		return ret;
	buf->posted = inject ? 2 : 1;
	if (!inject)
		er->tx_posted++;
	/* (an ARM read now that counts fewer messages than we posted rings at
	 * once: fs_bell_on_arm) */
	if (arms_after && !s->peer_armed && fs_ring_peer_sleeps(s))
		fs_bell_take_arms(e);
	if (s->peer_armed) {
		/* the peer sleeps until told; only a message with a header
		 * disarms the stream there, so a pulled payload's ring names it */
		if (header)
			fs_bell_ring_posted(s);
		else
			fs_bell_ring(s);
	}
	return 0;
}

/* Whether S's next message may carry our ARM (FS_MSG_ARM), which saves a
 * waiter of a sleepy engine its ARM datagram: both ends have a doorbell,
 * the stream is not armed yet, and our reader has taken every message that
 * came (the peer takes the header's freed as what we have seen: with
 * messages unread it would ring at once for nothing). While several of our
 * threads wait (no early arming), still on a stream to a peer of this host
 * that reads our page of sleepers before it rings: a waiter beside others
 * sleeps deeply on its own streams armed so (fs_wait_deep_sleep), and a
 * ring nobody needs costs the peer a memory read. */
static bool fs_stream_arm_inline(const struct fs_stream *s)
{
	struct fs_engine *e = fs_engine_peek();

	return !s->armed && s->credit.freed == s->rx_msgs && s->bell_addr.sin6_port && e &&
	       (fs_engine_arms_early(e) || (fs_engine_spins_short(e) && fs_ring_peer_paged(s))) &&
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
		      FS_TAG_CTRL_ALL, true);
	if (!ret && arm) {
		s->armed = true;
		FS_STAT_INC(bell_arms);
		FS_STAT_INC(bell_arms_inline);
	}
	return ret;
}

/* Writes BUF's header, LEN in its len field (the payload's length; a
 * CLOSING's count); returns the advertised limit before it (for
 * fs_credit_rx_undo if BUF does not go). */
static uint32_t fs_fill_header(struct fs_stream *s, struct fs_buf *buf, uint32_t seq, uint32_t len)
{
	struct fs_wire_msg_hdr hdr = {
		.seq = seq,
		.ctrl_ack = s->ctrl_processed,
		.len = len,
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

			if (!fs_stream_credits(s) || fs_cork_hold(s, buf))
				break;
			s->cork_held_ns = 0;
			old_limit = fs_fill_header(s, buf, s->tx_seq + 1, buf->len);
			ret = fs_post_msg(s, buf, FS_CLASS_DATA, pull);
			if (ret == -EAGAIN) {
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
			if (buf->kind == FS_MSG_DATA) {
				FS_STAT_ADD(fabric_tx_bytes, buf->len);
				FS_STAT_INC(fabric_tx_msgs);
			}
			buf->seq = s->tx_seq;
			buf->announced = pull;
		}
		if (buf->announced) {
			/* The announcement is out: the payload must follow, credit or not. */
			ret = fs_post(s, buf, buf->mem + FS_WIRE_MSG_PREFIX, buf->len, true,
				      fs_tag_pull(s->peer_id, buf->seq, s->token), false);
			if (ret == -EAGAIN)
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
		FS_WARN("stream %u: sending on the %s rail (its rail %u) failed: %s; resetting it", s->id,
			fs_fabric_prov_name(s->erail->rail.kind), buf->rail, strerror(-ret));
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
	 * from retries of sends the provider refused for a moment (-EAGAIN),
	 * long after the credit that allowed them; without this nginx, told
	 * "not writable", waited for an EPOLLOUT that never came. */
	if (s->txq_count < queued)
		fs_stream_changed(e, s);
}

struct fs_buf *fs_txq_data_buf(struct fs_stream *s, unsigned queued)
{
	struct fs_buf *buf;

	unsigned rail;

	if (queued >= fs_params.send_queue)
		return NULL;
	/* Its rail is chosen now (stripe.c): the buffer is registered with
	 * that rail's domain. A further rail's pool that is empty: the home. */
	rail = fs_stripe_pick(s, queued);
	buf = fs_pool_get(&fs_stream_rail(s, rail)->tx_data);
	if (!buf && rail) {
		rail = 0;
		buf = fs_pool_get(&s->erail->tx_data);
	}
	if (buf) {
		buf->kind = FS_MSG_DATA;
		buf->stream = s;
		buf->rail = (uint8_t)rail;
	}
	return buf;
}

/* Queues an empty FIN after the data (once: a shutdown(SHUT_WR) may have
 * queued it). A closed stream also tells its peer what waits for credit. */
int fs_stream_queue_fin(struct fs_engine *e, struct fs_stream *s)
{
	struct fs_buf *buf;

	if (s->peer_ended) {
		s->fin_queued = s->fin_done = true; /* nobody to tell */
		return 0;
	}
	if (!s->fin_queued) {
		/* TCP first: the FIN goes on the fabric, behind the ONTO that
		 * says where our TCP bytes end (tcpfirst.h) */
		if (s->tf_tx_tcp && !fs_tcpfirst_tx_switch(e, s, true))
			return -ENOBUFS;
		buf = fs_pool_get(&s->erail->tx_data);
		if (!buf)
			return -ENOBUFS;
		buf->kind = FS_MSG_FIN;
		buf->stream = s;
		fs_stream_enqueue(e, s, buf);
		s->fin_queued = true;
		fs_stream_flush(e, s);
	}
	if (s->state == FS_STREAM_CLOSED)
		fs_stream_maybe_closing(e, s);
	return 0;
}

void fs_stream_enqueue(struct fs_engine *e, struct fs_stream *s, struct fs_buf *buf)
{
	if (!s->txq_head) {
		e->pending_tx++;
		fs_dlist_add(&e->pending, &s->pending_link);
	}
	fs_buf_append(&s->txq_head, &s->txq_tail, buf);
	s->txq_count++;
}

/* Appends bytes DONE to TOTAL of the iovec to S's send queue: into its last
 * buffer while that is a DATA message with room (up to the peer's chunk, and
 * not announced yet: small writes coalesce while they wait for credit), else
 * into a new buffer, while the queue holds fewer than SEND_QUEUE messages
 * and the pool has one. A buffer that is full goes out at once if credit
 * allows. Returns the new DONE: short of TOTAL when the queue is full (or
 * the pool empty). */
size_t fs_txq_append(struct fs_engine *e, struct fs_stream *s, const struct iovec *iov, int iovcnt, size_t done,
		     size_t total)
{
	while (done < total && s->hb == FS_HB_NONE) {
		struct fs_buf *buf = s->txq_tail;
		size_t room, n;

		/* a buffer whose announcement went out has a fixed length */
		if (!buf || buf->kind != FS_MSG_DATA || buf->len >= s->peer_chunk || buf->announced) {
			buf = fs_txq_data_buf(s, s->txq_count);
			if (!buf)
				break;
			fs_stream_enqueue(e, s, buf);
		}
		room = s->peer_chunk - buf->len;
		n = fs_iov_copy_out(buf->mem + FS_WIRE_MSG_PREFIX + buf->len, room < total - done ? room : total - done,
				    iov, iovcnt, done);
		buf->len += (uint32_t)n;
		done += n;
		if (buf->len >= s->peer_chunk)
			fs_stream_flush(e, s);
	}
	return done;
}

ssize_t fs_txq_append_from(struct fs_engine *e, struct fs_stream *s, fs_stream_io_fn source, void *arg, size_t max,
			    bool *drained)
{
	size_t done = 0;
	ssize_t err = 0;

	*drained = false;
	while (done < max && s->hb == FS_HB_NONE) {
		struct fs_buf *buf = s->txq_tail;
		bool fresh = false;
		size_t want;
		ssize_t n;

		if (!buf || buf->kind != FS_MSG_DATA || buf->len >= s->peer_chunk || buf->announced) {
			buf = fs_txq_data_buf(s, s->txq_count);
			if (!buf)
				break;
			fresh = true;
		}
		want = s->peer_chunk - buf->len;
		if (want > max - done)
			want = max - done;
		n = source(arg, buf->mem + FS_WIRE_MSG_PREFIX + buf->len, want);
		if (n <= 0) {
			/* nothing came: no empty DATA message joins the queue */
			if (fresh)
				fs_pool_put(buf);
			*drained = true;
			err = n;
			break;
		}
		if (fresh)
			fs_stream_enqueue(e, s, buf);
		buf->len += (uint32_t)n;
		done += (size_t)n;
		if (buf->len >= s->peer_chunk)
			fs_stream_flush(e, s);
		if ((size_t)n < want) {
			*drained = true; /* the source has no more for now */
			break;
		}
	}
	return done ? (ssize_t)done : err;
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

/* ---- credit reports ---------------------------------------------------- */

/* After core/credit.c moved S's grant from OLD_GRANT, or was refused by the
 * budget (DENIED): a grown grant is on engine.grown until it goes back; a
 * refused stream is on engine.starved, which the service thread looks at
 * again (fs_engine_grants_idle: other streams may give budget back while
 * S's reader waits without consuming), until an answer is not refused. */
static void fs_stream_grant_after(struct fs_engine *e, struct fs_stream *s, unsigned old_grant, bool denied)
{
	if (s->credit.grant > old_grant) {
		FS_STAT_INC(credit_grows);
		if (!fs_dlist_linked(&s->grant_link))
			fs_dlist_add(&e->grown, &s->grant_link);
	}
	if (denied && !fs_dlist_linked(&s->starve_link)) {
		FS_STAT_INC(credit_denied); /* once per spell, not per retry */
		fs_dlist_add(&e->starved, &s->starve_link);
	} else if (!denied && fs_dlist_linked(&s->starve_link)) {
		fs_dlist_del(&s->starve_link);
	}
}

void fs_stream_consumed(struct fs_engine *e, struct fs_stream *s)
{
	unsigned grant = s->credit.grant;
	bool denied;

	fs_credit_rx_consume(&s->credit, s->budget, 1, s->rx_msgs, s->rx_bytes, &denied);
	fs_stream_grant_after(e, s, grant, denied);
}

/* Messages arrived on S: if they used up the peer's credit, the grant
 * grows (budget permitting), or, at the window, more is offered when what
 * waits unread is small (core/credit.h); so a writer that closes and exits
 * has delivered what the window holds, and a reader that waits for more
 * bytes without consuming is not stuck. */
void fs_stream_arrived(struct fs_engine *e, struct fs_stream *s)
{
	unsigned grant = s->credit.grant;
	bool denied;

	if (s->state != FS_STREAM_OPEN)
		return;
	if (fs_credit_rx_arrived(&s->credit, s->budget, s->rx_msgs, s->rx_bytes, &denied))
		fs_stream_maybe_credit(e, s);
	fs_stream_grant_after(e, s, grant, denied);
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
		if (s->state != FS_STREAM_OPEN)
			fs_dlist_del(&s->starve_link);
		else
			fs_stream_arrived(e, s); /* unlinks it unless refused again */
	}
}

/* Posts a control message of KIND (header only, LEN in its len field) on
 * S, whose control channel is free. Returns 0, -ENOBUFS (no buffer) or
 * -EAGAIN (the provider refused it: the credits it carried are undone). */
static int fs_stream_post_ctrl(struct fs_stream *s, unsigned kind, uint32_t len)
{
	struct fs_buf *buf = fs_pool_get(&s->erail->tx_ctrl);
	uint32_t old_limit;

	if (!buf)
		return -ENOBUFS;
	buf->kind = kind;
	buf->len = 0;
	buf->stream = s;
	old_limit = fs_fill_header(s, buf, s->ctrl_sent + 1, len);
	if (fs_post_msg(s, buf, FS_CLASS_CTRL, false)) {
		fs_credit_rx_undo(&s->credit, s->budget, old_limit);
		fs_pool_put(buf);
		return -EAGAIN;
	}
	s->ctrl_sent++;
	if (buf->posted == 2)
		fs_pool_put(buf);
	return 0;
}

/* S has a CREDIT or CLOSING that could not go now: the progress rounds
 * retry it (fs_engine_retry_credits). */
static void fs_stream_ctrl_retry(struct fs_engine *e, struct fs_stream *s)
{
	if (!fs_dlist_linked(&s->credit_link))
		fs_dlist_add(&e->credit_retry, &s->credit_link);
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
	ret = fs_stream_post_ctrl(s, FS_MSG_CREDIT, 0);
	if (ret == -ENOBUFS)
		return;
	if (ret) {
		/* Not sent (a full transmit queue): the credits stay unreported,
		 * and every progress round retries (fs_engine_retry_credits).
		 * The peer may be waiting for them before it sends anything, so
		 * no header of its would come to retry it, and the reader may
		 * be asleep in epoll_wait, not in a read. */
		s->credit_pending = true;
		fs_stream_ctrl_retry(e, s);
		return;
	}
	s->credit_pending = false;
	if (fs_dlist_linked(&s->credit_link) && !s->closing_pending)
		fs_dlist_del(&s->credit_link);
}

/* Whether S's CLOSING is still worth sending: closed after its handshake
 * (the peer's address known), messages waiting beyond its credit, the
 * stream not broken. (peer_gone is no reason not to: the exit sets it on
 * every stream only not to wait for the peer's FIN.) */
static bool fs_stream_closing_wanted(const struct fs_stream *s)
{
	return !s->closing_sent && s->fin_queued && s->state == FS_STREAM_CLOSED && s->peer_addr != FI_ADDR_UNSPEC &&
	       s->hb == FS_HB_NONE && !s->error && s->txq_head && fs_stream_credits(s) < s->txq_count;
}

/* S is closed (or its process is ending) with messages its peer's credit
 * does not cover, its FIN among them: tells the peer how many
 * (FS_MSG_CLOSING, once), so that it takes them now, reader or not
 * (credit.h). Without it the bytes waited for the peer's reader, and an
 * exit gave up on them after FABSOCK_LINGER_SEC. Needs the control channel
 * free (one unacknowledged CTRL at a time), else it is retried when the
 * peer's acknowledgement comes, or by the progress rounds. Engine lock held. */
void fs_stream_maybe_closing(struct fs_engine *e, struct fs_stream *s)
{
	if (!fs_stream_closing_wanted(s)) {
		s->closing_pending = false;
		return;
	}
	/* header only: its len field says how many messages wait */
	if (s->ctrl_sent == s->ctrl_acked && !fs_stream_post_ctrl(s, FS_MSG_CLOSING, s->txq_count)) {
		s->closing_sent = true;
		s->closing_pending = false;
		FS_STAT_INC(closing_sent);
		return;
	}
	s->closing_pending = true;
	fs_stream_ctrl_retry(e, s);
}

/* Retries the CREDITs (and CLOSINGs) whose post failed or had to wait; a
 * stream leaves the list once they went out or it can no longer send them.
 * Engine lock held. */
void fs_engine_retry_credits(struct fs_engine *e)
{
	for (struct fs_dlist *n = e->credit_retry.next, *next; n != &e->credit_retry; n = next) {
		struct fs_stream *s = fs_stream_of(n, credit_link);

		next = n->next; /* a CREDIT that goes out unlinks S */
		if (s->credit_pending && s->ctrl_sent == s->ctrl_acked)
			fs_stream_maybe_credit(e, s);
		if (s->closing_pending && s->ctrl_sent == s->ctrl_acked)
			fs_stream_maybe_closing(e, s);
		if (s->closing_pending && !fs_stream_closing_wanted(s))
			s->closing_pending = false;
		if (fs_dlist_linked(&s->credit_link) && !s->closing_pending &&
		    (!s->credit_pending || s->error || s->peer_gone ||
		     (s->state != FS_STREAM_OPEN && s->hb != FS_HB_SWITCHING)))
			fs_dlist_del(&s->credit_link);
	}
}

/* ---- send completions -------------------------------------------------- */

/* A send of ours completed (or failed). */
void fs_tx_done(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf)
{
	struct fs_stream *s = buf->stream;

	if (buf->posted == 1 && er->tx_posted)
		er->tx_posted--;
	buf->posted = 0;
	if (s && buf->role == FS_BUF_TX && !fs_msg_is_ctrl(buf->kind)) {
		fs_stream_changed(e, s);
		s->tx_inflight--;
		if (buf->kind == FS_MSG_FIN)
			s->fin_done = true;
		if (s->state == FS_STREAM_CLOSED)
			fs_orphan_check(e, s);
	}
	fs_pool_put(buf);
}
