/* SPDX-License-Identifier: MIT */
/*
 * The service thread: its loop, its poll set, its timer, the one-shot
 * watches, the fork hooks and the exit it runs for a fatal signal. See
 * service.h.
 */
#include "core/service.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "core/bell.h"
#include "core/ring.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/guard.h"
#include "core/handback.h"
#include "core/sigs.h"
#include "core/sock.h"
#include "core/stats.h"
#include "preload/real.h"

static pthread_mutex_t fs_service_lock = PTHREAD_MUTEX_INITIALIZER;
static int fs_service_wake_fd = -1;
/* A one-shot timer for fs_service_kick_soon, and whether it is set. */
static int fs_service_timer_fd = -1;
static int fs_service_timer_armed;
static pid_t fs_service_pid;
/* Held by the service thread whenever it is not asleep in poll. A fork
 * takes it first (fs_service_fork_prepare), so that the child never starts
 * with a lock the thread held mid-work: libfabric's, the allocator's, ours.
 * Whether this fork's prepare got it. */
static pthread_mutex_t fs_service_busy = PTHREAD_MUTEX_INITIALIZER;
static bool fs_service_fork_held;
/* A signal handler asked the service thread to run the process's end
 * (fs_service_exit), and the eventfd it waits on for the answer. */
static int fs_service_exit_wanted;
static int fs_service_exit_fd = -1;

/* The pending watches (service.h), newest first. The service thread alone
 * takes them off, so one it put in its poll set is still here after the
 * poll. */
static struct fs_watch *fs_watch_list;
static size_t fs_watch_count;

/* The doorbell's datagrams, our ring eventfd and the hand-back requests
 * that were ready while another thread held the engine lock: served by the
 * next look that gets the lock (fs_service_engine_look), left out of the
 * polls until then. The thread never queues for the engine lock: behind a
 * few hundred application threads (320 connections' readers and writers)
 * it waited half a second and more, and the probes only it answers (a
 * server whose threads wait in the kernel for their first bytes) waited
 * with it, past their clients' timeout (e2e_many storm-320x64K). The
 * service thread's own; reset in a forked child with the rest of it. */
static bool fs_service_bell_deferred, fs_service_ring_deferred, fs_service_handback_deferred;

static void *fs_service_main(void *arg);

/* Starts the thread in this process if it is not running. Service lock held. */
static void fs_service_ensure(void)
{
	if (fs_service_pid == fs_self_pid())
		return;
	if (fs_service_wake_fd < 0)
		fs_service_wake_fd = fs_internal_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
	if (fs_service_timer_fd < 0)
		fs_service_timer_fd = fs_internal_fd(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
	if (fs_service_exit_fd < 0)
		fs_service_exit_fd = fs_internal_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
	if (fs_thread_start(fs_service_main, 256 * 1024) == 0)
		__atomic_store_n(&fs_service_pid, fs_self_pid(), __ATOMIC_RELEASE);
	else
		FS_WARN("cannot start the fabsock service thread; probes go unanswered");
}

static void fs_service_start(void)
{
	/* running in this process already: the common case, no lock */
	if (__atomic_load_n(&fs_service_pid, __ATOMIC_ACQUIRE) == fs_self_pid())
		return;
	pthread_mutex_lock(&fs_service_lock);
	fs_service_ensure();
	pthread_mutex_unlock(&fs_service_lock);
}

void fs_service_kick(void)
{
	uint64_t one = 1;

	fs_service_start();
	if (fs_service_wake_fd >= 0) {
		ssize_t n = fs_real.write(fs_service_wake_fd, &one, sizeof(one));
		(void)n;
	}
}

void fs_service_kick_soon(void)
{
	struct itimerspec soon = { .it_value = { .tv_nsec = FS_SERVICE_SOON_NS } };

	fs_service_start();
	if (fs_service_timer_fd < 0) {
		fs_service_kick();
		return;
	}
	/* One timer for every request until it fires: the thread clears the
	 * flag before its progress round, which sees what we left for it. */
	if (!__atomic_exchange_n(&fs_service_timer_armed, 1, __ATOMIC_ACQ_REL) &&
	    timerfd_settime(fs_service_timer_fd, 0, &soon, NULL)) {
		__atomic_store_n(&fs_service_timer_armed, 0, __ATOMIC_RELEASE);
		fs_service_kick();
	}
}

static void fs_service_queue(struct fs_watch *w, int fd, short events, uint64_t deadline_ns, fs_watch_fn fn, void *arg)
{
	pthread_mutex_lock(&fs_service_lock);
	/* field by field: QUEUED is read without the lock (fs_service_watch_drop) */
	w->fd = fd;
	w->events = events;
	w->ready = false;
	w->deadline_ns = deadline_ns;
	w->fn = fn;
	w->arg = arg;
	w->prev = NULL;
	__atomic_store_n(&w->queued, true, __ATOMIC_RELEASE);
	w->next = fs_watch_list;
	if (fs_watch_list)
		fs_watch_list->prev = w;
	fs_watch_list = w;
	fs_watch_count++;
	pthread_mutex_unlock(&fs_service_lock);
}

void fs_service_watch(struct fs_watch *w, int fd, short events, uint64_t deadline_ns, fs_watch_fn fn, void *arg)
{
	fs_service_queue(w, fd, events, deadline_ns, fn, arg);
	fs_service_kick();
}

bool fs_service_watch_drop(struct fs_watch *w)
{
	bool queued;

	/* never queued, or fired already (a plain client's accepted socket
	 * at its close: the service lock, process-wide, twice a connection
	 * for nothing). One queued by another thread after this look is one
	 * queued after the drop, as it could be after the locked look. */
	if (!__atomic_load_n(&w->queued, __ATOMIC_ACQUIRE))
		return false;
	pthread_mutex_lock(&fs_service_lock);
	queued = w->queued;
	if (queued) {
		w->fd = -1;
		w->deadline_ns = 0;
	}
	pthread_mutex_unlock(&fs_service_lock);
	return queued;
}

bool fs_service_watch_expire(struct fs_watch *w)
{
	bool queued = fs_service_watch_drop(w);

	if (queued)
		fs_service_kick();
	return queued;
}

void fs_service_watch_soon(struct fs_watch *w, int fd, short events, uint64_t deadline_ns, fs_watch_fn fn, void *arg)
{
	fs_service_queue(w, fd, events, deadline_ns, fn, arg);
	fs_service_kick_soon();
}

void fs_service_exit(void)
{
	uint64_t one = 1;
	ssize_t n;

	if (__atomic_load_n(&fs_service_pid, __ATOMIC_ACQUIRE) != getpid() || fs_service_wake_fd < 0 ||
	    fs_service_exit_fd < 0) {
		fs_core_exit(); /* no thread to hand it to: no stream either */
		return;
	}
	/* Only async-signal-safe calls from here: an atomic store, write()
	 * and poll() on eventfds. The service thread blocks every signal. */
	__atomic_store_n(&fs_service_exit_wanted, 1, __ATOMIC_RELEASE);
	n = fs_real.write(fs_service_wake_fd, &one, sizeof(one));
	(void)n;
	{
		struct pollfd p = { .fd = fs_service_exit_fd, .events = POLLIN };
		/* the exit path's own bound is FABSOCK_LINGER_SEC; a second more
		 * for a thread that may first wait for a lock */
		long ms = (long)fs_params.linger_sec * 1000 + 1000;

		while (fs_real.poll(&p, 1, (int)ms) < 0 && errno == EINTR)
			;
	}
}

/* How long a fork waits for the service thread to finish what it is doing
 * (a probe answer, a progress round); past it the fork goes ahead as it
 * would without fabsock (the thread may be waiting for a lock the forking
 * thread holds, in a signal handler say). */
#define FS_SERVICE_FORK_WAIT_MS 500

void fs_service_fork_prepare(void)
{
	struct timespec until;

	fs_service_fork_held = false;
	if (__atomic_load_n(&fs_service_pid, __ATOMIC_ACQUIRE) != getpid())
		return; /* no service thread in this process */
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_nsec += FS_SERVICE_FORK_WAIT_MS * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	fs_service_fork_held = pthread_mutex_timedlock(&fs_service_busy, &until) == 0;
	if (!fs_service_fork_held)
		FS_STAT_INC(forks_unquiesced); /* an atomic add: fine in a fork from a signal handler */
}

void fs_service_fork_parent(void)
{
	if (fs_service_fork_held) {
		fs_service_fork_held = false;
		pthread_mutex_unlock(&fs_service_busy);
	}
}

void fs_service_after_fork(void)
{
	/* taken by this fork's prepare, or held by the parent's thread, which
	 * the child does not have */
	pthread_mutex_init(&fs_service_busy, NULL);
	fs_service_fork_held = false;
	fs_watch_list = NULL; /* the parent's to fire */
	fs_watch_count = 0;
	fs_service_bell_deferred = fs_service_ring_deferred = fs_service_handback_deferred = false;
	/* Threads do not survive fork: the child starts its own when needed. */
	pthread_mutex_init(&fs_service_lock, NULL);
	if (fs_service_wake_fd >= 0) {
		fs_internal_fd_close(fs_service_wake_fd);
		fs_service_wake_fd = -1;
	}
	if (fs_service_exit_fd >= 0) {
		fs_internal_fd_close(fs_service_exit_fd);
		fs_service_exit_fd = -1;
	}
	fs_service_exit_wanted = 0;
	/* the parent's timer is shared with the parent, as is its flag */
	if (fs_service_timer_fd >= 0) {
		fs_internal_fd_close(fs_service_timer_fd);
		fs_service_timer_fd = -1;
	}
	fs_service_timer_armed = 0;
}

/* The service thread's poll set: the wake-up fds, the registered
 * descriptors (the listeners' probe sockets), the watches' fds, and per
 * entry whose it is. It grows with the number of watches; when it cannot,
 * the watches left out still fire at their deadlines. */
struct fs_service_slot {
	fs_service_ready_fn ready; /* a registered descriptor's, with ARG */
	void *arg;
	struct fs_watch *watch;
};
struct fs_service_set {
	struct pollfd *pfd;
	struct fs_service_slot *slot;
	size_t cap;
	nfds_t n; /* the entries put, while the registered ones are added */
};

/* The module whose descriptors each round polls (fs_service_on_fds). */
static const struct fs_service_fds *fs_service_registered;

/* Fires the watches whose fd is ready or whose deadline passed: the N
 * entries of SET from FIRST were polled for watches. */
static void fs_service_run_watches(const struct fs_service_set *set, nfds_t first, nfds_t n)
{
	uint64_t now = fs_now_ns();
	struct fs_watch *fire = NULL, *w, *next;

	pthread_mutex_lock(&fs_service_lock);
	for (nfds_t i = first; i < n; i++)
		if (set->pfd[i].revents)
			set->slot[i].watch->ready = true;
	for (w = fs_watch_list; w; w = next) {
		next = w->next;
		if (!w->ready && now < w->deadline_ns)
			continue;
		if (w->prev)
			w->prev->next = w->next;
		else
			fs_watch_list = w->next;
		if (w->next)
			w->next->prev = w->prev;
		fs_watch_count--;
		__atomic_store_n(&w->queued, false, __ATOMIC_RELEASE);
		w->next = fire;
		fire = w;
	}
	pthread_mutex_unlock(&fs_service_lock);
	while (fire) {
		/* FN may queue W again, which rewrites it: read it first */
		fs_watch_fn fn = fire->fn;
		void *arg = fire->arg;
		bool timed_out = !fire->ready;

		w = fire;
		fire = w->next;
		fn(arg, timed_out);
	}
}

/* Makes room for WANT entries if it can. Returns the room there is. */
static size_t fs_service_set_fit(struct fs_service_set *set, size_t want)
{
	struct pollfd *pfd;
	struct fs_service_slot *slot;
	size_t cap = set->cap ? set->cap : 64;

	if (want <= set->cap)
		return set->cap;
	while (cap < want)
		cap *= 2;
	pfd = realloc(set->pfd, cap * sizeof(*pfd));
	if (pfd)
		set->pfd = pfd;
	slot = realloc(set->slot, cap * sizeof(*slot));
	if (slot)
		set->slot = slot;
	if (pfd && slot)
		set->cap = cap;
	return set->cap;
}

/* Puts entry N: FD polled for EVENTS, for READY (with ARG) or W (or
 * neither). */
static nfds_t fs_service_set_put(struct fs_service_set *set, nfds_t n, int fd, short events,
				 fs_service_ready_fn ready, void *arg, struct fs_watch *w)
{
	set->pfd[n] = (struct pollfd){ .fd = fd, .events = events };
	set->slot[n] = (struct fs_service_slot){ .ready = ready, .arg = arg, .watch = w };
	return n + 1;
}

/* The service thread's poll set: wake-up eventfd, bell, timer, hand-back
 * requests, the ring eventfd and the ring's handover socket (ring.h), the
 * provider's completion queue (tcp, net: set by fs_service_engine_look);
 * then the registered descriptors (the listeners' probe sockets),
 * the watches, and at most FS_SERVICE_BLOCKED kernel sockets a hand-back
 * waits to write to. */
#define FS_SERVICE_FIXED 7
#define FS_SERVICE_CQ_SLOT 6
#define FS_SERVICE_BLOCKED 16

bool fs_service_set_add(struct fs_service_set *set, int fd, short events, fs_service_ready_fn ready, void *arg)
{
	if (set->n + FS_SERVICE_BLOCKED >= set->cap)
		return false; /* the rest is kept for the hand-backs */
	set->n = fs_service_set_put(set, set->n, fd, events, ready, arg, NULL);
	return true;
}

void fs_service_on_fds(const struct fs_service_fds *fds)
{
	__atomic_store_n(&fs_service_registered, fds, __ATOMIC_RELEASE);
}

/* Builds the round's poll set in SET: the fixed entries, the registered
 * descriptors (up to *NL) and the watches (up to *NW), room kept for the
 * hand-backs' sockets; *NEXT_DEADLINE is the nearest watch's deadline
 * (UINT64_MAX: none). Returns the entries, or 0 when there is no memory
 * for the fixed ones. */
static nfds_t fs_service_build_set(struct fs_service_set *set, nfds_t *nl, nfds_t *nw, uint64_t *next_deadline)
{
	const struct fs_service_fds *reg = __atomic_load_n(&fs_service_registered, __ATOMIC_ACQUIRE);
	size_t registered = 0;
	nfds_t n = 0, cap;

	pthread_mutex_lock(&fs_service_lock);
	if (reg)
		registered = reg->count();
	cap = fs_service_set_fit(set, FS_SERVICE_FIXED + registered + fs_watch_count + FS_SERVICE_BLOCKED);
	if (cap < FS_SERVICE_FIXED + FS_SERVICE_BLOCKED) {
		pthread_mutex_unlock(&fs_service_lock);
		return 0;
	}
	n = fs_service_set_put(set, n, fs_service_wake_fd, POLLIN, NULL, NULL, NULL);
	/* the bell: -1 (ignored by poll) until a HELLO opened it */
	n = fs_service_set_put(set, n, fs_bell_fd(), POLLIN, NULL, NULL, NULL);
	n = fs_service_set_put(set, n, fs_service_timer_fd, POLLIN, NULL, NULL, NULL);
	/* requests for a stream back from processes forked later */
	n = fs_service_set_put(set, n, fs_handback_request_fd(fs_engine_peek()), POLLIN, NULL, NULL, NULL);
	/* rings of peers of this host, and peers asking for our eventfd */
	n = fs_service_set_put(set, n, fs_ring_fd(), POLLIN, NULL, NULL, NULL);
	n = fs_service_set_put(set, n, fs_ring_listen_fd(), POLLIN, NULL, NULL, NULL);
	n = fs_service_set_put(set, n, -1, POLLIN, NULL, NULL, NULL); /* FS_SERVICE_CQ_SLOT */
	set->n = n;
	if (reg)
		reg->put(set);
	*nl = n = set->n;
	*next_deadline = UINT64_MAX;
	for (struct fs_watch *w = fs_watch_list; w; w = w->next) {
		if (w->deadline_ns < *next_deadline)
			*next_deadline = w->deadline_ns;
		if (n + FS_SERVICE_BLOCKED < cap) /* else left to its deadline */
			n = fs_service_set_put(set, n, w->fd, w->events, NULL, NULL, w);
	}
	*nw = n;
	pthread_mutex_unlock(&fs_service_lock);
	return n;
}

/* A provider that moves bytes only inside our calls (tcp, net) and has a
 * completion queue fd (fs_engine_cq_wait_fd): with live streams and nothing
 * to post, the thread sleeps on that fd (*CQ, in SET's FS_SERVICE_CQ_SLOT)
 * instead of polling in slices of IDLE_US (1 ms after activity, doubling to
 * 50 ms): a completion wakes it at once, and an idle process wakes only for
 * the slice of its timed work (grants going back, doorbells to arm,
 * lingering closes). While completions come and an application thread
 * sleeps on the fd itself, the thread keeps its slices as before: that
 * thread wakes for them, and two threads woken for each completion would
 * cost a context switch each on a busy host; once FS_SERVICE_CQ_QUIET_MS
 * passed without one, both watch it. Returns false when fi_trywait says a
 * progress round is due first (poll without sleeping). Engine lock held. */
#define FS_SERVICE_CQ_QUIET_MS 50

static bool fs_service_cq_look(struct fs_engine *e, struct fs_service_set *set, uint64_t now, bool *cq)
{
	int fd;

	if (__atomic_load_n(&e->cq_sleepers, __ATOMIC_RELAXED) &&
	    e->active_ns + FS_SERVICE_CQ_QUIET_MS * 1000000ull > now)
		return true;
	fd = fs_engine_cq_wait_fd(e);
	if (fd == -EAGAIN)
		return false;
	if (fd >= 0) {
		set->pfd[FS_SERVICE_CQ_SLOT].fd = fd;
		*cq = true;
	}
	return true;
}

/* Whether this thread counts as a sleeper a local ring wakes (ring.h):
 * only while work of its own waits for a peer's message (sends waiting
 * for credit, closing streams, hand-backs). The application's sleepers
 * count themselves; one that is awake looks before it sleeps, so a ring
 * for it would only wake this thread for nothing. Engine lock held. */
static __thread bool fs_service_counted;

static void fs_service_count_sleep(struct fs_engine *e, bool want)
{
	if (want == fs_service_counted && !(want && fs_ring_sleep_stale()))
		return;
	if (fs_service_counted)
		fs_ring_sleep_end();
	fs_service_counted = want;
	if (!want)
		return;
	fs_ring_sleep_begin();
	fs_engine_progress(e); /* a message posted before the count rang nobody */
}

/* Consecutive 1 ms looks for streams on their way back (the service thread's own). */
static unsigned fs_service_switch_looks;

/* The engine's work before the poll, if its lock is free (else someone is
 * making progress): stale pulls, idle grants, the hand-backs' sockets
 * waiting for room (added to SET after entry *N), arming the doorbells when
 * idle, leaving the bell to deep sleepers (*BELL_OFF), the completion
 * queue's fd (fs_service_cq_look). Returns the poll's timeout for the
 * engine's sake (-1: none; 1 ms while a stream is on its way back to TCP;
 * IDLE_US while streams live, FS_BELL_SLICE_MS when deeply idle or when a
 * completion wakes us anyway). */
static int fs_service_engine_look(struct fs_service_set *set, nfds_t *n, uint64_t idle_us, bool *bell_off)
{
	struct fs_engine *e = fs_engine_peek();
	/* Busy engine lock: someone is making progress; look again soon. */
	bool busy = true, live = true, deep = false, switching = false, cq = false, ring_idle = false;

	if (!e)
		return -1;
	if (pthread_mutex_trylock(&e->lock) == 0) {
		uint64_t now = fs_now_ns();

		if (fs_service_bell_deferred || fs_service_ring_deferred)
			fs_bell_drain_locked(e, fs_service_bell_deferred, fs_service_ring_deferred);
		if (fs_service_handback_deferred)
			fs_handback_serve(e);
		fs_service_bell_deferred = fs_service_ring_deferred = fs_service_handback_deferred = false;
		busy = fs_engine_busy(e);
		/* A stream on its way back to TCP waits for the peer's SWITCH or
		 * RETURN_END, which may ring nobody (the stream not armed) while
		 * its application already reads and writes the kernel socket and
		 * makes no progress round of ours: its held bytes go out when
		 * this thread looks. Look every millisecond until it is over
		 * (one round trip, usually), for a second at most: a peer that
		 * does not answer (stopped) is then looked for at the idle pace. */
		switching = e->switching.next != &e->switching;
		/* orphans included (live_streams): one waits for
		 * the peer's FIN or its linger deadline, and only
		 * a progress round sees either */
		live = e->live_streams != 0;
		/* eventfds of peers with no stream left: kept a while (ring.h) */
		ring_idle = fs_ring_sweep(now);
		/* payloads a slow reader leaves at the sender come over */
		fs_engine_pull_stale(e);
		/* grants of streams gone quiet go back to the floor */
		fs_engine_grants_idle(e);
		/* a NIC's interface gone down resets its streams */
		if (live)
			fs_engine_nics_watch(e, now);
		/* TCP writes of hand-backs waiting for room */
		{
			int fds[FS_SERVICE_BLOCKED];
			unsigned nb = fs_handback_blocked_fds(e, fds, FS_SERVICE_BLOCKED);

			for (unsigned i = 0; i < nb; i++)
				*n = fs_service_set_put(set, *n, fds[i], POLLOUT, NULL, NULL, NULL);
		}
		fs_engine_debug_dump(e, now);
		/* Idle: ask every peer to ring the doorbell, then sleep on it. */
		if (!busy && fs_engine_quiet(e, now))
			fs_bell_arm_all(e);
		/* A sleepy engine's waiter sleeping deeply armed
		 * every stream: with nothing in flight, this thread
		 * is needed for a ring or a watch only. */
		deep = fs_engine_deep_idle(e) || (e->deep_waiters && fs_engine_waiters_arm(e));
		/* deep sleepers watch the doorbell: one wake-up per
		 * ring, theirs (fs_engine_bell_watched) */
		*bell_off = (deep && e->deep_waiters) || e->beside_watcher;
		__atomic_store_n(&e->service_bell_off, *bell_off, __ATOMIC_RELAXED);
		if (*bell_off) {
			set->pfd[1].fd = -1;
			set->pfd[4].fd = -1;
		}
		fs_service_count_sleep(e, !*bell_off && (e->pending.next != &e->pending || e->orphans || switching));
		if (live && !busy)
			busy = !fs_service_cq_look(e, set, now, &cq);
		fs_engine_unlock(e);
	}
	/* still owed (the lock was busy): not polled for, or the poll would
	 * return at once; the busy lock's short poll comes back for them */
	if (fs_service_bell_deferred)
		set->pfd[1].fd = -1;
	if (fs_service_handback_deferred)
		set->pfd[3].fd = -1;
	if (fs_service_ring_deferred)
		set->pfd[4].fd = -1;
	if (busy)
		return 0;
	if (!switching) {
		fs_service_switch_looks = 0;
	} else if (fs_service_switch_looks < 1000) {
		fs_service_switch_looks++;
		return 1;
	}
	if (deep || cq)
		return FS_BELL_SLICE_MS;
	if (live)
		return (int)(idle_us / 1000);
	/* idle ring entries to sweep (fs_ring_sweep), and nothing else */
	return ring_idle ? (int)(FS_RING_SWEEP_NS / 1000000ull) : -1;
}

/* Serves the fixed entries of PFD after a poll that returned RET: gives the
 * bell back to this thread (*BELL_OFF), the wake-up, an exit a signal asked
 * for, a ring (*IDLE_US back to its start), the timer, hand-back requests. */
static void fs_service_fixed_ready(const struct pollfd *pfd, int ret, bool *bell_off, uint64_t *idle_us)
{
	struct fs_engine *e;

	if (*bell_off && (e = fs_engine_peek())) {
		__atomic_store_n(&e->service_bell_off, false, __ATOMIC_RELAXED);
		*bell_off = false;
	}
	if (ret > 0 && (pfd[0].revents & POLLIN)) {
		uint64_t v;
		ssize_t r = fs_real.read(fs_service_wake_fd, &v, sizeof(v));
		(void)r;
	}
	if (__atomic_load_n(&fs_service_exit_wanted, __ATOMIC_ACQUIRE)) {
		/* a signal is ending the process: deliver, then answer */
		uint64_t one = 1;
		ssize_t r;

		fs_core_exit();
		r = fs_real.write(fs_service_exit_fd, &one, sizeof(one));
		(void)r;
		__atomic_store_n(&fs_service_exit_wanted, 0, __ATOMIC_RELEASE);
	}
	if (ret > 0 && ((pfd[1].revents | pfd[4].revents) & POLLIN)) {
		bool datagrams = pfd[1].revents & POLLIN, ring = pfd[4].revents & POLLIN;

		*idle_us = 1000; /* a ring: the peer's message is on its way */
		e = fs_engine_peek();
		if (!fs_bell_try_drain(e, datagrams, ring)) {
			/* the lock's holder makes progress; its posts read the
			 * doorbell's ARMs themselves while we do not watch it
			 * (fs_engine_bell_watched), and the next look that gets
			 * the lock reads the rest */
			fs_service_bell_deferred |= datagrams;
			fs_service_ring_deferred |= ring;
			__atomic_store_n(&e->service_bell_off, true, __ATOMIC_RELAXED);
		}
	}
	if (ret > 0 && (pfd[5].revents & POLLIN))
		fs_ring_serve();
	if (ret > 0 && (pfd[2].revents & POLLIN)) {
		uint64_t v;
		ssize_t r = fs_real.read(fs_service_timer_fd, &v, sizeof(v));

		(void)r;
		__atomic_store_n(&fs_service_timer_armed, 0, __ATOMIC_RELEASE);
	}
	if (ret > 0 && (pfd[3].revents & POLLIN) && (e = fs_engine_peek())) {
		if (pthread_mutex_trylock(&e->lock) == 0) {
			fs_handback_serve(e);
			fs_engine_unlock(e);
		} else {
			fs_service_handback_deferred = true; /* the next look serves it */
		}
	}
}

/* The engine's work after a round: a progress round if its lock is free
 * and streams live, and the back-off of *IDLE_US while nothing happens. */
static void fs_service_progress(uint64_t *idle_us)
{
	struct fs_engine *e = fs_engine_peek();

	if (e && pthread_mutex_trylock(&e->lock) == 0) {
		int done = e->live_streams ? fs_engine_progress(e) : 0;

		fs_engine_unlock(e);
		/* Back off while nothing happens: idle costs ~nothing. */
		*idle_us = done ? 1000 : (*idle_us < 50000 ? *idle_us * 2 : 50000);
	}
}

/* The engine's share of a round is still called directly: its doorbell
 * and hand-back fds at fixed slots, its look under the engine lock before
 * the poll (which may leave the doorbell out of the set), the doorbell and
 * hand-back requests served after it, the progress round and its back-off
 * after the watches. A registered tick (issue 15) would need a hook at each
 * of those points, and its back-off state would have to be reset at fork:
 * a change of its own, not part of the move out of probe.c. */
static void *fs_service_main(void *arg)
{
	struct fs_service_set set = { 0 };
	uint64_t idle_us = 1000, next_deadline;
	nfds_t nl, nw;
	bool bell_off = false;

	FS_GUARD_ENTER(); /* everything this thread does is fabsock's own */
	pthread_mutex_lock(&fs_service_busy);
	for (;;) {
		struct pollfd *pfd;
		nfds_t n;
		int timeout_ms;
		int ret;

		n = fs_service_build_set(&set, &nl, &nw, &next_deadline);
		if (!n) { /* no memory for the fixed entries: try again soon */
			fs_real.poll(NULL, 0, 10);
			continue;
		}
		pfd = set.pfd;
		timeout_ms = fs_service_engine_look(&set, &n, idle_us, &bell_off);
		if (next_deadline != UINT64_MAX) {
			uint64_t now = fs_now_ns();
			int until = next_deadline > now ? (int)((next_deadline - now) / 1000000ull) + 1 : 0;

			if (timeout_ms < 0 || until < timeout_ms)
				timeout_ms = until;
		}
		pthread_mutex_unlock(&fs_service_busy); /* a fork may go now */
		if (timeout_ms == 0) {
			struct timespec ts = { 0, 100000 }; /* 100 us */

			ret = fs_real.ppoll(pfd, n, &ts, NULL);
		} else {
			ret = fs_real.poll(pfd, n, timeout_ms);
		}
		pthread_mutex_lock(&fs_service_busy);
		/* the probes first: each client waits for its answer at most
		 * FABSOCK_PROBE_TIMEOUT_MS, and nothing else here is as short */
		for (nfds_t i = FS_SERVICE_FIXED; i < nl; i++)
			set.slot[i].ready(set.slot[i].arg, ret > 0 ? pfd[i].revents : 0);
		fs_service_fixed_ready(pfd, ret, &bell_off, &idle_us);
		fs_service_run_watches(&set, nl, nw);
		fs_service_progress(&idle_us);
	}
	return arg;
}
