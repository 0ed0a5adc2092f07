/* SPDX-License-Identifier: MIT */
/*
 * The UDP capability probe (both sides), the shared probe-record table and
 * the service thread. See probe.h for the protocol and the record state
 * machine.
 */
#include "core/probe.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <dirent.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <stdio.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "config/rules.h"
#include "core/bell.h"
#include "core/engine.h"
#include "core/guard.h"
#include "core/handback.h"
#include "core/sigs.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/udp.h"
#include "core/wire.h"
#include "preload/real.h"

/* Records of connections in negotiation, and of those settled in the last
 * FS_PROBE_SETTLED_TTL_NS: room for a burst of 16,384 connections to one
 * listener (a table is 640 KiB of address space, resident where used). */
#define FS_PROBE_TABLE_SLOTS 16384u
/* A YES waits for the server to read the connection's HELLO, however long
 * the connection sits in the accept backlog. */
#define FS_PROBE_REC_TTL_NS (120ull * 1000000000ull)
/* A settled connection's record (TCP, or its HELLO read) only answers a
 * late probe NO, and a probe comes within its client's wait of the
 * connect (at most FS_WIRE_PROBE_WAIT_MAX_MS), which came before the
 * server settled it: kept that long and 5 s more. */
#define FS_PROBE_SETTLED_TTL_NS ((FS_WIRE_PROBE_WAIT_MAX_MS + 5000ull) * 1000000ull)
#define FS_PROBE_RATE_PER_SEC 20000u
#define FS_PROBE_RCVBUF (4 << 20)
/* A client sends its probe again FS_PROBE_RESEND_FIRST_MS after the first
 * one if no answer came (a datagram dropped in a burst), then after twice
 * as long each time, within its probe timeout. The server answers a
 * repeated probe as it answered the first (same record, same nonce). */
#define FS_PROBE_RESEND_FIRST_MS 30u
#define FS_PROBE_RESENDS_MAX 4u

#define FS_PROBE_TABLE_USERS 64

struct fs_probe_table {
	pthread_mutex_t lock; /* process-shared, robust */
	struct fs_probe_rec rec[FS_PROBE_TABLE_SLOTS];
	/* A table shared by SO_REUSEPORT listeners of several processes (a
	 * named file, see fs_probe_table_shared): which processes use it. */
	uint32_t ready;
	int32_t users[FS_PROBE_TABLE_USERS];
};

struct fs_listener {
	int udp_fd;
	uint16_t port;
	int refs;
	pid_t pid; /* the process whose service thread watches udp_fd */
	struct fs_probe_table *table;
	bool shared_table; /* named: see fs_probe_table_shared */
	char table_path[96];
	uint64_t bucket_ns; /* rate limiter: start of the current second */
	unsigned bucket_used;
	bool closed; /* the application closed the listening socket (atomic) */
	int table_fd; /* a private table's memfd (internal, CLOEXEC), or -1 */
	/* the table's lock was held past FS_PROBE_TABLE_LOCK_MS: until then
	 * (atomic), tries do not wait (fs_table_lock) */
	uint64_t table_stuck_until_ns;
	struct fs_listener *next;
};

/* ---- the shared record table ------------------------------------------- */

/* How long a table's lock may be waited for. Every holder keeps it for a
 * lookup or two (microseconds); a process that keeps it longer (stopped
 * under a debugger, or one of our user's processes holding it on purpose)
 * costs each connection of the listener this much, then TCP. */
#define FS_PROBE_TABLE_LOCK_MS 1000

#define FS_PROBE_TABLE_STUCK_NS (5ull * 1000000000ull)

static int fs_table_lock(struct fs_listener *l)
{
	struct fs_probe_table *t = l->table;
	struct timespec until;
	int ret;

	if (__atomic_load_n(&l->table_stuck_until_ns, __ATOMIC_RELAXED) > fs_now_ns()) {
		/* held too long a moment ago: no more waiting (the service
		 * thread answers every listener's probes) until it has been
		 * seen free again */
		ret = pthread_mutex_trylock(&t->lock);
		if (ret == EOWNERDEAD) {
			pthread_mutex_consistent(&t->lock);
			ret = 0;
		}
		if (ret == 0)
			__atomic_store_n(&l->table_stuck_until_ns, 0, __ATOMIC_RELAXED);
		return ret;
	}
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += FS_PROBE_TABLE_LOCK_MS / 1000;
	until.tv_nsec += (FS_PROBE_TABLE_LOCK_MS % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	ret = pthread_mutex_timedlock(&t->lock, &until);
	if (ret == EOWNERDEAD) {
		/* A process died holding it: records are plain data, still valid. */
		pthread_mutex_consistent(&t->lock);
		ret = 0;
	}
	if (ret == ETIMEDOUT) {
		__atomic_store_n(&l->table_stuck_until_ns, fs_now_ns() + FS_PROBE_TABLE_STUCK_NS, __ATOMIC_RELAXED);
		FS_WARN_ONCE("a probe table's lock was held for over %d ms: its listener's connections stay on "
			     "kernel TCP while it is", FS_PROBE_TABLE_LOCK_MS);
	}
	return ret;
}

static bool fs_rec_stale(const struct fs_probe_rec *r, uint64_t now)
{
	if (r->state == FS_REC_NONE)
		return true;
	return now - r->stamp_ns > (r->state == FS_REC_YES ? FS_PROBE_REC_TTL_NS : FS_PROBE_SETTLED_TTL_NS);
}

/* Linear probing ends a key's chain at the first empty (NONE) slot. A
 * stale record right before an empty slot is on no live key's chain (that
 * chain would have to pass the empty slot), so it becomes empty too, and
 * so on backwards from EMPTY. Without it every slot ever used stayed
 * occupied, and each lookup of a new connection walked the whole table. */
static void fs_table_trim(struct fs_probe_table *t, unsigned empty, uint64_t now)
{
	for (unsigned n = 0; n < FS_PROBE_TABLE_SLOTS; n++) {
		unsigned prev = (empty + FS_PROBE_TABLE_SLOTS - 1) % FS_PROBE_TABLE_SLOTS;
		struct fs_probe_rec *r = &t->rec[prev];

		if (r->state == FS_REC_NONE || !fs_rec_stale(r, now))
			return;
		memset(r, 0, sizeof(*r));
		empty = prev;
	}
}

/* The first empty slot of the walk from H, among its first N + 1. */
static struct fs_probe_rec *fs_table_first_none(struct fs_probe_table *t, uint32_t h, unsigned n)
{
	for (unsigned i = 0; i <= n; i++) {
		struct fs_probe_rec *r = &t->rec[(h + i) % FS_PROBE_TABLE_SLOTS];

		if (r->state == FS_REC_NONE)
			return r;
	}
	return NULL;
}

static struct fs_probe_rec *fs_table_find(struct fs_probe_table *t, const uint8_t addr[16], uint16_t port,
					  bool create)
{
	uint64_t now = fs_now_ns();
	uint32_t h = fs_wire_crc32(addr, 16) ^ (port * 2654435761u);
	struct fs_probe_rec *free_slot = NULL;

	for (unsigned i = 0; i < FS_PROBE_TABLE_SLOTS; i++) {
		unsigned slot = (h + i) % FS_PROBE_TABLE_SLOTS;
		struct fs_probe_rec *r = &t->rec[slot];
		bool stale = fs_rec_stale(r, now);

		if (!stale && r->port == port && memcmp(r->addr, addr, 16) == 0)
			return r;
		if (r->state == FS_REC_NONE) {
			/* end of this probe chain: what ends in stale records
			 * before it ends here now, so chains stay short */
			fs_table_trim(t, slot, now);
			if (free_slot && free_slot->state == FS_REC_NONE)
				free_slot = NULL; /* trimmed: the first NONE of the walk is as good */
			if (!free_slot)
				free_slot = fs_table_first_none(t, h, i);
			break;
		}
		if (stale && !free_slot)
			free_slot = r;
	}
	if (!create || !free_slot)
		return NULL;
	memset(free_slot, 0, sizeof(*free_slot));
	memcpy(free_slot->addr, addr, 16);
	free_slot->port = port;
	free_slot->stamp_ns = now;
	return free_slot;
}

bool fs_probe_rec_stale(const struct fs_probe_rec *r, uint64_t accepted_ns)
{
	return accepted_ns && (r->state == FS_REC_TCP || r->state == FS_REC_DONE) && r->stamp_ns < accepted_ns;
}

enum fs_rec_state fs_listener_claim_tcp(struct fs_listener *l, const uint8_t addr[16], uint16_t port,
					uint64_t accepted_ns, struct fs_probe_rec *out)
{
	struct fs_probe_rec *r;
	enum fs_rec_state state = FS_REC_TCP;

	if (fs_table_lock(l))
		return FS_REC_TCP;
	r = fs_table_find(l->table, addr, port, true);
	if (r) {
		if (r->state == FS_REC_NONE || fs_probe_rec_stale(r, accepted_ns)) {
			r->state = FS_REC_TCP;
			r->stamp_ns = fs_now_ns();
			/* this connection's now: a later probe must not take it
			 * for an earlier connection's (fs_listener_answer) */
			r->client_inode = 0;
		}
		state = r->state;
		if (out)
			*out = *r;
	}
	pthread_mutex_unlock(&l->table->lock);
	return state;
}

enum fs_rec_state fs_listener_lookup(struct fs_listener *l, const uint8_t addr[16], uint16_t port,
				     struct fs_probe_rec *out)
{
	struct fs_probe_rec *r;
	enum fs_rec_state state = FS_REC_NONE;

	if (fs_table_lock(l))
		return FS_REC_NONE;
	r = fs_table_find(l->table, addr, port, false);
	if (r) {
		state = r->state;
		if (out)
			*out = *r;
	}
	pthread_mutex_unlock(&l->table->lock);
	return state;
}

void fs_listener_forget(struct fs_listener *l, const uint8_t addr[16], uint16_t port)
{
	struct fs_probe_rec *r;

	if (fs_table_lock(l))
		return;
	r = fs_table_find(l->table, addr, port, false);
	if (r) {
		/* Keep the slot occupied (it may be inside another key's probe
		 * chain) but make it match nothing and be reusable; the next
		 * walk that ends after it empties it (fs_table_trim). */
		memset(r->addr, 0, sizeof(r->addr));
		r->port = 0;
		r->stamp_ns = 0;
	}
	pthread_mutex_unlock(&l->table->lock);
}

bool fs_listener_move(struct fs_listener *l, const uint8_t addr[16], uint16_t port, enum fs_rec_state from,
		      enum fs_rec_state to)
{
	struct fs_probe_rec *r;
	bool moved = false;

	if (fs_table_lock(l))
		return false;
	r = fs_table_find(l->table, addr, port, from == FS_REC_NONE);
	if (r && r->state == from) {
		r->state = to;
		r->stamp_ns = fs_now_ns();
		moved = true;
	}
	pthread_mutex_unlock(&l->table->lock);
	return moved;
}

/* ---- service thread ---------------------------------------------------- */

/* One NETLINK_SOCK_DIAG socket per process, one question at a time. The
 * service thread and application threads drain probes at the same time: on
 * a socket without the lock one asker read and dropped another's reply, and
 * the other waited out its poll (100 ms, the whole of a single-threaded
 * server) to answer unchecked. A fork child opens its own (see
 * fs_service_after_fork), or parent and child would read each other's. */
static pthread_mutex_t fs_diag_lock = PTHREAD_MUTEX_INITIALIZER;
static int fs_diag_fd = -1;

static pthread_mutex_t fs_service_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fs_listener *fs_service_listeners;
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
static bool fs_service_dirty;
/* A signal handler asked the service thread to run the process's end
 * (fs_service_exit), and the eventfd it waits on for the answer. */
static int fs_service_exit_wanted;
static int fs_service_exit_fd = -1;

/* The pending watches (probe.h), newest first. The service thread alone
 * takes them off, so one it put in its poll set is still here after the
 * poll. */
static struct fs_watch *fs_watch_list;
static size_t fs_watch_count;

static void *fs_service_main(void *arg);
static void fs_service_drop_closed(void);

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
	*w = (struct fs_watch){ .fd = fd, .events = events, .deadline_ns = deadline_ns, .fn = fn, .arg = arg, .queued = true };
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

bool fs_service_watch_expire(struct fs_watch *w)
{
	bool queued;

	pthread_mutex_lock(&fs_service_lock);
	queued = w->queued;
	if (queued) {
		w->fd = -1;
		w->deadline_ns = 0;
	}
	pthread_mutex_unlock(&fs_service_lock);
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
	/* Threads do not survive fork: the child starts its own when needed.
	 * The parent's listeners stay the parent's to answer. */
	pthread_mutex_init(&fs_service_lock, NULL);
	fs_service_listeners = NULL;
	fs_service_dirty = true;
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
	pthread_mutex_init(&fs_diag_lock, NULL);
	if (fs_diag_fd >= 0) { /* shared with the parent, as its replies would be */
		fs_internal_fd_close(fs_diag_fd);
		fs_diag_fd = -1;
	}
}

/* The service thread's poll set: the wake-up fds, the listeners' probe
 * sockets, the watches' fds, and per entry whose it is. It grows with the
 * number of watches; when it cannot, the watches left out still fire at
 * their deadlines. */
struct fs_service_slot {
	struct fs_listener *listener; /* holds a reference while polled */
	struct fs_watch *watch;
};
struct fs_service_set {
	struct pollfd *pfd;
	struct fs_service_slot *slot;
	size_t cap;
};

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
		w->queued = false;
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

/* Puts entry N: FD polled for EVENTS, for L or W (or neither). */
static nfds_t fs_service_set_put(struct fs_service_set *set, nfds_t n, int fd, short events,
				 struct fs_listener *l, struct fs_watch *w)
{
	set->pfd[n] = (struct pollfd){ .fd = fd, .events = events };
	set->slot[n] = (struct fs_service_slot){ .listener = l, .watch = w };
	return n + 1;
}

/* The service thread's poll set: wake-up eventfd, bell, timer, hand-back
 * requests; then the listeners' probe sockets, the watches, and at most
 * FS_SERVICE_BLOCKED kernel sockets a hand-back waits to write to. */
#define FS_SERVICE_FIXED 4
#define FS_SERVICE_BLOCKED 16

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
		nfds_t n = 0, cap;
		int timeout_ms = -1;
		struct fs_engine *e;
		int ret;
		size_t listeners = 0;

		pthread_mutex_lock(&fs_service_lock);
		fs_service_drop_closed();
		for (struct fs_listener *l = fs_service_listeners; l; l = l->next)
			listeners++;
		cap = fs_service_set_fit(&set, FS_SERVICE_FIXED + listeners + fs_watch_count + FS_SERVICE_BLOCKED);
		if (cap < FS_SERVICE_FIXED + FS_SERVICE_BLOCKED) { /* no memory for the fixed entries: try again soon */
			pthread_mutex_unlock(&fs_service_lock);
			fs_real.poll(NULL, 0, 10);
			continue;
		}
		pfd = set.pfd;
		n = fs_service_set_put(&set, n, fs_service_wake_fd, POLLIN, NULL, NULL);
		/* the bell: -1 (ignored by poll) until a HELLO opened it */
		n = fs_service_set_put(&set, n, fs_bell_fd(), POLLIN, NULL, NULL);
		n = fs_service_set_put(&set, n, fs_service_timer_fd, POLLIN, NULL, NULL);
		/* requests for a stream back from processes forked later */
		n = fs_service_set_put(&set, n, fs_handback_request_fd(fs_engine_peek()), POLLIN, NULL, NULL);
		for (struct fs_listener *l = fs_service_listeners; l && n + FS_SERVICE_BLOCKED < cap; l = l->next) {
			n = fs_service_set_put(&set, n, l->udp_fd, POLLIN, l, NULL);
			fs_listener_get(l);
		}
		nl = n;
		next_deadline = UINT64_MAX;
		for (struct fs_watch *w = fs_watch_list; w; w = w->next) {
			if (w->deadline_ns < next_deadline)
				next_deadline = w->deadline_ns;
			if (n + FS_SERVICE_BLOCKED < cap) /* else left to its deadline */
				n = fs_service_set_put(&set, n, w->fd, w->events, NULL, w);
		}
		nw = n;
		pthread_mutex_unlock(&fs_service_lock);

		e = fs_engine_peek();
		if (e) {
			/* Busy engine lock: someone is making progress; look again soon. */
			bool busy = true, live = true, deep = false;

			if (pthread_mutex_trylock(&e->lock) == 0) {
				uint64_t now = fs_now_ns();

				busy = fs_engine_busy(e);
				/* orphans included (live_streams): one waits for
				 * the peer's FIN or its linger deadline, and only
				 * a progress round sees either */
				live = e->live_streams != 0;
				/* payloads a slow reader leaves at the sender come over */
				fs_engine_pull_stale(e);
				/* TCP writes of hand-backs waiting for room */
				{
					int fds[FS_SERVICE_BLOCKED];
					unsigned nb = fs_handback_blocked_fds(e, fds, FS_SERVICE_BLOCKED);

					for (unsigned i = 0; i < nb; i++)
						n = fs_service_set_put(&set, n, fds[i], POLLOUT, NULL, NULL);
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
				bell_off = deep && e->deep_waiters;
				__atomic_store_n(&e->service_bell_off, bell_off, __ATOMIC_RELAXED);
				if (bell_off)
					pfd[1].fd = -1;
				pthread_mutex_unlock(&e->lock);
			}
			if (busy)
				timeout_ms = 0;
			else if (deep)
				timeout_ms = FS_BELL_SLICE_MS;
			else if (live)
				timeout_ms = (int)(idle_us / 1000);
		}
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
		if (bell_off && (e = fs_engine_peek())) {
			__atomic_store_n(&e->service_bell_off, false, __ATOMIC_RELAXED);
			bell_off = false;
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
		if (ret > 0 && (pfd[1].revents & POLLIN)) {
			fs_bell_drain(fs_engine_peek());
			idle_us = 1000; /* a ring: the peer's message is on its way */
		}
		if (ret > 0 && (pfd[2].revents & POLLIN)) {
			uint64_t v;
			ssize_t r = fs_real.read(fs_service_timer_fd, &v, sizeof(v));

			(void)r;
			__atomic_store_n(&fs_service_timer_armed, 0, __ATOMIC_RELEASE);
		}
		if (ret > 0 && (pfd[3].revents & POLLIN) && (e = fs_engine_peek())) {
			pthread_mutex_lock(&e->lock);
			fs_handback_serve(e);
			pthread_mutex_unlock(&e->lock);
		}
		for (nfds_t i = FS_SERVICE_FIXED; i < nl; i++) {
			if (ret > 0 && (pfd[i].revents & POLLIN))
				fs_listener_drain(set.slot[i].listener);
			fs_listener_put(set.slot[i].listener);
		}
		fs_service_run_watches(&set, nl, nw);
		e = fs_engine_peek();
		if (e && pthread_mutex_trylock(&e->lock) == 0) {
			int done = e->live_streams ? fs_engine_progress(e) : 0;

			pthread_mutex_unlock(&e->lock);
			/* Back off while nothing happens: idle costs ~nothing. */
			idle_us = done ? 1000 : (idle_us < 50000 ? idle_us * 2 : 50000);
		}
	}
	return arg;
}

/* ---- listener side ----------------------------------------------------- */

static void fs_probe_table_init_lock(struct fs_probe_table *table)
{
	pthread_mutexattr_t ma;

	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&table->lock, &ma);
	pthread_mutexattr_destroy(&ma);
}

/*
 * SO_REUSEPORT listeners: several sockets (often in several processes) on
 * one address and port, the kernel spreading connections among them. Their
 * UDP twins share the port too (SO_REUSEPORT), and the kernel spreads probes
 * by its own hash, so the twin that answers a probe is not the listener
 * that accepts the connection. They therefore share one probe table, a
 * file in /dev/shm named after the network namespace and the address:
 * whichever twin answers records there, whichever listener accepts looks
 * there. The file lists the processes using it; the last one out removes
 * it, and a process that finds only dead ones (SIGKILL) starts it afresh.
 */
static void fs_probe_tables_clean_stale(void);
static void fs_probe_table_leave(struct fs_listener *l);

/* Opens the table file PATH (FLAGS: O_RDWR or O_RDONLY, maybe with
 * O_CREAT|O_EXCL) and takes its flock: every step that creates, joins,
 * leaves or removes a shared table runs under it, so no process sees a
 * table half made or signs in to one being removed. The file must be ours:
 * a regular file (no symlink), owned by our effective uid, mode 0600, no
 * larger than a table; anything else is refused (-1, *REFUSED set). The
 * path must still name the file opened (else -1, errno ESTALE: a leaver
 * removed it meanwhile; try again). */
static int fs_probe_table_lock(const char *path, int flags, struct stat *st, bool *refused)
{
	struct stat now;
	int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC, 0600);

	*refused = false;
	if (fd < 0) {
		/* a symlink (ELOOP), or a file of another user's (EACCES) */
		*refused = errno == ELOOP || errno == EACCES || errno == EPERM;
		return -1;
	}
	if (flags & O_CREAT)
		(void)fchmod(fd, 0600); /* whatever the umask */
	while (flock(fd, LOCK_EX) && errno == EINTR)
		;
	if (fstat(fd, st) || !S_ISREG(st->st_mode) || st->st_uid != geteuid() || (st->st_mode & 07777) != 0600 ||
	    (size_t)st->st_size > sizeof(struct fs_probe_table)) {
		*refused = true;
		fs_real.close(fd);
		return -1;
	}
	if (stat(path, &now) || now.st_dev != st->st_dev || now.st_ino != st->st_ino) {
		fs_real.close(fd);
		errno = ESTALE;
		return -1;
	}
	return fd;
}

/* Drops the flock and closes FD. The flock must be dropped by hand: a
 * mapping of the file keeps its open file, and the lock, alive. */
static void fs_probe_table_unlock(int fd)
{
	flock(fd, LOCK_UN);
	fs_real.close(fd);
}

/* Signs PID in (a free or dead process's slot); false if all are taken. */
static bool fs_probe_table_sign_in(struct fs_probe_table *table, int32_t pid)
{
	for (int i = 0; i < FS_PROBE_TABLE_USERS; i++) {
		int32_t old = __atomic_load_n(&table->users[i], __ATOMIC_ACQUIRE);

		if (old > 0 && old != pid && fs_pid_alive(old))
			continue;
		if (__atomic_compare_exchange_n(&table->users[i], &old, pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			return true;
	}
	return false;
}

static bool fs_probe_table_in_use(const int32_t users[FS_PROBE_TABLE_USERS], int32_t except)
{
	for (int i = 0; i < FS_PROBE_TABLE_USERS; i++)
		if (users[i] > 0 && users[i] != except && fs_pid_alive(users[i]))
			return true;
	return false;
}

/* Reads a locked table file's `ready` and `users` (not its records):
 * true if it is a whole, ready table that no live process but EXCEPT uses. */
static bool fs_probe_table_file_stale(int fd, const struct stat *st, int32_t except)
{
	int32_t users[FS_PROBE_TABLE_USERS];
	uint32_t ready;

	return (size_t)st->st_size == sizeof(struct fs_probe_table) &&
	       pread(fd, &ready, sizeof(ready), offsetof(struct fs_probe_table, ready)) == (ssize_t)sizeof(ready) &&
	       ready &&
	       pread(fd, users, sizeof(users), offsetof(struct fs_probe_table, users)) == (ssize_t)sizeof(users) &&
	       !fs_probe_table_in_use(users, except);
}

static struct fs_probe_table *fs_probe_table_shared(struct fs_listener *l, const struct sockaddr_storage *ss)
{
	uint8_t key[16];
	uint16_t port;
	struct stat st;
	struct fs_probe_table *table = MAP_FAILED;
	unsigned long netns = 0;

	fs_probe_tables_clean_stale();
	if (stat("/proc/self/ns/net", &st) == 0)
		netns = (unsigned long)st.st_ino;
	fs_sockaddr_key((const struct sockaddr *)ss, key, &port);
	snprintf(l->table_path, sizeof(l->table_path),
		 "/dev/shm/fabsock-probe-%lu-%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x-%u", netns,
		 key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7], key[8], key[9], key[10], key[11],
		 key[12], key[13], key[14], key[15], port);
	/* Bounded: each retry means another process created or removed the
	 * file in the meantime, which takes it microseconds. */
	for (int attempt = 0; attempt < 200; attempt++) {
		bool refused, creator = true;
		int fd = fs_probe_table_lock(l->table_path, O_RDWR | O_CREAT | O_EXCL, &st, &refused);

		if (fd < 0 && !refused && errno == EEXIST) {
			creator = false;
			fd = fs_probe_table_lock(l->table_path, O_RDWR, &st, &refused);
		}
		if (refused) {
			FS_STAT_INC(probe_tables_refused);
			FS_WARN("probe table %s is not one this process made (owner, mode or size); the listener "
				"stays plain TCP",
				l->table_path);
			return NULL;
		}
		if (fd < 0) {
			if (errno != ENOENT && errno != ESTALE && errno != EEXIST)
				return NULL;
			usleep(1000);
			continue;
		}
		if (!creator && (size_t)st.st_size < sizeof(*table)) {
			/* its creator has not yet taken the lock, or died before */
			fs_probe_table_unlock(fd);
			usleep(1000);
			continue;
		}
		if ((!creator || ftruncate(fd, sizeof(*table)) == 0) &&
		    (table = mmap(NULL, sizeof(*table), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) != MAP_FAILED) {
			if (creator || !__atomic_load_n(&table->ready, __ATOMIC_ACQUIRE)) {
				/* new, or left unready by a creator that died mid-way */
				fs_probe_table_init_lock(table);
				memset(table->users, 0, sizeof(table->users));
			}
			if (!fs_probe_table_sign_in(table, (int32_t)getpid()))
				FS_WARN("probe table %s: more than %d processes share it; not signed in",
					l->table_path, FS_PROBE_TABLE_USERS);
			/* signed in before ready: a ready table with no live user is stale */
			__atomic_store_n(&table->ready, 1, __ATOMIC_RELEASE);
		} else if (creator) {
			unlink(l->table_path);
		}
		fs_probe_table_unlock(fd);
		if (table == MAP_FAILED)
			return NULL;
		l->shared_table = true;
		FS_DBG("listener on port %u shares probe table %s%s", port, l->table_path, creator ? " (new)" : "");
		return table;
	}
	FS_WARN("probe table %s: could not join it; the listener stays plain TCP", l->table_path);
	return NULL;
}

void fs_listeners_exit(void)
{
	pthread_mutex_lock(&fs_service_lock);
	for (struct fs_listener *l = fs_service_listeners; l; l = l->next)
		if (l->shared_table && l->pid == getpid())
			fs_probe_table_leave(l);
	pthread_mutex_unlock(&fs_service_lock);
}

/* Removes shared probe tables whose every user died (SIGKILL): once per
 * process, when it first shares one. */
static void fs_probe_tables_clean_stale(void)
{
	static int done;
	DIR *dir;
	struct dirent *de;

	if (__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL) || !(dir = opendir("/dev/shm")))
		return;
	while ((de = readdir(dir))) {
		char path[300];
		struct stat st;
		bool refused;
		int fd;

		if (strncmp(de->d_name, "fabsock-probe-", 14) != 0)
			continue;
		snprintf(path, sizeof(path), "/dev/shm/%s", de->d_name);
		fd = fs_probe_table_lock(path, O_RDONLY, &st, &refused);
		if (fd < 0)
			continue; /* gone, or not ours: not ours to remove */
		/* a short file is being created (its creator waits for the lock) */
		if (fs_probe_table_file_stale(fd, &st, 0) && unlink(path) == 0)
			FS_INFO("removed stale probe table %s", de->d_name);
		fs_probe_table_unlock(fd);
	}
	closedir(dir);
}

/* Signs this process out of a shared table; the last one removes the file. */
static void fs_probe_table_leave(struct fs_listener *l)
{
	int32_t me = (int32_t)getpid();
	struct stat st;
	bool refused;
	int fd = fs_probe_table_lock(l->table_path, O_RDONLY, &st, &refused);

	for (int i = 0; i < FS_PROBE_TABLE_USERS; i++) {
		int32_t pid = me;

		__atomic_compare_exchange_n(&l->table->users[i], &pid, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
	}
	if (fd < 0)
		return; /* removed already, or replaced by a file not ours */
	/* the file may be a newer table than ours (ours was removed and made
	 * again): remove it only if it is unused, whichever it is */
	if (fs_probe_table_file_stale(fd, &st, me))
		unlink(l->table_path);
	fs_probe_table_unlock(fd);
}

struct fs_listener *fs_listener_open(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	struct fs_listener *l;
	int udp, one = 1;

	if (fs_real.getsockname(fd, (struct sockaddr *)&ss, &len))
		return NULL;
	if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)
		return NULL;
	udp = fs_real.socket(ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (udp < 0)
		return NULL;
	if (ss.ss_family == AF_INET6) {
		int v6only = 0;
		socklen_t olen = sizeof(v6only);

		fs_real.getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &olen);
		fs_real.setsockopt(udp, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
	}
	{
		int reuseport = 0;
		socklen_t olen = sizeof(reuseport);

		if (fs_real.getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &reuseport, &olen) == 0 && reuseport)
			fs_real.setsockopt(udp, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
		one = reuseport;
	}
	{
		/* Room for a burst: wrk -c 1000 probes 1000 connections at once,
		 * and the default buffer (208 KiB, about 270 small datagrams)
		 * dropped some, whose clients then waited out their probe timeout
		 * and stayed on TCP. A privileged process is not held to
		 * net.core.rmem_max (the client also sends its probe again). */
		int rcvbuf = FS_PROBE_RCVBUF;

		if (fs_real.setsockopt(udp, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf)))
			fs_real.setsockopt(udp, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	}
	if (fs_real.bind(udp, (struct sockaddr *)&ss, len)) {
		FS_INFO("listener on port %u: UDP port taken (%s); this listener stays plain TCP",
			ntohs(((struct sockaddr_in *)&ss)->sin_port), strerror(errno));
		fs_real.close(udp);
		return NULL;
	}
	l = calloc(1, sizeof(*l));
	if (!l) {
		fs_real.close(udp);
		return NULL;
	}
	l->table_fd = -1;
	if (one) { /* SO_REUSEPORT */
		l->table = fs_probe_table_shared(l, &ss);
		if (!l->table) {
			FS_INFO("listener on port %u: cannot share a probe table (%s); this listener stays plain TCP",
				ntohs(((struct sockaddr_in *)&ss)->sin_port), strerror(errno));
			fs_real.close(udp);
			free(l);
			return NULL;
		}
	} else {
		/* a memfd, so that a program this process execs with a connection
		 * accepted here can look its record up (fs_listener_exec_fd) */
		int tfd = memfd_create("fabsock-probe-table", MFD_CLOEXEC);

		l->table_fd = -1;
		if (tfd >= 0 && ftruncate(tfd, sizeof(*l->table)) == 0) {
			l->table = mmap(NULL, sizeof(*l->table), PROT_READ | PROT_WRITE, MAP_SHARED, tfd, 0);
			if (l->table != MAP_FAILED)
				l->table_fd = fs_internal_fd(tfd);
			else
				fs_real.close(tfd);
		} else {
			if (tfd >= 0)
				fs_real.close(tfd);
			l->table = mmap(NULL, sizeof(*l->table), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
					-1, 0);
		}
		if (l->table == MAP_FAILED) {
			fs_real.close(udp);
			free(l);
			return NULL;
		}
		fs_probe_table_init_lock(l->table);
		__atomic_store_n(&l->table->ready, 1, __ATOMIC_RELEASE);
	}
	l->udp_fd = udp;
	fs_udp_want_dest(udp, ss.ss_family); /* which local address each probe was sent to */
	l->refs = 1;
	l->pid = getpid();
	l->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);

	pthread_mutex_lock(&fs_service_lock);
	fs_listener_get(l);
	l->next = fs_service_listeners;
	fs_service_listeners = l;
	fs_service_ensure();
	pthread_mutex_unlock(&fs_service_lock);
	fs_service_kick();
	return l;
}

int fs_listener_exec_fd(struct fs_listener *l)
{
	int fd = -1, out;

	if (l->table_fd >= 0)
		fd = fs_real.fcntl(l->table_fd, F_DUPFD_CLOEXEC, 0);
	else if (l->shared_table)
		fd = open(l->table_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	out = fs_internal_fd(fd);
	if (out >= 0)
		fs_real.fcntl(out, F_SETFD, 0); /* it survives the exec */
	return out;
}

struct fs_listener *fs_listener_attach(int fd)
{
	struct fs_probe_table *table;
	struct fs_listener *l;
	struct stat st;

	/* our own file (the old program's): a memfd, or a table in /dev/shm
	 * this user made; nothing else is mapped */
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (size_t)st.st_size != sizeof(*table)) {
		FS_INFO("fd %d: not a probe table of this user; connections inherited with it stay on TCP", fd);
		return NULL;
	}
	table = mmap(NULL, sizeof(*table), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (table == MAP_FAILED)
		return NULL;
	if (__atomic_load_n(&table->ready, __ATOMIC_ACQUIRE) != 1 || !(l = calloc(1, sizeof(*l)))) {
		munmap(table, sizeof(*table));
		return NULL;
	}
	l->udp_fd = -1;
	l->table_fd = -1;
	l->table = table;
	l->refs = 1;
	l->pid = getpid();
	l->closed = true; /* it listens on nothing here */
	return l;
}

int fs_listener_fd(struct fs_listener *l)
{
	return l->udp_fd;
}

void fs_listener_get(struct fs_listener *l)
{
	__atomic_fetch_add(&l->refs, 1, __ATOMIC_RELAXED);
}

void fs_listener_put(struct fs_listener *l)
{
	if (__atomic_sub_fetch(&l->refs, 1, __ATOMIC_ACQ_REL))
		return;
	if (l->udp_fd >= 0)
		fs_real.close(l->udp_fd);
	if (l->table_fd >= 0)
		fs_internal_fd_close(l->table_fd);
	if (l->shared_table && l->pid == getpid())
		fs_probe_table_leave(l);
	munmap(l->table, sizeof(*l->table));
	free(l);
}

/* The application closed the listening socket. Connections it accepted may
 * still negotiate, and their probes may not have arrived yet (socat closes
 * its listener right after accept()): the service thread keeps answering
 * on the twin until the last of them lets go of it, then drops it
 * (fs_service_drop_closed). */
void fs_listener_close(struct fs_listener *l)
{
	__atomic_store_n(&l->closed, true, __ATOMIC_RELEASE);
	fs_listener_put(l);
	fs_service_kick();
}

/* Takes closed listeners that nothing but the service list holds off the
 * list. Service lock held. */
static void fs_service_drop_closed(void)
{
	for (struct fs_listener **link = &fs_service_listeners; *link;) {
		struct fs_listener *l = *link;

		if (__atomic_load_n(&l->closed, __ATOMIC_ACQUIRE) && __atomic_load_n(&l->refs, __ATOMIC_ACQUIRE) == 1) {
			*link = l->next;
			fs_listener_put(l);
			continue;
		}
		link = &l->next;
	}
}

static int fs_diag_socket_locked(void)
{
	if (fs_diag_fd < 0) {
		int fd = fs_real.socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);

		if (fd >= 0)
			fs_diag_fd = fs_internal_fd(fd);
	}
	return fs_diag_fd;
}

/* Sends the sock_diag request ASK and reads its answer: 1 (a connection in
 * a live state, or with ANY_STATE in any state), 0 (none), -1 (cannot tell).
 * A socket found stores its inode in *INODE (0 once no descriptor holds
 * it: closed, TIME_WAIT). Called with fs_diag_lock. */
static int fs_diag_exchange(const struct nlmsghdr *ask, uint32_t *inode, bool any_state)
{
	struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
	union {
		struct nlmsghdr nlh;
		char bytes[1024];
	} reply;
	int fd = fs_diag_socket_locked();
	ssize_t n;

	if (fd < 0)
		return -1;
	if (fs_real.sendto(fd, ask, ask->nlmsg_len, MSG_NOSIGNAL, (struct sockaddr *)&kernel, sizeof(kernel)) < 0)
		return -1;
	for (int tries = 0; tries < 8; tries++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (fs_real.poll(&p, 1, 100) <= 0)
			return -1;
		n = fs_real.recv(fd, &reply, sizeof(reply), MSG_DONTWAIT);
		if (n < (ssize_t)sizeof(struct nlmsghdr))
			return -1;
		if (reply.nlh.nlmsg_seq != ask->nlmsg_seq)
			continue; /* an answer to an earlier question that timed out */
		if (reply.nlh.nlmsg_type == SOCK_DIAG_BY_FAMILY) {
			const struct inet_diag_msg *info = NLMSG_DATA(&reply.nlh);

			if (n < (ssize_t)NLMSG_LENGTH(sizeof(*info)))
				return -1;
			*inode = info->idiag_inode;
			if (any_state)
				return 1;
			/* An exact lookup ignores idiag_states: judge the state here.
			 * SYN_RECV: the client's last handshake ACK and its probe may
			 * be processed out of order. Closing states are gone. */
			return info->idiag_state == TCP_ESTABLISHED || info->idiag_state == TCP_SYN_RECV;
		}
		if (reply.nlh.nlmsg_type == NLMSG_ERROR) {
			const struct nlmsgerr *err = NLMSG_DATA(&reply.nlh);

			return err->error == -ENOENT ? 0 : -1;
		}
		return -1;
	}
	return -1;
}

/* Asks the kernel whether an established TCP connection LOCAL:LPORT <->
 * CLIENT:CPORT exists (in the accept queue or accepted): one exact socket
 * lookup over NETLINK_SOCK_DIAG. A probe is answered yes only for a real
 * connection, so forged or garbled probes cannot leave records for
 * connections that do not exist (which would deny offload to whoever later
 * uses that port). Returns 1 (exists), 0 (does not), -1 (cannot tell). */
static int fs_diag_lookup(const uint8_t local[16], uint16_t lport, const uint8_t client[16], uint16_t cport,
			  uint32_t *inode, bool any_state)
{
	uint32_t ignored;
	static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 req;
	} msg = { 0 };
	bool v4 = memcmp(client, mapped, 12) == 0;
	int answer;

	msg.nlh.nlmsg_len = sizeof(msg);
	msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	msg.nlh.nlmsg_flags = NLM_F_REQUEST;
	msg.nlh.nlmsg_seq = (uint32_t)fs_now_ns();
	msg.req.sdiag_family = v4 ? AF_INET : AF_INET6;
	msg.req.sdiag_protocol = IPPROTO_TCP;
	msg.req.idiag_states = (1u << TCP_ESTABLISHED) | (1u << TCP_SYN_RECV); /* for dumps; see below */
	msg.req.id.idiag_sport = htons(lport);
	msg.req.id.idiag_dport = htons(cport);
	if (v4) {
		memcpy(msg.req.id.idiag_src, local + 12, 4);
		memcpy(msg.req.id.idiag_dst, client + 12, 4);
	} else {
		memcpy(msg.req.id.idiag_src, local, 16);
		memcpy(msg.req.id.idiag_dst, client, 16);
	}
	msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
	msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	pthread_mutex_lock(&fs_diag_lock);
	answer = fs_diag_exchange(&msg.nlh, inode ? inode : &ignored, any_state);
	pthread_mutex_unlock(&fs_diag_lock);
	return answer;
}

/* A client on this host (its address is ours: the listener's own, or
 * loopback) has its end of the connection in this network namespace. */
static bool fs_client_local(const uint8_t local[16], const uint8_t client[16])
{
	static const uint8_t v4_loop[13] = { [10] = 0xff, [11] = 0xff, [12] = 127 };
	static const uint8_t v6_loop[16] = { [15] = 1 };

	return memcmp(local, client, 16) == 0 || memcmp(client, v4_loop, 13) == 0 ||
	       memcmp(client, v6_loop, 16) == 0;
}

/* Whether the connection LOCAL:LPORT <-> CLIENT:CPORT exists, as
 * fs_diag_lookup. For a client on this host the kernel is asked for the
 * client's end instead (ESTABLISHED once its connect() returned, which is
 * when it probes): the same one lookup proves the connection and gives the
 * inode of the client's socket (*CLIENT_INODE, else 0), which the HELLO's
 * shm address is later checked against (fs_negotiate: one readlink). */
static int fs_conn_exists(const uint8_t local[16], uint16_t lport, const uint8_t client[16], uint16_t cport,
			  uint32_t *client_inode)
{
	*client_inode = 0;
	if (fs_client_local(local, client) && fs_diag_lookup(client, cport, local, lport, client_inode, false) == 1)
		return 1;
	*client_inode = 0;
	return fs_diag_lookup(local, lport, client, cport, NULL, false);
}

int fs_conn_peer_inode(int fd, uint32_t *inode)
{
	struct sockaddr_storage me, peer;
	socklen_t mlen = sizeof(me), plen = sizeof(peer);
	uint8_t maddr[16], paddr[16];
	uint16_t mport, pport;

	if (fs_real.getsockname(fd, (struct sockaddr *)&me, &mlen) || fs_real.getpeername(fd, (struct sockaddr *)&peer, &plen) ||
	    (me.ss_family != AF_INET && me.ss_family != AF_INET6))
		return -1;
	fs_sockaddr_key((struct sockaddr *)&me, maddr, &mport);
	fs_sockaddr_key((struct sockaddr *)&peer, paddr, &pport);
	/* the peer's socket: its local end is our remote one */
	return fs_diag_lookup(paddr, pport, maddr, mport, inode, true);
}

static bool fs_listener_rate_ok(struct fs_listener *l)
{
	uint64_t now = fs_now_ns();

	if (now - l->bucket_ns > 1000000000ull) {
		l->bucket_ns = now;
		l->bucket_used = 0;
	}
	return ++l->bucket_used <= FS_PROBE_RATE_PER_SEC;
}

static void fs_listener_answer(struct fs_listener *l, const uint8_t *pkt, ssize_t len,
			       const struct sockaddr_storage *from, socklen_t fromlen, const uint8_t local[16],
			       bool have_local)
{
	struct fs_probe ask, reply;
	uint8_t src[16], out[FS_WIRE_PROBE_LEN];
	uint16_t src_port;
	struct fs_probe_rec *r;
	uint8_t answer = FS_PROBE_NO;
	uint32_t client_inode = 0;

	if (len != FS_WIRE_PROBE_LEN || fs_wire_probe_decode(pkt, (size_t)len, &ask) || ask.type != FS_PROBE_ASK) {
		FS_STAT_INC(probes_bad);
		return;
	}
	fs_sockaddr_key((const struct sockaddr *)from, src, &src_port);
	/* The datagram must come from the address it speaks for. */
	if (memcmp(src, ask.client_addr, 16) != 0) {
		FS_STAT_INC(probes_bad);
		return;
	}
	{
		bool ok = false;

		/* The service thread and application threads both drain probes. */
		if (fs_table_lock(l) == 0) {
			ok = fs_listener_rate_ok(l);
			pthread_mutex_unlock(&l->table->lock);
		}
		if (!ok)
			return;
	}
	{
		struct sockaddr_in6 client = { .sin6_family = AF_INET6, .sin6_port = htons(ask.client_port) };

		memcpy(&client.sin6_addr, ask.client_addr, 16);
		if (fs_rules_match(&fs_rules_global, FS_SIDE_SERVER, (struct sockaddr *)&client, l->port) ==
		    FS_RULE_KERNEL)
			goto reply;
	}
	/* Only a connection that exists gets a record (and a yes). */
	if (have_local) {
		int exists = fs_conn_exists(local, l->port, ask.client_addr, ask.client_port, &client_inode);

		if (exists == 0) {
			FS_STAT_INC(probes_bad);
			FS_DBG("probe for port %u: no such connection", ask.client_port);
			goto reply;
		}
		if (exists < 0) {
			FS_STAT_INC(probes_unchecked);
			FS_WARN_ONCE("cannot check probes against the kernel's connections (sock_diag); "
				     "answering them unchecked");
		}
	}
	if (fs_table_lock(l) == 0) {
		r = fs_table_find(l->table, ask.client_addr, ask.client_port, true);
		/* A record of an earlier connection from the same client port (a
		 * client with hundreds of connections reuses ports within the
		 * record's lifetime): the kernel names another socket for the
		 * connection now, and only one connection holds a 4-tuple at a
		 * time, so that one is gone. (Seen: pgbench -c 300's second run,
		 * 8 of 300 answered no.) */
		if (r && r->state != FS_REC_NONE && client_inode && r->client_inode && r->client_inode != client_inode) {
			FS_DBG("probe for port %u: the record was an earlier connection's (inode %u, now %u)",
			       ask.client_port, r->client_inode, client_inode);
			r->state = FS_REC_NONE;
		}
		if (r && (r->state == FS_REC_NONE || (r->state == FS_REC_YES && r->nonce == ask.nonce))) {
			r->state = FS_REC_YES;
			r->nonce = ask.nonce;
			r->wait_ms = ask.wait_ms;
			r->client_inode = client_inode;
			r->stamp_ns = fs_now_ns();
			answer = FS_PROBE_YES;
		} else if (r) {
			FS_DBG("probe for port %u answered no: record state %u, nonce %#llx vs %#llx, age %llu ms",
			       ask.client_port, r->state, (unsigned long long)r->nonce,
			       (unsigned long long)ask.nonce, (unsigned long long)((fs_now_ns() - r->stamp_ns) / 1000000));
		}
		pthread_mutex_unlock(&l->table->lock);
	}
reply:
	reply = ask;
	reply.type = answer;
	/* from the address the probe came to: the client's UDP socket is
	 * connected to it, and a listener on the wildcard address would
	 * otherwise answer from its route's (a client of 127.0.0.2, or of a
	 * host's second address, never heard the answer) */
	if (fs_wire_probe_encode(&reply, out, sizeof(out)) == FS_WIRE_PROBE_LEN)
		fs_udp_send_from(l->udp_fd, out, sizeof(out), MSG_DONTWAIT | MSG_NOSIGNAL, (const struct sockaddr *)from,
				 fromlen, local);
	if (answer == FS_PROBE_YES)
		FS_STAT_INC(probes_answered_yes);
	else
		FS_STAT_INC(probes_answered_no);
}

void fs_listener_drain(struct fs_listener *l)
{
	if (l->udp_fd < 0)
		return; /* attached (fs_listener_attach): another process answers */
	for (int i = 0; i < 256; i++) {
		uint8_t pkt[FS_WIRE_PROBE_LEN + 1], local[16];
		struct sockaddr_storage from;
		socklen_t fromlen;
		/* with the local address the probe was sent to: the connection's */
		ssize_t n = fs_udp_recv(l->udp_fd, pkt, sizeof(pkt), &from, &fromlen, local);
		static const uint8_t any[16];

		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		fs_listener_answer(l, pkt, n, &from, fromlen, local, memcmp(local, any, 16) != 0);
	}
}

/* ---- client side ------------------------------------------------------- */

int fs_probe_start(struct fs_probe_client *pc, int fd, const struct sockaddr *peer)
{
	struct sockaddr_storage local;
	socklen_t len = sizeof(local);
	struct fs_probe ask = { .type = FS_PROBE_ASK };
	uint8_t pkt[FS_WIRE_PROBE_LEN];
	socklen_t peerlen = peer->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	int udp;

	pc->udp_fd = -1;
	if (fs_params.test_probe_delay_ms)
		usleep((useconds_t)(fs_params.test_probe_delay_ms * 1000));
	if (fs_real.getsockname(fd, (struct sockaddr *)&local, &len))
		return -errno;
	fs_sockaddr_key((struct sockaddr *)&local, ask.client_addr, &ask.client_port);
	if (getrandom(&ask.nonce, sizeof(ask.nonce), GRND_NONBLOCK) != sizeof(ask.nonce))
		ask.nonce = fs_now_ns() ^ ((uint64_t)fs_self_pid() << 32);
	ask.wait_ms = (uint32_t)fs_params.probe_timeout_ms;
	if (fs_wire_probe_encode(&ask, pkt, sizeof(pkt)) != FS_WIRE_PROBE_LEN)
		return -EINVAL;
	udp = fs_real.socket(local.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (udp < 0)
		return -errno;
	/* Send from the TCP connection's own address so the server can check
	 * that the probe speaks for this connection. */
	if (local.ss_family == AF_INET)
		((struct sockaddr_in *)&local)->sin_port = 0;
	else
		((struct sockaddr_in6 *)&local)->sin6_port = 0;
	if (fs_real.bind(udp, (struct sockaddr *)&local, len) || fs_real.connect(udp, peer, peerlen) ||
	    fs_real.send(udp, pkt, sizeof(pkt), MSG_NOSIGNAL) != (ssize_t)sizeof(pkt)) {
		int err = -errno;

		fs_real.close(udp);
		return err;
	}
	FS_STAT_INC(probes_sent);
	pc->udp_fd = udp;
	pc->nonce = ask.nonce;
	pc->deadline_ns = fs_now_ns() + fs_params.probe_timeout_ms * 1000000ull;
	memcpy(pc->pkt, pkt, sizeof(pkt));
	pc->resends = 0;
	pc->resend_ns = fs_now_ns() + FS_PROBE_RESEND_FIRST_MS * 1000000ull;
	{
		struct timespec rt;
		int on = 1;

		/* the answer is judged by when it arrived, not by when a busy
		 * service thread got round to reading it */
		clock_gettime(CLOCK_REALTIME, &rt);
		pc->deadline_real_ns = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec +
				       fs_params.probe_timeout_ms * 1000000ull;
		fs_real.setsockopt(udp, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on));
	}
	return 0;
}

void fs_probe_cancel(struct fs_probe_client *pc)
{
	if (pc->udp_fd >= 0)
		fs_real.close(pc->udp_fd);
	pc->udp_fd = -1;
}

enum fs_probe_outcome fs_probe_result(struct fs_probe_client *pc, int fd, uint64_t deadline_ns,
				      bool *tcp_readable)
{
	enum fs_probe_outcome out = FS_PROBE_PENDING;
	uint64_t arrival_real = 0;
	/* The answer takes tens of microseconds on one host: a caller willing
	 * to wait polls without sleeping for FABSOCK_SPIN_US first, as a
	 * blocking receive does. Waking from a sleep costs as much again on a
	 * virtual machine, and that is on every connection's critical path. */
	uint64_t spin_end = fs_spin_end(fs_now_ns());
	unsigned step = 0;

	*tcp_readable = false;
	if (pc->udp_fd < 0)
		return FS_PROBE_OUT_TIMEOUT;
	for (;;) {
		struct pollfd pfd[2] = {
			{ .fd = pc->udp_fd, .events = POLLIN },
			{ .fd = fd, .events = POLLIN },
		};
		uint64_t now = fs_now_ns(), until = deadline_ns < pc->deadline_ns ? deadline_ns : pc->deadline_ns;
		bool spin = now < spin_end && now < until;
		int timeout_ms, ret;

		if (now >= pc->resend_ns && pc->resends < FS_PROBE_RESENDS_MAX) {
			/* no answer yet: the first datagram may have been dropped */
			fs_real.send(pc->udp_fd, pc->pkt, sizeof(pc->pkt), MSG_NOSIGNAL | MSG_DONTWAIT);
			pc->resends++;
			FS_STAT_INC(probes_resent);
			pc->resend_ns = now + ((uint64_t)FS_PROBE_RESEND_FIRST_MS << pc->resends) * 1000000ull;
		}
		if (pc->resends < FS_PROBE_RESENDS_MAX && pc->resend_ns < until)
			until = pc->resend_ns;
		timeout_ms = spin ? 0 : until > now ? (int)((until - now + 999999) / 1000000) : 0;
		ret = fs_real.poll(pfd, 2, timeout_ms);

		if (ret == 0 && spin) {
			fs_spin_relax(&step);
			continue;
		}

		if (ret < 0 && errno == EINTR)
			continue;
		if (ret > 0 && (pfd[0].revents & (POLLIN | POLLERR))) {
			uint8_t pkt[FS_WIRE_PROBE_LEN + 1];
			struct fs_probe answer;
			union {
				struct cmsghdr align;
				char bytes[128];
			} control;
			struct iovec iov = { .iov_base = pkt, .iov_len = sizeof(pkt) };
			struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &control,
					      .msg_controllen = sizeof(control) };
			ssize_t n = fs_real.recvmsg(pc->udp_fd, &msg, MSG_DONTWAIT);

			if (n < 0 && errno == ECONNREFUSED) {
				out = FS_PROBE_OUT_REFUSED;
				break;
			}
			if (n == FS_WIRE_PROBE_LEN && fs_wire_probe_decode(pkt, (size_t)n, &answer) == 0 &&
			    answer.nonce == pc->nonce &&
			    (answer.type == FS_PROBE_YES || answer.type == FS_PROBE_NO)) {
				out = answer.type == FS_PROBE_YES ? FS_PROBE_OUT_YES : FS_PROBE_OUT_NO;
				for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
					if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
						struct timespec at;

						memcpy(&at, CMSG_DATA(c), sizeof(at));
						arrival_real = (uint64_t)at.tv_sec * 1000000000ull + (uint64_t)at.tv_nsec;
					}
				}
				break;
			}
			continue; /* anything else is not an answer to us */
		}
		if (ret > 0 && (pfd[1].revents & (POLLIN | POLLHUP | POLLERR))) {
			*tcp_readable = true;
			return FS_PROBE_PENDING;
		}
		if (fs_now_ns() >= pc->deadline_ns) {
			out = FS_PROBE_OUT_TIMEOUT;
			break;
		}
		if (fs_now_ns() >= deadline_ns)
			return FS_PROBE_PENDING;
	}
	/* A yes that arrived after our deadline is too late: the server may
	 * have stopped waiting for the HELLO. Judged by the kernel's arrival
	 * stamp where there is one (the server waits seconds beyond our
	 * deadline, so reading it late is fine); else by now. */
	if (out == FS_PROBE_OUT_YES &&
	    (arrival_real ? arrival_real > pc->deadline_real_ns : fs_now_ns() > pc->deadline_ns + 5000000ull))
		out = FS_PROBE_OUT_TIMEOUT;
	/* The server may have spoken first after all. */
	if (out == FS_PROBE_OUT_YES) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (fs_real.poll(&p, 1, 0) > 0)
			*tcp_readable = true;
	}
	fs_probe_cancel(pc);
	return out;
}
