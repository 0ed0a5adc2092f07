/* SPDX-License-Identifier: MIT */
/*
 * epoll over offloaded sockets. An offloaded socket's kernel fd never
 * becomes readable (its data comes over the fabric) and is always
 * writable, so the kernel cannot answer for it. For every epoll instance
 * that holds fabsock sockets, fabsock keeps a member record per such
 * socket: the application's events and epoll_data, and the ONESHOT and
 * edge-triggered state. The socket's kernel fd stays in the kernel set,
 * tagged with the member (not the application's data):
 *  - while the socket is not yet connected (added before connect(), as
 *    nginx adds its upstream connections), with the application's own
 *    events and data (FS_EP_REG_APP_OWN), as if fabsock had never seen
 *    it: its events go to the application as the kernel gives them, and
 *    one that stays on TCP costs no system call of ours (the tagged entry
 *    cost a MOD once plain, or a DEL at close). A connect() that may
 *    negotiate takes the tag first (fs_epoll_sock_negotiates);
 *  - while the socket is still negotiating, with the application's events
 *    under our tag: the kernel's answers are right for it then, and the
 *    bytes that arrive (a HELLO, an ACK, plain data) are what settles it;
 *  - once offloaded, with EPOLLIN | EPOLLRDHUP edge-triggered only, so the
 *    control connection's EOF (the peer closed or died) still wakes us;
 *  - once left to the kernel, with the application's events and data, as
 *    if fabsock had never seen it; the member goes away.
 * Those moves happen lazily, at the next epoll_wait. A server's connection
 * closed after it settled as TCP and before that (nginx's connection per
 * request) leaves its tagged entry to the kernel, which drops it with the
 * file, when no other descriptor can hold the file (fs_member_close_alone).
 *
 * An offloaded member the application takes out (EPOLL_CTL_DEL) is parked,
 * not freed: off every list, its kernel entry (the control connection's)
 * kept, so that the next EPOLL_CTL_ADD of the same fd and socket takes it
 * back without a system call. Event loops that add a socket for one write
 * or one read and take it out again (redis-benchmark, hiredis, libevent's
 * one-shot users) made two kernel epoll_ctl calls per request for entries
 * whose events never change: half the client's CPU at -c 1000. To the
 * application a parked member does not exist (MOD and DEL: ENOENT); the
 * kernel events of its entry only tell the stream of its control
 * connection; a close of the fd, a close of the instance, or an ADD that
 * finds the socket no longer offloaded drops it with its kernel entry.
 *
 * epoll_wait and its scans of the members are in epoll_wait.c; the
 * structures both files share, in epoll_internal.h.
 *
 * Kernel events name members by a tag, never by a pointer (fs_member_tag):
 * a slot index and its generation, under a marker no application pointer
 * can carry (bits 63..48 are not a canonical x86-64 address). A kernel
 * event can outlive its member (another thread's EPOLL_CTL_DEL or close()
 * between the kernel's answer and our look at it): its tag then names a
 * slot of another generation, and the event is dropped. (Events used to
 * carry the member's address, looked up in a hash: a member freed in that
 * window made the event look like one of the application's own, and Apache's
 * event MPM dereferenced fabsock's pointer as its own: SIGSEGV.)
 *
 * Every instance record also keeps an eventfd in its kernel set (tag
 * FS_EP_TAG_WAKE): a thread waiting in the kernel on an instance with no
 * offloaded member (no reason to poll) is woken when another thread adds
 * one, so it looks at the new member instead of sleeping out its timeout.
 *
 * Lock order: fs_epoll.lock, then fs_sock.lock, then the engine lock
 * (every lock: core/locks.h).
 */
#include "core/epoll.h"
#include "core/history.h"
#include "core/epoll_internal.h"
#include "core/tcpfirst.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <uthash.h>

#include "config/log.h"
#include "config/params.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/plain.h"
#include "core/sock.h"
#include "core/stats.h"
#include "preload/real.h"

/* ---- member slots and their tags ---------------------------------------- */

struct fs_ep_member *fs_ep_chunks[FS_EP_CHUNKS]; /* published once, never freed */
static uint32_t fs_ep_slots_made;
static struct fs_ep_member *fs_ep_free;
static pthread_mutex_t fs_ep_slot_lock = PTHREAD_MUTEX_INITIALIZER;

static struct fs_ep_member *fs_member_alloc(struct fs_epoll *fe)
{
	struct fs_ep_member *m;

	fs_lock(&fs_ep_slot_lock);
	m = fs_ep_free;
	if (m) {
		fs_ep_free = m->free_next;
	} else if (fs_ep_slots_made < FS_EP_CHUNK * FS_EP_CHUNKS) {
		uint32_t chunk = fs_ep_slots_made / FS_EP_CHUNK;

		if (!fs_ep_chunks[chunk]) {
			struct fs_ep_member *c = calloc(FS_EP_CHUNK, sizeof(*c));

			if (c)
				__atomic_store_n(&fs_ep_chunks[chunk], c, __ATOMIC_RELEASE);
		}
		if (fs_ep_chunks[chunk]) {
			m = &fs_ep_chunks[chunk][fs_ep_slots_made % FS_EP_CHUNK];
			m->index = fs_ep_slots_made++;
		}
	}
	pthread_mutex_unlock(&fs_ep_slot_lock);
	if (!m)
		return NULL;
	/* Everything after the owner: a waiter holding a stale tag may be
	 * reading index, gen and fe (atomically) right now. */
	memset(&m->free_next, 0, sizeof(*m) - offsetof(struct fs_ep_member, free_next));
	__atomic_store_n(&m->fe, fe, __ATOMIC_RELEASE);
	return m;
}

static void fs_member_release(struct fs_ep_member *m)
{
	__atomic_store_n(&m->fe, NULL, __ATOMIC_RELEASE);
	__atomic_fetch_add(&m->gen, 1, __ATOMIC_ACQ_REL);
	fs_lock(&fs_ep_slot_lock);
	m->free_next = fs_ep_free;
	fs_ep_free = m;
	pthread_mutex_unlock(&fs_ep_slot_lock);
}

static uint64_t fs_member_tag(const struct fs_ep_member *m)
{
	return FS_EP_TAG_MARK | ((uint64_t)(__atomic_load_n(&m->gen, __ATOMIC_RELAXED) & 0xffffu) << 32) | m->index;
}
struct fs_epoll **fs_ept;
/* Per epoll fd: threads in fs_epoll_wait_plain on it (atomic counters). */
uint32_t *fs_ep_plain;
/* Per fd: the socket fabsock let go of there (fs_sock_release: settled as
 * TCP, handed back) while epoll member records still name it
 * (fs_epoll_sock_left), until the last of them goes. From then on the
 * application's epoll_ctl and close() of that fd no longer come through
 * fabsock's socket, so they look here first: a member converted later, at
 * the next epoll_wait, would put back the events and data it had and undo
 * what the application registered since (memcaslap waited for EPOLLIN
 * forever: its DEL and ADD of EPOLLIN went to the kernel, and the member's
 * conversion restored the EPOLLOUT of before). Made with fs_ept, before
 * any member exists; compared as a key only, never dereferenced unless a
 * member (which holds a reference) is found for it. */
static struct fs_sock **fs_ep_left;
static int fs_ept_hi = -1; /* highest epfd with an instance record */
pthread_mutex_t fs_ept_lock = PTHREAD_MUTEX_INITIALIZER;

static struct fs_epoll *fs_epoll_get_or_make(int epfd)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);

	if (fe || epfd < 0 || (size_t)epfd >= fs_fdt_size)
		return fe;
	fs_lock(&fs_ept_lock);
	if (!fs_ept)
		__atomic_store_n(&fs_ept, fs_fd_table_map(fs_fdt_size, sizeof(*fs_ept)), __ATOMIC_RELEASE);
	if (!fs_ep_left)
		__atomic_store_n(&fs_ep_left, fs_fd_table_map(fs_fdt_size, sizeof(*fs_ep_left)), __ATOMIC_RELEASE);
	if (fs_ept && !(fe = fs_ept[epfd])) {
		fe = calloc(1, sizeof(*fe));
		if (fe) {
			struct epoll_event wake = { .events = EPOLLIN, .data.u64 = FS_EP_TAG_WAKE };

			pthread_mutex_init(&fe->lock, NULL);
			pthread_mutex_init(&fe->rlock, NULL);
			fs_dlist_init(&fe->ready);
			fs_dlist_init(&fe->pending);
			fe->need_full = true;
			fe->epfd = epfd;
			fe->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
			uint64_t one = 1;
			ssize_t n;

			if (fe->wake_fd >= 0) {
				fe->wake_fd = fs_internal_fd(fe->wake_fd);
				if (fs_real.epoll_ctl(epfd, EPOLL_CTL_ADD, fe->wake_fd, &wake)) {
					fs_internal_fd_close(fe->wake_fd);
					fe->wake_fd = -1;
				}
			}
			__atomic_store_n(&fs_ept[epfd], fe, __ATOMIC_RELEASE);
			if (epfd > fs_ept_hi)
				__atomic_store_n(&fs_ept_hi, epfd, __ATOMIC_RELEASE);
			if (fe->wake_fd >= 0 && fs_ep_plain && __atomic_load_n(&fs_ep_plain[epfd], __ATOMIC_ACQUIRE)) {
				/* A thread waits on the instance in the kernel, unaware
				 * of fabsock (fs_epoll_wait_plain): wake it, now that
				 * the record it will look for is there. (Only then: the
				 * eventfd stays readable, and so would the instance to
				 * poll() or an outer epoll.) */
				n = fs_real.write(fe->wake_fd, &one, sizeof(one));
				(void)n;
			}
		}
	}
	pthread_mutex_unlock(&fs_ept_lock);
	return fe;
}

/* ---- the ready list ------------------------------------------------------ */

/* M leaves the ready list, or the batch a look took from it. rlock held. */
static void fs_ready_unlink_locked(struct fs_ep_member *m)
{
	if (fs_dlist_linked(&m->rnode))
		fs_dlist_del(&m->rnode);
}

void fs_ready_push(struct fs_epoll *fe, struct fs_ep_member *m)
{
	fs_lock(&fe->rlock);
	if (!fs_dlist_linked(&m->rnode))
		fs_dlist_add_tail(&fe->ready, &m->rnode);
	pthread_mutex_unlock(&fe->rlock);
}

/* fs_stream_changed, under the engine lock: look at the member next time. */
static void fs_member_stream_changed(struct fs_stream_watch *w)
{
	struct fs_ep_member *m = (struct fs_ep_member *)((char *)w - offsetof(struct fs_ep_member, watch));

	fs_ready_push(__atomic_load_n(&m->fe, __ATOMIC_ACQUIRE), m);
}

/* Makes offloaded member M watch its socket's stream (and be looked at
 * once), or stop watching one it no longer has. fe->lock held. */
static void fs_member_watch(struct fs_epoll *fe, struct fs_ep_member *m)
{
	struct fs_stream *st = m->s && fs_sock_state(m->s) == FS_SOCK_OFFLOADED ? m->s->stream : NULL;
	struct fs_engine *e;

	if (__atomic_load_n(&m->watch.stream, __ATOMIC_RELAXED) == st)
		return;
	e = fs_engine_peek();
	if (!e)
		return;
	pthread_mutex_lock(&e->lock);
	fs_stream_watch_del(&m->watch);
	if (st) {
		m->watch.fn = fs_member_stream_changed;
		fs_stream_watch_add(st, &m->watch);
	}
	fs_engine_unlock(e);
	if (st)
		fs_ready_push(fe, m);
}

/* ---- the pending list ---------------------------------------------------- */

/* Puts M on the pending list unless it is settled: an offloaded socket
 * whose member watches its stream (fs_member_watch), so that the ready
 * list hears of every change. fe->lock held. */
static void fs_member_sort(struct fs_epoll *fe, struct fs_ep_member *m)
{
	bool settled = m->s && __atomic_load_n(&m->watch.stream, __ATOMIC_RELAXED);

	if (settled && fs_member_pending(m))
		fs_dlist_del(&m->pnode);
	else if (!settled && !fs_member_pending(m))
		fs_dlist_add(&fe->pending, &m->pnode);
}

static void fs_member_key(uint64_t key[2], int fd, const struct fs_sock *s)
{
	key[0] = (uint32_t)fd;
	key[1] = (uintptr_t)s;
}

/* FE's member for FD of socket S (NULL: a nested instance). fe->lock held. */
static struct fs_ep_member *fs_member_find(struct fs_epoll *fe, int fd, const struct fs_sock *s)
{
	struct fs_ep_member *m;
	uint64_t key[2];

	fs_member_key(key, fd, s);
	HASH_FIND(hh, fe->by_key, key, sizeof(key), m);
	return m;
}

/* Takes M off FE's member list and ready list and stops it watching its
 * stream. fe->lock held. */
static void fs_member_unlink(struct fs_epoll *fe, struct fs_ep_member *m)
{
	if (__atomic_load_n(&m->watch.stream, __ATOMIC_RELAXED)) {
		struct fs_engine *e = fs_engine_peek();

		if (e) {
			pthread_mutex_lock(&e->lock);
			fs_stream_watch_del(&m->watch);
			fs_engine_unlock(e);
		}
	}
	fs_lock(&fe->rlock);
	fs_ready_unlink_locked(m);
	pthread_mutex_unlock(&fe->rlock);
	if (fs_member_pending(m))
		fs_dlist_del(&m->pnode);
	if (m->prev)
		m->prev->next = m->next;
	else /* fe->members is also read without the lock (has_members) */
		__atomic_store_n(&fe->members, m->next, __ATOMIC_RELEASE);
	if (m->next)
		m->next->prev = m->prev;
	m->next = m->prev = NULL;
}

/* Puts M (not on the list) at the head of FE's member list, and on the
 * pending list: the next look fixes it up and watches its stream.
 * fe->lock held. */
static void fs_member_link(struct fs_epoll *fe, struct fs_ep_member *m)
{
	m->next = fe->members;
	m->prev = NULL;
	if (fe->members)
		fe->members->prev = m;
	__atomic_store_n(&fe->members, m, __ATOMIC_RELEASE);
	fs_dlist_add(&fe->pending, &m->pnode);
}

static void fs_member_free(struct fs_epoll *fe, struct fs_ep_member *m)
{
	HASH_DELETE(hh, fe->by_key, m);
	if (m->parked)
		__atomic_fetch_sub(&fe->parked, 1, __ATOMIC_RELEASE);
	else
		fs_member_unlink(fe, m);
	if (m->s) {
		struct fs_sock **left = __atomic_load_n(&fs_ep_left, __ATOMIC_ACQUIRE);
		struct fs_sock *expect = m->s;

		/* the last record naming a socket fabsock let go of: its fd
		 * is a plain one from now on */
		if (!__atomic_sub_fetch(&m->s->ep_members, 1, __ATOMIC_ACQ_REL) && left && m->fd >= 0 &&
		    (size_t)m->fd < fs_fdt_size)
			__atomic_compare_exchange_n(&left[m->fd], &expect, NULL, false, __ATOMIC_ACQ_REL,
						    __ATOMIC_ACQUIRE);
		fs_sock_put(m->s);
	} else {
		__atomic_sub_fetch(&fe->nested, 1, __ATOMIC_RELEASE);
	}
	fs_member_release(m);
}

/* The application closed EPFD: forget its members. */
void fs_epoll_closed(int epfd)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);
	struct fs_ep_member *m, *tmp;

	if (!fe)
		return;
	fs_lock(&fs_ept_lock);
	__atomic_store_n(&fs_ept[epfd], NULL, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&fs_ept_lock);
	/* Another thread may still be inside epoll_wait on it; leak the shell
	 * (a few bytes per closed epoll instance) rather than free it under it. */
	fs_lock(&fe->lock);
	HASH_ITER(hh, fe->by_key, m, tmp)
		fs_member_free(fe, m); /* every member, parked ones too */
	if (fe->wake_fd >= 0) {
		/* under the lock: a waiter reads it only under the lock */
		fs_internal_fd_close(fe->wake_fd);
		fe->wake_fd = -1;
	}
	pthread_mutex_unlock(&fe->lock);
	/* The kernel takes the closed instance out of every set it is in (with
	 * its last fd): so go its members there, before another instance gets
	 * the fd number and a stale member reports that one's readiness. */
	fs_epoll_fd_closing(NULL, epfd);
}

static void fs_member_drop(struct fs_epoll *fe, struct fs_ep_member *m);
static void fs_member_make_own(struct fs_epoll *fe, struct fs_ep_member *m);

/* Whether the close of M's fd is one the kernel itself would outlive when
 * the fd is not the file's only one (fs_member_close_alone): M's socket is a plain kernel one and
 * fabsock holds no descriptor of it, so the file stays open exactly as
 * long as the application's own descriptors (another fd of this process,
 * a forked child's, one passed away) keep it; the kernel then keeps the
 * entry and goes on reporting it with the application's data (the
 * classic epoll gotcha, which programs may rely on: a prefork server's
 * parent that closes an accepted fd its child serves). So its entry is
 * made the application's own (one EPOLL_CTL_MOD, as the DEL it replaces)
 * and the kernel decides. fe->lock held. */
static bool fs_member_close_plain(const struct fs_ep_member *m)
{
	enum fs_sock_state st;

	if (!m->s || m->parked)
		return false;
	st = fs_sock_state(m->s);
	return (st == FS_SOCK_KERNEL || st == FS_SOCK_SERVER_PLAIN) && !m->s->fd_private;
}

/* Whether the close of M's fd may leave M's kernel entry to the kernel
 * (no EPOLL_CTL_DEL): the kernel drops an entry with its file's last
 * descriptor. M's socket is one fabsock let go of (settled as TCP), which
 * holds no descriptor of the file besides the application's (no close in
 * the background, no private duplicate), and
 * - its entry is the application's own (FS_EP_REG_APP_OWN): kept while
 *   another descriptor holds the file, with the application's data,
 *   exactly as without fabsock; or
 * - it carries our tag for the application's events (a server's
 *   connection that settled as TCP at its first receive: nginx closes it
 *   before its next epoll_wait would make the entry its own), and the
 *   closing descriptor is the file's only one: the socket's only fd in
 *   this process, made after the last moment another process could have
 *   come to hold one (fs_fds_spread: a fork, a spawn, SCM_RIGHTS, a
 *   duplicate fabsock did not count). A tag left in the kernel would name
 *   nobody (its events dropped, a level-triggered one returned at every
 *   wait).
 * fe->lock held. */
static bool fs_member_close_alone(const struct fs_ep_member *m)
{
	if (!fs_params.epoll_own || !fs_member_close_plain(m))
		return false; /* (EPOLL_OWN=0: a system call at every close, as before, for comparison) */
	if (m->reg == FS_EP_REG_APP_OWN)
		return true;
	return m->reg == FS_EP_REG_APP_EVENTS && m->s->n_app_fds <= 1 &&
	       m->s->fds_spread == __atomic_load_n(&fs_fds_spread, __ATOMIC_SEQ_CST);
}

/* The application is about to close FD, one of S's fds (S NULL: FD is a
 * nested epoll instance). Takes it out of
 * every epoll instance now, while the fd still names the socket: the
 * kernel would keep its entry (tagged with a member of ours) as long as
 * the socket stays open, and fabsock keeps it open after close() (a
 * duplicate fd, or the stream's control channel until the FIN is out).
 * A plain socket's entry is left to the kernel instead: as it is when the
 * closing fd is the file's only one (fs_member_close_alone), made the
 * application's own otherwise (fs_member_close_plain). */
void fs_epoll_fd_closing(struct fs_sock *s, int fd)
{
	int hi = __atomic_load_n(&fs_ept_hi, __ATOMIC_ACQUIRE);

	for (int epfd = 0; epfd <= hi; epfd++) {
		struct fs_epoll *fe = fs_epoll_peek(epfd);
		struct fs_ep_member *m;

		if (!fe || (!__atomic_load_n(&fe->members, __ATOMIC_ACQUIRE) &&
			    !__atomic_load_n(&fe->parked, __ATOMIC_ACQUIRE)))
			continue;
		fs_lock(&fe->lock);
		while ((m = fs_member_find(fe, fd, s))) {
			if (fs_member_close_alone(m))
				fs_member_free(fe, m);
			else if (fs_member_close_plain(m))
				fs_member_make_own(fe, m);
			else
				fs_member_drop(fe, m);
		}
		pthread_mutex_unlock(&fe->lock);
	}
}

static int fs_kernel_ctl(struct fs_epoll *fe, int op, struct fs_ep_member *m, uint32_t events, bool app_data);
static uint32_t fs_member_kernel_events(struct fs_ep_member *m, enum fs_ep_reg reg);

/* (epoll.h) Each member of S that kept the application's own entry takes
 * our tag with the application's events: the kernel's MOD reports again
 * what is there. */
void fs_epoll_sock_negotiates(struct fs_sock *s)
{
	int hi = __atomic_load_n(&fs_ept_hi, __ATOMIC_ACQUIRE);
	int fds[4];
	unsigned n = 0;

	if (!__atomic_load_n(&s->ep_members, __ATOMIC_ACQUIRE))
		return;
	fs_lock(&s->lock);
	for (unsigned i = 0; i < s->n_app_fds && n < 4; i++)
		if (s->app_fds[i] >= 0)
			fds[n++] = s->app_fds[i];
	pthread_mutex_unlock(&s->lock);
	for (int epfd = 0; epfd <= hi; epfd++) {
		struct fs_epoll *fe = fs_epoll_peek(epfd);

		if (!fe || !__atomic_load_n(&fe->members, __ATOMIC_ACQUIRE))
			continue;
		fs_lock(&fe->lock);
		for (unsigned i = 0; i < n; i++) {
			struct fs_ep_member *m = fs_member_find(fe, fds[i], s);

			if (m && m->reg == FS_EP_REG_APP_OWN && !m->parked) {
				m->reg = FS_EP_REG_APP_EVENTS;
				fs_kernel_ctl(fe, EPOLL_CTL_MOD, m, fs_member_kernel_events(m, m->reg), false);
			}
		}
		pthread_mutex_unlock(&fe->lock);
	}
}

bool fs_epoll_known(int epfd)
{
	return fs_epoll_peek(epfd) != NULL;
}

bool fs_epoll_has_members(int epfd)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);

	return fe && __atomic_load_n(&fe->members, __ATOMIC_ACQUIRE) != NULL;
}

/* Whether S's member may have (or keep) the application's own kernel
 * entry with EVENTS (FS_EP_REG_APP_OWN): S is a kernel socket not yet
 * connected, for which the kernel's answers are right. An EXCLUSIVE entry
 * cannot be modified, which a negotiation would need. (Not a server's
 * connection waiting for its client's first bytes, though the kernel's
 * answers are right for it too: a probe answered after the ADD makes those
 * bytes a HELLO, which would reach the application untranslated, and its
 * receive, taking the HELLO, would return EAGAIN on a socket just reported
 * readable: a Python selectors server raised BlockingIOError,
 * e2e_pending_wait. Its tagged entry goes at the close with no system call
 * where nothing else holds the file: fs_member_close_alone.) */
static bool fs_member_own_ok(struct fs_sock *s, uint32_t events)
{
	return fs_params.epoll_own && fs_sock_state(s) == FS_SOCK_FRESH && !(events & EPOLLEXCLUSIVE);
}

static int fs_kernel_ctl(struct fs_epoll *fe, int op, struct fs_ep_member *m, uint32_t events, bool app_data)
{
	struct epoll_event ev = { .events = events };

	if (app_data)
		ev.data = m->data;
	else
		ev.data.u64 = fs_member_tag(m);
	return fs_real.epoll_ctl(fe->epfd, op, m->fd, op == EPOLL_CTL_DEL ? NULL : &ev);
}

/* What the kernel set should watch for a member in its current state. */
static enum fs_ep_reg fs_member_wanted_reg(struct fs_ep_member *m)
{
	enum fs_sock_state st;

	if (!m->s)
		return FS_EP_REG_APP_EVENTS; /* nested instance: the kernel's answer counts too */
	st = fs_sock_state(m->s);
	if (st == FS_SOCK_OFFLOADED)
		return FS_EP_REG_CONTROL;
	/* the application's own entry stays while the socket is what it was
	 * made for (never taken anew: fs_member_add decides) */
	if (m->reg == FS_EP_REG_APP_OWN && fs_member_own_ok(m->s, m->events))
		return FS_EP_REG_APP_OWN;
	return FS_EP_REG_APP_EVENTS;
}

static uint32_t fs_member_kernel_events(struct fs_ep_member *m, enum fs_ep_reg reg)
{
	if (reg == FS_EP_REG_APP_OWN)
		return m->events; /* exactly the application's (never EXCLUSIVE: fs_member_own_ok) */
	if (reg == FS_EP_REG_CONTROL)
		/* (TCP first: a writer on the kernel socket waits for its room,
		 * whose edges the kernel reports; after the switch none come) */
		return EPOLLIN | EPOLLRDHUP | EPOLLET | (fs_tcpfirst_tx_on_tcp(m->s->stream) ? EPOLLOUT : 0);
	/* ONESHOT stays ours: the kernel must keep reporting while we decide;
	 * EXCLUSIVE entries cannot be modified, which state changes need */
	return m->events & ~(uint32_t)(EPOLLONESHOT | EPOLLEXCLUSIVE);
}

/* M's socket is a plain kernel one from now on: its kernel entry becomes
 * the application's own, its events and data exactly (a readiness the
 * kernel already has is reported again: EPOLL_CTL_MOD looks at the file),
 * and M goes. An exclusive entry cannot be modified: it is made anew (with
 * EPOLLEXCLUSIVE, which ours left out; never one-shot). fe->lock held. */
static void fs_member_make_own(struct fs_epoll *fe, struct fs_ep_member *m)
{
	if (m->reg != FS_EP_REG_APP_OWN) {
		if (m->events & EPOLLEXCLUSIVE) {
			fs_kernel_ctl(fe, EPOLL_CTL_DEL, m, 0, true);
			fs_kernel_ctl(fe, EPOLL_CTL_ADD, m, m->events, true);
		} else {
			fs_kernel_ctl(fe, EPOLL_CTL_MOD, m, m->disarmed ? 0 : m->events, true);
		}
	}
	fs_member_free(fe, m);
}

/* Brings the kernel registration in line with the socket's state; drops
 * members that were closed or left to the kernel. fe->lock held. Returns
 * false if M was freed. */
bool fs_member_fixup(struct fs_epoll *fe, struct fs_ep_member *m)
{
	enum fs_sock_state st;
	enum fs_ep_reg want;

	if (!m->s) {
		if (!fs_epoll_peek(m->inner_epfd)) {
			/* the inner instance was closed; the kernel dropped it */
			fs_member_free(fe, m);
			return false;
		}
		return true; /* a nested instance stays pending */
	}
	st = fs_sock_state(m->s);
	if (st == FS_SOCK_OFFLOADED && fs_sock_must_unshare(m->s)) {
		/* forked after the offload, or back on TCP: a kernel socket */
		int err;

		fs_sock_unshare(m->s, &err);
		st = fs_sock_state(m->s);
	}
	/* Closed, or this fd of a duplicated socket closed (fabsock drops the
	 * member then, where the kernel would keep it while another fd holds
	 * the socket open: docs/design.md, "dup"). A socket left to the kernel
	 * has no slots any more and is handled below. */
	if (m->s->closed) {
		fs_member_free(fe, m); /* the kernel dropped the closed fd itself */
		return false;
	}
	if (st != FS_SOCK_KERNEL && !fs_sock_has_fd(m->s, m->fd)) {
		/* Gone from the table: closed, or left to the kernel by
		 * another thread just now (fs_sock_release sets KERNEL before
		 * it clears the fds: read again after the fd's absence) */
		st = fs_sock_state(m->s);
		if (st != FS_SOCK_KERNEL) {
			fs_member_free(fe, m); /* the kernel dropped the closed fd itself */
			return false;
		}
	}
	if (st == FS_SOCK_KERNEL || st == FS_SOCK_SERVER_PLAIN || st == FS_SOCK_LISTENING) {
		fs_member_make_own(fe, m);
		return false;
	}
	want = fs_member_wanted_reg(m);
	if (want != m->reg) {
		/* (never to APP_OWN: only fs_member_add makes one) */
		fs_kernel_ctl(fe, EPOLL_CTL_MOD, m, fs_member_kernel_events(m, want), false);
		m->reg = want;
	}
	fs_member_watch(fe, m);
	fs_member_sort(fe, m);
	return true;
}

/* Whether S belongs in an epoll instance's member list (it is or may
 * become offloaded). */
static bool fs_epoll_wants(struct fs_sock *s)
{
	enum fs_sock_state st = fs_sock_state(s);

	return st == FS_SOCK_FRESH || st == FS_SOCK_OFFLOADED || fs_sock_pending(s);
}

/* Takes M out of the instance's view, keeping it and its kernel entry for
 * the next ADD (see the top of this file). fe->lock held. */
static void fs_member_park(struct fs_epoll *fe, struct fs_ep_member *m)
{
	fs_member_unlink(fe, m);
	m->parked = true;
	__atomic_fetch_add(&fe->parked, 1, __ATOMIC_RELEASE);
}

/* Drops member M (parked or not) and its kernel entry. fe->lock held. */
static void fs_member_drop(struct fs_epoll *fe, struct fs_ep_member *m)
{
	fs_kernel_ctl(fe, EPOLL_CTL_DEL, m, 0, false);
	fs_member_free(fe, m);
}

/* An ADD found parked member M for its fd and socket: takes it back with
 * EVENT, as a new member (true); or, its socket no longer offloaded, drops
 * it (false: the caller adds afresh). fe->lock held. */
static bool fs_member_unpark(struct fs_epoll *fe, struct fs_ep_member *m, const struct epoll_event *event)
{
	if (m->s->closed || fs_member_wanted_reg(m) != FS_EP_REG_CONTROL) {
		fs_member_drop(fe, m);
		return false;
	}
	m->parked = false;
	__atomic_fetch_sub(&fe->parked, 1, __ATOMIC_RELEASE);
	m->events = event->events;
	m->data = event->data;
	m->disarmed = false;
	m->reported_once = false;
	m->out_gen = 0;
	fs_member_link(fe, m);
	FS_STAT_INC(epoll_readds);
	return true;
}

/* Before the kernel gets an epoll_ctl of FD for socket S, which fabsock
 * does not offload (any more): EPFD's member for them must not stand in
 * its way. A parked one (the application took it out) goes with its
 * kernel entry, so that an ADD does not fail EEXIST; one still in the set
 * becomes the application's own kernel entry now, with the events and
 * data the application gave it (EPOLLET and EPOLLONESHOT too), so that
 * the call changes that entry, as it would without fabsock. */
static void fs_epoll_pass_member(int epfd, int fd, struct fs_sock *s)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);
	struct fs_ep_member *m;

	if (!fe || (!__atomic_load_n(&fe->members, __ATOMIC_ACQUIRE) && !__atomic_load_n(&fe->parked, __ATOMIC_ACQUIRE)))
		return;
	fs_lock(&fe->lock);
	m = fs_member_find(fe, fd, s);
	if (m && m->parked)
		fs_member_drop(fe, m);
	else if (m)
		fs_member_fixup(fe, m);
	pthread_mutex_unlock(&fe->lock);
}

void fs_epoll_sock_left(struct fs_sock *s)
{
	struct fs_sock **left = __atomic_load_n(&fs_ep_left, __ATOMIC_ACQUIRE);

	if (!left || s->closed || !__atomic_load_n(&s->ep_members, __ATOMIC_ACQUIRE))
		return;
	for (unsigned i = 0; i < s->n_app_fds; i++) {
		int fd = s->app_fds[i];

		if (fd >= 0 && (size_t)fd < fs_fdt_size)
			__atomic_store_n(&left[fd], s, __ATOMIC_RELEASE);
	}
}

/* The socket noted at FD by fs_epoll_sock_left, or NULL. */
static struct fs_sock *fs_epoll_left_sock(int fd)
{
	struct fs_sock **left = __atomic_load_n(&fs_ep_left, __ATOMIC_ACQUIRE);

	if (!left || fd < 0 || (size_t)fd >= fs_fdt_size)
		return NULL;
	return __atomic_load_n(&left[fd], __ATOMIC_ACQUIRE);
}

bool fs_epoll_left(int fd)
{
	return fs_epoll_left_sock(fd) != NULL;
}

void fs_epoll_left_ctl(int epfd, int fd)
{
	struct fs_sock *s = fs_epoll_left_sock(fd);

	if (s)
		fs_epoll_pass_member(epfd, fd, s);
}

void fs_epoll_left_closing(int fd)
{
	struct fs_sock **left = __atomic_load_n(&fs_ep_left, __ATOMIC_ACQUIRE);
	struct fs_sock *s;

	if (!left || fd < 0 || (size_t)fd >= fs_fdt_size ||
	    !(s = __atomic_exchange_n(&left[fd], NULL, __ATOMIC_ACQ_REL)))
		return;
	fs_epoll_fd_closing(s, fd);
}

/* Adds a member for FD (a fabsock socket S, or a nested epoll instance when
 * S is NULL) to FE and to its kernel set, or takes back a parked one. */
static int fs_member_add(struct fs_epoll *fe, int fd, struct fs_sock *s, const struct epoll_event *event)
{
	struct fs_ep_member *m;
	int ret;

	fs_lock(&fe->lock);
	if (s && (m = fs_member_find(fe, fd, s)) && m->parked && fs_member_unpark(fe, m, event))
		goto added;
	m = fs_member_alloc(fe);
	if (!m) {
		pthread_mutex_unlock(&fe->lock);
		return -ENOMEM;
	}
	m->fd = fd;
	m->s = s;
	m->inner_epfd = s ? -1 : fd;
	m->events = event->events;
	m->data = event->data;
	m->reg = s && fs_member_own_ok(s, m->events) ? FS_EP_REG_APP_OWN : fs_member_wanted_reg(m);
	if (fs_kernel_ctl(fe, EPOLL_CTL_ADD, m, fs_member_kernel_events(m, m->reg), m->reg == FS_EP_REG_APP_OWN)) {
		ret = -errno;
		pthread_mutex_unlock(&fe->lock);
		fs_member_release(m);
		return ret;
	}
	if (s) {
		fs_sock_ref(s);
		__atomic_add_fetch(&s->ep_members, 1, __ATOMIC_ACQ_REL);
		fs_core_epoll_add(s); /* close() must take it out of epoll sets */
	}
	else
		__atomic_add_fetch(&fe->nested, 1, __ATOMIC_RELEASE);
	fs_member_key(m->key, fd, s);
	HASH_ADD(hh, fe->by_key, key, sizeof(m->key), m);
	fs_member_link(fe, m);
added:
	/* the member is linked: a waiter that counted itself a kernel
	 * sleeper before this read sees it or is woken (fs_epoll_wait_bare
	 * counts itself, then reads the members without the lock) */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&fe->kernel_sleepers, __ATOMIC_SEQ_CST) && fe->wake_fd >= 0) {
		/* a thread sleeps in the kernel on this instance for its whole
		 * timeout: it must look at the new member */
		uint64_t one = 1;
		ssize_t n = fs_real.write(fe->wake_fd, &one, sizeof(one));

		(void)n;
	}
	pthread_mutex_unlock(&fe->lock);
	return 0;
}

static bool fs_member_peek(struct fs_ep_member *m, int depth)
{
	uint32_t gen, ev;

	if (m->disarmed)
		return false;
	if (!m->s)
		return depth > 0 && fs_epoll_peek_ready_depth(m->inner_epfd, depth - 1);
	if (fs_sock_state(m->s) != FS_SOCK_OFFLOADED || m->s->pid != fs_self_pid() || !m->s->stream)
		return false;
	ev = fs_stream_poll_state(m->s->stream, &gen) & (m->events | EPOLLERR | EPOLLHUP);
	if (!ev)
		return false;
	return !(m->events & EPOLLET) || !m->reported_once || gen != m->reported_gen;
}

/* Level readiness of EPFD's fabsock members, without consuming edge or
 * one-shot state: what decides whether the instance itself looks readable
 * to poll() or to an outer epoll. DEPTH bounds nesting (and loops). */
bool fs_epoll_peek_ready_depth(int epfd, int depth)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);
	bool ready = false;

	if (!fe)
		return false;
	fs_lock(&fe->lock);
	for (struct fs_ep_member *m = fe->members; m && !ready; m = m->next)
		ready = fs_member_peek(m, depth);
	pthread_mutex_unlock(&fe->lock);
	return ready;
}

bool fs_epoll_peek_ready(int epfd)
{
	fs_engine_progress_locked();
	return fs_epoll_peek_ready_depth(epfd, 4);
}

/* Settles EPFD's negotiating members without waiting: the handshake bytes
 * they consume (a HELLO, an ACK) make the instance look readable to the
 * kernel although nothing is there for the application. */
static void fs_epoll_settle_members(int epfd, int depth)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);
	struct fs_dlist *node, *next;

	if (!fe)
		return;
	fs_lock(&fe->lock);
	/* settled members have nothing to settle */
	for (node = fe->pending.next; node != &fe->pending; node = next) {
		struct fs_ep_member *m = fs_member_of_pnode(node);

		next = node->next;
		if (!m->s) {
			if (depth > 0)
				fs_epoll_settle_members(m->inner_epfd, depth - 1);
			continue;
		}
		if (fs_sock_pending(m->s) && fs_sock_state(m->s) != FS_SOCK_CONNECTING)
			fs_sock_settle(m->s, false, fs_now_ns());
		fs_member_fixup(fe, m);
	}
	pthread_mutex_unlock(&fe->lock);
}

bool fs_epoll_kernel_readable(int epfd)
{
	struct pollfd p = { .fd = epfd, .events = POLLIN };

	fs_epoll_settle_members(epfd, 4);
	return fs_real.poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

/* Is FD an epoll instance? Asked at EPOLL_CTL_ADD of every descriptor that
 * is not fabsock's socket: a pipe, an eventfd, and every TCP socket that
 * settled as TCP before the application added it (an event loop's client
 * connections to a plain server, or sent to TCP by their history, now
 * settle at connect()). An instance is an anonymous inode (no file type in
 * its mode), so one fstat rules out sockets, pipes and files, and only an
 * anonymous inode has its name read (a readlink through /proc per
 * connection was an event loop's dearest call of fabsock's). */
bool fs_epoll_is_instance(int fd)
{
	char path[64], link[64];
	struct stat st;
	ssize_t n;

	/* a TCP connection its history chose, added by an event loop right
	 * after its connect(): a socket, known without a system call */
	if (fs_history_follows(fd))
		return false;
	/* a plain listener's untracked connection (core/plain.h): the same */
	if (fs_plain_marked(fd))
		return false;
	if (fstat(fd, &st) == 0 && (st.st_mode & S_IFMT) != 0)
		return false;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n <= 0)
		return false;
	link[n] = '\0';
	return strcmp(link, "anon_inode:[eventpoll]") == 0;
}

int fs_epoll_ctl_nested(int epfd, int op, int fd, struct epoll_event *event)
{
	struct fs_epoll *fe, *inner;
	struct fs_ep_member *m;
	int ret = 0;

	if (op != EPOLL_CTL_ADD) {
		/* FD may be any descriptor (a MOD or DEL is not asked whether
		 * it is an instance): a member exists only for an instance that
		 * has a record already, so make none (a record and its eventfd
		 * for every pipe or kernel socket the application modifies) */
		fe = fs_epoll_peek(epfd);
		/* no nested instance in it: nothing to find, no lock (wrk's
		 * every connection: five MOD or DEL calls on plain sockets in
		 * an instance whose first connections were offloaded). A
		 * nested member added meanwhile by another thread is one the
		 * application has not told of yet: its own ADD's, ordered
		 * after this call by the application as without fabsock. */
		if (!fe || !__atomic_load_n(&fe->nested, __ATOMIC_ACQUIRE))
			return FS_PASS;
		fs_lock(&fe->lock);
		m = fs_member_find(fe, fd, NULL);
		if (!m) {
			pthread_mutex_unlock(&fe->lock);
			return FS_PASS;
		}
		if (op == EPOLL_CTL_DEL) {
			if (fs_kernel_ctl(fe, EPOLL_CTL_DEL, m, 0, false))
				ret = -errno;
			fs_member_free(fe, m);
		} else if (!event) {
			ret = -EFAULT;
		} else {
			m->events = event->events;
			m->data = event->data;
			m->disarmed = false;
			if (fs_kernel_ctl(fe, EPOLL_CTL_MOD, m, fs_member_kernel_events(m, m->reg), false))
				ret = -errno;
		}
		pthread_mutex_unlock(&fe->lock);
		return ret;
	}
	if (!event)
		return -EFAULT;
	inner = fs_epoll_get_or_make(fd);
	fe = fs_epoll_get_or_make(epfd);
	if (!fe || !inner)
		return FS_PASS;
	return fs_member_add(fe, fd, NULL, event);
}

int fs_epoll_ctl(int epfd, int op, int fd, struct epoll_event *event, struct fs_sock *s)
{
	struct fs_epoll *fe;
	struct fs_ep_member *m, *found = NULL;
	int ret = 0;

	if (op == EPOLL_CTL_ADD) {
		if (!fs_epoll_wants(s)) {
			fs_epoll_pass_member(epfd, fd, s);
			return FS_PASS;
		}
		if (!event)
			return -EFAULT;
		fe = fs_epoll_get_or_make(epfd);
		if (!fe)
			return FS_PASS;
		return fs_member_add(fe, fd, s, event);
	}

	fe = fs_epoll_peek(epfd);
	if (!fe)
		return FS_PASS;
	fs_lock(&fe->lock);
	/* at most one member is this open socket: the kernel refuses a
	 * second EPOLL_CTL_ADD of one fd */
	m = fs_member_find(fe, fd, s);
	if (m && !s->closed)
		found = m;
	if (!found) {
		pthread_mutex_unlock(&fe->lock);
		return FS_PASS; /* the kernel answers (ENOENT, or a kernel entry) */
	}
	m = found;
	if (m->parked && (op == EPOLL_CTL_DEL || op == EPOLL_CTL_MOD)) {
		ret = -ENOENT; /* the application took it out already */
	} else if (op == EPOLL_CTL_DEL) {
		if (m->reg == FS_EP_REG_CONTROL && fs_sock_state(s) == FS_SOCK_OFFLOADED) {
			fs_member_park(fe, m);
		} else {
			if (fs_kernel_ctl(fe, EPOLL_CTL_DEL, m, 0, false))
				ret = -errno;
			fs_member_free(fe, m);
		}
	} else if (op == EPOLL_CTL_MOD) {
		if (!event) {
			ret = -EFAULT;
		} else {
			m->events = event->events;
			m->data = event->data;
			m->disarmed = false;
			m->reported_once = false;
			if (m->watch.stream)
				fs_ready_push(fe, m); /* look at it with its new events */
			/* else it is pending: every look sees it */
			/* an offloaded member's kernel entry watches the control
			 * connection only, whatever the application asks for: it
			 * does not change, so spare the system call */
			if (m->reg == FS_EP_REG_APP_OWN && !fs_member_own_ok(s, m->events))
				m->reg = FS_EP_REG_APP_EVENTS; /* under our tag from now on */
			if (m->reg != FS_EP_REG_CONTROL &&
			    fs_kernel_ctl(fe, EPOLL_CTL_MOD, m, fs_member_kernel_events(m, m->reg),
					  m->reg == FS_EP_REG_APP_OWN))
				ret = -errno;
		}
	} else {
		ret = -EINVAL;
	}
	pthread_mutex_unlock(&fe->lock);
	return ret;
}
