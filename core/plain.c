/* SPDX-License-Identifier: MIT */
/*
 * Plain listeners: see plain.h and docs/design.md ("Plain listeners").
 *
 * The order that keeps a "yes" from an untracked connection (Dekker's): the
 * accept raises its port's count, fences, and reads the table's count of
 * YES records; the answerer records its YES (yes_live raised), fences, and
 * reads the port's count. One of the two sees the other: an accept that
 * sees a YES anywhere in the table tracks the connection as before, an
 * answer that sees the count takes its YES back and says no.
 */
#include "core/plain.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#include "config/log.h"
#include "config/params.h"
#include "config/rules.h"
#include "core/fdtable.h"
#include "core/listener_internal.h"
#include "core/negotiate.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/udp.h"
#include "core/util.h"
#include "core/wire.h"

/* Listeners of this process that turned plain once: their tables stay
 * mapped for good (a mark names its table by slot; a close may come after
 * the listener is gone), so at most this many per process. */
#define FS_PLAIN_TABLES 64u
/* A probe's client counts its wait from its connect(); the coarse clock
 * the stamps are read with lags by a tick at most. */
#define FS_PLAIN_CLOCK_SLACK_MS 20u

uint64_t *fs_plain_marks;
unsigned long fs_plain_marks_size;
static struct fs_probe_table *fs_plain_tables[FS_PLAIN_TABLES];
static unsigned fs_plain_tables_n;
static pthread_mutex_t fs_plain_lock = PTHREAD_MUTEX_INITIALIZER;

/* A mark: the fs_fds_spread of its accept (high word), its table's slot
 * (bits 16-23, from 1) and the client port (low 16 bits). */
static uint64_t fs_plain_mark(unsigned spread, unsigned slot, uint16_t port)
{
	return (uint64_t)spread << 32 | (uint64_t)slot << 16 | port;
}

static uint32_t fs_plain_now_ms(void)
{
	return (uint32_t)(fs_now_coarse_ns() / 1000000u) | 1u;
}

/* One fewer untracked connection from PORT in T, stamped first (a probe
 * that reads the lower count reads the stamp too). */
static void fs_plain_lower(struct fs_probe_table *t, uint16_t port, bool stamp)
{
	uint32_t n = __atomic_load_n(&t->plain_live[port], __ATOMIC_RELAXED);

	if (stamp)
		__atomic_store_n(&t->plain_closed_ms[port], fs_plain_now_ms(), __ATOMIC_RELEASE);
	while (n && !__atomic_compare_exchange_n(&t->plain_live[port], &n, n - 1, false, __ATOMIC_SEQ_CST,
						 __ATOMIC_RELAXED))
		;
}

/* The marks' table, mapped at its first use. fs_plain_lock held. */
static uint64_t *fs_plain_marks_map(void)
{
	uint64_t *marks = __atomic_load_n(&fs_plain_marks, __ATOMIC_ACQUIRE);

	if (!marks && fs_fdt_size) {
		marks = fs_fd_table_map(fs_fdt_size, sizeof(*marks));
		if (!marks)
			return NULL;
		fs_plain_marks_size = fs_fdt_size;
		__atomic_store_n(&fs_plain_marks, marks, __ATOMIC_RELEASE);
	}
	return marks;
}

void fs_plain_note_socket(int fd)
{
	uint64_t *marks = __atomic_load_n(&fs_plain_marks, __ATOMIC_ACQUIRE), none = 0;

	if (!marks) {
		pthread_mutex_lock(&fs_plain_lock);
		marks = fs_plain_marks_map();
		pthread_mutex_unlock(&fs_plain_lock);
	}
	if (marks && fd >= 0 && (unsigned long)fd < fs_plain_marks_size)
		__atomic_compare_exchange_n(&marks[fd], &none, FS_PLAIN_SOCKET, false, __ATOMIC_ACQ_REL,
					    __ATOMIC_RELAXED);
}

/* L turns plain in this process: a slot for its table, the marks' table. */
static void fs_plain_begin(struct fs_listener *l)
{
	uint64_t *marks;

	pthread_mutex_lock(&fs_plain_lock);
	if (__atomic_load_n(&l->plain, __ATOMIC_RELAXED))
		goto out;
	if (!l->plain_handle) {
		if (fs_plain_tables_n >= FS_PLAIN_TABLES)
			goto out;
		__atomic_store_n(&fs_plain_tables[fs_plain_tables_n++], l->table, __ATOMIC_RELEASE);
		__atomic_store_n(&l->plain_handle, fs_plain_tables_n, __ATOMIC_RELEASE);
	}
	marks = fs_plain_marks_map();
	if (!marks)
		goto out;
	__atomic_store_n(&l->plain_gen_seen, __atomic_load_n(&l->table->plain_gen, __ATOMIC_ACQUIRE), __ATOMIC_RELAXED);
	__atomic_store_n(&l->plain, true, __ATOMIC_RELEASE);
	FS_STAT_INC(plain_listeners);
	FS_INFO("listener on port %u: its last %u connections from this host stayed on kernel TCP; "
		"later ones are not tracked until a client probes", l->port,
		(unsigned)fs_params.plain_after);
out:
	pthread_mutex_unlock(&fs_plain_lock);
}

/* Whether L may turn plain at all: its own table (a table shared with
 * SO_REUSEPORT listeners of other programs may be an older build's,
 * without the counts), its probe twin bound (no other twin answers for
 * it), no rules and no TCP first (both may send a HELLO without a "yes"
 * and expect it read). */
static bool fs_plain_allowed(const struct fs_listener *l)
{
	return fs_params.plain_after && !l->shared_table && l->table && l->table != MAP_FAILED &&
	       !__atomic_load_n(&l->table->plain_off, __ATOMIC_ACQUIRE) &&
	       !fs_params.tcp_first && !fs_rules_global.count && fs_fdt_size &&
	       !__atomic_load_n(&l->closed, __ATOMIC_ACQUIRE) && __atomic_load_n(&l->twin_bound, __ATOMIC_ACQUIRE);
}

bool fs_plain_loopback(const struct sockaddr *addr)
{
	uint8_t key[16];
	uint16_t port;

	if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)
		return false;
	fs_sockaddr_key(addr, key, &port);
	return fs_negotiate_loopback(key);
}

void fs_plain_settled(struct fs_listener *l, bool wanted)
{
	if (wanted) {
		__atomic_store_n(&l->plain_streak, 0, __ATOMIC_RELAXED);
		if (__atomic_load_n(&l->plain, __ATOMIC_RELAXED))
			__atomic_store_n(&l->plain, false, __ATOMIC_RELEASE);
		return;
	}
	if (__atomic_add_fetch(&l->plain_streak, 1, __ATOMIC_RELAXED) >= fs_params.plain_after &&
	    !__atomic_load_n(&l->plain, __ATOMIC_RELAXED) && fs_plain_allowed(l))
		fs_plain_begin(l);
}

bool fs_plain_accept(struct fs_listener *l, int fd, const struct sockaddr *addr, const socklen_t *len,
		     socklen_t room, unsigned spread)
{
	struct fs_probe_table *t;
	uint8_t key[16];
	uint16_t port;
	uint64_t *marks, prev;
	struct fs_sock *old;

	if (!__atomic_load_n(&l->plain, __ATOMIC_ACQUIRE))
		return false;
	t = l->table;
	if (__atomic_load_n(&t->plain_gen, __ATOMIC_ACQUIRE) != __atomic_load_n(&l->plain_gen_seen, __ATOMIC_RELAXED) ||
	    __atomic_load_n(&t->plain_off, __ATOMIC_ACQUIRE) || !__atomic_load_n(&l->twin_bound, __ATOMIC_ACQUIRE)) {
		/* a client probed and was refused (or the twin is gone): track
		 * again, from a new streak */
		__atomic_store_n(&l->plain, false, __ATOMIC_RELEASE);
		__atomic_store_n(&l->plain_streak, 0, __ATOMIC_RELAXED);
		FS_STAT_INC(plain_ended);
		FS_INFO("listener on port %u: a client probed; its connections are tracked again", l->port);
		return false;
	}
	if (!addr || !len || *len > room || *len < sizeof(sa_family_t) ||
	    (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
		return false;
	fs_sockaddr_key(addr, key, &port);
	marks = __atomic_load_n(&fs_plain_marks, __ATOMIC_ACQUIRE);
	if (!fs_negotiate_loopback(key) || !marks || fd < 0 || (unsigned long)fd >= fs_plain_marks_size)
		return false;
	__atomic_add_fetch(&t->plain_live[port], 1, __ATOMIC_SEQ_CST);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&t->yes_live, __ATOMIC_SEQ_CST)) {
		/* a "yes" is out, maybe for this connection: tracked (its
		 * record decides, as before) */
		fs_plain_lower(t, port, false);
		FS_STAT_INC(plain_tracked_yes);
		return false;
	}
	/* a record left at this number by a close fabsock did not see */
	old = fs_fdt_peek(fd);
	if (old && (old = fs_fdt_set(fd, NULL)) && old != FS_SOCK_INTERNAL)
		fs_sock_put(old);
	prev = __atomic_exchange_n(&marks[fd], fs_plain_mark(spread, l->plain_handle, port), __ATOMIC_ACQ_REL);
	if (prev)
		fs_plain_release(prev);
	FS_STAT_INC(plain_accepted);
	return true;
}

bool fs_plain_refuses(struct fs_probe_table *t, uint16_t port, uint32_t wait_ms)
{
	uint32_t closed;

	if (wait_ms > FS_WIRE_PROBE_WAIT_MAX_MS)
		wait_ms = FS_WIRE_PROBE_WAIT_MAX_MS;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (!__atomic_load_n(&t->plain_live[port], __ATOMIC_SEQ_CST)) {
		closed = __atomic_load_n(&t->plain_closed_ms[port], __ATOMIC_ACQUIRE);
		if (!closed || fs_plain_now_ms() - closed > wait_ms + FS_PLAIN_CLOCK_SLACK_MS)
			return false;
	}
	__atomic_add_fetch(&t->plain_gen, 1, __ATOMIC_ACQ_REL);
	FS_STAT_INC(plain_probes_refused);
	return true;
}

void fs_plain_release(uint64_t mark)
{
	unsigned slot = (unsigned)(mark >> 16) & 0xffu;
	struct fs_probe_table *t;

	if (!slot || slot > FS_PLAIN_TABLES || !(t = __atomic_load_n(&fs_plain_tables[slot - 1], __ATOMIC_ACQUIRE)))
		return;
	if ((uint32_t)(mark >> 32) != __atomic_load_n(&fs_fds_spread, __ATOMIC_SEQ_CST)) {
		/* another process may hold the connection now (a fork, a
		 * spawn, SCM_RIGHTS, a duplicate): its port stays counted, and
		 * the listener is never plain again (a server that forks for
		 * each connection would block a port with each) */
		FS_STAT_INC(plain_kept);
		if (!__atomic_exchange_n(&t->plain_off, 1, __ATOMIC_ACQ_REL)) {
			FS_STAT_INC(plain_off);
			FS_INFO("a plain listener's untracked connection may be held by another process (a fork); "
				"its listener tracks every connection from now on");
		}
		return;
	}
	fs_plain_lower(t, (uint16_t)mark, true);
}

void fs_plain_restore(int fd, uint64_t mark)
{
	uint64_t *marks = __atomic_load_n(&fs_plain_marks, __ATOMIC_ACQUIRE), none = 0;

	if (mark && marks && fd >= 0 && (unsigned long)fd < fs_plain_marks_size &&
	    __atomic_compare_exchange_n(&marks[fd], &none, mark, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		return;
	if (mark)
		fs_plain_drop(mark);
}

void fs_plain_drop(uint64_t mark)
{
	/* (a close_range: most often a child's after a fork, whose marks are kept anyway) */
	if (mark > FS_PLAIN_SOCKET)
		FS_STAT_INC(plain_kept);
}

void fs_plain_dup(int fd)
{
	uint64_t *marks = __atomic_load_n(&fs_plain_marks, __ATOMIC_ACQUIRE);

	if (marks && fd >= 0 && (unsigned long)fd < fs_plain_marks_size &&
	    __atomic_load_n(&marks[fd], __ATOMIC_RELAXED) > FS_PLAIN_SOCKET)
		fs_fds_spread_note(); /* two descriptors: one close must not lower the count */
}
