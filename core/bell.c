/* SPDX-License-Identifier: MIT */
/*
 * The doorbell (see bell.h): one UDP socket per process, ARM and RING
 * datagrams.
 */
#include "core/bell.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/ring.h"
#include "core/service.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/udp.h"
#include "core/wire.h"
#include "preload/real.h"

static pthread_mutex_t fs_bell_lock = PTHREAD_MUTEX_INITIALIZER;
static int fs_bell_sock = -1;
static int fs_bell_family;
static uint16_t fs_bell_local_port;
static pid_t fs_bell_pid;
static bool fs_bell_failed;

/* Dual-stack where the host has IPv6, else IPv4 only. */
static int fs_bell_open_locked(void)
{
	static const int families[] = { AF_INET6, AF_INET };

	for (unsigned i = 0; i < 2; i++) {
		struct sockaddr_storage ss = { 0 };
		socklen_t len = families[i] == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
		int fd = fs_real.socket(families[i], SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), off = 0;

		if (fd < 0)
			continue;
		ss.ss_family = (sa_family_t)families[i];
		if (families[i] == AF_INET6)
			fs_real.setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
		fs_udp_want_dest(fd, families[i]); /* where each datagram came to (fs_bell_drain) */
		if (fs_real.bind(fd, (struct sockaddr *)&ss, len) || fs_real.getsockname(fd, (struct sockaddr *)&ss, &len)) {
			fs_real.close(fd);
			continue;
		}
		fs_bell_family = families[i];
		fs_bell_local_port = ntohs(families[i] == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
								   : ((struct sockaddr_in *)&ss)->sin_port);
		{
			/* room for a burst of ARMs from a peer with many streams */
			int rcvbuf = 1 << 20;

			fs_real.setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
		}
		fs_bell_pid = fs_self_pid();
		__atomic_store_n(&fs_bell_sock, fs_internal_fd(fd), __ATOMIC_RELEASE);
		return 0;
	}
	return -1;
}

uint16_t fs_bell_port(void)
{
	uint16_t port = 0;
	bool opened = false;

	if (!fs_params.doorbell)
		return 0;
	pthread_mutex_lock(&fs_bell_lock);
	if (fs_bell_sock < 0 && !fs_bell_failed) {
		if (fs_bell_open_locked()) {
			fs_bell_failed = true;
			FS_INFO("no doorbell socket (%s): idle waiters keep polling", strerror(errno));
		} else {
			opened = true;
			fs_ring_open(fs_bell_local_port); /* peers of this host ring it instead */
		}
	}
	if (fs_bell_sock >= 0)
		port = fs_bell_local_port;
	pthread_mutex_unlock(&fs_bell_lock);
	if (opened)
		fs_service_kick(); /* the service thread adds the bell to its set */
	return port;
}

int fs_bell_fd(void)
{
	return __atomic_load_n(&fs_bell_sock, __ATOMIC_ACQUIRE);
}

void fs_bell_after_fork(void)
{
	pthread_mutex_init(&fs_bell_lock, NULL);
	if (fs_bell_sock >= 0 && fs_bell_pid != fs_self_pid()) {
		fs_internal_fd_close(fs_bell_sock); /* the child's copy only */
		__atomic_store_n(&fs_bell_sock, -1, __ATOMIC_RELEASE);
	}
	fs_ring_after_fork();
	fs_bell_failed = false;
}

void fs_bell_set_peer(struct fs_stream *s, const struct sockaddr *peer, const struct sockaddr *local, uint16_t port)
{
	uint16_t local_port;

	memset(&s->bell_addr, 0, sizeof(s->bell_addr));
	memset(s->bell_local, 0, sizeof(s->bell_local));
	if (!port || !peer || !local)
		return;
	fs_sockaddr_key(local, s->bell_local, &local_port);
	if (peer->sa_family == AF_INET6) {
		s->bell_addr = *(const struct sockaddr_in6 *)peer;
	} else if (peer->sa_family == AF_INET) {
		/* as a v4-mapped address; sent from an IPv4 socket it is unmapped */
		s->bell_addr.sin6_family = AF_INET6;
		s->bell_addr.sin6_addr.s6_addr[10] = 0xff;
		s->bell_addr.sin6_addr.s6_addr[11] = 0xff;
		memcpy(&s->bell_addr.sin6_addr.s6_addr[12], &((const struct sockaddr_in *)peer)->sin_addr, 4);
	} else {
		return;
	}
	s->bell_addr.sin6_port = htons(port);
	fs_ring_prepare(s); /* a peer of this host: fetch its eventfd meanwhile */
	/* an ARM that came before the address (bell.c: fs_bell_on_arm), and a
	 * message already posted: it asked for this ring */
	if (s->peer_armed && (s->tx_seq || s->ctrl_sent))
		fs_bell_ring(s);
}

/* Sends a datagram to the doorbell of S's peer, from our address of the
 * TCP connection (the peer takes ARMs only from there; a host with several
 * addresses would otherwise send from its route's). */
static int fs_bell_send(const struct fs_stream *s, const uint8_t *buf, size_t len)
{
	const struct sockaddr_in6 *a6 = &s->bell_addr;
	struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = a6->sin6_port };
	int fd = fs_bell_fd();

	if (fd < 0 || !a6->sin6_port)
		return -1;
	if (fs_bell_family == AF_INET6)
		return fs_udp_send_from(fd, buf, len, MSG_NOSIGNAL, (const struct sockaddr *)a6, sizeof(*a6),
					s->bell_local) < 0 ? -1 : 0;
	if (!IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr))
		return -1;
	memcpy(&a4.sin_addr, &a6->sin6_addr.s6_addr[12], 4);
	return fs_udp_send_from(fd, buf, len, MSG_NOSIGNAL, (const struct sockaddr *)&a4, sizeof(a4), s->bell_local) < 0
		       ? -1
		       : 0;
}

void fs_bell_ring(struct fs_stream *s)
{
	/* the stream it rings for: the peer takes it only from this stream's
	 * addresses and with its token (fs_bell_drain) */
	struct fs_bell_entry ent = { .stream_id = s->peer_id, .token = (uint32_t)s->token, .data_seen = s->rx_msgs,
				     .ctrl_seen = s->ctrl_processed };
	uint8_t buf[FS_WIRE_BELL_HDR + FS_WIRE_BELL_ENTRY];
	int len = fs_wire_bell_encode(FS_BELL_RING, &ent, 1, buf, sizeof(buf));

	if (!s->bell_addr.sin6_port)
		return; /* not known yet: fs_bell_set_peer rings */
	s->peer_armed = false;
	if (len > 0 && fs_bell_send(s, buf, (size_t)len) == 0)
		FS_STAT_INC(bell_rings_sent);
}

void fs_bell_ring_posted(struct fs_stream *s)
{
	/* the message just posted disarms the stream at the peer (ring.h):
	 * this ring need not name it */
	if (s->bell_addr.sin6_port && fs_ring_peer(s)) {
		s->peer_armed = false;
		FS_STAT_INC(bell_rings_sent);
		FS_STAT_INC(bell_rings_local);
		return;
	}
	fs_bell_ring(s);
}

/* Streams whose peer will send nothing more need no ring: they are left
 * unarmed without holding the rest back. */
static bool fs_bell_quiet(const struct fs_stream *s)
{
	return s->dead || s->error || s->peer_gone;
}

/* ARMs for one peer doorbell, sent as one datagram: a process with
 * hundreds of streams to one peer must not flood that peer's socket. */
struct fs_bell_batch {
	struct fs_stream *first; /* gives the address */
	struct fs_stream *members[FS_WIRE_BELL_MAX];
	struct fs_bell_entry ent[FS_WIRE_BELL_MAX];
	unsigned count;
};

#define FS_BELL_BATCHES 8

static bool fs_bell_same_peer(const struct fs_stream *a, const struct fs_stream *b)
{
	return a->bell_addr.sin6_port == b->bell_addr.sin6_port &&
	       !memcmp(&a->bell_addr.sin6_addr, &b->bell_addr.sin6_addr, sizeof(a->bell_addr.sin6_addr)) &&
	       a->bell_addr.sin6_scope_id == b->bell_addr.sin6_scope_id;
}

/* Sends a batch; its streams count as armed once it went out. */
static bool fs_bell_flush(struct fs_bell_batch *b)
{
	uint8_t buf[FS_WIRE_BELL_LEN_MAX];
	int len;

	if (!b->count)
		return true;
	len = fs_wire_bell_encode(FS_BELL_ARM, b->ent, b->count, buf, sizeof(buf));
	if (len < 0 || fs_bell_send(b->first, buf, (size_t)len))
		return false;
	for (unsigned i = 0; i < b->count; i++)
		b->members[i]->armed = true;
	FS_STAT_ADD(bell_arms, b->count);
	b->count = 0;
	return true;
}

bool fs_bell_arm_all(struct fs_engine *e)
{
	static struct fs_bell_batch batches[FS_BELL_BATCHES]; /* engine lock held: one user */
	unsigned next_victim = 0;
	bool ok = true;

	if (__atomic_load_n(&e->armed_all, __ATOMIC_RELAXED))
		return true;
	if (fs_bell_fd() < 0)
		return false;
	for (unsigned i = 0; i < FS_BELL_BATCHES; i++)
		batches[i].count = 0;
	for (uint32_t id = 1; id < e->streams_cap && ok; id++) {
		struct fs_stream *s = e->streams[id];
		struct fs_bell_batch *b = NULL;

		if (!s || s->armed || fs_bell_quiet(s))
			continue;
		if (s->state == FS_STREAM_HELLO || !s->bell_addr.sin6_port) {
			ok = false; /* a handshake under way, or a peer without a doorbell */
			break;
		}
		for (unsigned i = 0; i < FS_BELL_BATCHES && !b; i++)
			if (batches[i].count && fs_bell_same_peer(batches[i].first, s))
				b = &batches[i];
		for (unsigned i = 0; i < FS_BELL_BATCHES && !b; i++)
			if (!batches[i].count)
				b = &batches[i];
		if (!b) {
			/* more peers than batches: send one to make room */
			b = &batches[next_victim++ % FS_BELL_BATCHES];
			ok = fs_bell_flush(b);
		}
		if (ok && b->count == FS_WIRE_BELL_MAX)
			ok = fs_bell_flush(b);
		if (!ok)
			break;
		if (!b->count)
			b->first = s;
		b->members[b->count] = s;
		b->ent[b->count].stream_id = s->peer_id;
		b->ent[b->count].token = (uint32_t)s->token;
		b->ent[b->count].data_seen = s->rx_msgs;
		b->ent[b->count].ctrl_seen = s->ctrl_processed;
		b->count++;
	}
	for (unsigned i = 0; i < FS_BELL_BATCHES; i++)
		if (!fs_bell_flush(&batches[i]))
			ok = false;
	if (ok)
		__atomic_store_n(&e->armed_all, true, __ATOMIC_RELAXED);
	return ok;
}

/* Where a doorbell datagram came from and to (v4-mapped addresses; the
 * port in network order, as bell_addr keeps it). */
struct fs_bell_route {
	uint8_t src[16], dst[16];
	uint16_t src_port;
	bool have_dst;
};

/* The stream ENT names, if the datagram may speak for it: the stream's
 * id and token, and, once we know the peer's doorbell, from its port and
 * the address of the TCP connection's peer, to ours (fs_bell_send sends
 * so). Before that (a handshake under way) only an ARM can come, and
 * UNROUTED says whether to take it. A datagram for a stream of ours from
 * anywhere else is dropped and counted. Lock held. */
static struct fs_stream *fs_bell_stream(struct fs_engine *e, const struct fs_bell_entry *ent,
					const struct fs_bell_route *rt, bool unrouted)
{
	struct fs_stream *s = ent->stream_id < e->streams_cap ? e->streams[ent->stream_id] : NULL;

	if (!s || s->dead || (uint32_t)s->token != ent->token)
		return NULL; /* a stream closed meanwhile (its peer armed it late), or a guess: not counted */
	if (!s->bell_addr.sin6_port ? !unrouted
				    : s->bell_addr.sin6_port != rt->src_port ||
					      memcmp(&s->bell_addr.sin6_addr, rt->src, 16) != 0 ||
					      (rt->have_dst && memcmp(s->bell_local, rt->dst, 16) != 0)) {
		FS_STAT_INC(msgs_dropped);
		return NULL;
	}
	return s;
}

/* An ARM from the peer of one of our streams. Lock held. */
static void fs_bell_on_arm(struct fs_engine *e, const struct fs_bell_entry *ent, const struct fs_bell_route *rt)
{
	struct fs_stream *s = fs_bell_stream(e, ent, rt, true);

	if (!s)
		return;
	/* A stream still in its handshake here: the peer (which answered it)
	 * may arm before the HELLO-ACK is read. Nothing was posted yet; the
	 * first message rings (the ACK gives the bell's address first). */
	if (s->state == FS_STREAM_HELLO) {
		s->peer_armed = true;
		return;
	}
	fs_bell_armed_by(s, ent->data_seen, ent->ctrl_seen);
}

void fs_bell_armed_by(struct fs_stream *s, uint32_t data_seen, uint32_t ctrl_seen)
{
	/* Posted messages it has not seen yet are on their way: ring now. */
	if (s->tx_seq != data_seen || s->ctrl_sent != ctrl_seen)
		fs_bell_ring(s);
	else
		s->peer_armed = true;
}

/* Reads and acts on up to 256 datagrams; true if one was a RING for us.
 * Lock held. */
static bool fs_bell_read(struct fs_engine *e, int fd)
{
	bool rung = false;

	for (unsigned i = 0; i < 256; i++) {
		uint8_t buf[FS_WIRE_BELL_LEN_MAX + 1];
		struct fs_bell_entry ent[FS_WIRE_BELL_MAX];
		unsigned count = 0;
		struct sockaddr_storage from;
		socklen_t fromlen;
		struct fs_bell_route rt;
		ssize_t n = fs_udp_recv(fd, buf, sizeof(buf), &from, &fromlen, rt.dst);
		static const uint8_t any[16];
		int type;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			break;
		fs_sockaddr_key((struct sockaddr *)&from, rt.src, &rt.src_port);
		rt.src_port = htons(rt.src_port);
		rt.have_dst = memcmp(rt.dst, any, 16) != 0;
		type = fs_wire_bell_decode(buf, (size_t)n, ent, &count);
		if (type < 0)
			FS_STAT_INC(msgs_dropped); /* not a doorbell datagram of this version */
		if (type == FS_BELL_RING) {
			/* for a stream of ours, from its peer's doorbell: we armed it,
			 * so we know where that is */
			struct fs_stream *s = fs_bell_stream(e, &ent[0], &rt, false);

			if (s) {
				/* The peer is disarmed now. Its message may still be on
				 * the way (or none came: an ARM carried by a message
				 * counts unread messages as unseen): arming again must
				 * send a new ARM, not count this one. */
				s->armed = false;
				rung = true;
			}
		} else if (type == FS_BELL_ARM) {
			for (unsigned j = 0; j < count; j++)
				fs_bell_on_arm(e, &ent[j], &rt);
		}
	}
	if (rung) {
		FS_STAT_INC(bell_rings_received);
		fs_engine_note_activity(e);
	}
	return rung;
}

/* A ring on our eventfd (ring.h): it names no stream, the message it
 * announces disarms its own. Lock held. */
static bool fs_bell_read_ring(struct fs_engine *e)
{
	if (!fs_ring_take())
		return false;
	FS_STAT_INC(bell_rings_received);
	fs_engine_note_activity(e);
	return true;
}

void fs_bell_drain_some(struct fs_engine *e, bool datagrams, bool ring)
{
	int fd = fs_bell_fd();

	if (!e) {
		/* no engine (yet, or after fork): nothing to ring; empty the socket */
		uint8_t buf[FS_WIRE_BELL_LEN_MAX];

		for (unsigned i = 0; datagrams && fd >= 0 && i < 256 &&
				     fs_real.recvfrom(fd, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL) >= 0;
		     i++)
			;
		if (ring)
			(void)fs_ring_take();
		return;
	}
	pthread_mutex_lock(&e->lock);
	fs_bell_drain_locked(e, datagrams, ring);
	fs_engine_unlock(e);
}

void fs_bell_drain_locked(struct fs_engine *e, bool datagrams, bool ring)
{
	int fd = fs_bell_fd();
	bool rung = false;

	if (datagrams && fd >= 0)
		rung = fs_bell_read(e, fd);
	if (ring && fs_bell_read_ring(e))
		rung = true;
	if (rung)
		fs_engine_progress(e);
}

bool fs_bell_try_drain(struct fs_engine *e, bool datagrams, bool ring)
{
	if (!e) {
		fs_bell_drain_some(e, datagrams, ring);
		return true;
	}
	if (pthread_mutex_trylock(&e->lock))
		return false;
	fs_bell_drain_locked(e, datagrams, ring);
	fs_engine_unlock(e);
	return true;
}

void fs_bell_drain(struct fs_engine *e)
{
	fs_bell_drain_some(e, true, true);
}

bool fs_bell_take_ring(struct fs_engine *e)
{
	return fs_bell_read_ring(e);
}

void fs_bell_take_arms(struct fs_engine *e)
{
	int fd = fs_bell_fd();

	if (fd >= 0)
		(void)fs_bell_read(e, fd);
}
