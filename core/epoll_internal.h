/* SPDX-License-Identifier: MIT */
/*
 * epoll internals shared by epoll.c (member records, instances, epoll_ctl)
 * and epoll_wait.c (the wait and its readiness scans) only.
 *
 * Lock order: fs_epoll.lock, then fs_sock.lock, then the engine lock
 * (every lock: core/locks.h).
 */
#ifndef FS_CORE_EPOLL_INTERNAL_H
#define FS_CORE_EPOLL_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/types.h>

/* The one table of these files, the members by (descriptor, socket
 * record), fs_member_key: 16 bytes, two words, always. uthash's own hash
 * (Jenkins over the bytes) and its memcmp cost 128 instructions a lookup
 * (callgrind, an nginx worker serving a plain connection per request: three
 * lookups a connection, at its ADD and its close); a multiply of each word,
 * folded, and a compare of the two words are a few. */
#define HASH_FUNCTION(keyptr, keylen, hashv)                                                              \
	do {                                                                                                \
		const uint64_t *fs_hk_ = (const uint64_t *)(const void *)(keyptr);                          \
		uint64_t fs_hv_ = fs_hk_[0] * 0x9e3779b97f4a7c15ull ^ fs_hk_[1] * 0xc2b2ae3d27d4eb4full; \
		(void)(keylen);                                                                             \
		(hashv) = (unsigned)(fs_hv_ >> 32) ^ (unsigned)fs_hv_;                                      \
	} while (0)
#define HASH_KEYCMP(a, b, n)                                                                              \
	(((const uint64_t *)(const void *)(a))[0] != ((const uint64_t *)(const void *)(b))[0] ||          \
	 ((const uint64_t *)(const void *)(a))[1] != ((const uint64_t *)(const void *)(b))[1])
#include <uthash.h>

#include "core/engine.h"
#include "core/fdtable.h"
#include "core/util.h"

#define FS_EP_BATCH 64

/* What a member's kernel entry holds (epoll.c, at the top):
 * APP_OWN: the application's events and data exactly, as without fabsock
 *   (a socket not yet connected, a plain kernel socket until connect()
 *   decides); its events go to the application untranslated, and it needs
 *   no system call when the socket stays on TCP;
 * APP_EVENTS: the application's events under our tag (negotiating);
 * CONTROL: our tag, the control connection's EOF only (offloaded). */
enum fs_ep_reg { FS_EP_REG_APP_EVENTS = 1, FS_EP_REG_CONTROL = 2, FS_EP_REG_APP_OWN = 3 };

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
	struct fs_dlist rnode; /* on the ready list (or a look's batch of it) */
	/* On fs_epoll.pending (fe->lock) while not settled: see there. */
	struct fs_dlist pnode;
	uint32_t look_gen; /* the stream's event generation at its last look */
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
	unsigned nested;             /* members that are nested instances (S NULL; atomic,
				      * read without the lock: while 0, an EPOLL_CTL_MOD or DEL
				      * of a descriptor that is not a fabsock socket has no
				      * member to look for, fs_epoll_ctl_nested) */
	uint64_t out_gen; /* bumped for every output being built (atomic) */
	int wake_fd;      /* eventfd in the kernel set (FS_EP_TAG_WAKE), or -1 */
	unsigned kernel_sleepers; /* threads waiting on it in the kernel for long */
	/* The ready list: offloaded members to look at (their stream changed,
	 * or they were reported level-triggered), oldest first. rlock is a
	 * leaf: taken under fe->lock, and under the engine lock by
	 * fs_stream_changed. */
	pthread_mutex_t rlock;
	struct fs_dlist ready;
	/* The pending list (fe->lock): members that are not a settled one (an
	 * offloaded socket whose member watches its stream): new ones, those
	 * still negotiating, nested instances. Every look fixes them up and
	 * looks at them; a settled one is looked at when it is on the ready
	 * list. So a look costs what is pending and ready, not what is idle. */
	struct fs_dlist pending;
	/* A full scan (every member) runs when need_full says so, after a
	 * fork (full_pid), and when the last one is FS_EP_FULL_EVERY_NS old:
	 * a safety net for a change no stream told of (counter
	 * epoll_unsignalled, 0 unless a path forgot fs_stream_changed). */
	bool need_full;
	uint64_t full_ns;
	pid_t full_pid;
};

#define FS_EP_FULL_EVERY_NS 10000000ull

/* ---- member slots and their tags (epoll.c) ------------------------------ */

#define FS_EP_TAG_MARK (0xfab5ull << 48)
#define FS_EP_TAG_MARK_MASK (0xffffull << 48)
#define FS_EP_TAG_WAKE (FS_EP_TAG_MARK | 0xffffffffull)
#define FS_EP_CHUNK 1024u
#define FS_EP_CHUNKS 4096u /* 4 Mi members */

/* Member slots by index, in chunks published once and never freed. */
extern struct fs_ep_member *fs_ep_chunks[FS_EP_CHUNKS];
/* Instance records by epoll fd (fs_fdt_size entries; made at the first epoll_ctl). */
extern struct fs_epoll **fs_ept;
/* Per epoll fd: threads in fs_epoll_wait_plain on it (atomic counters). */
extern uint32_t *fs_ep_plain;
/* Guards making fs_ept and fs_ep_plain, and the records' publication. */
extern pthread_mutex_t fs_ept_lock;

/* The member of FE that TAG names, or NULL: not a tag of ours (*OURS
 * false: the application's own data), or a member since gone. */
static inline struct fs_ep_member *fs_member_by_tag(struct fs_epoll *fe, uint64_t tag, bool *ours)
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

/* EPFD's instance record, or NULL. */
static inline struct fs_epoll *fs_epoll_peek(int epfd)
{
	/* the table is made once, by the first epoll_ctl, while other threads
	 * may already be looking */
	struct fs_epoll **table = __atomic_load_n(&fs_ept, __ATOMIC_ACQUIRE);

	if (!table || epfd < 0 || (size_t)epfd >= fs_fdt_size)
		return NULL;
	return __atomic_load_n(&table[epfd], __ATOMIC_ACQUIRE);
}

/* Whether M is on its instance's pending list. */
static inline bool fs_member_pending(const struct fs_ep_member *m)
{
	return fs_dlist_linked(&m->pnode);
}

static inline struct fs_ep_member *fs_member_of_pnode(struct fs_dlist *node)
{
	return (struct fs_ep_member *)((char *)node - offsetof(struct fs_ep_member, pnode));
}

static inline struct fs_ep_member *fs_member_of_rnode(struct fs_dlist *node)
{
	return (struct fs_ep_member *)((char *)node - offsetof(struct fs_ep_member, rnode));
}

/* Defined in epoll.c, used by epoll_wait.c. fe->lock held unless said. */

/* Queues M on FE's ready list (takes fe->rlock, a leaf). */
void fs_ready_push(struct fs_epoll *fe, struct fs_ep_member *m);
/* Brings M's kernel registration in line with its socket's state, and M
 * onto or off the pending list; false if M was freed (closed, or left to
 * the kernel). */
bool fs_member_fixup(struct fs_epoll *fe, struct fs_ep_member *m);
/* Level readiness of EPFD's members, nesting bounded by DEPTH (takes the
 * instance's lock). */
bool fs_epoll_peek_ready_depth(int epfd, int depth);

#endif
