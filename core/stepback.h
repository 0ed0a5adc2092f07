/* SPDX-License-Identifier: MIT */
/*
 * Stepping back from the fabric (issue 27, "step back when the fabric
 * loses"): the per-stream measure of whether the fabric pays, and the
 * decision to hand a stream back to kernel TCP when it does not.
 *
 * Why: a request/response stream whose waits end in a sleep pays fabsock's
 * sleep and wake-up (arming, a ring, a progress round over the completion
 * queue, the engine lock) on every turn, and those cost more than the
 * kernel's socket wake-up; with more runnable processes than cores
 * (pgbench -c 4 on two cores, memcslap, a proxy) that is every turn, and
 * such streams ran 0.2-0.6x the kernel. The fabric wins when the answer
 * comes within the spin (a free core: pgbench -c 1 is 1.2-2x) or when a
 * turn moves many bytes (copies, not wake-ups, dominate).
 *
 * The measure, per socket (struct fs_stepback in struct fs_sock), counted
 * in the data entry points (sock_io.c) for offloaded streams only, once per
 * call for the step-back and the connection history both (the stream's
 * totals are the history's): a turn is a receive of data after a send. It is judged by the thread that read
 * it: "slept" when that thread's last wait before the read
 * (fs_wait_thread: the stream wait, poll, select or epoll_wait) ended after
 * FABSOCK_SPIN_US with few events; "quick" when it ended within the spin,
 * or the data was there without a wait since the send. One thread counts:
 * the first to cross a turn's boundary on the stream; a stream on which a
 * second thread starts a request or reads the start of an answer is never
 * judged (fs_stepback_mine).
 * Every FABSOCK_STEPBACK_TURNS turns the window is judged (not the first:
 * the warm-up; two in a row must say so)
 * (fs_stepback_judge): average bytes per turn at most
 * FABSOCK_STEPBACK_BYTES, at least half the turns judged, and
 * FABSOCK_STEPBACK_SLEPT_PCT % of those slept: the stream is handed back
 * (core/handback.h, as initiator) and counted in handback_fabric_slower;
 * otherwise the next window starts. Per stream, not per process: turns and
 * bytes are a stream's, and one process's streams differ (a server with a
 * busy client and an idle one); the sleep is a thread's, attributed to the
 * stream whose answer it waited for.
 *
 * A client that steps back tells its connection history (history.h), so
 * that the program's next connections to the destination start on TCP
 * (with the history's relearn).
 */
#ifndef FS_CORE_STEPBACK_H
#define FS_CORE_STEPBACK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/params.h"
#include "core/util.h"
#include "core/wait.h"

struct fs_sock;
struct fs_history_conn;

/* A stream's turns and bytes, counted once per data call for both of
 * their readers: the step-back's windows (below) and the connection
 * history's report at close (history.h, through fs_stepback_totals). The
 * stream's totals and last_send are every data-calling thread's (relaxed
 * atomics: plain loads and stores on x86; two threads counting at the
 * same instant may lose one count, which a heuristic can afford, and no
 * field is ever written by two threads without them); the window's
 * fields are the owner thread's alone (fs_stepback_mine). */
struct fs_stepback {
	/* the stream's, all threads (atomic, relaxed) */
	uint64_t bytes;    /* payload moved, both directions, since the offload */
	uint32_t requests; /* sends that followed a receive, and the first: the history's turns */
	bool last_send;    /* the last data call was a send: the next receive ends a turn */
	bool held_first;   /* the first request was held before the HELLO-ACK (atomic) */
	/* the window's, the owner's alone */
	uint64_t window_from; /* bytes when this window began */
	uint32_t waits;    /* the owner's fs_wait_thread.waits at the turn's request */
	uint32_t turns;    /* this window */
	uint32_t measured; /* turns judged (all, since one thread counts) */
	uint32_t slept;    /* of those, answers that came after a sleep */
	bool warm;         /* the first window is over (it is not judged) */
	bool strike;       /* the last window said "step back" (atomic: the close reads it) */
	uint16_t judged;   /* windows judged (past the warm-up; atomic: the close reads it) */
	uint16_t judged_over; /* ... of them, windows that said "step back" */
	uint64_t window_ns; /* fs_now_ns() when this window began (0: the warm-up's) */
	uint64_t strike_ns; /* ... when the first of the windows in a row that said so began */
	/* the judged windows' time and turns (the owner's; atomic: the close
	 * reads them) */
	uint64_t judged_ns;
	uint32_t judged_turns;
	/* the client socket's history (set before its connect: fs_core_connect);
	 * NULL: a server's stream, judged by its sleeps alone */
	const struct fs_history_conn *hist;
	bool done;         /* decided (handed back), or never to decide (atomic) */
	uintptr_t owner;   /* the one thread that counts (atomic; 0: none yet) */
};

/* Whether this thread counts for SB's window: the first thread to cross a
 * turn's boundary on the stream (fs_stepback_sent/received) owns the
 * measure, and every window field is its alone. A stream whose data calls come from a second thread (a sender and
 * a reader thread: a duplex or streaming program, not a request/response
 * one) is never judged: the two would race on the counts (TSan, CI). Its
 * totals still count. */
static inline bool fs_stepback_mine(struct fs_stepback *sb)
{
	uintptr_t self = (uintptr_t)pthread_self();
	uintptr_t owner = __atomic_load_n(&sb->owner, __ATOMIC_RELAXED);

	if (__atomic_load_n(&sb->done, __ATOMIC_RELAXED))
		return false;
	if (owner == self ||
	    (!owner && __atomic_compare_exchange_n(&sb->owner, &owner, self, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)))
		return true;
	__atomic_store_n(&sb->done, true, __ATOMIC_RELAXED);
	return false;
}

/* Whether a window of TURNS turns (MEASURED judged) moving BYTES is of the
 * kind the step-back judges at all: small turns (at most
 * FABSOCK_STEPBACK_BYTES a turn), half of them judged. Pure. */
bool fs_stepback_small(uint32_t turns, uint32_t measured, uint64_t bytes);
/* Whether such a window (SMALL: fs_stepback_small), SLEPT of its MEASURED
 * turns after a sleep, steps back by its sleeps. Pure:
 * tests/unit/test_stepback.c. */
bool fs_stepback_judge(bool small, uint32_t measured, uint32_t slept);

/* The fabric's time per turn FAB against TCP's, TCP (ns; both known): -1
 * when the fabric was faster by FS_STEPBACK_FASTER_PCT at least, 1 when it
 * was slower by FS_STEPBACK_SLOWER_PCT at least, 0 between (the margins
 * keep a stream from flapping on noise). Pure; the one rule of both the
 * windows (fs_stepback_measure) and the history's decision
 * (fs_history_decide). */
#define FS_STEPBACK_FASTER_PCT 5u
#define FS_STEPBACK_SLOWER_PCT 10u
static inline int fs_stepback_compare(uint64_t fab, uint64_t tcp)
{
	if (fab * 100 <= tcp * (100 - FS_STEPBACK_FASTER_PCT))
		return -1;
	return fab * 100 >= tcp * (100 + FS_STEPBACK_SLOWER_PCT) ? 1 : 0;
}

/* A judged window's verdict by time: OVER, what its sleeps said, against
 * NS_TURN, its time per turn, and the program's recent TCP connections to
 * the destination (fs_history_tcp_ns_turn). A window the sleeps condemn
 * but that ran faster does not step back (stepback_overruled: a sleep is a
 * proxy for the fabric's cost, the time per turn is the cost); one they
 * keep, of the step-back's kind (SMALL: fs_stepback_small), but that ran
 * slower says "step back" (stepback_measured_slower), with the same streak
 * rule (two windows in a row, FABSOCK_STEPBACK_MS). A server's stream (no
 * history) and a program with no TCP time of the last minutes keep the
 * sleeps' verdict. */
bool fs_stepback_measure(struct fs_stepback *sb, bool over, uint64_t ns_turn, bool small);

/* The stream's totals: what moved, counted in one place (plain adds on
 * the data path; relaxed so that a second thread's count is no race). */
static inline void fs_stepback_count(struct fs_stepback *sb, uint64_t n)
{
	__atomic_store_n(&sb->bytes, __atomic_load_n(&sb->bytes, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
}

/* A send's turn boundary: true when it follows a receive (or is the
 * first), which starts a request. */
static inline bool fs_stepback_request(struct fs_stepback *sb)
{
	if (__atomic_load_n(&sb->last_send, __ATOMIC_RELAXED))
		return false;
	__atomic_store_n(&sb->last_send, true, __ATOMIC_RELAXED);
	__atomic_store_n(&sb->requests, __atomic_load_n(&sb->requests, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
	return true;
}

/* An offloaded stream's send took N bytes. Inline: every send. Who owns
 * the window is asked at a turn's boundaries only, where the window's
 * fields are written: a second thread's call in the middle of a request
 * (or of an answer) touches none of them, and a duplex program's sender
 * and reader each cross a boundary at once. */
static inline void fs_stepback_sent(struct fs_stepback *sb, uint64_t n)
{
	fs_stepback_count(sb, n);
	if (fs_stepback_request(sb) && fs_stepback_mine(sb))
		sb->waits = fs_wait_thread.waits;
}

/* Bytes the application wrote before the HELLO-ACK, held for the stream
 * (sock_io.c, fs_sock_send_early): they count for the totals and start the
 * first request (the history's first turn), but claim no owner (the thread
 * that connects and writes first need not be the one that goes on: a
 * pool's), and the answer to them is no turn of the step-back's window:
 * its first turn is the first request made on the fabric, for the client
 * as for the server, whose windows end at the same turn. */
static inline void fs_stepback_sent_held(struct fs_stepback *sb, uint64_t n)
{
	fs_stepback_count(sb, n);
	if (fs_stepback_request(sb))
		__atomic_store_n(&sb->held_first, true, __ATOMIC_RELAXED);
}

/* An offloaded stream's receive returned N bytes of data. Returns true
 * when the window just ended says: step back (fs_stepback_fire). */
static inline bool fs_stepback_received(struct fs_stepback *sb, uint64_t n)
{
	bool over;

	fs_stepback_count(sb, n);
	if (!__atomic_load_n(&sb->last_send, __ATOMIC_RELAXED))
		return false; /* the rest of the same answer */
	__atomic_store_n(&sb->last_send, false, __ATOMIC_RELAXED);
	if (!fs_stepback_mine(sb))
		return false;
	if (__builtin_expect(__atomic_load_n(&sb->held_first, __ATOMIC_RELAXED), 0)) {
		__atomic_store_n(&sb->held_first, false, __ATOMIC_RELAXED);
		return false; /* the answer to the held request */
	}
	sb->turns++;
	sb->measured++;
	/* a wait since the request, and the last one slept */
	if (fs_wait_thread.waits != sb->waits && fs_wait_thread.last_slept)
		sb->slept++;
	if (sb->turns < fs_params.stepback_turns)
		return false;
	/* the first window is the stream's warm-up (the rail opening, the
	 * ring's hand-over, the grant growing): its waits are late for
	 * reasons that pass; judging it stepped back 6 pairs that ran 2.5x
	 * the kernel's rate once warm */
	bool small = fs_stepback_small(sb->turns, sb->measured,
				       __atomic_load_n(&sb->bytes, __ATOMIC_RELAXED) - sb->window_from);
	over = sb->warm && fs_params.stepback && fs_stepback_judge(small, sb->measured, sb->slept);
	uint64_t now = fs_now_ns();
	if (sb->warm && sb->window_ns && now > sb->window_ns) {
		/* a judged window: its time per turn, kept for the history and
		 * compared with the program's TCP connections before its
		 * sleeps may say "step back" */
		__atomic_store_n(&sb->judged_ns, sb->judged_ns + (now - sb->window_ns), __ATOMIC_RELAXED);
		__atomic_store_n(&sb->judged_turns, sb->judged_turns + sb->turns, __ATOMIC_RELAXED);
		if (fs_params.stepback)
			over = fs_stepback_measure(sb, over, (now - sb->window_ns) / sb->turns, small);
	}
	if (sb->warm && sb->judged < UINT16_MAX) {
		__atomic_store_n(&sb->judged, sb->judged + 1, __ATOMIC_RELAXED);
		if (over)
			__atomic_store_n(&sb->judged_over, sb->judged_over + 1, __ATOMIC_RELAXED);
	}
	sb->warm = true;
	/* two windows in a row, spanning FABSOCK_STEPBACK_MS at least: a
	 * passing spell of load (a build beside, a burst of other clients,
	 * a database's checkpointer) does not hand back for good a stream
	 * that wins on the fabric most of the time. A fast stream's window
	 * is a few ms (pgbench -S -c 1: 128 turns in 4-5 ms, where the
	 * fabric runs it at 1.5-1.8x the kernel): a new backend's slow
	 * first answers (cold caches) stepped it back in 3 bench runs of 3
	 * with two windows alone, and with a 100 ms floor. A slow stream's
	 * two windows span the time anyway. */
	if (over && !__atomic_load_n(&sb->strike, __ATOMIC_RELAXED)) {
		__atomic_store_n(&sb->strike, true, __ATOMIC_RELAXED);
		sb->strike_ns = sb->window_ns;
		over = false;
	} else if (!over) {
		__atomic_store_n(&sb->strike, false, __ATOMIC_RELAXED);
	} else if (fs_params.stepback_ms && now - sb->strike_ns < fs_params.stepback_ms * 1000000ull) {
		over = false; /* a streak, not yet long enough */
	}
	sb->window_ns = now;
	sb->turns = sb->measured = sb->slept = 0;
	sb->window_from = __atomic_load_n(&sb->bytes, __ATOMIC_RELAXED);
	return over;
}

/* Whether SB's stream was losing on the fabric when it closed: its last
 * window said "step back" (fs_stepback_judge, past the warm-up), or more
 * than half of its judged windows did, and it had not stepped back (the
 * streak had not lasted FABSOCK_STEPBACK_MS). A connection shorter than
 * the streak's time (wrk's through a proxy: 1,000 requests, 200-400 ms,
 * nginx's keepalive_requests) never stepped back, and its close told the
 * history that the fabric paid: the next ones were offloaded, each to lose
 * for its whole life. By the last window alone, one in three or four such
 * connections closed after a window that happened not to lose, and its
 * whole window took a step-back off the history: 10 of a wrk run's 80
 * connections went on the fabric again. */
static inline bool fs_stepback_losing(const struct fs_stepback *sb)
{
	uint16_t judged = __atomic_load_n(&sb->judged, __ATOMIC_RELAXED);

	return fs_params.stepback && !__atomic_load_n(&sb->done, __ATOMIC_RELAXED) &&
	       (__atomic_load_n(&sb->strike, __ATOMIC_RELAXED) ||
		(judged && 2u * __atomic_load_n(&sb->judged_over, __ATOMIC_RELAXED) > judged));
}

/* The stream's judged windows' time per turn (ns), once they make a whole
 * window; 0 before. */
static inline uint64_t fs_stepback_ns_turn(const struct fs_stepback *sb)
{
	uint32_t turns = __atomic_load_n(&sb->judged_turns, __ATOMIC_RELAXED);

	return turns >= fs_params.stepback_turns ? __atomic_load_n(&sb->judged_ns, __ATOMIC_RELAXED) / turns : 0;
}

/* The stream's totals, for the history's report at close: its turns (the
 * requests) and bytes. */
static inline void fs_stepback_totals(const struct fs_stepback *sb, uint64_t *turns, uint64_t *bytes)
{
	*turns = __atomic_load_n(&sb->requests, __ATOMIC_RELAXED);
	*bytes = __atomic_load_n(&sb->bytes, __ATOMIC_RELAXED);
}

/* Whether TURNS make at least one whole step-back window: a stream that
 * long on the fabric without stepping back shows that the fabric pays
 * (the history clears its step-back count). */
static inline bool fs_stepback_whole_window(uint64_t turns)
{
	return turns >= fs_params.stepback_turns;
}

/* The window of S said "step back": hands its stream back to TCP (unless
 * it is on its way already, or closing), counts it, tells the history.
 * No lock held. */
void fs_stepback_fire(struct fs_sock *s);

#endif
