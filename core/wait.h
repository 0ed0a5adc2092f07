/* SPDX-License-Identifier: MIT */
/*
 * One blocking wait's pace: how long it spins, the sleep slices that grow
 * after the spin, its deadline, and whether its answer came late. Every
 * waiting loop of the core (a stream's send and receive, poll and select,
 * epoll_wait, the handshake's peeks, the probe's answer) keeps a struct
 * fs_wait and asks it, each round, what to do: look again at once (spin),
 * sleep a slice, or stop (the deadline has passed). What a loop looks at,
 * what it sleeps on and which locks it holds stay the loop's own, except
 * the deep sleep of the loops without the engine lock (fs_wait_deep_sleep).
 *
 * One deadline convention: an absolute time on fs_now_ns()'s clock
 * (CLOCK_MONOTONIC, ns), 0 for none. Callers with a relative timeout
 * convert it once, at their entry, with fs_wait_deadline_ms/_ns. The policy
 * (fs_wait_init, fs_wait_next, fs_wait_slice_ns, fs_wait_clamp_ns,
 * fs_wait_ms_until, fs_wait_late) reads no clock: it is handed the time,
 * so that tests/unit/test_wait.c can drive it.
 */
#ifndef FS_CORE_WAIT_H
#define FS_CORE_WAIT_H

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "config/params.h"
#include "core/runq.h"
#include "core/util.h"

struct fs_stream;
struct fs_sock;

struct fs_engine;

/* The first sleep slice after the spin; each one after doubles, up to
 * fs_wait_slice_cap_us. */
#define FS_WAIT_FIRST_SLICE_US 10u
/* The most streams a waiter beside others may sleep deeply on (its own
 * ARMs, fs_wait_deep_sleep); a set of more waits in slices as before. */
#define FS_WAIT_OWN_MAX 32u
/* The spin of a wait in a sleepy engine, or with FABSOCK_WAIT_ARM, whose
 * waits outlast the spin anyway (fs_engine_spins_short): on a machine with
 * more waiters than cores every spin takes a core from a process with
 * work. Waits are still judged late or quick by SPIN_US (late_at), so
 * that quick answers end the sleepiness. */
#define FS_SLEEPY_SPIN_US 10u
/* A wait that brought more events than this is not counted late, however
 * long it took: one sleep served many messages (wake.c's sleepiness score,
 * the step-back measure). */
#define FS_SLEEPY_EVENTS 2
/* The spin of a wait while the host has no core free (runq.h): one look. */
#define FS_CROWDED_SPIN_US 1u

struct fs_wait {
	uint64_t start;      /* when the wait began */
	uint64_t deadline;   /* when it gives up; 0: never */
	uint64_t spin_end;   /* it looks without sleeping until then */
	uint64_t late_at;    /* start + SPIN_US: an answer after it is late */
	uint64_t idle_since; /* the slice cap grows with the time since */
	uint64_t slice_us;   /* the next sleep slice, before the deadline's clamp */
	unsigned step;       /* fs_spin_relax's count */
	uint64_t ceded_ns;   /* time its spin's yields gave the core to other threads (fs_wait_spin) */
};

enum fs_wait_step {
	FS_WAIT_SPIN,  /* look again at once, after fs_wait_spin */
	FS_WAIT_SLEEP, /* sleep fs_wait_slice_ns (or the loop's own, clamped) */
	FS_WAIT_OVER,  /* the deadline has passed */
};

/* The deadline of a wait that starts at NOW for TIMEOUT_MS (poll's and
 * epoll_wait's convention: negative for none, 0 for a single look). */
uint64_t fs_wait_deadline_ms(uint64_t now, int timeout_ms);
/* The same for a timeout in nanoseconds (negative: none). */
uint64_t fs_wait_deadline_ns(uint64_t now, int64_t timeout_ns);

/* Starts W at NOW, giving up at DEADLINE (0: never). It spins SPIN_US, or
 * FS_SLEEPY_SPIN_US when SHORT_SPIN and that is shorter. */
void fs_wait_init(struct fs_wait *w, uint64_t now, uint64_t deadline, bool short_spin);
/* fs_wait_init for a wait on engine E (NULL: none yet): a short spin when
 * E is sleepy (fs_engine_spins_short). */
void fs_wait_begin(struct fs_wait *w, const struct fs_engine *e, uint64_t now, uint64_t deadline);

/* What the round at NOW does: stop once the deadline has passed, else
 * spin until spin_end, else sleep. Inline: a spinning loop asks it on
 * every turn. */
static inline enum fs_wait_step fs_wait_next(const struct fs_wait *w, uint64_t now)
{
	if (w->deadline && now >= w->deadline)
		return FS_WAIT_OVER;
	return now < w->spin_end ? FS_WAIT_SPIN : FS_WAIT_SLEEP;
}
/* The sleep slice for the round at NOW, in ns, never past the deadline; the
 * next one doubles, up to the cap for the time idle since idle_since. */
uint64_t fs_wait_slice_ns(struct fs_wait *w, uint64_t now);
/* NS, shortened so that a sleep starting at NOW ends by the deadline. */
uint64_t fs_wait_clamp_ns(const struct fs_wait *w, uint64_t now, uint64_t ns);
/* Milliseconds from NOW until UNTIL, rounded up (a timeout the kernel
 * takes in ms must not end early), at most INT_MAX; -1 when UNTIL is 0
 * (none), 0 when it has passed. */
int fs_wait_ms_until(uint64_t now, uint64_t until);
/* Something happened at ACTIVE_NS (the engine's last activity): the slice
 * cap counts idleness from then, if later than the wait's start. */
void fs_wait_note_activity(struct fs_wait *w, uint64_t active_ns);
/* Whether an answer at NOW came only after SPIN_US. */
static inline bool fs_wait_late(const struct fs_wait *w, uint64_t now)
{
	return now >= w->late_at;
}
/* The longest sleep slice after IDLE_NS of waiting with nothing happening:
 * FABSOCK_SLEEP_MAX_US, or FABSOCK_IDLE_SLEEP_US after IDLE_AFTER_MS. */
uint64_t fs_wait_slice_cap_us(uint64_t idle_ns);

/* W got EVENTS (> 0) things it waited for, now: tells engine E (NULL: none)
 * whether they came late (fs_engine_wait_done), and notes it for this
 * thread (fs_wait_thread). Reads the clock. */
void fs_wait_done(const struct fs_wait *w, struct fs_engine *e, int events);
/* Whether W, ending at NOW with EVENTS things, counts as a sleep for the
 * step-back measure (fs_wait_thread.last_slept): its answer came after
 * SPIN_US, or its spin's yields gave the core to other threads for
 * FS_CEDED_SLEPT_NS; and it brought at most FS_SLEEPY_EVENTS. Pure. */
bool fs_wait_slept(const struct fs_wait *w, uint64_t now, int events);

/* This thread's waits, for the step-back measure (core/stepback.h): a turn
 * of a stream whose answer this thread waited for is judged by the last
 * wait that ended before the answer was read. */
struct fs_wait_thread {
	uint32_t waits;  /* waits that ended with something (fs_wait_done) */
	bool last_slept; /* the last one came late, with few events */
	/* The streams the poll, select or epoll_wait of this thread waits
	 * for (fs_wait_own_*), for its deep sleep while other threads wait
	 * too; own_bad: more than FS_WAIT_OWN_MAX, or something only a look
	 * can settle (a socket still negotiating, a nested instance). */
	unsigned own_n;
	bool own_bad;
	struct fs_sock *own[FS_WAIT_OWN_MAX]; /* a reference each (fs_wait_own_reset drops them) */
};
extern __thread struct fs_wait_thread fs_wait_thread __attribute__((tls_model("initial-exec")));

/* What this thread's poll, select or epoll_wait waits for, told before
 * it may sleep deeply (fs_wait_deep_sleep): reset (which drops the
 * references; no engine lock held), each offloaded socket it looks at (a
 * reference is taken: its stream stays while this thread may sleep on it),
 * or "something else" (bad: no deep sleep beside other waiters). fs_wait_own_wanted: whether a deep sleep would ask (the engine
 * is sleepy and more than one thread waits), so that an epoll instance
 * walks its members only then. No lock. */
void fs_wait_own_reset(void);
void fs_wait_own_add(struct fs_sock *s);
void fs_wait_own_bad(void);
bool fs_wait_own_wanted(void);

/* For poll, select and epoll_wait, which wait without the engine lock:
 * when the engine is deeply idle, sleeps in ppoll on FDS[0..N), the
 * engine's deep fd, the doorbell, the ring eventfd and the provider's
 * completion-queue fd where it has one (tcp, net) (FDS has room for
 * N + FS_WAIT_DEEP_SLOTS; a ring is read here) for FS_BELL_SLICE_MS at most, never past W's deadline, sets
 * *SLEPT and returns ppoll's count of FDS[0..N) or -errno. Otherwise
 * returns 0 at once with *SLEPT false; and -EAGAIN when this call has just
 * armed every stream: the caller looks at its set once more (a message may
 * have come before the ARM) and may then sleep deeply. Takes the engine
 * lock itself and sleeps without it. */
#define FS_WAIT_DEEP_SLOTS 4
int fs_wait_deep_sleep(const struct fs_wait *w, struct pollfd *fds, nfds_t n, const sigset_t *sigmask,
		       bool *slept);

/* For a blocking receive or send (stream.c), which waits with the engine
 * lock held: whether its wait on S may sleep as a waiter beside others
 * does (the engine is sleepy, more than one thread waits, S asked its peer
 * for a ring with our last message and nothing of ours is in flight on it,
 * nothing else of the engine needs a look), and that sleep: on S's eventfd
 * and CTL_FD (its revents in *CTL_REVENTS), the doorbell and the ring too
 * if no other sleeper watches them, for FS_BELL_SLICE_MS at most, never
 * past W's deadline. The sleep drops the engine lock and returns without
 * it: ppoll's count for CTL_FD, 0 (woken for S, or not slept), or -errno. */
bool fs_wait_stream_beside(struct fs_engine *e, const struct fs_stream *s);
int fs_wait_stream_beside_sleep(struct fs_engine *e, const struct fs_wait *w, struct fs_stream *s, int ctl_fd,
				short *ctl_revents);

/* How often a spinning wait asks the kernel about the application's own
 * descriptors (and the control connections of its offloaded sockets)
 * between its looks at the streams. Asking on every look cost a system
 * call each: a sleepy postgres backend made about five epoll_wait calls
 * per query where the kernel's wait makes one. */
#define FS_WAIT_KERNEL_EVERY_NS 5000ull

/* Whether W's round at NOW, which does not sleep and does not end the wait
 * (its deadline has not passed, it found nothing yet), leaves the kernel
 * for a later round. KERNEL_AT: when W last asked (0: not yet); ARMED:
 * this round armed the streams and looks at them once more before it
 * sleeps. A kernel event is not lost by waiting: it stays pending, and
 * every sleep of a wait has the kernel's descriptors in its set (the deep
 * sleep's ppoll, a slice).
 * - just armed: the sleep of the next round asks, or that round does;
 * - the first round of a short spin (a sleepy engine, whose answers come
 *   after it anyway): the sleep after it asks;
 * - a later spinning round: every FS_WAIT_KERNEL_EVERY_NS. */
static inline bool fs_wait_kernel_later(const struct fs_wait *w, uint64_t now, uint64_t kernel_at, bool armed)
{
	if (armed)
		return true;
	if (!kernel_at)
		return w->spin_end - w->start <= FS_SLEEPY_SPIN_US * 1000ull;
	return now - kernel_at < FS_WAIT_KERNEL_EVERY_NS;
}

/* One step of a spinning wait: a pause, and every fourth step a yield of
 * the CPU. On a host with more runnable threads than cores the peer we wait
 * for is often queued on our own core; without the yield it runs only when
 * the scheduler preempts the spinner, milliseconds later. With nothing
 * else runnable sched_yield() returns at once. */
static inline void fs_spin_relax(unsigned *step)
{
	if ((++*step & 3) == 0)
		sched_yield();
	else
		__builtin_ia32_pause();
}

/* A yield that took longer than this ran another thread on our core: a
 * sched_yield() with nothing else runnable returns in well under a
 * microsecond. */
#define FS_YIELD_CEDED_NS 3000ull
/* A wait whose spin's yields gave the core to other threads for this long
 * in all is judged as a sleep by the step-back measure (fs_wait_done),
 * even when its answer came within SPIN_US: the waiter was off its core
 * for much longer than a kernel sleep and wake-up take, while other work
 * ran, so the spin did not buy the answer sooner; the core was shared by
 * more runnable threads than there are cores, where a spinner that yields
 * keeps taking its fair share of them. Measured (2-core Intel Xeon VM,
 * stats of one run each): pgbench -S -c 4 -j 2's backends, which the
 * fabric ran at 0.6-0.9x the kernel, ceded 30-100 us in 90 % of their
 * ceded waits; nginx keep-alive with wrk -c 4 (1.6-1.8x the kernel) under
 * 30 us in 95-98 % of its workers' and wrk's. */
#define FS_CEDED_SLEPT_NS 30000ull
/* A yield that took this long ran a time slice of other work (a build, a
 * batch job beside), not a peer's short turn: such work runs until its
 * slice ends, where a sleeping waiter would be woken at once when its
 * answer comes and preempt it. 64 B ping-pong beside two busy loops at
 * nice 19 on 2 cores: 20,000 turns 1.1-1.6 s with yielding spins (450 of
 * the 20,000 waits lost 3 ms each), 0.2-0.26 s with no spin, the kernel
 * 0.15-0.3 s. Where such losses take half the time, the process's waits
 * sleep at once for a spell (fs_runq_slice_lost). pgbench -c 4's backends
 * ceded under 100 us per wait. */
#define FS_YIELD_SLICE_NS 1000000ull

/* fs_spin_relax for a wait, which adds up the time a yield of its spin
 * gave the core to another thread (w->ceded_ns). Two clock reads per
 * yield. */
static inline void fs_wait_spin(struct fs_wait *w)
{
	/* a crowded wait's one look yields nothing: a yield there is what
	 * lost the slice */
	if ((++w->step & 3) == 0 && w->spin_end - w->start > FS_CROWDED_SPIN_US * 1000ull) {
		uint64_t t0 = fs_now_ns();
		uint64_t d;

		sched_yield();
		d = fs_now_ns() - t0;
		if (d > FS_YIELD_CEDED_NS)
			w->ceded_ns += d;
		if (__builtin_expect(d >= FS_YIELD_SLICE_NS, 0))
			fs_runq_slice_lost(t0 + d, d);
	} else {
		__builtin_ia32_pause();
	}
}

/* When a spinning wait that starts at NOW (ns) goes to sleep instead:
 * FABSOCK_SPIN_US later. For waits that keep no struct fs_wait. */
static inline uint64_t fs_spin_end(uint64_t now)
{
	uint64_t us = fs_params.spin_us;

	if (us > FS_CROWDED_SPIN_US && fs_runq_crowded(now))
		us = FS_CROWDED_SPIN_US;
	return now + us * 1000ull;
}

static inline struct timespec fs_wait_timespec(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };

	return ts;
}

#endif
