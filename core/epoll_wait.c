/* SPDX-License-Identifier: MIT */
/*
 * epoll_wait over offloaded sockets (the member records, the instances and
 * epoll_ctl are epoll.c's). Readiness of offloaded members comes from their
 * streams; kernel events tagged with a member are translated (and may
 * settle a negotiating socket); the rest are the application's own. Like a blocking
 * receive it polls for FABSOCK_SPIN_US, then sleeps in the real epoll_wait
 * in slices of at most FABSOCK_SLEEP_MAX_US, looking at the streams between
 * slices.
 *
 * A full scan looks at every member; the ready list alone (the members
 * whose streams changed) does while nothing else can have changed. Kernel
 * events are collected after the scan and merged into its output.
 *
 * Lock order: fs_epoll.lock, then fs_sock.lock, then the engine lock
 * (every lock: core/locks.h).
 */
#include "core/epoll.h"
#include "core/epoll_internal.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include "config/log.h"
#include "core/bell.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/wait.h"
#include "preload/real.h"

static bool fs_have_pwait2 = true; /* kernel 5.11+; else millisecond slices */

/* Readiness of an offloaded member, after ET and ONESHOT. fe->lock held;
 * ENGINE_LOCKED: the engine lock too (the scan takes it once for all). */
static uint32_t fs_member_ready_in(struct fs_ep_member *m, bool engine_locked)
{
	uint32_t gen, ev;

	if (!m->s) {
		/* nested instance: readable while its members are */
		if (m->disarmed || !(m->events & EPOLLIN) || !fs_epoll_peek_ready_depth(m->inner_epfd, 3))
			return 0;
		if (m->events & EPOLLONESHOT)
			m->disarmed = true;
		return EPOLLIN;
	}
	/* (pid: atomic, the service thread settles a client's socket) */
	if (m->disarmed || __atomic_load_n(&m->s->pid, __ATOMIC_RELAXED) != fs_self_pid() || !m->s->stream)
		return 0;
	ev = engine_locked ? fs_stream_events_locked(m->s->stream, &gen) : fs_stream_poll_state(m->s->stream, &gen);
	m->look_gen = gen;
	/* poll and epoll share the bit values of these events */
	ev &= (m->events | EPOLLERR | EPOLLHUP) & (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLERR | EPOLLHUP | EPOLLPRI);
	if (!ev)
		return 0;
	if (m->events & EPOLLET) {
		if (m->reported_once && gen == m->reported_gen)
			return 0;
		m->reported_gen = gen;
		m->reported_once = true;
	}
	if (m->events & EPOLLONESHOT)
		m->disarmed = true;
	return ev;
}

static uint32_t fs_member_ready(struct fs_ep_member *m)
{
	return fs_member_ready_in(m, false);
}

/* Handles a kernel event tagged with member M. Returns the events to give
 * the application (0: none). fe->lock held. */
static uint32_t fs_member_kernel_event(struct fs_epoll *fe, struct fs_ep_member *m, uint32_t kev)
{
	struct fs_sock *s = m->s;

	if (!s) {
		if (m->disarmed)
			return 0;
		/* the inner instance may only have handshake bytes in it */
		if ((kev & EPOLLIN) && !fs_epoll_kernel_readable(m->inner_epfd) &&
		    !fs_epoll_peek_ready_depth(m->inner_epfd, 3))
			kev &= ~(uint32_t)EPOLLIN;
		kev &= m->events | EPOLLERR | EPOLLHUP;
		if (kev && (m->events & EPOLLONESHOT))
			m->disarmed = true;
		return kev;
	}
	if (m->reg == FS_EP_REG_CONTROL) {
		/* the peer's control connection moved: a close or a reset */
		if (s->stream && __atomic_load_n(&s->pid, __ATOMIC_RELAXED) == fs_self_pid())
			fs_stream_note_ctl(s->stream, s->fd);
		return m->parked ? 0 : fs_member_ready(m);
	}
	/* Negotiating: what arrived may settle it (a HELLO, an ACK, data, the
	 * connection coming up). Writability alone settles nothing: the
	 * application has not written yet. */
	switch (fs_sock_state(s)) {
	case FS_SOCK_SERVER_PENDING:
		/* a client that did not probe: its bytes (or its FIN) go to
		 * the application as the kernel reports them, and its first
		 * receive settles it (fs_sock_read_direct); settling here cost
		 * a poll, and the event: the member went back to the kernel's
		 * entry, which reported it only in the next round */
		if ((kev & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !fs_sock_read_direct(s))
			fs_sock_settle(s, false, fs_now_ns());
		break;
	case FS_SOCK_CLIENT_HELLO_SENT:
		if (kev & (EPOLLIN | EPOLLHUP | EPOLLERR))
			fs_sock_settle(s, false, fs_now_ns());
		break;
	case FS_SOCK_CONNECTING:
	case FS_SOCK_CLIENT_PENDING:
		fs_sock_settle(s, false, fs_now_ns());
		break;
	default:
		break;
	}
	if (!fs_member_fixup(fe, m))
		return 0; /* left to the kernel: its entry reports from now on */
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED)
		return fs_member_ready(m);
	if (m->disarmed)
		return 0;
	/* Still negotiating: a client that cannot take bytes yet (no HELLO
	 * sent, or its hold full) does not invite a writer to spin. */
	if (!fs_sock_writable_early(s))
		kev &= ~(uint32_t)EPOLLOUT;
	kev &= m->events | EPOLLERR | EPOLLHUP;
	if (kev && (m->events & EPOLLONESHOT))
		m->disarmed = true;
	return kev;
}

/* Records that M's event is OUT[INDEX] of the output GEN. */
static void fs_member_reported(struct fs_ep_member *m, uint64_t gen, int index)
{
	m->out_gen = gen;
	m->out_index = index;
}

/* After M was looked at (EV: what it reported): a level-triggered member
 * that reported stays on the ready list (it is ready until the application
 * takes what is there, as the kernel's epoll keeps it); an edge-triggered
 * or one-shot one waits for its stream's next change; one whose stream
 * will change with time alone (fs_stream_timed_locked) stays too. Engine
 * lock held. */
static void fs_member_requeue(struct fs_epoll *fe, struct fs_ep_member *m, uint32_t ev)
{
	if (m->disarmed)
		return;
	if ((ev && !(m->events & EPOLLET)) || (m->s->stream && fs_stream_timed_locked(m->s->stream)))
		fs_ready_push(fe, m);
}

/* Looks at offloaded member M (engine lock held): its events, if any, go
 * to OUT[N] of the output GEN, and it is queued again as
 * fs_member_requeue says. Returns the new count. */
static int fs_member_look(struct fs_epoll *fe, struct fs_ep_member *m, struct epoll_event *out, int n,
			  uint64_t gen)
{
	uint32_t ev = fs_member_ready_in(m, true);

	if (ev) {
		out[n].events = ev;
		out[n].data = m->data;
		fs_member_reported(m, gen, n);
		n++;
	}
	fs_member_requeue(fe, m, ev);
	return n;
}

/* Looks at M, not a settled member (or in a full scan, any member) without
 * the engine lock: fixes it up, reports a nested instance, and moves a
 * handshake on (settling one takes the engine lock). *DRAINED: the
 * listener whose probes this look answered already. Returns the new count
 * in OUT (the output GEN). fe->lock held. */
static int fs_member_look_unsettled(struct fs_epoll *fe, struct fs_ep_member *m, struct epoll_event *out, int n,
				    uint64_t gen, const void **drained)
{
	uint32_t ev;

	if (!fs_member_fixup(fe, m))
		return n;
	if (!m->s) {
		ev = fs_member_ready(m);
		if (ev) {
			out[n].events = ev;
			out[n].data = m->data;
			fs_member_reported(m, gen, n);
			n++;
		}
		return n;
	}
	if (fs_sock_state(m->s) == FS_SOCK_CLIENT_PENDING) {
		/* the service thread usually got there first; if not, try
		 * once without waiting */
		fs_sock_settle(m->s, true, fs_now_ns());
		fs_member_fixup(fe, m);
	} else if (fs_sock_state(m->s) == FS_SOCK_SERVER_PENDING) {
		/* its client waits for the probe's answer, which a busy
		 * host's service thread may give too late: once per
		 * listener and scan, this thread answers */
		*drained = fs_sock_drain_probes(m->s, *drained);
		/* a nonblocking sender told -EAGAIN: settled for it once its
		 * wait is over, then reported writable (offloaded: its stream;
		 * TCP: the kernel entry, made anew, reports it) */
		if (fs_sock_settle_owed(m->s))
			fs_member_fixup(fe, m);
	}
	return n;
}

/* The pending list (fs_epoll.pending): every member not settled, fixed up
 * and looked at. One that settles now watches its stream and is on the
 * ready list for its first look. fe->lock held. */
static int fs_epoll_scan_pending(struct fs_epoll *fe, struct epoll_event *out, int n, int max, uint64_t gen,
				 const void *drained)
{
	struct fs_dlist *node, *next;

	for (node = fe->pending.next; node != &fe->pending && n < max; node = next) {
		next = node->next; /* the member may leave the list (settled, or freed) */
		n = fs_member_look_unsettled(fe, fs_member_of_pnode(node), out, n, gen, &drained);
	}
	return n;
}

/* One pass over every member (the safety net: fs_epoll.need_full); fills
 * OUT, the output GEN. fe->lock held. The completion queue runs once for
 * the whole pass, and the offloaded members are looked at under one engine
 * lock, not one each. */
static int fs_epoll_scan(struct fs_epoll *fe, struct epoll_event *out, int max, uint64_t gen, bool progress,
			 const void *drained)
{
	struct fs_engine *e = fs_engine_peek();
	struct fs_ep_member *m, *next;
	int n = 0;

	if (fe->members && progress)
		fs_engine_progress_locked();

	for (m = fe->members; m && n < max; m = next) {
		next = m->next;
		if (fs_member_pending(m) || !m->s)
			n = fs_member_look_unsettled(fe, m, out, n, gen, &drained);
		else
			fs_member_fixup(fe, m);
	}
	/* a full pass (the output did not fill up first) */
	fe->need_full = m != NULL;
	fe->full_ns = fs_now_ns();
	fe->full_pid = fs_self_pid();
	if (!e || !fe->members)
		return n;
	pthread_mutex_lock(&e->lock);
	for (m = fe->members; m; m = m->next) {
		bool quiet;
		uint32_t was;
		int before = n;

		if (!m->s || fs_sock_state(m->s) != FS_SOCK_OFFLOADED)
			continue;
		if (n >= max) {
			/* no room to look: look next time */
			fs_ready_push(fe, m);
			continue;
		}
		/* a settled member off the ready list, whose stream told of
		 * no change since its last look, has nothing new to say */
		quiet = !fs_member_pending(m) && !fs_dlist_linked(&m->rnode) && m->watch.stream;
		was = m->look_gen;
		n = fs_member_look(fe, m, out, n, gen);
		if (quiet && n > before && m->look_gen == was) {
			FS_STAT_INC(epoll_unsignalled);
			FS_DBG("epoll: fd %d was ready without its stream telling", m->fd);
		}
	}
	fs_engine_unlock(e);
	return n;
}

/* The ready list alone (fs_epoll.need_full and what goes with it): the
 * members whose streams changed since they were looked at, and those
 * reported level-triggered last time; their events go to OUT from N on.
 * fe->lock held. The list is taken whole and looked at in batches (one
 * engine lock each), up to MAX events; what is left goes back to its
 * front. A member is off every list while it is looked at, so a change of
 * its stream meanwhile queues it again. Returns the new count. */
static int fs_epoll_scan_ready(struct fs_epoll *fe, struct epoll_event *out, int n, int max, uint64_t gen)
{
	struct fs_engine *e = fs_engine_peek();
	struct fs_ep_member *batch[FS_EP_BATCH];
	struct fs_dlist rest; /* what this look took; rlock guards it too */

	if (!e)
		return n;
	fs_lock(&fe->rlock);
	fs_dlist_take_all(&fe->ready, &rest);
	pthread_mutex_unlock(&fe->rlock);
	while (!fs_dlist_empty(&rest) && n < max) {
		int nb = 0;

		fs_lock(&fe->rlock);
		while (!fs_dlist_empty(&rest) && nb < FS_EP_BATCH && nb < max - n) {
			struct fs_ep_member *m = fs_member_of_rnode(rest.next);

			fs_dlist_del(&m->rnode);
			batch[nb++] = m;
		}
		pthread_mutex_unlock(&fe->rlock);
		for (int i = 0; i < nb; i++) {
			/* closed, forked, or handed back: freed, or pending now */
			if (!fs_member_fixup(fe, batch[i]) || fs_member_pending(batch[i]))
				batch[i] = NULL;
		}
		pthread_mutex_lock(&e->lock);
		for (int i = 0; i < nb; i++) {
			struct fs_ep_member *m = batch[i];

			if (m)
				n = fs_member_look(fe, m, out, n, gen);
		}
		fs_engine_unlock(e);
	}
	/* no room for them: first in line next time */
	fs_lock(&fe->rlock);
	fs_dlist_splice_front(&fe->ready, &rest);
	pthread_mutex_unlock(&fe->rlock);
	return n;
}

/* Whether FE's next look may be at its ready list alone. fe->lock held. */
static bool fs_epoll_ready_list_will_do(const struct fs_epoll *fe, uint64_t now)
{
	return !fe->need_full && now - fe->full_ns < FS_EP_FULL_EVERY_NS && fe->full_pid == fs_self_pid();
}

/* Collects kernel events for EPFD into KBUF (room for K): the wait the
 * caller decided (WAIT_US 0: none; LONG: the whole time until W's
 * deadline). Returns the count or -errno. */
static int fs_epoll_kernel_wait(int epfd, struct epoll_event *kbuf, int k, uint64_t wait_us, bool longwait,
				const struct fs_wait *w, const sigset_t *sigmask)
{
	int ret, ms, cq_fd;

	if (longwait) {
		ms = fs_wait_ms_until(fs_now_ns(), w->deadline);
	} else if (wait_us && (cq_fd = fs_engine_cq_wait_fd_try()) != -1) {
		/* a provider that moves bytes only inside our calls (tcp, net):
		 * its completion queue's fd beside the instance's, so that they
		 * wake us instead of waiting in the kernel for the slice; one
		 * with work pending (-EAGAIN) gets the first slice only */
		struct pollfd two[2] = { { .fd = epfd, .events = POLLIN }, { .fd = cq_fd, .events = POLLIN } };
		uint64_t ns = cq_fd < 0 ? FS_WAIT_FIRST_SLICE_US * 1000ull : wait_us * 1000ull;
		struct timespec ts = fs_wait_timespec(ns);

		if (cq_fd < 0)
			two[1].fd = -1;
		else
			fs_engine_cq_sleep(fs_engine_peek(), true);
		ret = fs_real.ppoll(two, 2, &ts, sigmask);
		if (cq_fd >= 0) {
			int err = errno;

			fs_engine_cq_sleep(fs_engine_peek(), false);
			errno = err;
		}
		if (ret < 0)
			return -errno;
		if (!two[0].revents)
			return 0;
		ret = fs_real.epoll_wait(epfd, kbuf, k, 0);
		return ret < 0 ? -errno : ret;
	} else if (wait_us && fs_have_pwait2) {
		/* microsecond slices: epoll_wait's milliseconds would add a
		 * whole one to every wake-up after the spin */
		struct timespec ts = { (time_t)(wait_us / 1000000), (long)(wait_us % 1000000) * 1000 };

		ret = fs_real.epoll_pwait2(epfd, kbuf, k, &ts, sigmask);
		if (!(ret < 0 && errno == ENOSYS))
			return ret < 0 ? -errno : ret;
		fs_have_pwait2 = false;
		ms = (int)((wait_us + 999) / 1000);
	} else {
		ms = (int)((wait_us + 999) / 1000);
	}
	ret = sigmask ? fs_real.epoll_pwait(epfd, kbuf, k, ms, sigmask) : fs_real.epoll_wait(epfd, kbuf, k, ms);
	return ret < 0 ? -errno : ret;
}

/* An epoll_wait returns N > 0 events: tells the engine whether it waited
 * past its spin for them (fs_engine_wait_done). */
static int fs_epoll_waited(const struct fs_wait *w, int n)
{
	fs_wait_done(w, fs_engine_peek(), n);
	return n;
}

/* One look at FE's members for a new output (its generation in *GEN): the
 * pending members and the ready list, or a full scan when it is due
 * (fs_epoll_ready_list_will_do). Returns the events put in EVENTS.
 *
 * A wait may sleep after a look that was not a full scan: the last full
 * scan is at most FS_EP_FULL_EVERY_NS old then, and a deep sleep lasts
 * FS_BELL_SLICE_MS at most, so a change no stream told of (there should be
 * none: epoll_unsignalled) is found that late, never lost. */
static int fs_epoll_look(struct fs_epoll *fe, struct epoll_event *events, int maxevents, uint64_t *gen,
			 bool spinning, bool probes_quiet)
{
	/* the probe sockets a kernel wait polled just now were empty: no
	 * listener's to drain (a recvmsg each, per look) */
	const void *drained = probes_quiet ? FS_SOCK_DRAIN_NONE : NULL;

	int n;

	/* a spinning round after the first: when another thread is in the
	 * engine, its progress is ours too (fs_engine_progress_try) */
	if (spinning && __atomic_load_n(&fe->members, __ATOMIC_ACQUIRE) && !fs_engine_progress_try())
		return -1;
	fs_lock(&fe->lock);
	*gen = __atomic_add_fetch(&fe->out_gen, 1, __ATOMIC_RELAXED);
	if (!fs_epoll_ready_list_will_do(fe, fs_now_ns())) {
		n = fs_epoll_scan(fe, events, maxevents, *gen, !spinning, drained);
	} else {
		if (fe->members && !spinning)
			fs_engine_progress_live_locked();
		n = fs_epoll_scan_pending(fe, events, 0, maxevents, *gen, drained);
		n = fs_epoll_scan_ready(fe, events, n, maxevents, *gen);
	}
	pthread_mutex_unlock(&fe->lock);
	return n;
}

/* Probe sockets a kernel wait (struct fs_ep_kwait) polls beside the
 * instance at most; an instance whose members' listeners have more waits
 * in slices, as before. */
#define FS_EP_KWAIT_PROBE_FDS 4

/* A wait that sleeps in the kernel although the instance has members: all
 * of them are accepted connections waiting for their client's first bytes
 * (SERVER_PENDING), which only the kernel can bring. */
struct fs_ep_kwait {
	bool on;
	unsigned nfds;
	int fds[FS_EP_KWAIT_PROBE_FDS]; /* listeners' probe sockets to poll too */
	uint64_t until;                 /* wake by then to look again (0: none) */
	bool probes_quiet;              /* fs_epoll_kwait found them empty */
};

/* Whether FE's wait at NOW may sleep in the kernel (fills KW): every member
 * is an accepted connection of this process still SERVER_PENDING. What can
 * settle such a one is the kernel's alone: its client's bytes or FIN (a
 * HELLO, or plain data) on its fd, whose kernel entry carries the
 * application's events; a probe on its listener's socket, which the
 * service thread answers, or this thread (fs_sock_drain_probes): those
 * sockets are polled too. Spinning or sleeping in slices for them, as for
 * an offloaded stream, stole the core from the very client it waited for
 * and cost a wake-up per slice: per request of a server whose clients stay
 * on TCP (nginx behind nginx: fallback_peer_plain) several context
 * switches and a 100 us spin. fe->lock held. */
static bool fs_epoll_kernel_settles(struct fs_epoll *fe, uint64_t now, struct fs_ep_kwait *kw)
{
	kw->nfds = 0;
	kw->until = 0;
	if (!fe->members)
		return false;
	for (struct fs_ep_member *m = fe->members, *next; m; m = next) {
		int fd;
		unsigned i;
		enum fs_sock_state st;

		next = m->next;
		/* A socket fabsock let go of since the last look (a client's
		 * connect() sent it to TCP: nginx adds an upstream socket to
		 * its set before connect(), so every proxied request left one
		 * here, and each wait of a proxy's worker went through the
		 * rounds): made the application's own entry and freed, as
		 * the next look would (fs_member_fixup), not a reason to
		 * spin. */
		if (m->s && ((st = fs_sock_state(m->s)) == FS_SOCK_KERNEL || st == FS_SOCK_SERVER_PLAIN ||
			     st == FS_SOCK_LISTENING || m->s->closed)) {
			if (!fs_member_fixup(fe, m))
				continue;
			return false;
		}
		/* (pid: atomic, the service thread settles a client's socket) */
		if (!m->s || !fs_member_pending(m) || __atomic_load_n(&m->s->pid, __ATOMIC_RELAXED) != fs_self_pid() ||
		    fs_sock_state(m->s) != FS_SOCK_SERVER_PENDING)
			return false;
		fd = fs_sock_probe_watch(m->s, now, &kw->until);
		if (fd < 0)
			continue;
		for (i = 0; i < kw->nfds && kw->fds[i] != fd; i++)
			;
		if (i < kw->nfds)
			continue;
		if (kw->nfds == FS_EP_KWAIT_PROBE_FDS)
			return false;
		kw->fds[kw->nfds++] = fd;
	}
	return true;
}

/* How the round that found N events waits in the kernel: not at all (N, or
 * W over, or still spinning: returns 0), for the whole time (*LONGWAIT),
 * or for W's next slice (returned, in microseconds, at least 1). KW: set
 * on when it sleeps in the kernel for members that only the kernel can
 * settle (fs_epoll_kernel_settles; *LONGWAIT too). */
static uint64_t fs_epoll_plan_wait(struct fs_epoll *fe, int epfd, int n, struct fs_wait *w, bool *longwait,
				   struct fs_ep_kwait *kw)
{
	uint64_t now = fs_now_ns(), ns;
	enum fs_wait_step next = fs_wait_next(w, now);

	kw->on = false;
	kw->probes_quiet = false;
	if (n || next == FS_WAIT_OVER)
		return 0;
	if (!fs_epoll_has_members(epfd)) {
		/* Nothing of ours to poll: the whole time in the kernel,
		 * counted as a kernel sleeper, so that a member another
		 * thread adds rings the instance's wake fd. */
		*longwait = true;
		return 0;
	}
	fs_lock(&fe->lock);
	kw->on = fs_epoll_kernel_settles(fe, now, kw);
	pthread_mutex_unlock(&fe->lock);
	if (kw->on) {
		*longwait = true;
		return 0;
	}
	if (next == FS_WAIT_SPIN)
		return 0;
	ns = fs_wait_slice_ns(w, now);
	return ns >= 1000 ? ns / 1000 : 1;
}

/* Deeply idle: sleeps on the epoll fd itself and the engine's deep fd, then
 * the kernel is asked without waiting (*WAIT_US 0), unless the sleep saw
 * the instance itself quiet (*KERNEL_QUIET). Returns 0, or -errno for
 * epoll_wait to return (EINTR: a signal). */
/* Tells the deep sleep which streams FE's waiter waits for (its offloaded
 * members), when other threads wait too (fs_wait_own_wanted). */
static void fs_epoll_own_streams(struct fs_epoll *fe)
{
	fs_wait_own_reset();
	if (!fs_wait_own_wanted())
		return;
	fs_lock(&fe->lock);
	for (struct fs_ep_member *m = fe->members; m; m = m->next) {
		/* (pid: atomic, the service thread settles a client's socket) */
		if (m->s && fs_sock_state(m->s) == FS_SOCK_OFFLOADED && m->s->stream &&
		    __atomic_load_n(&m->s->pid, __ATOMIC_RELAXED) == fs_self_pid()) {
			fs_wait_own_add(m->s);
			if (fs_wait_thread.own_bad)
				break; /* more than FS_WAIT_OWN_MAX */
		} else {
			fs_wait_own_bad(); /* negotiating, nested, not ours to sleep on */
			break;
		}
	}
	pthread_mutex_unlock(&fe->lock);
}

static int fs_epoll_deep_sleep(struct fs_epoll *fe, int epfd, const struct fs_wait *w, const sigset_t *sigmask,
			       uint64_t *wait_us, bool *kernel_quiet, bool *armed, bool *slept_out)
{
	struct pollfd dp[1 + FS_WAIT_DEEP_SLOTS] = { { .fd = epfd, .events = POLLIN } };
	bool slept;
	int r;

	fs_epoll_own_streams(fe);
	r = fs_wait_deep_sleep(w, dp, 1, sigmask, &slept);
	fs_wait_own_reset(); /* the references it took */

	*slept_out = slept;
	if (slept) {
		if (r < 0)
			return r;
		*wait_us = 0;
		/* r counts the instance alone (fs_wait_deep_sleep): not readable
		 * when a ring or the slice woke us, so an epoll_wait now would
		 * find nothing (a sleepy backend's third call per wake-up); an
		 * event that comes after is found by the next round's kernel
		 * look, or wakes the next sleep at once */
		*kernel_quiet = r == 0;
	} else if (r == -EAGAIN) {
		*wait_us = 0; /* just armed: look again, then sleep */
		*armed = true;
	}
	return 0;
}

/* When a kernel wait for pending members (KW, fs_epoll_kernel_settles)
 * begun at NOW must end: at KW's wake time or after FS_BELL_SLICE_MS at
 * most (a member settled by another thread meanwhile, which rings nothing,
 * is found that late, never lost: the bound of every deep sleep). */
static uint64_t fs_epoll_kwait_end(uint64_t now, const struct fs_ep_kwait *kw)
{
	uint64_t end = now + FS_BELL_SLICE_MS * 1000000ull;

	return kw->until && kw->until < end ? kw->until : end;
}

/* The kernel wait KW planned (fs_epoll_kernel_settles): the instance EPFD
 * and KW's probe sockets, until W's deadline, KW's wake time, or
 * FS_BELL_SLICE_MS at most (a member settled by another thread meanwhile,
 * which rings nothing, is found that late, never lost: the bound of
 * every deep sleep). Returns the kernel events in KBUF (room for K), 0
 * for a wake-up with none (a probe, the time), or -errno. */
static int fs_epoll_kwait(int epfd, struct epoll_event *kbuf, int k, struct fs_ep_kwait *kw,
			  const struct fs_wait *w, const sigset_t *sigmask)
{
	struct pollfd pf[1 + FS_EP_KWAIT_PROBE_FDS] = { { .fd = epfd, .events = POLLIN } };
	uint64_t now = fs_now_ns(), end = fs_epoll_kwait_end(now, kw);
	struct timespec ts;
	bool quiet = true;
	int ret;

	kw->probes_quiet = false;
	if (w->deadline && w->deadline < end)
		end = w->deadline;
	if (!kw->nfds) {
		/* nothing beside the instance: one call, as the kernel's own */
		uint64_t wait_us = end > now ? (end - now + 999) / 1000 : 0;

		return fs_epoll_kernel_wait(epfd, kbuf, k, wait_us ? wait_us : 1, false, w, sigmask);
	}
	for (unsigned i = 0; i < kw->nfds; i++) {
		pf[1 + i].fd = kw->fds[i];
		pf[1 + i].events = POLLIN;
	}
	ts = fs_wait_timespec(end > now ? end - now : 0);
	ret = fs_real.ppoll(pf, 1 + kw->nfds, &ts, sigmask);
	if (ret < 0)
		return -errno;
	for (unsigned i = 0; i < kw->nfds; i++)
		quiet = quiet && !pf[1 + i].revents;
	if (!pf[0].revents)
		return 0;
	/* (a look right after need not drain them: fs_epoll_look) */
	kw->probes_quiet = quiet && (!kw->until || fs_now_ns() < kw->until);
	ret = fs_real.epoll_wait(epfd, kbuf, k, 0);
	return ret < 0 ? -errno : ret;
}

/* Collects kernel events for FE (at EPFD) into KBUF (room for K): for the whole time
 * until W's deadline as one of its kernel sleepers (LONGWAIT; with KW on,
 * fs_epoll_kwait's), else waiting WAIT_US at most. Returns the count or
 * -errno. */
static int fs_epoll_collect(struct fs_epoll *fe, int epfd, struct epoll_event *kbuf, int k, uint64_t wait_us,
			    bool longwait, struct fs_ep_kwait *kw, const struct fs_wait *w,
			    const sigset_t *sigmask)
{
	bool again;

	if (!longwait)
		return fs_epoll_kernel_wait(epfd, kbuf, k, wait_us, false, w, sigmask);
	fs_lock(&fe->lock);
	__atomic_add_fetch(&fe->kernel_sleepers, 1, __ATOMIC_SEQ_CST);
	/* a member added before the count went up was seen by no one */
	if (kw->on) {
		struct fs_ep_kwait now_kw;

		again = !fs_epoll_kernel_settles(fe, fs_now_ns(), &now_kw);
	} else {
		again = fe->members != NULL;
	}
	pthread_mutex_unlock(&fe->lock);
	if (again)
		k = 0;
	else if (kw->on)
		k = fs_epoll_kwait(epfd, kbuf, k, kw, w, sigmask);
	else
		k = fs_epoll_kernel_wait(epfd, kbuf, k, 0, true, w, sigmask);
	__atomic_sub_fetch(&fe->kernel_sleepers, 1, __ATOMIC_SEQ_CST);
	return k;
}

/* Adds the K kernel events of KBUF to EVENTS (N there already, room for
 * MAXEVENTS), the output GEN: the application's own as they are, a
 * member's translated. Returns the new count. */
static int fs_epoll_merge_kernel(struct fs_epoll *fe, const struct epoll_event *kbuf, int k,
				 struct epoll_event *events, int n, int maxevents, uint64_t gen)
{
	fs_lock(&fe->lock);
	for (int i = 0; i < k && n < maxevents; i++) {
		bool ours;
		struct fs_ep_member *m = fs_member_by_tag(fe, kbuf[i].data.u64, &ours);
		uint32_t ev;

		if (!ours) {
			events[n++] = kbuf[i]; /* the application's own fd */
			continue;
		}
		if (kbuf[i].data.u64 == FS_EP_TAG_WAKE) {
			uint64_t v;
			ssize_t r = fs_real.read(fe->wake_fd, &v, sizeof(v));

			(void)r;
			continue;
		}
		if (!m)
			continue; /* a member gone since the kernel answered */
		ev = fs_member_kernel_event(fe, m, kbuf[i].events);
		if (!ev)
			continue;
		/* the scan may have reported this member already: one entry
		 * per fd, with the events of both */
		if (m->out_gen == gen && m->out_index < n) {
			events[m->out_index].events |= ev;
			continue;
		}
		events[n].events = ev;
		events[n].data = m->data;
		fs_member_reported(m, gen, n);
		n++;
	}
	pthread_mutex_unlock(&fe->lock);
	return n;
}

/* fs_epoll_wait's rounds for FE at EPFD, W begun. */
static int fs_epoll_wait_rounds(struct fs_epoll *fe, int epfd, struct epoll_event *events, int maxevents,
				struct fs_wait *w, const sigset_t *sigmask)
{
	struct epoll_event kbuf[FS_EP_BATCH];
	struct fs_ep_kwait kw = { .on = false };
	uint64_t kernel_at = 0; /* when this wait last asked the kernel (0: not yet) */

	for (bool first = true;; first = false) {
		int n, k;
		uint64_t wait_us, gen, now;
		bool longwait = false, kernel_quiet = false, armed = false, slept = false;

		n = fs_epoll_look(fe, events, maxevents, &gen,
				  !first && fs_wait_next(w, fs_now_ns()) == FS_WAIT_SPIN, !first && kw.probes_quiet);
		if (n < 0) {
			fs_wait_spin(w); /* skipped: another thread is in the engine */
			continue;
		}
		wait_us = fs_epoll_plan_wait(fe, epfd, n, w, &longwait, &kw);
		k = maxevents - n < FS_EP_BATCH ? maxevents - n : FS_EP_BATCH;
		if (!k)
			return fs_epoll_waited(w, n); /* full from our members alone (a kernel call with no room fails EINVAL) */
		if (wait_us) {
			int r = fs_epoll_deep_sleep(fe, epfd, w, sigmask, &wait_us, &kernel_quiet, &armed, &slept);

			if (r < 0)
				return r;
		}
		now = fs_now_ns();
		/* (a round that slept asks, unless its sleep saw the instance
		 * quiet: the instance may be what woke it) */
		if (!n && !longwait && !wait_us && !slept && fs_wait_next(w, now) != FS_WAIT_OVER &&
		    fs_wait_kernel_later(w, now, kernel_at, armed))
			kernel_quiet = true; /* looked at with the streams' next look, or by the sleep */
		else if (!kernel_quiet)
			kernel_at = now;
		k = kernel_quiet ? 0 : fs_epoll_collect(fe, epfd, kbuf, k, n ? 0 : wait_us, longwait, &kw, w, sigmask);
		if (k < 0)
			return n ? n : k;
		n = fs_epoll_merge_kernel(fe, kbuf, k, events, n, maxevents, gen);
		if (n)
			return fs_epoll_waited(w, n);
		if (fs_wait_next(w, fs_now_ns()) == FS_WAIT_OVER)
			return 0;
		/* a pause (or a yield) between spinning looks only: after a
		 * sleep or an arming the next look comes at once (a backend
		 * woken by its query's ring yielded its core every fourth time) */
		if (!wait_us && !longwait && !slept && !armed)
			fs_wait_spin(w);
	}
}

/* The application's own call on EPFD (the sigmask variant when it gave one):
 * the count, or -errno. */
static int fs_epoll_real_wait(int epfd, struct epoll_event *events, int maxevents, int timeout_ms,
			      const sigset_t *sigmask)
{
	int k = sigmask ? fs_real.epoll_pwait(epfd, events, maxevents, timeout_ms, sigmask)
			: fs_real.epoll_wait(epfd, events, maxevents, timeout_ms);

	return k < 0 ? -errno : k;
}

/* What is left of TIMEOUT_MS (> 0) begun at START (fs_now_coarse_ns), for
 * a wait that must go on after a member came: may wait a tick longer. */
static int fs_epoll_ms_left(int timeout_ms, uint64_t start)
{
	uint64_t spent_ms = (fs_now_coarse_ns() - start) / 1000000ull;

	return spent_ms >= (uint64_t)timeout_ms ? 0 : timeout_ms - (int)spent_ms;
}

/* fs_epoll_wait_bare's answers when FE has members it cannot wait for in
 * one kernel call (or parked ones): the usual rounds must wait; when its
 * wait saw only fabsock's events (a member came): the rounds wait the rest
 * of the time; and when it woke before the application's timeout to look
 * at its pending members again (their probes: fs_epoll_kernel_settles). */
#define FS_EP_NOT_BARE INT_MIN
#define FS_EP_BARE_WOKEN (INT_MIN + 1)
#define FS_EP_BARE_CUT (INT_MIN + 2)

/* An instance that has a record but no member now (a client whose first
 * connections were offloaded and whose later ones went to TCP; a server
 * between its plain clients), or whose members are all accepted
 * connections waiting for their clients' first bytes (a server's plain
 * clients: each connection is one between its accept and its first read;
 * fs_epoll_kernel_settles, with no probe socket to poll): the whole wait in
 * the kernel, one call, as fabsock's rounds did for it (a kernel sleeper
 * for the whole time) but without their looks, clock reads, locks and wait
 * accounting (about 1 us a call: a wrk client's every epoll_wait, and 5 %
 * of an nginx worker's time serving a connection per request). Pending
 * members wake it by the time their listener's probes would need this
 * thread's help (FS_DRAIN_AFTER_NS) or FS_BELL_SLICE_MS (what a member
 * settled by another thread meanwhile waits at most, as in the rounds'
 * kernel wait). Counted a kernel sleeper, so that a member another thread
 * adds meanwhile rings the wake fd; events that carry fabsock's tags (the
 * wake fd, a member: a pending one's bytes settle it as in the rounds) go
 * through the usual merge. Returns the count (0: the time is up), -errno,
 * FS_EP_NOT_BARE (nothing waited), FS_EP_BARE_WOKEN or FS_EP_BARE_CUT. */
static int fs_epoll_wait_bare(struct fs_epoll *fe, int epfd, struct epoll_event *events, int maxevents,
			      int timeout_ms, const sigset_t *sigmask)
{
	struct epoll_event ours[FS_EP_BATCH];
	uint64_t gen = 0;
	int k, kept = 0, nours = 0;
	bool cut = false, have_gen = false;

	if (__atomic_load_n(&fe->parked, __ATOMIC_ACQUIRE))
		return FS_EP_NOT_BARE;
	if (!__atomic_load_n(&fe->members, __ATOMIC_ACQUIRE)) {
		/* No member: no lock (wrk, its first connections offloaded and
		 * the rest on TCP: two lock pairs a wait). Counted a kernel
		 * sleeper first, then the members looked at again; an adder
		 * links its member, then reads the count (fs_member_add, a full
		 * fence between): one of the two sees the other, and a member
		 * added meanwhile rings the wake fd. */
		__atomic_add_fetch(&fe->kernel_sleepers, 1, __ATOMIC_SEQ_CST);
		if (!__atomic_load_n(&fe->members, __ATOMIC_SEQ_CST) && !__atomic_load_n(&fe->parked, __ATOMIC_SEQ_CST)) {
			k = fs_epoll_real_wait(epfd, events, maxevents, timeout_ms, sigmask);
			__atomic_sub_fetch(&fe->kernel_sleepers, 1, __ATOMIC_SEQ_CST);
			goto waited;
		}
		__atomic_sub_fetch(&fe->kernel_sleepers, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&fe->parked, __ATOMIC_ACQUIRE))
			return FS_EP_NOT_BARE;
	}
	fs_lock(&fe->lock);
	if (__atomic_load_n(&fe->parked, __ATOMIC_ACQUIRE)) {
		pthread_mutex_unlock(&fe->lock);
		return FS_EP_NOT_BARE;
	}
	if (fe->members) {
		struct fs_ep_kwait kw;
		uint64_t now = fs_now_ns(), end;
		int ms;

		if (!fs_epoll_kernel_settles(fe, now, &kw) || kw.nfds) {
			pthread_mutex_unlock(&fe->lock);
			return FS_EP_NOT_BARE;
		}
		end = fs_epoll_kwait_end(now, &kw);
		ms = end > now ? (int)((end - now + 999999) / 1000000) : 0;
		if (timeout_ms < 0 || timeout_ms > ms) {
			timeout_ms = ms;
			cut = true;
		}
		FS_STAT_INC(epoll_bare_pending);
	}
	__atomic_add_fetch(&fe->kernel_sleepers, 1, __ATOMIC_SEQ_CST);
	pthread_mutex_unlock(&fe->lock);
	k = fs_epoll_real_wait(epfd, events, maxevents, timeout_ms, sigmask);
	__atomic_sub_fetch(&fe->kernel_sleepers, 1, __ATOMIC_SEQ_CST);
waited:
	if (k < 0)
		return k;
	for (int i = 0; i < k; i++) {
		if ((events[i].data.u64 & FS_EP_TAG_MARK_MASK) != FS_EP_TAG_MARK) {
			events[kept++] = events[i];
			continue;
		}
		if (!have_gen) {
			/* the output's generation, for the merge of ours only
			 * (an atomic count: each output's is its own, with no
			 * lock pair of its own per wait) */
			gen = __atomic_add_fetch(&fe->out_gen, 1, __ATOMIC_RELAXED);
			have_gen = true;
		}
		ours[nours++] = events[i];
		/* a batch of ours merged at once, none dropped (an edge of a
		 * member's would be lost): its output lands at or before
		 * index I, which is read already (each event read adds at
		 * most one to KEPT + NOURS) */
		if (nours == FS_EP_BATCH) {
			kept = fs_epoll_merge_kernel(fe, ours, nours, events, kept, maxevents, gen);
			nours = 0;
		}
	}
	if (nours)
		kept = fs_epoll_merge_kernel(fe, ours, nours, events, kept, maxevents, gen);
	if (kept)
		return kept;
	/* nothing for the application although the kernel answered: only
	 * fabsock's events (a member came, or a pending one's bytes settled
	 * nothing the application asked for) */
	if (k)
		return FS_EP_BARE_WOKEN;
	return cut ? FS_EP_BARE_CUT : 0;
}

int fs_epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout_ms, const sigset_t *sigmask)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);
	uint64_t start;
	struct fs_wait w;
	bool counted;
	int ret;

	if (maxevents <= 0)
		return -EINVAL;
	if (!fe)
		return fs_epoll_real_wait(epfd, events, maxevents, timeout_ms, sigmask); /* no record (closed meanwhile) */
	if (fs_params.epoll_bare) {
		/* (the coarse clock: read again only if the wait must go on) */
		uint64_t bare_start = timeout_ms > 0 ? fs_now_coarse_ns() : 0;

		ret = fs_epoll_wait_bare(fe, epfd, events, maxevents, timeout_ms, sigmask);
		if (ret != FS_EP_NOT_BARE && ret != FS_EP_BARE_WOKEN && ret != FS_EP_BARE_CUT)
			return ret;
		if (ret != FS_EP_NOT_BARE) {
			/* a member came, or the pending ones' time to be looked
			 * at: the rounds wait the rest of the time */
			if (ret == FS_EP_BARE_WOKEN)
				FS_STAT_INC(epoll_bare_woken);
			else
				FS_STAT_INC(epoll_bare_cut);
			if (timeout_ms == 0)
				return 0;
			if (timeout_ms > 0)
				timeout_ms = fs_epoll_ms_left(timeout_ms, bare_start);
		}
	}
	start = fs_now_ns();
	counted = fs_epoll_has_members(epfd);
	if (counted)
		fs_ready_wait_enter();
	fs_wait_begin(&w, fs_engine_peek(), start, fs_wait_deadline_ms(start, timeout_ms));
	ret = fs_epoll_wait_rounds(fe, epfd, events, maxevents, &w, sigmask);
	if (counted)
		fs_ready_wait_leave();
	return ret;
}

int fs_epoll_drop_ours(struct epoll_event *events, int k)
{
	int kept = 0;

	/* what carries a tag of ours is not the application's: the wake fd,
	 * a member */
	for (int i = 0; i < k; i++)
		if ((events[i].data.u64 & FS_EP_TAG_MARK_MASK) != FS_EP_TAG_MARK)
			events[kept++] = events[i];
	return kept;
}

int fs_epoll_wait_plain(int epfd, struct epoll_event *events, int maxevents, int timeout_ms, const sigset_t *sigmask)
{
	/* the coarse clock (10 ns against 40 here, per call of an instance
	 * fabsock never had a member in): only the rare wait that must go on
	 * after a member came reads it again, and may wait a tick longer */
	uint64_t start = timeout_ms > 0 ? fs_now_coarse_ns() : 0;
	uint32_t *plain = __atomic_load_n(&fs_ep_plain, __ATOMIC_ACQUIRE);
	int k, kept;

	if (!plain && epfd >= 0 && (size_t)epfd < fs_fdt_size) {
		fs_lock(&fs_ept_lock);
		if (!fs_ep_plain)
			__atomic_store_n(&fs_ep_plain, fs_fd_table_map(fs_fdt_size, sizeof(*fs_ep_plain)),
					 __ATOMIC_RELEASE);
		plain = fs_ep_plain;
		pthread_mutex_unlock(&fs_ept_lock);
	}
	if (plain && epfd >= 0 && (size_t)epfd < fs_fdt_size)
		__atomic_fetch_add(&plain[epfd], 1, __ATOMIC_ACQ_REL);
	else
		plain = NULL;
	/* a record made after the count went up wakes us; one made before it
	 * is seen here */
	k = fs_epoll_known(epfd) ? 0 : fs_epoll_real_wait(epfd, events, maxevents, timeout_ms, sigmask);
	if (plain)
		__atomic_fetch_sub(&plain[epfd], 1, __ATOMIC_ACQ_REL);
	if (k < 0 || !fs_epoll_known(epfd))
		return k;

	/* Another thread gave the instance its first fabsock member while this
	 * one waited: drop what is ours and wait the rest fabsock's way. */
	kept = fs_epoll_drop_ours(events, k);
	if (kept || timeout_ms == 0)
		return kept;
	if (timeout_ms > 0)
		timeout_ms = fs_epoll_ms_left(timeout_ms, start);
	return fs_epoll_wait(epfd, events, maxevents, timeout_ms, sigmask);
}
