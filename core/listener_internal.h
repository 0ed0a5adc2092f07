/* SPDX-License-Identifier: MIT */
/*
 * What listener.c (answers, records, opening and closing) and twin.c (the
 * twin's socket and lifetime, the application's UDP port) share.
 */
#ifndef FS_CORE_LISTENER_INTERNAL_H
#define FS_CORE_LISTENER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/listener.h"
#include "core/records.h"

/* Records of connections in negotiation, and of those settled in the last
 * FS_PROBE_SETTLED_TTL_NS: room for a burst of 16,384 connections to one
 * listener (a table is 640 KiB of address space, resident where used). */
#define FS_PROBE_TABLE_SLOTS 16384u
#define FS_PROBE_TABLE_USERS 64
/* A closed listener's twin waits at most this long for the probes of the
 * connections it accepted (a client probes as its connect() returns, about
 * when the server's accept() does; it sends again after 30, 60 and 120 ms). */
#define FS_TWIN_CLOSE_GRACE_NS (500ull * 1000000ull)
/* A live listener without its twin binds it again: after a bind that found
 * the port taken, from FS_TWIN_RETRY_FIRST_MS doubling to the maximum; after
 * the application took the port (it closing that socket retries at once). */
#define FS_TWIN_RETRY_FIRST_MS 50u
#define FS_TWIN_RETRY_YIELDED_MS 1000u
#define FS_TWIN_RETRY_MAX_MS 4000u
/* How long a bind waits for a twin this process let go to be gone. */
#define FS_TWIN_BIND_SOON_MS 200

struct fs_probe_table {
	pthread_mutex_t lock; /* process-shared, robust */
	struct fs_probe_rec rec[FS_PROBE_TABLE_SLOTS];
	/* A table shared by SO_REUSEPORT listeners of several processes (a
	 * named file, see fs_probe_table_shared): which processes use it. */
	uint32_t ready;
	int32_t users[FS_PROBE_TABLE_USERS];
	/* A private table: the pid whose service thread answers the twin's
	 * probes while the twin is bound there (0: none). A forked child that
	 * accepts from the listener leaves the answering to it while it lives
	 * (fs_listener_answered). */
	int32_t answerer;
	/* Records in state YES (under the lock; read without it): while 0, a
	 * plain client's first read need not look for its record (a "yes"
	 * given after the look is found by the claim after the read, as
	 * before). A count an older build sharing the table does not keep
	 * only costs that look (fs_listener_yes_none). */
	uint32_t yes_live;
	/* Plain listeners (core/plain.h): bumped by an answerer that said no
	 * for an untracked connection (every process of the listener tracks
	 * its connections again); per client port, the untracked connections
	 * held (atomic) and when that count was last lowered (coarse
	 * monotonic ms, | 1; 0: never). Untouched pages cost nothing. */
	uint32_t plain_gen;
	/* a process of the listener let go of an untracked connection another
	 * process may hold (a fork-per-connection server): never plain again */
	uint32_t plain_off;
	uint32_t plain_live[65536];
	uint32_t plain_closed_ms[65536];
};

struct fs_listener {
	/* the twin while twin_bound; else a placeholder (an unbound AF_UNIX
	 * socket under the same number, which never reads anything) or -1:
	 * the number stays valid for whoever polls or drains it meanwhile */
	int udp_fd;
	uint16_t port;
	/* the twin's address and options: the listening socket's (a twin bound
	 * again later cannot look at that socket, which may be gone) */
	struct sockaddr_storage addr;
	socklen_t addrlen;
	int v6only;
	bool reuseport;
	/* The twin (fs_listeners_lock): bound from listen() to close() unless
	 * the application binds the UDP port itself, which it always gets
	 * (fs_listeners_yield); a live listener without it tries again at
	 * twin_retry_ns (fs_twin_timer_fire), a closed one lets it go once no
	 * connection it accepted waits for a probe (unsettled), at most
	 * FS_TWIN_CLOSE_GRACE_NS after the close. */
	bool twin_bound;
	uint64_t twin_retry_ns; /* 0: no retry due */
	unsigned twin_retry_ms;
	uint64_t closed_ns;
	int unsettled; /* accepted with the twin bound, still SERVER_PENDING (atomic) */
	int refs;
	pid_t pid; /* the process whose service thread watches udp_fd */
	/* in a forked child: table->answerer was seen alive until then (atomic) */
	uint64_t answerer_seen_until_ns; /* fs_now_coarse_ns */
	/* the application's listening socket (its latest, for a reopened
	 * listener): a forked child that still holds it there listens too
	 * (fs_listeners_inherit) */
	int app_fd;
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
	/* plain listeners (core/plain.h), this process's view: connections
	 * from this host that settled without the fabric in a row (atomic),
	 * whether its connections from this host go untracked (atomic), the
	 * table's plain_gen then, and its slot among the plain tables (0:
	 * none; the table is then never unmapped, marks may name it) */
	unsigned plain_streak;
	bool plain;
	uint32_t plain_gen_seen;
	unsigned plain_handle;
	/* its listener record (core/records.h): inode 0 when none */
	struct fs_record_pub rec;
	struct fs_listener *next;
};

/* A forked child notes the listeners its parent had, from the parent's list
 * as the child sees it (fs_listeners_after_fork, before dropping it). */
void fs_listeners_inherit(const struct fs_listener *parents);
/* This process accepted a connection from L: if L is inherited, its
 * connections to L stay on TCP from now on (fs_listeners_own). */
void fs_listeners_accepted(const struct fs_listener *l);

/* The listeners whose twins the service thread polls (fs_listeners_fds),
 * newest first. Lock order: the service thread takes fs_listeners_lock
 * inside its own lock (fs_listeners_count, fs_listeners_add_fds), never the
 * other way. */
extern pthread_mutex_t fs_listeners_lock;
extern struct fs_listener *fs_service_listeners;

/* twin.c: binds L's twin (0 or -errno), the same waiting up to
 * FS_TWIN_BIND_SOON_MS for a twin this process just let go, lets it go;
 * fs_listeners_lock held (or L not published yet). */
int fs_twin_bind(struct fs_listener *l);
int fs_twin_bind_soon(struct fs_listener *l);
void fs_twin_release(struct fs_listener *l);
/* The twins' timer fires at AT (0: not needed) or earlier. Never with
 * fs_listeners_lock held (it takes fs_service_lock). */
void fs_twin_timer_arm(uint64_t at);
void fs_twin_after_fork(void);

#endif
