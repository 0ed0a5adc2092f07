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
#include <time.h>

#include "config/params.h"
#include "core/bell.h"
#include "core/engine.h"
#include "core/ring.h"
#include "core/runq.h"
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
	uint64_t spin_us = fs_params.spin_us;

	if (short_spin && spin_us > FS_SLEEPY_SPIN_US)
		spin_us = FS_SLEEPY_SPIN_US;
	/* more runnable threads than cores: a spin would take the core the
	 * answer needs (runq.h); look once, then sleep, as the kernel's
	 * waiters do. One microsecond, not 0: a loop asks its first step with
	 * the NOW it started with, and a spin of 0 would sleep before any look
	 * (with FABSOCK_SPIN_US=0 a psql download of 18 MB hangs, before this
	 * change too) */
	if (spin_us > FS_CROWDED_SPIN_US && fs_runq_crowded(now))
		spin_us = FS_CROWDED_SPIN_US;
	w->start = now;
	w->deadline = deadline;
	w->spin_end = now + spin_us * 1000ull;
	w->late_at = now + fs_params.spin_us * 1000ull;
	w->idle_since = now;
	w->slice_us = FS_WAIT_FIRST_SLICE_US;
	w->step = 0;
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

void fs_wait_done(const struct fs_wait *w, struct fs_engine *e, int events)
{
	bool late = fs_wait_late(w, fs_now_ns());

	fs_engine_wait_done(e, late, events);
	/* a wait that brought many events serves many messages at one sleep:
	 * not a loss, as for the sleepiness score (FS_SLEEPY_EVENTS) */
	fs_wait_thread.last_slept = late && events <= FS_SLEEPY_EVENTS;
	fs_wait_thread.waits++;
}

int fs_wait_deep_sleep(const struct fs_wait *w, struct pollfd *fds, nfds_t n, const sigset_t *sigmask,
		       bool *slept)
{
	struct fs_engine *e = fs_engine_peek();
	uint64_t now, ns = FS_BELL_SLICE_MS * 1000000ull;
	struct timespec ts;
	bool was_armed, armed_now;
	int ret, err, cq_fd;

	*slept = false;
	/* a lock-free look first: without waiters' arming, busy engines are
	 * never armed */
	if (!e || (!fs_engine_arms_early(e) && !__atomic_load_n(&e->armed_all, __ATOMIC_RELAXED)))
		return 0;
	now = fs_now_ns();
	pthread_mutex_lock(&e->lock);
	was_armed = __atomic_load_n(&e->armed_all, __ATOMIC_RELAXED);
	/* A provider that moves bytes only inside our calls (tcp, net) wakes
	 * a deep sleeper itself through its completion queue's fd: on it, a
	 * message whose ring is late or lost costs no 250 ms slice. One with
	 * work pending first gets no deep sleep now (the caller's slice). */
	cq_fd = fs_engine_cq_wait_fd(e);
	fds[n].fd = cq_fd != -EAGAIN && fs_engine_wait_deep(e, false) ? fs_engine_deep_begin(e) : -1;
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
