/* SPDX-License-Identifier: MIT */
/*
 * epoll over offloaded sockets. An offloaded socket's kernel fd never
 * becomes readable (its data comes over the fabric) and is always
 * writable, so the kernel cannot answer for it. For every epoll instance
 * that holds fabsock sockets, fabsock keeps a member record per such
 * socket: the application's events and epoll_data, and the ONESHOT and
 * edge-triggered state. The socket's kernel fd stays in the kernel set,
 * tagged with the member (not the application's data):
 *  - while the socket is still negotiating (or not yet connected), with
 *    the application's events: the kernel's answers are right for it then,
 *    and the bytes that arrive (a HELLO, an ACK, plain data) are what
 *    settles it;
 *  - once offloaded, with EPOLLIN | EPOLLRDHUP edge-triggered only, so the
 *    control connection's EOF (the peer closed or died) still wakes us;
 *  - once left to the kernel, with the application's events and data, as
 *    if fabsock had never seen it; the member goes away.
 * Those moves happen lazily, at the next epoll_wait.
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
 * epoll_wait: readiness of offloaded members comes from their streams;
 * kernel events tagged with a member are translated (and may settle a
 * negotiating socket); the rest are the application's own. Like a blocking
 * receive it polls for FABSOCK_SPIN_US, then sleeps in the real epoll_wait
 * in slices of at most FABSOCK_SLEEP_MAX_US, looking at the streams between
 * slices.
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
 * Lock order: fs_epoll.lock, then fs_sock.lock, then the engine lock.
 */
#include "core/epoll.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <uthash.h>

#include "config/log.h"
#include "config/params.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/sock.h"
#include "core/stats.h"
#include "preload/real.h"

#define FS_EP_BATCH 64

enum fs_ep_reg { FS_EP_REG_APP_EVENTS = 1, FS_EP_REG_CONTROL = 2 };

struct fs_ep_member {
	/* index, gen and fe come first: fs_member_alloc clears what follows */
	uint32_t index;                   /* its slot (fs_ep_slot) */
	uint32_t gen;                     /* bumped at every release (atomic) */
	struct fs_epoll *fe;              /* owner while in use (atomic), NULL when free */
	struct fs_ep_member *free_next;   /* fs_ep_free */
	struct fs_ep_member *next, *prev; /* fs_epoll.members */
	int fd;
	struct fs_sock *s; /* a reference; NULL for a nested epoll instance */
	int inner_epfd;    /* nested epoll instance (s == NULL): its fd */
	uint32_t events;   /* the application's, with EPOLLET/EPOLLONESHOT */
	epoll_data_t data; /* the application's */
	bool disarmed;     /* EPOLLONESHOT fired; EPOLL_CTL_MOD re-arms */
	bool parked;       /* taken out by the application, kept for its next ADD */
	uint32_t reported_gen;
	bool reported_once;
	enum fs_ep_reg reg;
	/* Where this member's event went in the output being built (so a
	 * kernel event for it merges into that entry, not a second one). */
	uint64_t out_gen;
	int out_index;
	/* An offloaded member watches its stream (engine lock) and is put on
	 * its instance's ready list (fs_epoll.rlock) when the stream changes,
	 * or after it was reported level-triggered. */
	struct fs_stream_watch watch;
	struct fs_ep_member *rnext, *rprev;
	bool queued;
	/* fs_epoll.by_key: found by (fd, socket) without a walk (epoll_ctl,
	 * close: a program with thousands of members calls them per request) */
	uint64_t key[2];
	UT_hash_handle hh;
};

struct fs_epoll {
	pthread_mutex_t lock;
	int epfd;
	struct fs_ep_member *members;
	struct fs_ep_member *by_key; /* the same members and the parked ones, by (fd, socket) */
	unsigned parked;             /* how many are parked (atomic: read without the lock) */
	uint64_t out_gen; /* bumped for every output being built */
	int wake_fd;      /* eventfd in the kernel set (FS_EP_TAG_WAKE), or -1 */
	unsigned kernel_sleepers; /* threads waiting on it in the kernel for long */
	/* The ready list: offloaded members to look at (their stream changed,
	 * or they were reported level-triggered), oldest first. rlock is a
	 * leaf: taken under fe->lock, and under the engine lock by
	 * fs_stream_changed. */
	pthread_mutex_t rlock;
	struct fs_ep_member *rhead, *rtail;
	/* When only the ready list is looked at (fs_epoll_scan_ready): no
	 * member was added since the last full scan, every member then was an
	 * offloaded one watching its stream, the process is the one that made
	 * them, and that scan is recent (FS_EP_FULL_EVERY_NS: a change no
	 * stream told of, a peer's grace running out, is found that late at
	 * most). A wait never sleeps without a full scan first. */
	bool need_full;
	unsigned unsettled;
	uint64_t full_ns;
	pid_t full_pid;
};

#define FS_EP_FULL_EVERY_NS 10000000ull

/* ---- member slots and their tags ---------------------------------------- */

#define FS_EP_TAG_MARK (0xfab5ull << 48)
#define FS_EP_TAG_MARK_MASK (0xffffull << 48)
#define FS_EP_TAG_WAKE (FS_EP_TAG_MARK | 0xffffffffull)
#define FS_EP_CHUNK 1024u
#define FS_EP_CHUNKS 4096u /* 4 Mi members */

static struct fs_ep_member *fs_ep_chunks[FS_EP_CHUNKS]; /* published once, never freed */
static uint32_t fs_ep_slots_made;
static struct fs_ep_member *fs_ep_free;
static pthread_mutex_t fs_ep_slot_lock = PTHREAD_MUTEX_INITIALIZER;

static struct fs_ep_member *fs_member_alloc(struct fs_epoll *fe)
{
	struct fs_ep_member *m;

	pthread_mutex_lock(&fs_ep_slot_lock);
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
	pthread_mutex_lock(&fs_ep_slot_lock);
	m->free_next = fs_ep_free;
	fs_ep_free = m;
	pthread_mutex_unlock(&fs_ep_slot_lock);
}

static uint64_t fs_member_tag(const struct fs_ep_member *m)
{
	return FS_EP_TAG_MARK | ((uint64_t)(__atomic_load_n(&m->gen, __ATOMIC_RELAXED) & 0xffffu) << 32) | m->index;
}

/* The member of FE that TAG names, or NULL: not a tag of ours (*OURS
 * false: the application's own data), or a member since gone. */
static struct fs_ep_member *fs_member_by_tag(struct fs_epoll *fe, uint64_t tag, bool *ours)
{
	uint32_t index = (uint32_t)tag, chunk = index / FS_EP_CHUNK;
	struct fs_ep_member *m, *c;

	*ours = (tag & FS_EP_TAG_MARK_MASK) == FS_EP_TAG_MARK;
	if (!*ours || tag == FS_EP_TAG_WAKE || chunk >= FS_EP_CHUNKS ||
	    !(c = __atomic_load_n(&fs_ep_chunks[chunk], __ATOMIC_ACQUIRE)))
		return NULL;
	m = &c[index % FS_EP_CHUNK];
	if (__atomic_load_n(&m->fe, __ATOMIC_ACQUIRE) != fe ||
	    (__atomic_load_n(&m->gen, __ATOMIC_ACQUIRE) & 0xffffu) != ((tag >> 32) & 0xffffu))
		return NULL;
	return m;
}

static struct fs_epoll **fs_ept;
/* Per epoll fd: threads in fs_epoll_wait_plain on it (atomic counters). */
static uint32_t *fs_ep_plain;
static int fs_ept_hi = -1; /* highest epfd with an instance record */
static bool fs_have_pwait2 = true; /* kernel 5.11+; else millisecond slices */
static pthread_mutex_t fs_ept_lock = PTHREAD_MUTEX_INITIALIZER;

static struct fs_epoll *fs_epoll_peek(int epfd)
{
	/* the table is made once, by the first epoll_ctl, while other threads
	 * may already be looking */
	struct fs_epoll **table = __atomic_load_n(&fs_ept, __ATOMIC_ACQUIRE);

	if (!table || epfd < 0 || (size_t)epfd >= fs_fdt_size)
		return NULL;
	return __atomic_load_n(&table[epfd], __ATOMIC_ACQUIRE);
}

static struct fs_epoll *fs_epoll_get_or_make(int epfd)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);

	if (fe || epfd < 0 || (size_t)epfd >= fs_fdt_size)
		return fe;
	pthread_mutex_lock(&fs_ept_lock);
	if (!fs_ept) {
		void *map = mmap(NULL, fs_fdt_size * sizeof(*fs_ept), PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (map != MAP_FAILED)
			__atomic_store_n(&fs_ept, map, __ATOMIC_RELEASE);
	}
	if (fs_ept && !(fe = fs_ept[epfd])) {
		fe = calloc(1, sizeof(*fe));
		if (fe) {
			struct epoll_event wake = { .events = EPOLLIN, .data.u64 = FS_EP_TAG_WAKE };

			pthread_mutex_init(&fe->lock, NULL);
			pthread_mutex_init(&fe->rlock, NULL);
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

static void fs_ready_unlink_locked(struct fs_epoll *fe, struct fs_ep_member *m)
{
	if (!m->queued)
		return;
	if (m->rprev)
		m->rprev->rnext = m->rnext;
	else
		fe->rhead = m->rnext;
	if (m->rnext)
		m->rnext->rprev = m->rprev;
	else
		fe->rtail = m->rprev;
	m->rnext = m->rprev = NULL;
	m->queued = false;
}

static void fs_ready_push(struct fs_epoll *fe, struct fs_ep_member *m)
{
	pthread_mutex_lock(&fe->rlock);
	if (!m->queued) {
		m->queued = true;
		m->rnext = NULL;
		m->rprev = fe->rtail;
		if (fe->rtail)
			fe->rtail->rnext = m;
		else
			fe->rhead = m;
		fe->rtail = m;
	}
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
	pthread_mutex_unlock(&e->lock);
	if (st)
		fs_ready_push(fe, m);
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
			pthread_mutex_unlock(&e->lock);
		}
	}
	pthread_mutex_lock(&fe->rlock);
	fs_ready_unlink_locked(fe, m);
	pthread_mutex_unlock(&fe->rlock);
	if (m->prev)
		m->prev->next = m->next;
	else /* fe->members is also read without the lock (has_members) */
		__atomic_store_n(&fe->members, m->next, __ATOMIC_RELEASE);
	if (m->next)
		m->next->prev = m->prev;
	m->next = m->prev = NULL;
}

/* Puts M (not on the list) at the head of FE's member list. fe->lock held. */
static void fs_member_link(struct fs_epoll *fe, struct fs_ep_member *m)
{
	m->next = fe->members;
	m->prev = NULL;
	if (fe->members)
		fe->members->prev = m;
	__atomic_store_n(&fe->members, m, __ATOMIC_RELEASE);
}

static void fs_member_free(struct fs_epoll *fe, struct fs_ep_member *m)
{
	HASH_DELETE(hh, fe->by_key, m);
	if (m->parked)
		__atomic_fetch_sub(&fe->parked, 1, __ATOMIC_RELEASE);
	else
		fs_member_unlink(fe, m);
	if (m->s)
		fs_sock_put(m->s);
	fs_member_release(m);
}

/* The application closed EPFD: forget its members. */
void fs_epoll_closed(int epfd)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);
	struct fs_ep_member *m, *tmp;

	if (!fe)
		return;
	pthread_mutex_lock(&fs_ept_lock);
	__atomic_store_n(&fs_ept[epfd], NULL, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&fs_ept_lock);
	/* Another thread may still be inside epoll_wait on it; leak the shell
	 * (a few bytes per closed epoll instance) rather than free it under it. */
	pthread_mutex_lock(&fe->lock);
	HASH_ITER(hh, fe->by_key, m, tmp)
		fs_member_free(fe, m); /* every member, parked ones too */
	if (fe->wake_fd >= 0) {
		/* under the lock: a waiter reads it only under the lock */
		fs_internal_fd_close(fe->wake_fd);
		fe->wake_fd = -1;
	}
	pthread_mutex_unlock(&fe->lock);
}

static void fs_member_drop(struct fs_epoll *fe, struct fs_ep_member *m);

/* The application is about to close FD, one of S's fds. Takes it out of
 * every epoll instance now, while the fd still names the socket: the
 * kernel would keep its entry (tagged with a member of ours) as long as
 * the socket stays open, and fabsock keeps it open after close() (a
 * duplicate fd, or the stream's control channel until the FIN is out). */
void fs_epoll_fd_closing(struct fs_sock *s, int fd)
{
	int hi = __atomic_load_n(&fs_ept_hi, __ATOMIC_ACQUIRE);

	for (int epfd = 0; epfd <= hi; epfd++) {
		struct fs_epoll *fe = fs_epoll_peek(epfd);
		struct fs_ep_member *m;

		if (!fe || (!__atomic_load_n(&fe->members, __ATOMIC_ACQUIRE) &&
			    !__atomic_load_n(&fe->parked, __ATOMIC_ACQUIRE)))
			continue;
		pthread_mutex_lock(&fe->lock);
		while ((m = fs_member_find(fe, fd, s)))
			fs_member_drop(fe, m);
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
	if (!m->s)
		return FS_EP_REG_APP_EVENTS; /* nested instance: the kernel's answer counts too */
	return fs_sock_state(m->s) == FS_SOCK_OFFLOADED ? FS_EP_REG_CONTROL : FS_EP_REG_APP_EVENTS;
}

static uint32_t fs_member_kernel_events(struct fs_ep_member *m, enum fs_ep_reg reg)
{
	if (reg == FS_EP_REG_CONTROL)
		return EPOLLIN | EPOLLRDHUP | EPOLLET;
	/* ONESHOT stays ours: the kernel must keep reporting while we decide;
	 * EXCLUSIVE entries cannot be modified, which state changes need */
	return m->events & ~(uint32_t)(EPOLLONESHOT | EPOLLEXCLUSIVE);
}

/* Brings the kernel registration in line with the socket's state; drops
 * members that were closed or left to the kernel. fe->lock held. Returns
 * false if M was freed. */
static bool fs_member_fixup(struct fs_epoll *fe, struct fs_ep_member *m)
{
	enum fs_sock_state st;
	enum fs_ep_reg want;

	if (!m->s) {
		if (!fs_epoll_peek(m->inner_epfd)) {
			/* the inner instance was closed; the kernel dropped it */
			fs_member_free(fe, m);
			return false;
		}
		return true;
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
	if (m->s->closed || (st != FS_SOCK_KERNEL && !fs_sock_has_fd(m->s, m->fd))) {
		fs_member_free(fe, m); /* the kernel dropped the closed fd itself */
		return false;
	}
	if (st == FS_SOCK_KERNEL || st == FS_SOCK_SERVER_PLAIN || st == FS_SOCK_LISTENING) {
		/* plain kernel socket from now on: the application's own entry */
		fs_kernel_ctl(fe, EPOLL_CTL_MOD, m, m->disarmed ? 0 : m->events, true);
		fs_member_free(fe, m);
		return false;
	}
	want = fs_member_wanted_reg(m);
	if (want != m->reg) {
		fs_kernel_ctl(fe, EPOLL_CTL_MOD, m, fs_member_kernel_events(m, want), false);
		m->reg = want;
	}
	fs_member_watch(fe, m);
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

/* An ADD of a socket fabsock leaves to the kernel: a parked member of the
 * same fd and socket must not stand in the kernel's way (EEXIST). */
static void fs_epoll_unpark_kernel(int epfd, int fd, struct fs_sock *s)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);
	struct fs_ep_member *m;

	if (!fe || !__atomic_load_n(&fe->parked, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&fe->lock);
	m = fs_member_find(fe, fd, s);
	if (m && m->parked)
		fs_member_drop(fe, m);
	pthread_mutex_unlock(&fe->lock);
}

/* Adds a member for FD (a fabsock socket S, or a nested epoll instance when
 * S is NULL) to FE and to its kernel set, or takes back a parked one. */
static int fs_member_add(struct fs_epoll *fe, int fd, struct fs_sock *s, const struct epoll_event *event)
{
	struct fs_ep_member *m;
	int ret;

	pthread_mutex_lock(&fe->lock);
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
	m->reg = fs_member_wanted_reg(m);
	if (fs_kernel_ctl(fe, EPOLL_CTL_ADD, m, fs_member_kernel_events(m, m->reg), false)) {
		ret = -errno;
		pthread_mutex_unlock(&fe->lock);
		fs_member_release(m);
		return ret;
	}
	if (s) {
		fs_sock_ref(s);
		fs_core_epoll_add(s); /* close() must take it out of epoll sets */
	}
	fs_member_key(m->key, fd, s);
	HASH_ADD(hh, fe->by_key, key, sizeof(m->key), m);
	fs_member_link(fe, m);
added:
	fe->need_full = true; /* the next look fixes it up, and watches its stream */
	if (fe->kernel_sleepers && fe->wake_fd >= 0) {
		/* a thread sleeps in the kernel on this instance for its whole
		 * timeout: it must look at the new member */
		uint64_t one = 1;
		ssize_t n = fs_real.write(fe->wake_fd, &one, sizeof(one));

		(void)n;
	}
	pthread_mutex_unlock(&fe->lock);
	return 0;
}

/* Level readiness of EPFD's fabsock members, without consuming edge or
 * one-shot state: what decides whether the instance itself looks readable
 * to poll() or to an outer epoll. DEPTH bounds nesting (and loops). */
static bool fs_epoll_peek_ready_depth(int epfd, int depth);

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

static bool fs_epoll_peek_ready_depth(int epfd, int depth)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);
	bool ready = false;

	if (!fe)
		return false;
	pthread_mutex_lock(&fe->lock);
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
	struct fs_ep_member *m, *next;

	if (!fe)
		return;
	pthread_mutex_lock(&fe->lock);
	for (m = fe->members; m; m = next) {
		next = m->next;
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

/* Is FD an epoll instance? Asked only at EPOLL_CTL_ADD of a non-socket. */
bool fs_epoll_is_instance(int fd)
{
	char path[64], link[64];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n <= 0)
		return false;
	link[n] = '\0';
	return strcmp(link, "anon_inode:[eventpoll]") == 0;
}

int fs_epoll_ctl_nested(int epfd, int op, int fd, struct epoll_event *event)
{
	struct fs_epoll *fe, *inner = fs_epoll_get_or_make(fd);
	struct fs_ep_member *m;
	int ret = 0;

	if (op != EPOLL_CTL_ADD) {
		fe = fs_epoll_peek(epfd);
		if (!fe)
			return FS_PASS;
		pthread_mutex_lock(&fe->lock);
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
			fs_epoll_unpark_kernel(epfd, fd, s);
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
	pthread_mutex_lock(&fe->lock);
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
			else
				fe->need_full = true;
			/* an offloaded member's kernel entry watches the control
			 * connection only, whatever the application asks for: it
			 * does not change, so spare the system call */
			if (m->reg != FS_EP_REG_CONTROL &&
			    fs_kernel_ctl(fe, EPOLL_CTL_MOD, m, fs_member_kernel_events(m, m->reg), false))
				ret = -errno;
		}
	} else {
		ret = -EINVAL;
	}
	pthread_mutex_unlock(&fe->lock);
	return ret;
}

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
	if (m->disarmed || m->s->pid != fs_self_pid() || !m->s->stream)
		return 0;
	ev = engine_locked ? fs_stream_events_locked(m->s->stream, &gen) : fs_stream_poll_state(m->s->stream, &gen);
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
		if (s->stream && s->pid == fs_self_pid())
			fs_stream_note_ctl(s->stream, s->fd);
		return m->parked ? 0 : fs_member_ready(m);
	}
	/* Negotiating: what arrived may settle it (a HELLO, an ACK, data, the
	 * connection coming up). Writability alone settles nothing: the
	 * application has not written yet. */
	switch (fs_sock_state(s)) {
	case FS_SOCK_SERVER_PENDING:
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
 * or one-shot one waits for its stream's next change. */
static void fs_member_requeue(struct fs_epoll *fe, struct fs_ep_member *m, uint32_t ev)
{
	if (ev && !(m->events & EPOLLET) && !m->disarmed)
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

/* One pass over the members; fills OUT, the output GEN. fe->lock held. The
 * completion queue runs once for the whole pass, and the offloaded members
 * are looked at under one engine lock, not one each: with many members
 * those were most of the cost of an epoll_wait. Negotiating and nested
 * members are handled first, without the engine lock (settling one takes
 * it). */
static int fs_epoll_scan(struct fs_epoll *fe, struct epoll_event *out, int max, uint64_t gen)
{
	struct fs_engine *e = fs_engine_peek();
	struct fs_ep_member *m, *next;
	bool any_offloaded = false;
	unsigned unsettled = 0;
	const void *drained = NULL;
	int n = 0;

	if (fe->members)
		fs_engine_progress_locked();

	for (m = fe->members; m && n < max; m = next) {
		uint32_t ev;

		next = m->next;
		if (!fs_member_fixup(fe, m))
			continue;
		if (!m->s || fs_sock_state(m->s) != FS_SOCK_OFFLOADED || !m->watch.stream)
			unsettled++;
		if (!m->s) {
			ev = fs_member_ready(m);
			if (ev) {
				out[n].events = ev;
				out[n].data = m->data;
				fs_member_reported(m, gen, n);
				n++;
			}
			continue;
		}
		if (fs_sock_state(m->s) == FS_SOCK_CLIENT_PENDING) {
			/* the service thread usually got there first; if not, try
			 * once without waiting */
			fs_sock_settle(m->s, true, fs_now_ns());
			if (!fs_member_fixup(fe, m))
				continue;
		} else if (fs_sock_state(m->s) == FS_SOCK_SERVER_PENDING) {
			/* its client waits for the probe's answer, which a busy
			 * host's service thread may give too late: once per
			 * listener and scan, this thread answers */
			drained = fs_sock_drain_probes(m->s, drained);
		}
		if (fs_sock_state(m->s) == FS_SOCK_OFFLOADED)
			any_offloaded = true;
	}
	/* a full pass (the output did not fill up first) says whether the
	 * ready list alone will do next time */
	fe->need_full = m != NULL;
	fe->unsettled = unsettled;
	fe->full_ns = fs_now_ns();
	fe->full_pid = fs_self_pid();
	if (!any_offloaded || !e)
		return n;
	pthread_mutex_lock(&e->lock);
	for (m = fe->members; m; m = m->next) {
		if (!m->s || fs_sock_state(m->s) != FS_SOCK_OFFLOADED)
			continue;
		if (n >= max) {
			/* no room to look: look next time */
			fs_ready_push(fe, m);
			continue;
		}
		n = fs_member_look(fe, m, out, n, gen);
	}
	pthread_mutex_unlock(&e->lock);
	return n;
}

/* The ready list alone (fs_epoll.need_full and what goes with it): the
 * members whose streams changed since they were looked at, and those
 * reported level-triggered last time. fe->lock held. The list is taken
 * whole and looked at in batches (one engine lock each), up to MAX events;
 * what is left goes back to its front. A member is off every list while it
 * is looked at, so a change of its stream meanwhile queues it again. */
static int fs_epoll_scan_ready(struct fs_epoll *fe, struct epoll_event *out, int max, uint64_t gen)
{
	struct fs_engine *e = fs_engine_peek();
	struct fs_ep_member *batch[FS_EP_BATCH];
	struct fs_ep_member *head, *tail;
	int n = 0;

	if (!e)
		return 0;
	fs_engine_progress_locked();
	pthread_mutex_lock(&fe->rlock);
	head = fe->rhead;
	tail = fe->rtail;
	fe->rhead = fe->rtail = NULL;
	pthread_mutex_unlock(&fe->rlock);
	while (head && n < max) {
		int nb = 0;

		pthread_mutex_lock(&fe->rlock);
		while (head && nb < FS_EP_BATCH && nb < max - n) {
			struct fs_ep_member *m = head;

			head = m->rnext;
			if (head)
				head->rprev = NULL;
			m->rnext = m->rprev = NULL;
			m->queued = false;
			batch[nb++] = m;
		}
		pthread_mutex_unlock(&fe->rlock);
		for (int i = 0; i < nb; i++) {
			/* closed, forked, or handed back: a full scan sorts it out */
			if (!fs_member_fixup(fe, batch[i]) || !batch[i]->s ||
			    fs_sock_state(batch[i]->s) != FS_SOCK_OFFLOADED) {
				batch[i] = NULL;
				fe->need_full = true;
			}
		}
		pthread_mutex_lock(&e->lock);
		for (int i = 0; i < nb; i++) {
			struct fs_ep_member *m = batch[i];

			if (m)
				n = fs_member_look(fe, m, out, n, gen);
		}
		pthread_mutex_unlock(&e->lock);
	}
	if (head) {
		/* no room for them: first in line next time */
		pthread_mutex_lock(&fe->rlock);
		tail->rnext = fe->rhead;
		if (fe->rhead)
			fe->rhead->rprev = tail;
		else
			fe->rtail = tail;
		fe->rhead = head;
		pthread_mutex_unlock(&fe->rlock);
	}
	return n;
}

/* Whether FE's next look may be at its ready list alone. fe->lock held. */
static bool fs_epoll_ready_list_will_do(const struct fs_epoll *fe, uint64_t now)
{
	return !fe->need_full && !fe->unsettled && now - fe->full_ns < FS_EP_FULL_EVERY_NS &&
	       fe->full_pid == fs_self_pid();
}

/* Collects kernel events for EPFD into KBUF (room for K): the wait the
 * caller decided (WAIT_US 0: none; LONG: the whole time until DEADLINE_NS,
 * 0 = none). Returns the count or -errno. */
static int fs_epoll_kernel_wait(int epfd, struct epoll_event *kbuf, int k, uint64_t wait_us, bool longwait,
				uint64_t deadline_ns, const sigset_t *sigmask)
{
	int ret, ms;

	if (longwait) {
		uint64_t now = fs_now_ns();

		ms = !deadline_ns ? -1 : deadline_ns > now ? (int)((deadline_ns - now + 999999) / 1000000ull) : 0;
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
static int fs_epoll_waited(int n, uint64_t late_at)
{
	fs_engine_wait_done(fs_engine_peek(), fs_now_ns() >= late_at, n);
	return n;
}

int fs_epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout_ms, const sigset_t *sigmask)
{
	struct fs_epoll *fe = fs_epoll_peek(epfd);
	uint64_t start = fs_now_ns();
	uint64_t deadline = timeout_ms >= 0 ? start + (uint64_t)timeout_ms * 1000000ull : 0;
	uint64_t late_at = fs_spin_end(start), spin_end = fs_wait_spin_end(fs_engine_peek(), start);
	uint64_t slice_us = 10;
	unsigned step = 0;
	struct epoll_event kbuf[FS_EP_BATCH];

	if (maxevents <= 0)
		return -EINVAL;
	if (!fe) {
		/* no record (closed meanwhile): the plain call will do */
		int k = sigmask ? fs_real.epoll_pwait(epfd, events, maxevents, timeout_ms, sigmask)
				: fs_real.epoll_wait(epfd, events, maxevents, timeout_ms);

		return k < 0 ? -errno : k;
	}
	for (;;) {
		int n, k;
		uint64_t now, wait_us = 0, gen;
		bool longwait = false, full;

		pthread_mutex_lock(&fe->lock);
		gen = ++fe->out_gen;
		now = fs_now_ns();
		full = !fs_epoll_ready_list_will_do(fe, now);
		n = full ? fs_epoll_scan(fe, events, maxevents, gen) : fs_epoll_scan_ready(fe, events, maxevents, gen);
		if (!n && !full && now >= spin_end) {
			/* Never go to sleep on the ready list's word alone: a
			 * member's first report may not come with a change of its
			 * stream, and a sleep can last the caller's whole timeout
			 * (a proxy under ASan waited 60 s for an upstream answer
			 * that had arrived). While busy, the full scan every
			 * FS_EP_FULL_EVERY_NS bounds what the list misses. */
			full = true;
			n = fs_epoll_scan(fe, events, maxevents, gen);
		}
		pthread_mutex_unlock(&fe->lock);
		now = fs_now_ns();
		if (!n && (!deadline || now < deadline)) {
			if (!fs_epoll_has_members(epfd)) {
				/* Nothing of ours to poll: the whole time in the kernel,
				 * counted as a kernel sleeper, so that a member another
				 * thread adds rings the instance's wake fd. */
				longwait = true;
			} else if (now >= spin_end) {
				uint64_t left_us = deadline ? (deadline - now) / 1000 : slice_us;
				uint64_t cap = fs_wait_slice_cap_us(now - start);

				wait_us = slice_us < left_us ? slice_us : left_us;
				if (!wait_us)
					wait_us = 1;
				slice_us = slice_us * 2 < cap ? slice_us * 2 : cap;
			}
		}
		k = maxevents - n < FS_EP_BATCH ? maxevents - n : FS_EP_BATCH;
		if (!k)
			return fs_epoll_waited(n, late_at); /* full from our members alone (a kernel call with no room fails EINVAL) */
		if (wait_us) {
			/* deeply idle: sleep on the epoll fd itself and the engine's
			 * deep fd, then collect without waiting */
			struct pollfd dp[3] = { { .fd = epfd, .events = POLLIN } };
			bool slept;
			int r = fs_engine_deep_sleep(dp, 1, deadline, sigmask, &slept);

			if (slept) {
				if (r < 0)
					return r; /* EINTR: a signal, as epoll_wait would say */
				wait_us = 0;
			} else if (r == -EAGAIN) {
				wait_us = 0; /* just armed: look again, then sleep */
			}
		}
		if (longwait) {
			pthread_mutex_lock(&fe->lock);
			fe->kernel_sleepers++;
			pthread_mutex_unlock(&fe->lock);
			/* a member added before the count went up was seen by no one */
			k = fs_epoll_has_members(epfd) ? 0
						       : fs_epoll_kernel_wait(epfd, kbuf, k, 0, true, deadline, sigmask);
			pthread_mutex_lock(&fe->lock);
			fe->kernel_sleepers--;
			pthread_mutex_unlock(&fe->lock);
		} else {
			k = fs_epoll_kernel_wait(epfd, kbuf, k, n ? 0 : wait_us, false, deadline, sigmask);
		}
		if (k < 0)
			return n ? n : k;
		pthread_mutex_lock(&fe->lock);
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
		if (n)
			return fs_epoll_waited(n, late_at);
		if ((deadline && fs_now_ns() >= deadline) || timeout_ms == 0)
			return 0;
		if (!wait_us && !longwait)
			fs_spin_relax(&step);
	}
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
	uint64_t start = fs_now_ns();
	uint32_t *plain = __atomic_load_n(&fs_ep_plain, __ATOMIC_ACQUIRE);
	int k, kept;

	if (!plain && epfd >= 0 && (size_t)epfd < fs_fdt_size) {
		pthread_mutex_lock(&fs_ept_lock);
		if (!fs_ep_plain) {
			void *map = mmap(NULL, fs_fdt_size * sizeof(*fs_ep_plain), PROT_READ | PROT_WRITE,
					 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

			if (map != MAP_FAILED)
				__atomic_store_n(&fs_ep_plain, map, __ATOMIC_RELEASE);
		}
		plain = fs_ep_plain;
		pthread_mutex_unlock(&fs_ept_lock);
	}
	if (plain && epfd >= 0 && (size_t)epfd < fs_fdt_size)
		__atomic_fetch_add(&plain[epfd], 1, __ATOMIC_ACQ_REL);
	else
		plain = NULL;
	/* a record made after the count went up wakes us; one made before it
	 * is seen here */
	if (fs_epoll_known(epfd))
		k = 0;
	else
		k = sigmask ? fs_real.epoll_pwait(epfd, events, maxevents, timeout_ms, sigmask)
			    : fs_real.epoll_wait(epfd, events, maxevents, timeout_ms);
	if (k < 0)
		k = -errno;
	if (plain)
		__atomic_fetch_sub(&plain[epfd], 1, __ATOMIC_ACQ_REL);
	if (k < 0 || !fs_epoll_known(epfd))
		return k;

	/* Another thread gave the instance its first fabsock member while this
	 * one waited: drop what is ours and wait the rest fabsock's way. */
	kept = fs_epoll_drop_ours(events, k);
	if (kept || timeout_ms == 0)
		return kept;
	if (timeout_ms > 0) {
		uint64_t spent_ms = (fs_now_ns() - start) / 1000000ull;

		timeout_ms = spent_ms >= (uint64_t)timeout_ms ? 0 : timeout_ms - (int)spent_ms;
	}
	return fs_epoll_wait(epfd, events, maxevents, timeout_ms, sigmask);
}
