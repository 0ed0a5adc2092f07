/* SPDX-License-Identifier: MIT */
/*
 * Waking sleepers: when the engine is sleepy or settled enough for waiters
 * to arm their streams' doorbells, the engine's eventfd that deep sleepers
 * wait on, the watches that epoll and poll put on a stream, and ringing the
 * threads asleep on a stream that changed. How long a waiter spins and
 * sleeps, and the lock-free waiters' deep sleep itself, are wait.c's.
 *
 * Who calls in: fs_stream_changed from everywhere a stream's state moves;
 * the wait loops (stream.c, and wait.c for poll, select and epoll) for the
 * sleepiness score and the deep fd; the service thread for quiet and deep
 * idle; fs_engine_progress (engine.c) rings at the end of each round
 * (fs_engine_ring, fs_engine_deep_wake). Which lock each function wants
 * is said where engine.h declares it: most want the engine lock; the
 * sleepiness score (fs_engine_wait_done) takes none.
 */
#include <sys/eventfd.h>

#include "config/params.h"
#include "core/bell.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/ring.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/stream_internal.h"
#include "core/wait.h"
#include "preload/real.h"

void fs_engine_note_activity(struct fs_engine *e)
{
	e->active_ns = fs_now_ns();
	/* waiters poll at the normal pace until the service thread has seen
	 * IDLE_AFTER_MS of quiet again and re-armed */
	__atomic_store_n(&e->armed_all, false, __ATOMIC_RELAXED);
	if (e->deep_waiters)
		e->deep_wanted = true;
}

/* Nothing of ours in flight (with OTHERS_SENDS, not even other threads'
 * sends) and nothing to flush: a ring will announce whatever happens next. */
static bool fs_engine_settled_as(struct fs_engine *e, bool others_sends)
{
	if (!fs_params.doorbell || !e->live_streams)
		return false;
	for (struct fs_engine_rail *er = fs_engine_ep_first(e); er; er = fs_engine_ep_next(e, er))
		if ((others_sends && er->tx_posted) || er->pulls_posted)
			return false; /* its completion comes without a ring */
	/* a corked tail (txq.c) goes when its hold is over, which only a
	 * progress round sees: no deep sleep before */
	for (struct fs_dlist *n = e->pending.next; n != &e->pending; n = n->next)
		if (fs_stream_cork_holds(fs_stream_of(n, pending_link)))
			return false;
	return !fs_engine_busy(e);
}

bool fs_engine_settled(struct fs_engine *e)
{
	return fs_engine_settled_as(e, true);
}

bool fs_engine_settled_beside(struct fs_engine *e)
{
	return fs_engine_settled_as(e, false);
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

/* Threads now inside a poll, select or epoll_wait of offloaded sockets. */
static unsigned fs_ready_waiters;

/* A waiter of this process has slept on its own streams beside others
 * (fs_wait_beside_sleep; sticky until a fork): its waits keep doing so,
 * never the engine-wide way one waiter alone does. Set only by a sleep
 * that happened, so a process whose waiters watch too many streams for it
 * (pgbench -c 300 -j 2: 150 each) keeps the early arming of a lone
 * waiter. */
static bool fs_ready_multi;

void fs_ready_wait_enter(void)
{
	__atomic_add_fetch(&fs_ready_waiters, 1, __ATOMIC_RELAXED);
}

void fs_ready_beside_slept(void)
{
	if (!__atomic_load_n(&fs_ready_multi, __ATOMIC_RELAXED))
		__atomic_store_n(&fs_ready_multi, true, __ATOMIC_RELAXED);
}

void fs_ready_wait_leave(void)
{
	__atomic_sub_fetch(&fs_ready_waiters, 1, __ATOMIC_RELAXED);
}

void fs_ready_wait_after_fork(void)
{
	__atomic_store_n(&fs_ready_waiters, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&fs_ready_multi, false, __ATOMIC_RELAXED);
}

bool fs_engine_arms_early(const struct fs_engine *e)
{
	return fs_params.doorbell &&
	       (fs_params.wait_arm || (__atomic_load_n(&e->sleepy, __ATOMIC_RELAXED) &&
				       __atomic_load_n(&fs_ready_waiters, __ATOMIC_RELAXED) <= 1 &&
				       !(fs_params.wait_beside && __atomic_load_n(&fs_ready_multi, __ATOMIC_RELAXED))));
}

bool fs_engine_spins_short(const struct fs_engine *e)
{
	/* not fs_engine_arms_early's waiter count: a sleepy engine's waits
	 * outlast the spin however many threads wait, and with two of them in
	 * poll (pgbench -j 2) the full spin of each took the cores its four
	 * backends needed */
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

/* The eventfd deep sleepers wait on; internal: an application's close-all
 * loop must not free the number for a file we would then write to. */
void fs_engine_deep_fd_open(struct fs_engine *e)
{
	int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

	e->deep_fd = fd >= 0 ? fs_internal_fd(fd) : -1;
}

int fs_engine_deep_begin(struct fs_engine *e)
{
	if (e->deep_fd < 0)
		fs_engine_deep_fd_open(e); /* its making at engine creation failed */
	if (e->deep_fd >= 0) {
		e->deep_waiters++;
		fs_ring_sleep_begin(); /* the caller looks once more before it sleeps */
	}
	return e->deep_fd;
}

void fs_engine_deep_end(struct fs_engine *e)
{
	fs_ring_sleep_end();
	if (--e->deep_waiters == 0 && e->deep_rung) {
		uint64_t v;
		ssize_t n = fs_real.read(e->deep_fd, &v, sizeof(v));

		(void)n;
		e->deep_rung = false;
	}
	if (!e->deep_waiters)
		e->deep_wanted = false;
}

/* Wakes the deep sleepers once; the fd stays readable until the last of
 * them has left, so none misses it. */
void fs_engine_deep_wake(struct fs_engine *e)
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
void fs_engine_ring(struct fs_engine *e)
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

int fs_stream_wake_fd(struct fs_stream *s)
{
	if (s->wake_fd < 0)
		s->wake_fd = fs_internal_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
	return s->wake_fd;
}

void fs_stream_sleep_begin(struct fs_engine *e, struct fs_stream *s)
{
	/* woken by the progress round a ring starts (the service thread's) */
	fs_ring_sleep_begin();
	if (!s->sleepers++ && !s->dead)
		fs_dlist_add(&e->sleeping, &s->sleep_link);
}

/* Tolerates a stream destroyed meanwhile (destroy unlinks it). */
void fs_stream_sleep_end(struct fs_engine *e, struct fs_stream *s)
{
	fs_ring_sleep_end();
	if (!--s->sleepers && fs_dlist_linked(&s->sleep_link))
		fs_dlist_del(&s->sleep_link);
}
