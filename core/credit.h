/* SPDX-License-Identifier: MIT */
/*
 * Receive credits of a stream, and the process-wide budget they come from.
 * Pure arithmetic: no fabric, no allocation, no locks (the engine lock
 * guards every call); tests/unit/test_grant.c drives it alone.
 *
 * The receiver lets its peer send every data message (DATA, PULL, FIN and
 * the hand-back kinds) whose sequence number is at most LIMIT. It says so in
 * each message header as two numbers: FREED, the messages its reader has
 * consumed, and GRANT, how many more it offers; the sender's limit is the
 * largest FREED + GRANT it has seen (it never goes back, whatever order
 * headers arrive in). The HELLO's window is the first grant: messages 1 to
 * window.
 *
 * The grant moves like TCP's receive window under auto-tuning:
 *  - it starts at FLOOR (FABSOCK_WINDOW_MIN), what every stream keeps
 *    however many there are: an idle connection holds a small grant;
 *  - when the peer has used every credit it was given (seen as its last
 *    allowed message arrives, or as the reader consumes), the grant
 *    doubles, up to MAX (FABSOCK_WINDOW), if the budget has room for it,
 *    whether or not the reader reads: like a kernel receive buffer, the
 *    stream takes what its peer writes up to the window, so a writer that
 *    closes and exits has delivered it (the reader may come later);
 *  - when the service thread finds that nothing arrived on the stream
 *    since its last look, the grant drops back to FLOOR (what was already
 *    advertised stays valid: the limit never goes back).
 * The budget (FABSOCK_RX_BUDGET_MB) charges every stream, at COST bytes per
 * message (the largest message it can keep), for what it may hold beyond
 * its floor: max(grant, limit - freed) - floor messages. So the memory all
 * streams of a process may make it hold is at most
 *   streams x FLOOR x COST + budget,
 * not streams x MAX x COST as with a fixed window.
 *
 * Small messages must not run a stream out of credit while its reader waits
 * for more bytes without consuming any (MSG_PEEK until a whole request is
 * there, FIONREAD, a poll for more): when every message the peer was
 * allowed has arrived and what is unread is less than SMALL_BYTES, the
 * grant counts from the arrivals instead of from what was consumed (BASE),
 * as the kernel keeps taking bytes until its receive buffer is full. At most
 * UNREAD_MAX messages are unread and offered at once.
 *
 * A sender that closes (or whose process ends) with messages its credit
 * does not cover, its FIN among them, says how many (FS_MSG_CLOSING, once): the
 * receiver's offer then reaches past its limit by that many (at most CAP,
 * the receiver's own FABSOCK_SEND_QUEUE + 1), charged to the budget, which
 * may be overdrawn for it up to twice its size; a report is due at once.
 * So the bytes a writer wrote before it closed reach its peer's memory,
 * reader or not, as the kernel keeps them in its socket buffers, and its
 * exit does not wait for the reader (FABSOCK_LINGER_SEC used to run out
 * with them undelivered).
 *
 * A report (a CREDIT message, when no data header would carry it) is due
 * when it would move the limit by at least half the grant and the peer has
 * less than half the grant left: so a request/response exchange never needs
 * one (the response carries the count), and a sender that used every credit
 * always gets one once the reader has consumed what it sent (the limit then
 * moves by the whole grant).
 */
#ifndef FS_CORE_CREDIT_H
#define FS_CORE_CREDIT_H

#include <stdbool.h>
#include <stdint.h>

#define FS_CREDIT_SMALL_BYTES (64u * 1024)
#define FS_CREDIT_UNREAD_MAX 256u /* the header's grant field holds 1..256 */

struct fs_credit_budget {
	uint64_t cap;  /* bytes */
	uint64_t used; /* bytes charged to streams */
};

struct fs_credit_rx {
	uint32_t freed;     /* messages the reader consumed */
	uint32_t limit;     /* the largest seq the peer may send, as advertised */
	uint32_t base;      /* the grant counts from here when past freed (small unread messages) */
	uint32_t idle_mark; /* messages received at the service thread's last look */
	uint32_t charged;   /* messages charged to the budget */
	uint32_t cost;      /* bytes per charged message */
	uint32_t closing_to; /* with CLOSING set: the offer reaches this seq at least */
	uint16_t grant, floor, max;
	bool closing; /* the peer closed with messages waiting (FS_MSG_CLOSING) */
};

/* Wrap-safe: A comes after B. */
static inline bool fs_credit_after(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) > 0;
}

/* A fresh stream's credits: FLOOR <= MAX messages (both clamped to
 * 1..UNREAD_MAX), COST bytes each. The first limit is FLOOR (the HELLO's window). */
void fs_credit_rx_init(struct fs_credit_rx *c, unsigned floor, unsigned max, uint32_t cost);

/* The reader consumed N messages; RECEIVED: messages that have arrived on
 * the stream so far, UNREAD_BYTES what is left of them. Grows the grant
 * when the peer had used all of its credit, else applies the small-unread
 * rule (fs_credit_rx_arrived). Returns true if the grant grew (*DENIED set
 * if the budget refused more). */
bool fs_credit_rx_consume(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t n, uint32_t received,
			  uint64_t unread_bytes, bool *denied);

/* Messages arrived (RECEIVED in all) and UNREAD_BYTES wait unread: if the
 * peer has used all its credit, the grant grows, or, at the window, counts
 * from the arrivals when they are small (see above). Returns true if the
 * offer moved (a report is due); *DENIED set if the budget refused it. */
bool fs_credit_rx_arrived(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t received,
			  uint64_t unread_bytes, bool *denied);

/* Whether the peer should be told now (see above). */
bool fs_credit_rx_due(const struct fs_credit_rx *c, uint32_t received);

/* What goes into an outgoing header: FREED and the grant; records the limit
 * they make as advertised. Returns the limit before, for fs_credit_rx_undo
 * if the message did not go. */
uint32_t fs_credit_rx_advertise(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t *freed,
				unsigned *grant);
void fs_credit_rx_undo(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t old_limit);

/* Whether a message numbered SEQ may arrive (within the advertised limit). */
static inline bool fs_credit_rx_allows(const struct fs_credit_rx *c, uint32_t seq)
{
	return !fs_credit_after(seq, c->limit);
}

/* The peer closed with N messages waiting for credit: extends the offer
 * by up to CAP of them past the advertised limit, if the budget's overdraft
 * (up to twice its cap) allows. Returns true if the offer moved (a report
 * is due now). */
bool fs_credit_rx_closing(struct fs_credit_rx *c, struct fs_credit_budget *b, unsigned n, unsigned cap);

/* The service thread's look: RECEIVED as in consume. A stream with nothing
 * new since the last look goes back to its floor. Returns true while the
 * grant is above the floor (look again next time). */
bool fs_credit_rx_idle(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t received);

/* The stream is going: gives back its charge. */
void fs_credit_rx_release(struct fs_credit_rx *c, struct fs_credit_budget *b);

/* Sender side. Messages that may go now: TX_SEQ is the last one sent. */
static inline unsigned fs_credit_tx_avail(uint32_t limit, uint32_t tx_seq)
{
	return fs_credit_after(limit, tx_seq) ? limit - tx_seq : 0;
}

/* A header from the peer said FREED and GRANT: moves *LIMIT forward if they
 * make a larger one. Numbers a peer cannot mean (freed beyond what we sent,
 * a grant of more than MAX_GRANT) are ignored. Returns true if it moved. */
bool fs_credit_tx_update(uint32_t *limit, uint32_t freed, unsigned grant, uint32_t tx_seq, unsigned max_grant);

#endif
