/* SPDX-License-Identifier: MIT */
/*
 * Engine internals shared by engine.c, txq.c, rxq.c, wake.c, stream.c and
 * handback.c only, grouped by the file that defines them. All with the
 * engine lock held unless said otherwise.
 */
#ifndef FS_CORE_STREAM_INTERNAL_H
#define FS_CORE_STREAM_INTERNAL_H

#include <sys/uio.h>

#include "core/engine.h"

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

/* In txq.c: the send queue, its posting, the credit reports, send
 * completions. */

/* Fault injection for tests (engine lock held): the next N sends are
 * refused by "the provider" with -EAGAIN, as shm does when a queue is
 * momentarily full. 0 in a real process. */
extern unsigned fs_fault_post_eagain;

/* The head of S's send queue could be posted now (credit, or the payload of
 * an announcement that went out). */
bool fs_stream_can_post(const struct fs_stream *s);
/* S's send queue is only a corked tail, held for now (txq.c). */
bool fs_stream_cork_holds(const struct fs_stream *s);
void fs_stream_flush(struct fs_engine *e, struct fs_stream *s);
void fs_stream_enqueue(struct fs_engine *e, struct fs_stream *s, struct fs_buf *buf);
/* A fresh data message for S from its rail's send pool, not queued yet;
 * NULL when QUEUED (what its queue holds) is FABSOCK_SEND_QUEUE already or
 * the pool is empty. */
struct fs_buf *fs_txq_data_buf(struct fs_stream *s, unsigned queued);
/* Appends bytes DONE to TOTAL of the iovec to S's send queue, coalescing
 * into its last buffer; returns the new DONE (short: the queue is full). */
/* fs_txq_append with the bytes read from SOURCE straight into the queue's
 * buffers, at most MAX: SOURCE is asked for no more than a buffer's room at
 * a time, so every byte it gives is queued (nothing is read that the queue
 * cannot take). Returns the bytes queued, or SOURCE's answer (0, -errno)
 * when it gave none; *DRAINED when SOURCE gave less than asked (it has no
 * more for now), false when the queue (or the pool) filled first. Engine
 * lock held: SOURCE must not block. */
ssize_t fs_txq_append_from(struct fs_engine *e, struct fs_stream *s, fs_stream_io_fn source, void *arg, size_t max,
			    bool *drained);
size_t fs_txq_append(struct fs_engine *e, struct fs_stream *s, const struct iovec *iov, int iovcnt, size_t done,
		     size_t total);
int fs_stream_queue_fin(struct fs_engine *e, struct fs_stream *s);
void fs_stream_maybe_credit(struct fs_engine *e, struct fs_stream *s);
/* A closed stream whose queue waits for credit tells its peer (txq.c). */
void fs_stream_maybe_closing(struct fs_engine *e, struct fs_stream *s);
/* The most waiting messages of a closing peer a stream takes: as many as
 * our own send queue may hold, and a FIN (its out-of-order slots count
 * them too). */
static inline unsigned fs_stream_closing_cap(void)
{
	return (unsigned)fs_params.send_queue + 1;
}
/* The reader (or the engine for a closed stream) consumed one message of
 * S: its credit comes back, and the grant may grow (core/credit.h). */
void fs_stream_consumed(struct fs_engine *e, struct fs_stream *s);
/* Messages arrived on S and were delivered: the grant may grow, a CREDIT
 * may be due (core/credit.h). */
void fs_stream_arrived(struct fs_engine *e, struct fs_stream *s);
/* Every progress round: the CREDITs whose post failed, again. */
void fs_engine_retry_credits(struct fs_engine *e);
/* A send of ours completed (or failed): its buffer goes back. */
void fs_tx_done(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf);

/* In rxq.c: the shared receives, the per-message receive path, pulls, and
 * taking bytes off the receive queue. */

/* Posts receives from POOL until *POSTED reaches TARGET: 0, or -ENOSPC
 * (pool or memory limit) / -EIO. */
int fs_post_more(struct fs_engine_rail *er, struct fs_pool *pool, unsigned *posted, unsigned target);
/* How many data receives ER keeps posted now. */
unsigned fs_data_want(const struct fs_engine_rail *er);
/* A catch-all receive completed (or was cancelled): it left the provider. */
void fs_recv_landed(struct fs_engine_rail *er, struct fs_buf *buf);
void fs_engine_repost(struct fs_engine_rail *er, struct fs_buf *buf);
/* Completions that progress hands in: a data or control message that
 * landed in a catch-all receive (BYTES long, from SRC), a pull's receive
 * (ERR: 0, or a negative errno: -ECANCELED when cancelled). */
void fs_rx_data(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf, size_t bytes, fi_addr_t src);
void fs_rx_ctrl(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf, size_t bytes, fi_addr_t src);
void fs_rx_pulled(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf, size_t bytes, int err);
/* Posts on ER the receive for exactly the payload announced by BUF (an
 * FS_MSG_PULL entry: BUF->pull_tag, BUF->len bytes) into DST, or into BUF's
 * own payload space when DST is NULL; with DST_LEN short of BUF->len, its
 * first DST_LEN bytes into DST and the rest into BUF, at the offset they
 * have in the payload (a split pull: only where fs_engine_pull_splits).
 * Returns 0 (BUF->pull is FS_PULL_POSTED until the completion) or a
 * negative errno. */
int fs_engine_pull(struct fs_engine_rail *er, struct fs_buf *buf, void *dst, size_t dst_len);
/* Whether ER's receives take a pull in two pieces (FABSOCK_PULL_SPLIT). */
bool fs_engine_pull_splits(const struct fs_engine_rail *er);
/* BUF's announcement leaves the unpulled set of S. */
void fs_stream_unpulled_dec(struct fs_engine *e, struct fs_stream *s);
/* A receive buffer S no longer wants: back to the catch-all receives, after
 * draining the payload first if it is an unpulled FS_MSG_PULL entry. */
void fs_engine_rx_discard(struct fs_engine_rail *er, struct fs_buf *buf);
/* Takes the head of S's receive queue off it (read, returned or dropped):
 * back to the provider, one more credit. */
void fs_stream_consume_head(struct fs_engine *e, struct fs_stream *s);
/* Copies from S's receive queue into the iovec from byte DONE of TOTAL,
 * consuming unless PEEK, pulling announced payloads (which may wait, the
 * engine lock released while it sleeps). Returns the bytes copied. */
size_t fs_recv_copy(struct fs_engine *e, struct fs_stream *s, const struct iovec *iov, int iovcnt, size_t done,
		    size_t total, bool peek, bool short_ok, int ctl_fd);
/* Consumes the first N bytes of S's receive queue, which a peek has just
 * copied (and so pulled: every entry they span is DATA now). */
void fs_recv_skip(struct fs_engine *e, struct fs_stream *s, size_t n);

/* In stream.c. */

/* Copies up to LEN bytes starting at byte OFFSET of the iovec into DST. */
size_t fs_iov_copy_out(void *dst, size_t len, const struct iovec *iov, int iovcnt, size_t offset);
typedef bool (*fs_ready_fn)(struct fs_stream *s, void *arg);
/* Waits with the engine lock held (released while sleeping) until READY,
 * an error, or DEADLINE_NS (0: none). Returns 0 when ready, else -EAGAIN
 * (deadline), -EINTR, -EBADF (closed meanwhile) or the stream's error. */
int fs_stream_wait(struct fs_engine *e, struct fs_stream *s, fs_ready_fn ready, void *arg, uint64_t deadline_ns,
		   int ctl_fd);
/* This side found S unusable (a send failed on the rail, bytes on its
 * control connection, a hand-back it cannot answer): S reports ECONNRESET
 * (once, then EOF/EPIPE), and the peer learns it as from a kernel reset,
 * at once: its control connection gets an RST (fs_tcp_reset). Before,
 * the peer learnt only when this side's application closed. WHY is
 * logged. */
void fs_stream_reset(struct fs_engine *e, struct fs_stream *s, const char *why);

/* In engine.c. */

void fs_engine_add_orphan(struct fs_engine *e, struct fs_stream *s);
/* An orphan's kernel socket closes once its FIN is out (or it broke). */
void fs_orphan_check(struct fs_engine *e, struct fs_stream *s);
/* S is back on TCP and still open: its resources go (its memory stays for
 * its socket until that lets go of it). */
void fs_engine_retire(struct fs_engine *e, struct fs_stream *s);
void fs_engine_reap(struct fs_engine *e);
/* A stream with ID and TOKEN was among the last ones freed. */
bool fs_engine_freed_recently(const struct fs_engine *e, uint32_t id, uint32_t token);

/* In wake.c. */

/* Opens E's deep-sleep eventfd (E->deep_fd, -1 on failure): at engine
 * creation (under the creation lock, before E is published) and again at a
 * deep sleep if that failed. */
void fs_engine_deep_fd_open(struct fs_engine *e);
/* End of a progress round: rings the deep sleepers once (when a change
 * wanted them), and the streams that changed while threads slept on them. */
void fs_engine_deep_wake(struct fs_engine *e);
void fs_engine_ring(struct fs_engine *e);

/* In stripe.c: a stream's rails (engine.h, rail_ep), all with the engine
 * lock held. */

/* A new stream's rails: its home, then (FABSOCK_RAILS above 1,
 * STRIPE_MIN above 0, not shm) the first endpoint of each other usable NIC
 * after the home's, in rank order: what its HELLO offers. */
void fs_stripe_init(struct fs_engine *e, struct fs_stream *s);
/* At the join, with the peer's HELLO or ACK: a SERVER pairs its NICs with
 * the client's rails (its ACK offers those), a client keeps the first
 * min(its, the peer's) rails; then the peer's address on each further rail
 * is inserted (FI_ADDR_UNSPEC where it cannot be: nothing is sent there). */
void fs_stripe_join(struct fs_engine *e, struct fs_stream *s, const struct fs_hello *peer, bool server);
/* Releases the peer's addresses on the further rails (the stream's end). */
void fs_stripe_release(struct fs_stream *s);
/* Disowns S's send buffers still posted on its further rails; how many. */
unsigned fs_stripe_disown(struct fs_stream *s);
/* Whether S uses the NIC whose first endpoint is HEAD (as home or stripe). */
bool fs_stripe_uses(const struct fs_stream *s, const struct fs_engine_rail *head);
/* Which of S's rails ER is (0: the home), -1: none. */
int fs_stripe_rail_of(const struct fs_stream *s, const struct fs_engine_rail *er);
/* The rail S's next data buffer is taken on, QUEUED messages in its send
 * queue: 0 (the home) unless the queue holds FABSOCK_STRIPE_MIN bytes, the
 * peer grants more than one message and fewer other streams than S has
 * further rails have a backlog (those fill the rails by spreading); then
 * the stream's rails in turn, the one with the fewest sends in flight
 * first. */
unsigned fs_stripe_pick(struct fs_stream *s, unsigned queued);
/* In engine.c: how many leading bits two IPv6 (or v4-mapped) addresses share. */
unsigned fs_ip_common_bits(const uint8_t a[16], const uint8_t b[16]);

#endif
