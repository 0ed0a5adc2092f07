/* SPDX-License-Identifier: MIT */
/*
 * The probe twin's socket and its lifetime (listener_internal.h): bound
 * while its listener listens, let go when the listener closes (after a
 * short grace for the probes of connections it accepted), given up to the
 * application's own UDP bind on the port and bound again when the
 * application lets the port go. docs/design.md, "The twin and the
 * application's UDP port" (issue 26).
 */
#include "core/listener_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/log.h"
#include "core/fdtable.h"
#include "core/service.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/udp.h"
#include "core/util.h"
#include "preload/real.h"

#define FS_PROBE_RCVBUF (4 << 20)

/* A UDP twin for L, not bound yet: the listening socket's IPV6_V6ONLY, and
 * its SO_REUSEPORT (never SO_REUSEADDR: a twin must never share its port
 * with an application's socket, whose bind then fails and takes the port
 * from the twin instead, fs_listeners_yield), with room for a burst of
 * probes. Returns the socket, or -1. */
static int fs_listener_twin(const struct fs_listener *l)
{
	int udp, one = 1;

	udp = fs_real.socket(l->addr.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (udp < 0)
		return -1;
	if (l->addr.ss_family == AF_INET6)
		fs_real.setsockopt(udp, IPPROTO_IPV6, IPV6_V6ONLY, &l->v6only, sizeof(l->v6only));
	if (l->reuseport)
		fs_real.setsockopt(udp, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
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
	return udp;
}

/* Binds L's twin: 0, or -errno (EADDRINUSE: the port is another socket's,
 * the application's or another process's). The socket takes the number of
 * L's placeholder. fs_listeners_lock held, or L not published yet. */
int fs_twin_bind(struct fs_listener *l)
{
	int udp = fs_listener_twin(l), err;

	if (udp < 0)
		return -errno;
	if (fs_real.bind(udp, (struct sockaddr *)&l->addr, l->addrlen))
		goto fail;
	fs_udp_want_dest(udp, l->addr.ss_family); /* which local address each probe was sent to */
	if (l->udp_fd < 0) {
		__atomic_store_n(&l->udp_fd, udp, __ATOMIC_RELEASE);
	} else {
		if (fs_real.dup3(udp, l->udp_fd, O_CLOEXEC) < 0)
			goto fail;
		fs_real.close(udp);
	}
	__atomic_store_n(&l->twin_bound, true, __ATOMIC_RELEASE);
	l->twin_retry_ns = 0;
	fs_listener_note_answerer(l);
	return 0;
fail:
	err = -errno;
	fs_real.close(udp);
	return err;
}

/* fs_twin_bind, for a twin this process let go a moment ago: its socket
 * closes once no poll holds its file (the service thread's ends at the
 * kick, an application thread's look for a probe within
 * FABSOCK_FIRST_SEND_WAIT_MS), so a port still taken is tried again for a
 * while. A client that probes meanwhile would find the port closed and
 * keep this host as plain TCP for FABSOCK_NEG_CACHE_SEC: the listener has
 * its twin when listen() returns. fs_listeners_lock held. */
int fs_twin_bind_soon(struct fs_listener *l)
{
	int err = fs_twin_bind(l);

	for (int i = 0; i < FS_TWIN_BIND_SOON_MS && err == -EADDRINUSE; i++) {
		struct timespec ms = { 0, 1000000 };

		fs_service_kick();
		nanosleep(&ms, NULL);
		err = fs_twin_bind(l);
	}
	return err;
}

/* Lets L's twin go: the port is free once no poll holds the socket's file
 * (the caller kicks the service thread out of its poll). The number stays
 * L's, an unbound placeholder, so that a thread draining or polling it
 * meanwhile never touches a descriptor the application opened under it.
 * fs_listeners_lock held. */
void fs_twin_release(struct fs_listener *l)
{
	int placeholder;

	if (!l->twin_bound)
		return;
	__atomic_store_n(&l->twin_bound, false, __ATOMIC_RELEASE);
	fs_listener_note_answerer(l);
	placeholder = fs_real.socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (placeholder >= 0 && fs_real.dup3(placeholder, l->udp_fd, O_CLOEXEC) >= 0) {
		fs_real.close(placeholder);
		return;
	}
	/* no descriptor to spare: close it; a drain racing this reads a
	 * closed number, at worst another socket's datagram's EAGAIN */
	if (placeholder >= 0)
		fs_real.close(placeholder);
	fs_real.close(__atomic_exchange_n(&l->udp_fd, -1, __ATOMIC_ACQ_REL));
}

/* ---- the twin's timer: grace after a close, retries while the port is taken */

static struct fs_watch fs_twin_timer;
static bool fs_twin_timer_armed;
static uint64_t fs_twin_timer_at;

static void fs_twin_timer_fire(void *arg, bool timed_out)
{
	uint64_t now = fs_now_ns(), next = 0;
	bool changed = false;

	(void)arg;
	(void)timed_out;
	__atomic_store_n(&fs_twin_timer_armed, false, __ATOMIC_RELEASE);
	pthread_mutex_lock(&fs_listeners_lock);
	for (struct fs_listener *l = fs_service_listeners; l; l = l->next) {
		uint64_t due = 0;

		if (l->pid != getpid())
			continue;
		if (__atomic_load_n(&l->closed, __ATOMIC_ACQUIRE)) {
			if (!l->twin_bound)
				continue;
			if (__atomic_load_n(&l->unsettled, __ATOMIC_ACQUIRE) == 0 ||
			    now >= l->closed_ns + FS_TWIN_CLOSE_GRACE_NS) {
				fs_twin_release(l);
				changed = true;
			} else {
				due = l->closed_ns + FS_TWIN_CLOSE_GRACE_NS;
			}
		} else if (!l->twin_bound && l->twin_retry_ns) {
			if (now >= l->twin_retry_ns) {
				if (fs_twin_bind(l) == 0) {
					FS_INFO("listener on port %u: the UDP port is free again; probes answered", l->port);
					changed = true;
				} else {
					l->twin_retry_ms = l->twin_retry_ms * 2 > FS_TWIN_RETRY_MAX_MS ? FS_TWIN_RETRY_MAX_MS
												: l->twin_retry_ms * 2;
					l->twin_retry_ns = now + l->twin_retry_ms * 1000000ull;
				}
			}
			due = l->twin_retry_ns;
		}
		if (due && (!next || due < next))
			next = due;
	}
	pthread_mutex_unlock(&fs_listeners_lock);
	if (changed)
		fs_service_kick(); /* a new round polls the twins as they are now */
	fs_twin_timer_arm(next);
}

/* The twins' timer fires at AT (CLOCK_MONOTONIC; 0: not needed), or
 * earlier: it runs every due change and arms itself for the next. Takes
 * fs_service_lock: never with fs_listeners_lock held. */
void fs_twin_timer_arm(uint64_t at)
{
	if (!at)
		return;
	if (__atomic_exchange_n(&fs_twin_timer_armed, true, __ATOMIC_ACQ_REL)) {
		/* queued for later: fire now, and it arms itself for the earliest */
		if (at < __atomic_load_n(&fs_twin_timer_at, __ATOMIC_ACQUIRE))
			fs_service_watch_expire(&fs_twin_timer);
		return;
	}
	__atomic_store_n(&fs_twin_timer_at, at, __ATOMIC_RELEASE);
	fs_service_watch(&fs_twin_timer, -1, 0, at, fs_twin_timer_fire, NULL);
}

/* The application's UDP sockets bound to a port (fs_listeners_note_udp), up
 * to FS_TWIN_DISPLACERS of them: closing one lets a twin waiting for that
 * port bind at once (fs_listeners_fd_closed), before the application's
 * next connection probes. Beyond that, twins retry on their timer. */
#define FS_TWIN_DISPLACERS 64
static int fs_twin_displacers[FS_TWIN_DISPLACERS];
static uint16_t fs_twin_displacer_ports[FS_TWIN_DISPLACERS];
int fs_twin_displacers_n;

void fs_listeners_note_udp(int fd, uint16_t port)
{
	pthread_mutex_lock(&fs_listeners_lock);
	if (fs_twin_displacers_n < FS_TWIN_DISPLACERS) {
		int n = fs_twin_displacers_n;

		__atomic_store_n(&fs_twin_displacers[n], fd, __ATOMIC_RELEASE);
		fs_twin_displacer_ports[n] = port;
		__atomic_store_n(&fs_twin_displacers_n, n + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&fs_listeners_lock);
}

int fs_listeners_yield(uint16_t port, int app_fd)
{
	uint64_t now = fs_now_ns(), next = 0;
	int released = 0;

	pthread_mutex_lock(&fs_listeners_lock);
	for (struct fs_listener *l = fs_service_listeners; l; l = l->next) {
		if (l->pid != getpid() || l->port != port || !l->twin_bound)
			continue;
		fs_twin_release(l);
		released++;
		FS_STAT_INC(twins_yielded);
		FS_INFO("listener on port %u: the application binds the UDP port; the probe twin gives way "
			"(connections stay on TCP until the port is free again)", port);
		if (!__atomic_load_n(&l->closed, __ATOMIC_ACQUIRE)) {
			l->twin_retry_ms = FS_TWIN_RETRY_YIELDED_MS;
			l->twin_retry_ns = now + l->twin_retry_ms * 1000000ull;
			if (!next || l->twin_retry_ns < next)
				next = l->twin_retry_ns;
		}
	}
	pthread_mutex_unlock(&fs_listeners_lock);
	(void)app_fd;
	if (released)
		fs_service_kick(); /* its poll lets go of the twin's file */
	fs_twin_timer_arm(next);
	return released;
}

void fs_listeners_fd_closed(int fd)
{
	int n = __atomic_load_n(&fs_twin_displacers_n, __ATOMIC_ACQUIRE), i;
	bool bound = false;
	uint16_t port;

	for (i = 0; i < n && __atomic_load_n(&fs_twin_displacers[i], __ATOMIC_ACQUIRE) != fd; i++)
		;
	if (i == n)
		return; /* not one of them: the common case, without the lock */
	pthread_mutex_lock(&fs_listeners_lock);
	for (i = 0; i < fs_twin_displacers_n && fs_twin_displacers[i] != fd; i++)
		;
	if (i == fs_twin_displacers_n) {
		pthread_mutex_unlock(&fs_listeners_lock);
		return;
	}
	port = fs_twin_displacer_ports[i];
	n = fs_twin_displacers_n - 1;
	__atomic_store_n(&fs_twin_displacers[i], fs_twin_displacers[n], __ATOMIC_RELEASE);
	fs_twin_displacer_ports[i] = fs_twin_displacer_ports[n];
	__atomic_store_n(&fs_twin_displacers_n, n, __ATOMIC_RELEASE);
	/* the port may be free: the twins waiting for it bind now, in this
	 * thread, so that the application's next connection finds them */
	for (struct fs_listener *l = fs_service_listeners; l; l = l->next)
		if (l->pid == getpid() && l->port == port && !l->twin_bound && l->twin_retry_ns &&
		    !__atomic_load_n(&l->closed, __ATOMIC_ACQUIRE) && fs_twin_bind(l) == 0) {
			FS_INFO("listener on port %u: the application closed its UDP socket; probes answered again",
				port);
			bound = true;
		}
	pthread_mutex_unlock(&fs_listeners_lock);
	if (bound)
		fs_service_kick(); /* a new round polls the twin */
}

/* A client of its own process's listener stays on TCP: the connection
 * waits in the listener's queue, where no descriptor and so no fabsock
 * state exists for it, until this process accepts it, and a HELLO there is
 * answered only when the application first uses the accepted socket. A
 * thread that connects and then writes more than the pre-ACK hold (or, with
 * an empty HELLO, anything) before it accepts would wait on itself. Over
 * TCP the kernel buffers those bytes as it would for any client. */
static bool fs_key_wildcard(const uint8_t a[16])
{
	static const uint8_t any6[16];
	static const uint8_t any4[16] = { [10] = 0xff, [11] = 0xff };

	return memcmp(a, any6, 16) == 0 || memcmp(a, any4, 16) == 0;
}

/* Listening sockets a forked child inherited (a prefork worker's, sharing
 * its parent's): the parent's service thread answers their probes, but a
 * worker accepts from them too, so a connection of the worker to one of
 * them may wait in the queue for the worker itself, as for its own
 * listener: one that writes more than the pre-ACK hold before it accepts
 * waited for itself for ever. An entry counts once this process has
 * accepted from it (fs_listeners_accepted): a child that only connects
 * (a test's clients forked after listen(), holding the socket unused)
 * still offloads, since another process accepts. Kept by value: the child
 * may close the socket, and the parent's listener record (the child's
 * copy) goes with it; an entry counts only while its descriptor still
 * holds a listening socket with that record. At most FS_INHERITED_MAX
 * (further ones are not noted: their connections may wait, as before).
 * Filled only after a fork, in the single-threaded child; read and marked
 * under fs_listeners_lock. */
#define FS_INHERITED_MAX 32
static struct {
	const void *listener; /* compared, never dereferenced */
	int fd;
	uint16_t port;
	bool accepting; /* this process accepted from it */
	uint8_t addr[16];
} fs_inherited[FS_INHERITED_MAX];
static unsigned fs_inherited_n;

/* Whether entry I's descriptor still holds the listening socket it named. */
static bool fs_inherited_holds(unsigned i)
{
	struct fs_sock *s = fs_fdt_peek(fs_inherited[i].fd);

	return s && s != FS_SOCK_INTERNAL && fs_sock_state(s) == FS_SOCK_LISTENING &&
	       (const void *)s->listener == fs_inherited[i].listener;
}

void fs_listeners_inherit(const struct fs_listener *parents)
{
	unsigned kept = 0;

	/* a grandchild holds what its parent inherited, while it still does;
	 * it has accepted from none of them yet */
	for (unsigned i = 0; i < fs_inherited_n; i++)
		if (fs_inherited_holds(i)) {
			fs_inherited[kept] = fs_inherited[i];
			fs_inherited[kept++].accepting = false;
		}
	for (const struct fs_listener *l = parents; l && kept < FS_INHERITED_MAX; l = l->next) {
		uint16_t port;

		if (__atomic_load_n(&l->closed, __ATOMIC_ACQUIRE) || l->app_fd < 0)
			continue;
		fs_inherited[kept].listener = l;
		fs_inherited[kept].fd = l->app_fd;
		fs_inherited[kept].accepting = false;
		fs_sockaddr_key((const struct sockaddr *)&l->addr, fs_inherited[kept].addr, &port);
		fs_inherited[kept].port = l->port;
		if (fs_inherited_holds(kept))
			kept++;
	}
	__atomic_store_n(&fs_inherited_n, kept, __ATOMIC_RELEASE);
}

void fs_listeners_accepted(const struct fs_listener *l)
{
	if (!__atomic_load_n(&fs_inherited_n, __ATOMIC_ACQUIRE) || l->pid == fs_self_pid())
		return; /* our own listener: fs_listeners_own knows it */
	pthread_mutex_lock(&fs_listeners_lock);
	for (unsigned i = 0; i < fs_inherited_n; i++)
		if (fs_inherited[i].listener == (const void *)l)
			fs_inherited[i].accepting = true;
	pthread_mutex_unlock(&fs_listeners_lock);
}

bool fs_listeners_own(const struct sockaddr *peer)
{
	uint8_t want[16], have[16];
	uint16_t port, lport;
	bool own = false;

	if (!__atomic_load_n(&fs_service_listeners, __ATOMIC_ACQUIRE) && !__atomic_load_n(&fs_inherited_n, __ATOMIC_ACQUIRE))
		return false; /* a process that listens on nothing: no lock */
	fs_sockaddr_key(peer, want, &port);
	pthread_mutex_lock(&fs_listeners_lock);
	for (struct fs_listener *l = fs_service_listeners; l && !own; l = l->next) {
		if (l->pid != fs_self_pid() || l->port != port || __atomic_load_n(&l->closed, __ATOMIC_ACQUIRE))
			continue;
		fs_sockaddr_key((const struct sockaddr *)&l->addr, have, &lport);
		own = fs_key_wildcard(have) || memcmp(have, want, 16) == 0;
	}
	for (unsigned i = 0; i < fs_inherited_n && !own; i++)
		own = fs_inherited[i].port == port && fs_inherited[i].accepting && fs_inherited_holds(i) &&
		      (fs_key_wildcard(fs_inherited[i].addr) || memcmp(fs_inherited[i].addr, want, 16) == 0);
	pthread_mutex_unlock(&fs_listeners_lock);
	return own;
}

/* The client ends of the last FS_OWN_CLIENTS connections kept on TCP
 * because their listener is ours (fs_listeners_own), for the server end:
 * such a client sends no HELLO, so a server that speaks first must not wait
 * for one (an `offload` rule vouching for the address made it wait its
 * 3.25 s). The server end takes its entry. A stale one (a connection
 * whose server end was never used, its port reused since by a client of
 * another process) only makes that server not wait, and strip a HELLO that
 * comes later. */
#define FS_OWN_CLIENTS 64
static struct {
	uint8_t addr[16];
	uint16_t port; /* 0: empty */
} fs_own_clients[FS_OWN_CLIENTS];
static unsigned fs_own_clients_next;

void fs_listeners_own_client(const struct sockaddr *local)
{
	unsigned i;

	pthread_mutex_lock(&fs_listeners_lock);
	i = fs_own_clients_next++ % FS_OWN_CLIENTS;
	fs_sockaddr_key(local, fs_own_clients[i].addr, &fs_own_clients[i].port);
	pthread_mutex_unlock(&fs_listeners_lock);
}

bool fs_listeners_is_own_client(const uint8_t addr[16], uint16_t port)
{
	bool own = false;

	if (!__atomic_load_n(&fs_own_clients_next, __ATOMIC_ACQUIRE))
		return false;
	pthread_mutex_lock(&fs_listeners_lock);
	for (unsigned i = 0; i < FS_OWN_CLIENTS && !own; i++) {
		own = fs_own_clients[i].port == port && memcmp(fs_own_clients[i].addr, addr, 16) == 0;
		if (own)
			fs_own_clients[i].port = 0; /* one server end per connection */
	}
	pthread_mutex_unlock(&fs_listeners_lock);
	return own;
}

void fs_twin_after_fork(void)
{
	fs_twin_displacers_n = 0;
	__atomic_store_n(&fs_twin_timer_armed, false, __ATOMIC_RELEASE);
	/* the parent's clients are not this process's */
	memset(fs_own_clients, 0, sizeof(fs_own_clients));
	fs_own_clients_next = 0;
}
