/* SPDX-License-Identifier: MIT */
/*
 * TCP first's waitless handshake (tcpfirst_hs.h): the client's decision and
 * HELLO, the server's proof and ACK. The rule of negotiate.c holds: a peer
 * that does not run fabsock never receives a byte it did not ask for (the
 * client writes only to a listening socket that the kernel names and that
 * a record of this user says strips the HELLO), and never has one taken
 * from it (the server consumes only a whole, valid waitless HELLO whose
 * sender the kernel says is a socket of this user on this host).
 */
#include "core/tcpfirst_hs.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "core/diag.h"
#include "core/negotiate.h"
#include "core/records.h"
#include "core/stats.h"
#include "core/udp.h"
#include "core/util.h"
#include "core/wire.h"
#include "preload/real.h"

#define FS_MS 1000000ull

bool fs_tfhs_is_waitless(const struct fs_hello *h)
{
	return (h->flags & FS_HELLO_TCP_FIRST) && h->addr_len == 0 && h->status == FS_NAK_NONE &&
	       h->provider == FS_PROV_SHM;
}

/* ---- the HELLO's MAC ------------------------------------------------------
 * SipHash-2-4 (Aumasson and Bernstein) of the token and the connection's
 * two ends, under this user's secret (fs_records_secret), carried in the
 * HELLO's nonce field (a waitless HELLO answers no probe). It proves to the
 * server that a process of its user wrote the HELLO for this very
 * connection, also when that process closed its socket before the server
 * looked (sock_diag then names root as the owner of an orphaned socket). */

static uint64_t fs_rotl(uint64_t x, int b)
{
	return (x << b) | (x >> (64 - b));
}

static uint64_t fs_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

#define FS_SIPROUND                                                                                                    \
	do {                                                                                                           \
		v0 += v1; v1 = fs_rotl(v1, 13); v1 ^= v0; v0 = fs_rotl(v0, 32);                                       \
		v2 += v3; v3 = fs_rotl(v3, 16); v3 ^= v2;                                                             \
		v0 += v3; v3 = fs_rotl(v3, 21); v3 ^= v0;                                                             \
		v2 += v1; v1 = fs_rotl(v1, 17); v1 ^= v2; v2 = fs_rotl(v2, 32);                                       \
	} while (0)

static uint64_t fs_siphash(const uint8_t key[16], const uint8_t *in, size_t len)
{
	uint64_t k0 = fs_le64(key), k1 = fs_le64(key + 8), m, b = (uint64_t)len << 56;
	uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
	uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
	size_t i;

	for (i = 0; i + 8 <= len; i += 8) {
		m = fs_le64(in + i);
		v3 ^= m;
		FS_SIPROUND;
		FS_SIPROUND;
		v0 ^= m;
	}
	for (size_t j = 0; i + j < len; j++)
		b |= (uint64_t)in[i + j] << (8 * j);
	v3 ^= b;
	FS_SIPROUND;
	FS_SIPROUND;
	v0 ^= b;
	v2 ^= 0xff;
	FS_SIPROUND;
	FS_SIPROUND;
	FS_SIPROUND;
	FS_SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/* The MAC of TOKEN on the connection CLIENT:CPORT -> SERVER:SPORT (address
 * keys, fs_sockaddr_key), or 0 without a secret (the server then needs the
 * kernel's word). Never 0 otherwise. */
static uint64_t fs_tfhs_mac(uint64_t token, const uint8_t client[16], uint16_t cport, const uint8_t server[16],
			    uint16_t sport)
{
	uint8_t key[FS_REC_KEY_LEN], in[8 + 2 * 18];
	uint64_t mac;

	if (!fs_records_secret(key))
		return 0;
	for (int i = 0; i < 8; i++)
		in[i] = (uint8_t)(token >> (8 * i));
	memcpy(in + 8, client, 16);
	in[24] = (uint8_t)(cport >> 8);
	in[25] = (uint8_t)cport;
	memcpy(in + 26, server, 16);
	in[42] = (uint8_t)(sport >> 8);
	in[43] = (uint8_t)sport;
	mac = fs_siphash(key, in, sizeof(in));
	return mac ? mac : 1;
}

bool fs_tfhs_ack_agrees(const struct fs_hello *ack)
{
	return fs_tfhs_is_waitless(ack);
}

uint64_t fs_tfhs_token(void)
{
	/* A random seed once per process (a forked child draws its own: the
	 * pid goes in), then SplitMix64 of a counter: a token per connection
	 * without a getrandom() each. It need not be secret (the MAC and the
	 * kernel prove the HELLO), only unlikely to repeat. */
	static uint64_t seed, counter;
	static pid_t seeded_pid;
	pid_t pid = fs_self_pid();
	uint64_t z;

	if (__atomic_load_n(&seeded_pid, __ATOMIC_ACQUIRE) != pid) {
		uint64_t fresh;

		if (getrandom(&fresh, sizeof(fresh), GRND_NONBLOCK) != sizeof(fresh))
			fresh = fs_now_ns() ^ ((uint64_t)pid << 32);
		__atomic_store_n(&seed, fresh, __ATOMIC_RELAXED);
		__atomic_store_n(&seeded_pid, pid, __ATOMIC_RELEASE);
	}
	z = __atomic_load_n(&seed, __ATOMIC_RELAXED) + __atomic_add_fetch(&counter, 0x9e3779b97f4a7c15ull, __ATOMIC_RELAXED);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void fs_tfhs_client_fill(struct fs_hello *h, int fd, uint64_t token, const struct sockaddr *peer)
{
	struct sockaddr_storage me;
	socklen_t mlen = sizeof(me);
	uint8_t maddr[16], paddr[16];
	uint16_t mport, pport;

	h->magic = FS_WIRE_HELLO_MAGIC;
	h->token = token;
	/* no probe: the nonce field carries the MAC (0: none) */
	h->nonce = 0;
	if (fs_real.getsockname(fd, (struct sockaddr *)&me, &mlen) == 0) {
		fs_sockaddr_key((struct sockaddr *)&me, maddr, &mport);
		fs_sockaddr_key(peer, paddr, &pport);
		h->nonce = fs_tfhs_mac(token, maddr, mport, paddr, pport);
	}
	h->provider = FS_PROV_SHM;
	h->flags = FS_HELLO_TCP_FIRST;
	h->addr_len = 0; /* no rail: none is opened for it */
	h->sock_fd = fd >= 0 ? (uint32_t)fd : 0;
}

bool fs_tfhs_client_may(int fd, const struct sockaddr *peer)
{
	uint8_t key[16];
	uint16_t port;
	uint32_t inode = 0, uid = FS_DIAG_NO_UID;

	if (!fs_params.tcp_first || !fs_params.tcp_first_waitless || !fs_params.shm)
		return false;
	fs_sockaddr_key(peer, key, &port);
	/* The listener a connection to PEER reaches, as the kernel says (the
	 * record names it by inode); its owner need not be us (a root master
	 * that listens for workers of ours publishes in our directory). */
	int found = fs_diag_listener(key, port, key, &inode, &uid);

	if (found != 1 || !inode) {
		FS_DBG("fd %d: no waitless HELLO: the kernel names no listener for port %u (%d)", fd, port, found);
		return false;
	}
	if (!fs_records_tcp_first(port, inode)) {
		FS_DBG("fd %d: no waitless HELLO: no record of ours for listener %u on port %u strips one", fd, inode, port);
		return false;
	}
	return true;
}

/* Writes all of BUF on FD (nonblocking sends, waiting for room up to
 * FABSOCK_HELLO_TIMEOUT_MS). 0 or -errno. */
static int fs_tfhs_send_all(int fd, const uint8_t *buf, size_t len)
{
	uint64_t deadline = fs_now_ns() + fs_params.hello_timeout_ms * FS_MS;
	size_t done = 0;

	while (done < len) {
		ssize_t n = fs_real.send(fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
		struct pollfd p = { .fd = fd, .events = POLLOUT };

		if (n > 0) {
			done += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && fs_now_ns() < deadline) {
			fs_real.poll(&p, 1, 10);
			continue;
		}
		return n < 0 ? -errno : -EPIPE;
	}
	return 0;
}

/* Whether the client end of the connection FD wrote HELLO as a process of
 * this user: the HELLO's MAC under this user's secret, else the kernel's
 * word that the client socket is this user's on this host. One
 * getsockname, one getpeername, and a sock_diag lookup without a MAC. */
static bool fs_tfhs_client_ours(int fd, const struct fs_hello *hello)
{
	struct sockaddr_storage me, peer;
	socklen_t mlen = sizeof(me), plen = sizeof(peer);
	uint8_t maddr[16], paddr[16];
	uint16_t mport, pport;
	uint32_t inode = 0, uid = FS_DIAG_NO_UID;

	if (fs_real.getsockname(fd, (struct sockaddr *)&me, &mlen) ||
	    fs_real.getpeername(fd, (struct sockaddr *)&peer, &plen) ||
	    (me.ss_family != AF_INET && me.ss_family != AF_INET6))
		return false;
	fs_sockaddr_key((struct sockaddr *)&me, maddr, &mport);
	fs_sockaddr_key((struct sockaddr *)&peer, paddr, &pport);
	if (hello->nonce && hello->nonce == fs_tfhs_mac(hello->token, paddr, pport, maddr, mport))
		return true;
	/* (fs_conn_exists asks for the client's end when it is on this host,
	 * and gives its owner; a remote client has none to give) */
	if (fs_conn_exists(maddr, mport, paddr, pport, &inode, &uid) != 1 || uid == FS_DIAG_NO_UID)
		return false;
	return uid == (uint32_t)fs_self_euid();
}

int fs_tfhs_server_take(int fd, const uint8_t *first, size_t n_first, size_t *taken)
{
	uint8_t buf[FS_WIRE_HELLO_MAX], wire[FS_WIRE_HELLO_MAX];
	size_t have = n_first < sizeof(buf) ? n_first : sizeof(buf);
	uint64_t deadline = 0;
	struct fs_hello hello, ack = { 0 };
	int ret = 0, len;

	*taken = 0;
	if (!fs_params.tcp_first)
		return 0;
	if (have)
		memcpy(buf, first, have);
	for (unsigned round = 0; round < 100000; round++) {
		ssize_t n = have < sizeof(buf) ? fs_real.recv(fd, buf + have, sizeof(buf) - have, MSG_PEEK | MSG_DONTWAIT) : 0;
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return have ? 0 : -errno;
		if (n <= 0 && !have)
			return 0; /* nothing there yet, or the client's end: nothing to take */
		ret = fs_wire_hello_decode(buf, have + (n > 0 ? (size_t)n : 0), FS_WIRE_HELLO_MAGIC, &hello);
		if (ret != 0)
			break;
		if (n == 0 && have < sizeof(buf))
			return 0; /* a prefix, then the client's end: data, as it is */
		/* the start of a HELLO: a waitless client writes it whole in one
		 * send, so the rest is on its way; a plain client's bytes that
		 * merely begin the same way wait as long, once */
		if (!deadline)
			deadline = fs_now_ns() + fs_params.hello_timeout_ms * FS_MS;
		if (fs_now_ns() >= deadline)
			return 0;
		if (fs_real.poll(&p, 1, 1) > 0)
			usleep(100); /* more came, or the same bytes: not a tight loop */
	}
	if (ret <= 0 || !fs_tfhs_is_waitless(&hello))
		return 0;
	if (!fs_tfhs_client_ours(fd, &hello)) {
		/* a HELLO-shaped message from a socket that is not ours: data */
		FS_STAT_INC(tcp_first_hello_unproved);
		FS_INFO("fd %d: a waitless HELLO from a client the kernel does not show as ours: left as data", fd);
		return 0;
	}
	/* Consume exactly the rest of the HELLO (peeked whole: it is there). */
	*taken = (size_t)ret < n_first ? (size_t)ret : n_first;
	for (size_t done = *taken; done < (size_t)ret;) {
		ssize_t n = fs_real.recv(fd, buf, (size_t)ret - done, MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -EIO;
		done += (size_t)n;
	}
	{
		/* The client's FIN is in already: it closed (or shut down its
		 * writing) before we looked. An ACK would come to a closed
		 * socket, whose kernel answers it with a reset (the server
		 * application would read ECONNRESET instead of the end); a
		 * half-closed client that still reads takes our bytes, or our
		 * end, without an ACK as a server's that stayed plain. */
		struct pollfd p = { .fd = fd, .events = POLLRDHUP };

		if (fs_real.poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
			FS_STAT_INC(tcp_first_waitless_served);
			FS_DBG("fd %d: waitless HELLO taken; the client's FIN is in: no ACK", fd);
			return 1;
		}
	}
	ack.magic = FS_WIRE_ACK_MAGIC;
	ack.status = FS_NAK_NONE;
	ack.token = hello.token;
	ack.provider = FS_PROV_SHM;
	ack.flags = FS_HELLO_TCP_FIRST;
	ack.sock_fd = (uint32_t)fd;
	/* no rail address: none is open for it (OPEN/OPENED not built) */
	len = fs_wire_hello_encode(&ack, wire, sizeof(wire));
	if (len <= 0)
		return -EINVAL;
	ret = fs_tfhs_send_all(fd, wire, (size_t)len);
	if (ret)
		return ret;
	FS_STAT_INC(tcp_first_waitless_served);
	FS_DBG("fd %d: waitless HELLO taken, ACK sent: TCP", fd);
	return 1;
}
