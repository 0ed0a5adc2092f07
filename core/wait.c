/* SPDX-License-Identifier: MIT */
/*
 * The waiting policy every blocking loop of the core shares (wait.h): the
 * spin, the sleep slices that double up to a cap that grows once the wait
 * has been idle for IDLE_AFTER_MS, the deadline (absolute, 0: none), and
 * whether the answer came late (the engine's sleepiness score); and the
 * deep sleep of the waiters that hold no engine lock (poll, select,
 * epoll_wait: fs_wait_deep_sleep, which takes it briefly to begin and end).
 * The loops keep what they look at and what they sleep on; they ask this
 * file when, and for how long.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "config/params.h"
#include "core/bell.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/ring.h"
#include "core/runq.h"
#include "core/service.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/util.h"
#include "core/wait.h"
#include "preload/real.h"

uint64_t fs_wait_deadline_ms(uint64_t now, int timeout_ms)
{
	uint64_t d;

	if (timeout_ms < 0)
		return 0;
	d = now + (uint64_t)timeout_ms * 1000000ull;
	return d ? d : 1; /* 0 would mean none */
}

uint64_t fs_wait_deadline_ns(uint64_t now, int64_t timeout_ns)
{
	uint64_t d;

	if (timeout_ns < 0)
		return 0;
	d = now + (uint64_t)timeout_ns;
	return d ? d : 1;
}

void fs_wait_init(struct fs_wait *w, uint64_t now, uint64_t deadline, bool short_spin)
{
	uint64_t spin_us = fs_params.spin_us, late_us = fs_params.spin_us;

	if (short_spin && spin_us > FS_SLEEPY_SPIN_US)
		spin_us = FS_SLEEPY_SPIN_US;
	/* more runnable threads than cores: a spin would take the core the
	 * answer needs (runq.h); look once, then sleep, as the kernel's
	 * waiters do. One microsecond, not 0: a loop asks its first step with
	 * the NOW it started with, and a spin of 0 would sleep before any look
	 * (with FABSOCK_SPIN_US=0 a psql download of 18 MB hangs, before this
	 * change too) */
	if (spin_us > FS_CROWDED_SPIN_US && fs_runq_crowded(now)) {
		/* and an answer after that look is late: the engine grows
		 * sleepy and arms, so that the message rings its sleeper, as
		 * the kernel wakes its reader; judged by SPIN_US, a sleep in
		 * slices waited for its timer (20,000 turns of 64 B ping-pong
		 * beside two busy loops: 2.0 s, against 0.2 s) */
		spin_us = FS_CROWDED_SPIN_US;
		late_us = FS_CROWDED_SPIN_US;
	}
	w->start = now;
	w->deadline = deadline;
	w->spin_end = now + spin_us * 1000ull;
	w->late_at = now + late_us * 1000ull;
	w->idle_since = now;
	w->slice_us = FS_WAIT_FIRST_SLICE_US;
	w->step = 0;
	w->ceded_ns = 0;
}

void fs_wait_begin(struct fs_wait *w, const struct fs_engine *e, uint64_t now, uint64_t deadline)
{
	fs_wait_init(w, now, deadline, e && fs_engine_spins_short(e));
}

uint64_t fs_wait_slice_cap_us(uint64_t idle_ns)
{
	if (fs_params.idle_after_ms && idle_ns >= fs_params.idle_after_ms * 1000000ull &&
	    fs_params.idle_sleep_us > fs_params.sleep_max_us)
		return fs_params.idle_sleep_us;
	return fs_params.sleep_max_us;
}

uint64_t fs_wait_clamp_ns(const struct fs_wait *w, uint64_t now, uint64_t ns)
{
	if (w->deadline && now + ns > w->deadline)
		ns = w->deadline > now ? w->deadline - now : 0;
	return ns;
}

uint64_t fs_wait_slice_ns(struct fs_wait *w, uint64_t now)
{
	uint64_t ns = fs_wait_clamp_ns(w, now, w->slice_us * 1000ull);
	uint64_t cap = fs_wait_slice_cap_us(now > w->idle_since ? now - w->idle_since : 0);

	w->slice_us = w->slice_us * 2 < cap ? w->slice_us * 2 : cap;
	return ns;
}

int fs_wait_ms_until(uint64_t now, uint64_t until)
{
	uint64_t ms;

	if (!until)
		return -1;
	if (until <= now)
		return 0;
	ms = (until - now + 999999) / 1000000ull;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

void fs_wait_note_activity(struct fs_wait *w, uint64_t active_ns)
{
	if (active_ns > w->idle_since)
		w->idle_since = active_ns;
}

__thread struct fs_wait_thread fs_wait_thread __attribute__((tls_model("initial-exec")));

bool fs_wait_slept(const struct fs_wait *w, uint64_t now, int events)
{
	/* a wait that brought many events serves many messages at one sleep:
	 * not a loss, as for the sleepiness score (FS_SLEEPY_EVENTS). A
	 * quick answer that came after the spin's yields gave the core away
	 * for long counts as a sleep (FS_CEDED_SLEPT_NS) */
	if (events > FS_SLEEPY_EVENTS)
		return false;
	return fs_wait_late(w, now) || w->ceded_ns >= FS_CEDED_SLEPT_NS;
}

void fs_wait_done(const struct fs_wait *w, struct fs_engine *e, int events)
{
	uint64_t now = fs_now_ns();
	bool late = fs_wait_late(w, now);

	/* the sleepiness score, which sets the spin itself, counts the late
	 * ones alone */
	fs_engine_wait_done(e, late, events);
	if (!late && w->ceded_ns >= FS_CEDED_SLEPT_NS)
		FS_STAT_INC(waits_ceded);
	fs_wait_thread.last_slept = fs_wait_slept(w, now, events);
	fs_wait_thread.waits++;
}

void fs_wait_own_reset(void)
{
	struct fs_wait_thread *t = &fs_wait_thread;

	for (unsigned i = 0; i < t->own_n; i++)
		fs_sock_put(t->own[i]);
	t->own_n = 0;
	t->own_bad = false;
}

void fs_wait_own_add(struct fs_sock *s)
{
	struct fs_wait_thread *t = &fs_wait_thread;

	if (t->own_bad)
		return;
	if (t->own_n == FS_WAIT_OWN_MAX) {
		t->own_bad = true;
		return;
	}
	fs_sock_ref(s);
	t->own[t->own_n++] = s;
}

void fs_wait_own_bad(void)
{
	fs_wait_thread.own_bad = true;
}

/* A deep sleep beside other waiters: the engine is sleepy, but does not
 * arm early (more than one thread waits) and is not armed whole. */
static bool fs_wait_beside_others(const struct fs_engine *e)
{
	return fs_params.wait_beside && fs_engine_spins_short(e) && !fs_engine_arms_early(e) &&
	       !__atomic_load_n(&e->armed_all, __ATOMIC_RELAXED);
}

bool fs_wait_own_wanted(void)
{
	struct fs_engine *e = fs_engine_peek();

	return e && fs_wait_beside_others(e);
}

/* The stream of this thread's Ith socket if it is still offloaded here
 * and the engine's, else NULL. Engine lock held. */
static struct fs_stream *fs_wait_own_stream(struct fs_engine *e, unsigned i)
{
	struct fs_stream *st = fs_wait_thread.own[i]->stream;

	if (!st || st->id >= e->streams_cap || e->streams[st->id] != st || st->dead)
		return NULL;
	return st;
}

/* Whether a stream of this thread's holds a message it has not read
 * (taken in by another thread's progress after this wait's look). */
static bool fs_wait_own_unread(struct fs_engine *e)
{
	for (unsigned i = 0; i < fs_wait_thread.own_n; i++) {
		struct fs_stream *st = fs_wait_own_stream(e, i);

		if (st && st->rxq_head)
			return true;
	}
	return false;
}

/* The sum of the event generations of this thread's streams. Lock held. */
static uint64_t fs_wait_own_gen(struct fs_engine *e)
{
	uint64_t g = 0;

	for (unsigned i = 0; i < fs_wait_thread.own_n; i++) {
		struct fs_stream *st = fs_wait_own_stream(e, i);

		if (st)
			g += st->ev_gen;
	}
	return g;
}

/* Whether S's peer rings us after its next message on S (armed by our last
 * message, FS_MSG_ARM) and nothing of ours is in flight on it (that
 * completion comes without a ring). Engine lock held. */
static bool fs_wait_stream_armed(const struct fs_stream *st)
{
	return st->armed && st->state != FS_STREAM_HELLO && st->bell_addr.sin6_port && !st->txq_count &&
	       !st->tx_inflight;
}

/* Whether every stream this thread waits for is still there and has asked
 * its peer for a ring (its last message carried the ARM: the peer rings
 * after its next post, when a thread of ours sleeps), and has no send of
 * its own in flight (that completion comes without a ring; other threads'
 * sends are their senders' to poll for). Engine lock held. */
static bool fs_wait_own_armed(struct fs_engine *e)
{
	const struct fs_wait_thread *t = &fs_wait_thread;

	if (t->own_bad || !t->own_n)
		return false;
	for (unsigned i = 0; i < t->own_n; i++) {
		struct fs_stream *st = fs_wait_own_stream(e, i);

		if (!st || !fs_wait_stream_armed(st))
			return false;
	}
	return true;
}

/* Beside other waiters, with the streams ST[0..NST) armed (engine lock
 * held on entry, dropped here): sleeps as a sleeper of each of them, on
 * their eventfds and FDS[0..N), for FS_BELL_SLICE_MS at most. One such
 * sleeper at a time (the watcher) also watches the doorbell and the ring;
 * without one, the service thread does. Whoever reads a ring runs the
 * progress round, which writes the eventfd of the streams that changed, so
 * only the thread that waits for one wakes (a deep sleep on the engine's
 * fd woke every sleeper on every ring: memcslap's set rate halved against
 * memcached's four workers). Returns ppoll's count of FDS[0..N) or -errno
 * with *SLEPT, or 0 without sleeping. */
#define FS_WAIT_BESIDE_FDS 64u
static int fs_wait_beside_sleep_on(struct fs_engine *e, const struct fs_wait *w, struct fs_stream **st, unsigned nst,
				   struct pollfd *fds, nfds_t n, const sigset_t *sigmask, bool *slept, uint64_t now)
{
	struct pollfd p[FS_WAIT_BESIDE_FDS + FS_WAIT_OWN_MAX + 2];
	struct timespec ts;
	unsigned k = 0, np;
	int ret, err, own_ready = 0, extra = 0;
	bool watch, bell_ready = false, ring_ready = false, others;

	if (n > FS_WAIT_BESIDE_FDS || nst > FS_WAIT_OWN_MAX) {
		fs_engine_unlock(e);
		return 0;
	}
	for (; k < nst; k++)
		if (fs_stream_wake_fd(st[k]) < 0)
			break;
	if (k < nst) {
		fs_engine_unlock(e);
		return 0;
	}
	for (k = 0; k < nst; k++) {
		fs_stream_sleep_begin(e, st[k]);
		p[n + k].fd = st[k]->wake_fd;
		p[n + k].events = POLLIN;
		p[n + k].revents = 0;
	}
	np = n + nst;
	/* One beside sleeper at a time watches the doorbell and the ring
	 * (the watcher): a ring for its own stream wakes it alone, as the
	 * kernel wakes its reader; one for another's is read here and the
	 * progress round wakes that thread. Without a watcher the service
	 * thread reads them (one more thread per wake-up). */
	watch = !e->deep_waiters && !e->beside_watcher;
	if (watch) {
		e->beside_watcher = true;
		p[np].fd = fs_bell_fd();
		p[np].events = POLLIN;
		p[np].revents = 0;
		p[np + 1].fd = fs_ring_fd();
		p[np + 1].events = POLLIN;
		p[np + 1].revents = 0;
		extra = 2;
	}
	FS_STAT_INC(deep_beside);
	fs_ready_beside_slept();
	/* Counted as asleep now (fs_stream_sleep_begin): a peer of this host
	 * that posted before it saw the count did not ring, so look once
	 * more; what it finds writes the eventfd of the stream it changed
	 * (fs_engine_ring), and the ppoll below returns at once. */
	fs_engine_progress(e);
	/* (Not the watcher: another sleeper or a deep sleeper watches the
	 * ring, and the service thread is told when the watcher leaves.) */
	fs_engine_unlock(e);
	memcpy(p, fds, n * sizeof(*p));
	ts = fs_wait_timespec(fs_wait_clamp_ns(w, now, FS_BELL_SLICE_MS * 1000000ull));
	ret = fs_real.ppoll(p, np + extra, &ts, sigmask);
	err = errno;
	pthread_mutex_lock(&e->lock);
	for (k = 0; k < nst; k++) {
		fs_stream_sleep_end(e, st[k]);
		if (ret > 0 && p[n + k].revents) {
			uint64_t v;
			ssize_t r = fs_real.read(st[k]->wake_fd, &v, sizeof(v));

			(void)r;
			own_ready++;
		}
	}
	if (watch) {
		e->beside_watcher = false;
		bell_ready = ret > 0 && p[np].revents;
		ring_ready = ret > 0 && p[np + 1].revents;
		own_ready += bell_ready + ring_ready;
	}
	/* others sleep unwatched now: the service thread looks within 1 ms */
	others = watch && e->sleeping.next != &e->sleeping;
	fs_engine_unlock(e);
	if (bell_ready || ring_ready)
		fs_bell_drain_some(e, bell_ready, ring_ready);
	if (others && __atomic_load_n(&e->service_bell_off, __ATOMIC_RELAXED))
		fs_service_kick_soon();
	for (nfds_t i = 0; i < n; i++)
		fds[i].revents = p[i].revents;
	*slept = true;
	if (ret < 0)
		return -err;
	return ret - own_ready;
}

/* The same for this thread's poll, select or epoll_wait (fs_wait_own_*). */
static int fs_wait_beside_sleep(struct fs_engine *e, const struct fs_wait *w, struct pollfd *fds, nfds_t n,
				const sigset_t *sigmask, bool *slept, uint64_t now)
{
	const struct fs_wait_thread *t = &fs_wait_thread;
	struct fs_stream *st[FS_WAIT_OWN_MAX];

	for (unsigned k = 0; k < t->own_n; k++) {
		st[k] = fs_wait_own_stream(e, k);
		if (!st[k]) {
			fs_engine_unlock(e);
			return 0;
		}
	}
	return fs_wait_beside_sleep_on(e, w, st, t->own_n, fds, n, sigmask, slept, now);
}

bool fs_wait_stream_beside(struct fs_engine *e, const struct fs_stream *s)
{
	return fs_wait_beside_others(e) && fs_wait_stream_armed(s) && fs_engine_cq_wait_fd(e) != -EAGAIN &&
	       fs_engine_settled_beside(e);
}

int fs_wait_stream_beside_sleep(struct fs_engine *e, const struct fs_wait *w, struct fs_stream *s, int ctl_fd,
				short *ctl_revents)
{
	struct pollfd ctl = { .fd = ctl_fd, .events = POLLIN | POLLRDHUP };
	bool slept;
	int ret;

	ret = fs_wait_beside_sleep_on(e, w, &s, 1, &ctl, 1, NULL, &slept, fs_now_ns());
	*ctl_revents = ret > 0 ? ctl.revents : 0;
	return ret;
}

int fs_wait_deep_sleep(const struct fs_wait *w, struct pollfd *fds, nfds_t n, const sigset_t *sigmask,
		       bool *slept)
{
	struct fs_engine *e = fs_engine_peek();
	uint64_t now, ns = FS_BELL_SLICE_MS * 1000000ull;
	struct timespec ts;
	bool was_armed, armed_now, beside, deep;
	int ret, err, cq_fd;

	*slept = false;
	/* a lock-free look first: without waiters' arming, busy engines are
	 * never armed; beside other waiters, one whose own streams are armed
	 * may sleep (below) */
	if (!e)
		return 0;
	beside = fs_wait_beside_others(e);
	if (!beside && !fs_engine_arms_early(e) && !__atomic_load_n(&e->armed_all, __ATOMIC_RELAXED))
		return 0;
	if (beside && (fs_wait_thread.own_bad || !fs_wait_thread.own_n))
		return 0;
	now = fs_now_ns();
	pthread_mutex_lock(&e->lock);
	was_armed = __atomic_load_n(&e->armed_all, __ATOMIC_RELAXED);
	/* A provider that moves bytes only inside our calls (tcp, net) wakes
	 * a deep sleeper itself through its completion queue's fd: on it, a
	 * message whose ring is late or lost costs no 250 ms slice. One with
	 * work pending first gets no deep sleep now (the caller's slice). */
	cq_fd = fs_engine_cq_wait_fd(e);
	if (beside && fs_wait_beside_others(e)) {
		/* Several threads wait (pgbench -j 2's two in ppoll): none arms
		 * the engine's every stream (fs_bell_arm_all sent ARMs for the
		 * others' streams, whose answers disarm them at once, and every
		 * ARM cost the peer a wake-up: TPC-B -c 4 -j 2 fell to a tenth).
		 * This one sleeps deeply when the streams it waits for asked
		 * for their ring with their last message (FS_MSG_ARM) and
		 * nothing of ours is in flight, after a progress round that
		 * takes what came meanwhile (a message disarms its stream). */
		uint64_t gen0 = fs_wait_own_gen(e);

		fs_engine_progress(e);
		if (fs_wait_own_gen(e) != gen0 || fs_wait_own_unread(e)) {
			/* news for this waiter: its caller looks again at once */
			fs_engine_unlock(e);
			*slept = true;
			return 0;
		}
		if (cq_fd != -EAGAIN && fs_engine_settled_beside(e) && fs_wait_own_armed(e))
			return fs_wait_beside_sleep(e, w, fds, n, sigmask, slept, now);
		fs_engine_unlock(e);
		return 0;
	} else {
		deep = cq_fd != -EAGAIN && fs_engine_wait_deep(e, false);
	}
	fds[n].fd = deep ? fs_engine_deep_begin(e) : -1;
	/* Counted as asleep now (fs_ring_sleep_begin): a peer of this host
	 * that posted before it saw the count did not ring, so look once
	 * more; what it finds rings the deep fd (fs_engine_deep_wake), and
	 * the poll below returns at once. */
	if (fds[n].fd >= 0)
		fs_engine_progress(e);
	armed_now = !was_armed && __atomic_load_n(&e->armed_all, __ATOMIC_RELAXED);
	fs_engine_unlock(e);
	if (fds[n].fd < 0)
		return armed_now ? -EAGAIN : 0;
	fds[n].events = POLLIN;
	fds[n].revents = 0;
	fds[n + 1].fd = fs_bell_fd();
	fds[n + 1].events = POLLIN;
	fds[n + 1].revents = 0;
	fds[n + 2].fd = fs_ring_fd(); /* rung by peers of this host (ring.h) */
	fds[n + 2].events = POLLIN;
	fds[n + 2].revents = 0;
	fds[n + 3].fd = cq_fd >= 0 ? cq_fd : -1;
	fds[n + 3].events = POLLIN;
	fds[n + 3].revents = 0;
	ns = fs_wait_clamp_ns(w, now, ns);
	ts = fs_wait_timespec(ns);
	if (cq_fd >= 0)
		fs_engine_cq_sleep(e, true);
	ret = fs_real.ppoll(fds, n + FS_WAIT_DEEP_SLOTS, &ts, sigmask);
	err = errno;
	if (cq_fd >= 0)
		fs_engine_cq_sleep(e, false);
	pthread_mutex_lock(&e->lock);
	fs_engine_deep_end(e);
	fs_engine_unlock(e);
	*slept = true;
	if (ret < 0)
		return -err;
	if (fds[n + 1].revents || fds[n + 2].revents) /* a ring: read it here, not through the service thread */
		fs_bell_drain_some(e, fds[n + 1].revents != 0, fds[n + 2].revents != 0);
	return ret - (fds[n].revents ? 1 : 0) - (fds[n + 1].revents ? 1 : 0) - (fds[n + 2].revents ? 1 : 0) -
	       (fds[n + 3].revents ? 1 : 0);
}
