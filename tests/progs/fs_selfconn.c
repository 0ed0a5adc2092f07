// SPDX-License-Identifier: MIT
/*
 * A program that talks to itself: one thread connects to its own listener
 * and uses the client end before it accepts (issue 26). The kernel never
 * blocks here: the connection is up once connect() returns, and what the
 * client sends waits in the server end's buffer (about 2.8 MB on loopback
 * here) until the same thread accepts and reads. Under fabsock the client
 * used to wait for the server's HELLO-ACK, which only the accepted socket's
 * first use sends: a blocking send larger than the pre-ACK hold (or any
 * send, with an empty HELLO) hung for ever.
 *
 * peer_late is the same question between two processes: a forked server
 * accepts only once the client says it sent. With an empty HELLO (the
 * provider failing to open) the client's sends waited for the server's NAK,
 * so for the server's first read, and here for ever. prefork_1m is a
 * prefork worker connecting to the listener it shares with its parent.
 *
 * Usage: fs_selfconn list | fs_selfconn SCENARIO. One scenario per process,
 * under a watchdog; every byte is a pattern checked where it lands, every
 * errno is the kernel's. Prints `PASS <scenario>` or `FAIL <scenario>: ...`.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define SC_WATCHDOG_S 30
#define SC_MIB (1u << 20)
/* below the server's HELLO wait for a client it was told runs fabsock
 * (FABSOCK_PROBE_TIMEOUT_MS 250 + a 3 s margin) */
#define SC_BANNER_MAX_MS 3000

static int sc_listen(char *port, size_t len)
{
	int fd = harness_listen(AF_INET, "127.0.0.1", "0", 0, 16);

	if (fd >= 0)
		snprintf(port, len, "%u", harness_local_port(fd));
	return fd;
}

static int sc_connect(const char *port, int flags)
{
	struct addrinfo *ai = harness_resolve("127.0.0.1", port, AF_INET);
	int fd;

	if (!ai)
		return harness_fail("resolve 127.0.0.1:%s", port);
	fd = harness_connect(ai, flags);
	freeaddrinfo(ai);
	return fd;
}

/* Client and accepted end of one connection to our own listener, with
 * nothing sent yet. */
struct sc_pair {
	int lfd, cfd, afd;
	char port[16];
};

static int sc_open(struct sc_pair *p, int client_flags)
{
	p->afd = -1;
	p->lfd = sc_listen(p->port, sizeof(p->port));
	if (p->lfd < 0)
		return -1;
	p->cfd = sc_connect(p->port, client_flags);
	return p->cfd < 0 ? -1 : 0;
}

static int sc_accept(struct sc_pair *p)
{
	p->afd = harness_accept(p->lfd, 5000, 0, NULL, NULL);
	return p->afd < 0 ? harness_fail("accept: %s", strerror(errno)) : 0;
}

static void sc_close(struct sc_pair *p)
{
	if (p->cfd >= 0)
		close(p->cfd);
	if (p->afd >= 0)
		close(p->afd);
	if (p->lfd >= 0)
		close(p->lfd);
}

/* A nonblocking receive finds nothing: EAGAIN, as the kernel's. */
static int sc_expect_nothing(int fd, const char *what)
{
	char c;
	ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);

	if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
		return harness_fail("%s: recv(MSG_DONTWAIT) returned %zd (%s), want EAGAIN", what, n,
				    n < 0 ? strerror(errno) : "data");
	return 0;
}

/* The client's blocking send of LEN before accept(): it must return LEN at
 * once; then the same thread accepts, reads it, and answers. */
static int sc_blocking_before_accept(size_t len)
{
	struct sc_pair p;
	int ret = -1;
	ssize_t n;
	char *buf = malloc(len);

	if (!buf || sc_open(&p, 0))
		goto out;
	harness_pattern_fill(1, 0, buf, len);
	n = send(p.cfd, buf, len, MSG_NOSIGNAL); /* one call, as the kernel takes it */
	if (n != (ssize_t)len) {
		harness_fail("blocking send of %zu before accept returned %zd (%s)", len, n, n < 0 ? strerror(errno) : "");
		goto out;
	}
	if (sc_expect_nothing(p.cfd, "client before the server wrote") || sc_accept(&p) ||
	    harness_recv_pattern(p.afd, 1, 0, len, "server reads what was sent before accept") ||
	    harness_send_pattern(p.afd, 2, 0, len) || harness_recv_pattern(p.cfd, 2, 0, len, "client reads the answer"))
		goto out;
	if (shutdown(p.cfd, SHUT_WR) || harness_expect_eof(p.afd)) {
		harness_fail("server end did not read the client's end of stream");
		goto out;
	}
	close(p.afd);
	p.afd = -1;
	ret = harness_expect_eof(p.cfd);
out:
	free(buf);
	sc_close(&p);
	return ret;
}

static int sc_blocking_100(void)
{
	return sc_blocking_before_accept(100);
}

static int sc_blocking_1m(void)
{
	return sc_blocking_before_accept(SC_MIB);
}

/* Two connections made, used out of order, accepted and read later. */
static int sc_accept_later(void)
{
	struct sc_pair p;
	int c2 = -1, a1 = -1, a2 = -1, ret = -1;
	struct sockaddr_storage s1, s2, peer;
	socklen_t l1 = sizeof(s1), l2 = sizeof(s2), pl;

	if (sc_open(&p, 0))
		goto out;
	c2 = sc_connect(p.port, 0);
	if (c2 < 0 || getsockname(p.cfd, (struct sockaddr *)&s1, &l1) || getsockname(c2, (struct sockaddr *)&s2, &l2))
		goto out;
	if (harness_send_pattern(c2, 12, 0, 1000) || harness_send_pattern(p.cfd, 11, 0, 100) ||
	    harness_send_pattern(c2, 12, 1000, 64 * 1024))
		goto out;
	if (sc_expect_nothing(c2, "second client before any accept"))
		goto out;
	for (int i = 0; i < 2; i++) {
		int a;

		pl = sizeof(peer);
		a = accept(p.lfd, (struct sockaddr *)&peer, &pl);
		if (a < 0) {
			harness_fail("accept %d: %s", i, strerror(errno));
			goto out;
		}
		if (pl == l1 && memcmp(&peer, &s1, pl) == 0)
			a1 = a;
		else if (pl == l2 && memcmp(&peer, &s2, pl) == 0)
			a2 = a;
		else {
			close(a);
			harness_fail("accepted a connection of neither client");
			goto out;
		}
	}
	if (a1 < 0 || a2 < 0) {
		harness_fail("accepted the same client twice");
		goto out;
	}
	if (harness_recv_pattern(a2, 12, 0, 1000 + 64 * 1024, "second connection") ||
	    harness_recv_pattern(a1, 11, 0, 100, "first connection") || harness_send_pattern(a1, 21, 0, 300) ||
	    harness_send_pattern(a2, 22, 0, 3000) || harness_recv_pattern(c2, 22, 0, 3000, "second answer") ||
	    harness_recv_pattern(p.cfd, 21, 0, 300, "first answer"))
		goto out;
	ret = 0;
out:
	if (c2 >= 0)
		close(c2);
	if (a1 >= 0)
		close(a1);
	if (a2 >= 0)
		close(a2);
	sc_close(&p);
	return ret;
}

/* A nonblocking client: connect, wait for writability (the kernel's
 * handshake needs no accept), send LEN in nonblocking calls. Whatever does
 * not fit yet goes after the accept, alternating with the server's reads
 * in this one thread. Every call returns at once. */
static int sc_nonblocking(size_t len)
{
	struct sc_pair p;
	size_t sent = 0, got = 0;
	uint64_t hash_out = HARNESS_FNV1A_OFFSET, hash_in = HARNESS_FNV1A_OFFSET;
	char *out = malloc(len), *in = malloc(65536);
	double deadline = harness_now_ms() + 20000;
	int ret = -1, eagain_before = 0;

	if (!out || !in || sc_open(&p, SOCK_NONBLOCK))
		goto done;
	harness_pattern_fill(3, 0, out, len);
	if (harness_wait_fd(p.cfd, POLLOUT, 5000) <= 0) {
		harness_fail("nonblocking client not writable before accept");
		goto done;
	}
	/* before accept: send until done or EAGAIN; each call is quick */
	while (sent < len) {
		double t0 = harness_now_ms();
		ssize_t n = send(p.cfd, out + sent, len - sent, MSG_NOSIGNAL);

		if (harness_now_ms() - t0 > 1000) {
			harness_fail("a nonblocking send took %.0f ms", harness_now_ms() - t0);
			goto done;
		}
		if (n > 0) {
			sent += (size_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			eagain_before = 1;
			break;
		}
		harness_fail("nonblocking send before accept: %zd (%s)", n, n < 0 ? strerror(errno) : "");
		goto done;
	}
	if (sent == 0) {
		harness_fail("a nonblocking send before accept took nothing");
		goto done;
	}
	harness_info("nonblocking: %zu of %zu bytes taken before accept%s", sent, len,
		     eagain_before ? " (then EAGAIN)" : "");
	hash_out = harness_fnv1a(hash_out, out, len);
	if (sc_accept(&p) || fcntl(p.afd, F_SETFL, O_NONBLOCK))
		goto done;
	while (got < len) {
		struct pollfd pf[2] = { { .fd = p.afd, .events = POLLIN }, { .fd = p.cfd, .events = sent < len ? POLLOUT : 0 } };
		ssize_t n;

		if (harness_now_ms() > deadline) {
			harness_fail("nonblocking: %zu sent, %zu read after 20 s", sent, got);
			goto done;
		}
		poll(pf, 2, 1000);
		if (sent < len) {
			n = send(p.cfd, out + sent, len - sent, MSG_NOSIGNAL);
			if (n > 0)
				sent += (size_t)n;
			else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
				harness_fail("nonblocking send: %s", strerror(errno));
				goto done;
			}
		}
		n = recv(p.afd, in, 65536, 0);
		if (n > 0) {
			if (harness_pattern_check(3, got, in, (size_t)n, "server reads the nonblocking client"))
				goto done;
			hash_in = harness_fnv1a(hash_in, in, (size_t)n);
			got += (size_t)n;
		} else if (n == 0) {
			harness_fail("server read an end of stream after %zu of %zu", got, len);
			goto done;
		} else if (errno != EAGAIN && errno != EWOULDBLOCK) {
			harness_fail("server recv: %s", strerror(errno));
			goto done;
		}
	}
	if (hash_in != hash_out) {
		harness_fail("checksum differs");
		goto done;
	}
	if (sc_expect_nothing(p.cfd, "nonblocking client before the server wrote") ||
	    harness_send_pattern(p.afd, 4, 0, 5000) || harness_recv_pattern(p.cfd, 4, 0, 5000, "client reads the answer"))
		goto done;
	ret = 0;
done:
	free(out);
	free(in);
	sc_close(&p);
	return ret;
}

static int sc_nonblocking_100(void)
{
	return sc_nonblocking(100);
}

static int sc_nonblocking_4m(void)
{
	return sc_nonblocking(4 * SC_MIB);
}

/* The server writes first (a banner) on a connection of its own process,
 * then an echo of requests of growing sizes; ends as the kernel's do. */
static int sc_echo(void)
{
	struct sc_pair p;
	char *buf = malloc(256 * 1024);
	int ret = -1;

	double t0;

	if (!buf || sc_open(&p, 0) || sc_accept(&p))
		goto out;
	t0 = harness_now_ms();
	if (harness_send_pattern(p.afd, 5, 0, 40) || harness_recv_pattern(p.cfd, 5, 0, 40, "banner"))
		goto out;
	/* A server that speaks first waits for a HELLO only where one can
	 * come: an `offload` rule vouching for the address made it wait the
	 * whole HELLO wait (3.25 s) for a client that sends none. */
	if (harness_now_ms() - t0 >= SC_BANNER_MAX_MS) {
		harness_fail("the banner took %.0f ms (the server waited for a HELLO)", harness_now_ms() - t0);
		goto out;
	}
	for (unsigned i = 0; i < 12; i++) {
		size_t len = (size_t)1 << (i + 6); /* 64 B .. 128 KiB */
		uint64_t key = 100 + i;

		if (harness_send_pattern(p.cfd, key, 0, len) || harness_recv_exact(p.afd, buf, len) ||
		    harness_pattern_check(key, 0, buf, len, "request") || harness_send_all(p.afd, buf, len) ||
		    harness_recv_pattern(p.cfd, key, 0, len, "echo"))
			goto out;
	}
	/* the client's end of stream, then the server's close */
	if (shutdown(p.cfd, SHUT_WR) || harness_expect_eof(p.afd))
		goto out;
	close(p.afd);
	p.afd = -1;
	if (harness_expect_eof(p.cfd))
		goto out;
	/* the peer is gone: a write ends in EPIPE (after at most one that the
	 * kernel takes before the peer's reset comes) */
	for (int i = 0;; i++) {
		ssize_t n = send(p.cfd, "x", 1, MSG_NOSIGNAL);

		if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
			break;
		if (n < 0 || i == 10) {
			harness_fail("send to a closed peer: %zd (%s), want EPIPE", n, n < 0 ? strerror(errno) : "taken");
			goto out;
		}
		harness_sleep_ms(20);
	}
	ret = 0;
out:
	free(buf);
	sc_close(&p);
	return ret;
}

/* The forked server of peer_late: listens, says its port on TO_PARENT,
 * accepts only when the parent's byte comes on FROM_PARENT. */
static int sc_late_server(int to_parent, int from_parent)
{
	char port[16], go;
	int lfd = sc_listen(port, sizeof(port)), afd;
	struct pollfd p = { .fd = from_parent, .events = POLLIN };

	if (lfd < 0 || write(to_parent, port, sizeof(port)) != (ssize_t)sizeof(port))
		return harness_fail("server: cannot listen or say its port");
	if (poll(&p, 1, 20000) != 1 || read(from_parent, &go, 1) != 1)
		return harness_fail("server: the client never said it sent (its send waited for this server)");
	afd = harness_accept(lfd, 5000, 0, NULL, NULL);
	if (afd < 0 || harness_recv_pattern(afd, 7, 0, 100 + 256 * 1024, "server reads the late-accepted client") ||
	    harness_send_pattern(afd, 8, 0, 1000) || harness_expect_eof(afd))
		return -1;
	close(afd);
	close(lfd);
	return 0;
}

static int sc_peer_late(void)
{
	int up[2], down[2], cfd = -1, ret = -1;
	char port[16];
	size_t sent = 100;
	pid_t pid;

	if (pipe(up) || pipe(down))
		return harness_fail("pipe: %s", strerror(errno));
	pid = fork();
	if (pid < 0)
		return harness_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		close(up[0]);
		close(down[1]);
		_exit(sc_late_server(up[1], down[0]) || harness_failures() ? 1 : 0);
	}
	close(up[1]);
	close(down[0]);
	if (read(up[0], port, sizeof(port)) != (ssize_t)sizeof(port)) {
		harness_fail("the server did not say its port");
		goto out;
	}
	cfd = sc_connect(port, 0);
	if (cfd < 0)
		goto out;
	/* blocking 100 B, then nonblocking calls: each returns at once, as
	 * the kernel's do, before the server has accepted */
	if (harness_send_pattern(cfd, 7, 0, 100) || fcntl(cfd, F_SETFL, O_NONBLOCK))
		goto out;
	while (sent < 100 + 256 * 1024) {
		double t0 = harness_now_ms();
		char buf[4096];
		size_t want = 100 + 256 * 1024 - sent < sizeof(buf) ? 100 + 256 * 1024 - sent : sizeof(buf);
		ssize_t n;

		harness_pattern_fill(7, sent, buf, want);
		n = send(cfd, buf, want, MSG_NOSIGNAL);
		if (harness_now_ms() - t0 > 1000) {
			harness_fail("a nonblocking send took %.0f ms", harness_now_ms() - t0);
			goto out;
		}
		if (n > 0) {
			sent += (size_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break; /* the rest after the server accepts */
		harness_fail("nonblocking send before accept: %zd (%s)", n, n < 0 ? strerror(errno) : "");
		goto out;
	}
	harness_info("%zu bytes sent before the server accepted", sent);
	if (write(down[1], "g", 1) != 1 || fcntl(cfd, F_SETFL, 0) ||
	    harness_send_pattern(cfd, 7, sent, 100 + 256 * 1024 - sent) ||
	    harness_recv_pattern(cfd, 8, 0, 1000, "client reads the answer") || shutdown(cfd, SHUT_WR))
		goto out;
	ret = 0;
out:
	close(down[1]); /* a server still waiting gives up */
	if (cfd >= 0)
		close(cfd);
	close(up[0]);
	if (harness_wait_child(pid, "server", 0))
		ret = -1;
	return ret;
}

/* The worker of prefork_1m: LFD is its parent's listening socket. */
static int sc_prefork_worker(int lfd, const char *port)
{
	struct sc_pair p = { .lfd = -1, .cfd = -1, .afd = -1 };
	char *buf = malloc(SC_MIB);
	int ret = -1, warm;
	ssize_t n;

	/* the worker's first connection, accepted by itself: it serves */
	warm = sc_connect(port, 0);
	if (!buf || warm < 0 || harness_send_byte(warm, 'w') < 0)
		goto out;
	p.lfd = lfd;
	if (sc_accept(&p) || harness_expect_byte(p.afd, 'w') < 0)
		goto out;
	close(p.afd);
	p.afd = -1;
	close(warm);
	warm = -1;
	/* then one it writes 1 MiB on before it accepts it */
	p.cfd = sc_connect(port, 0);
	if (p.cfd < 0)
		goto out;
	harness_pattern_fill(9, 0, buf, SC_MIB);
	n = send(p.cfd, buf, SC_MIB, MSG_NOSIGNAL);
	if (n != (ssize_t)SC_MIB) {
		harness_fail("worker: blocking send of 1 MiB before accept returned %zd (%s)", n,
			     n < 0 ? strerror(errno) : "");
		goto out;
	}
	if (sc_accept(&p) || harness_recv_pattern(p.afd, 9, 0, SC_MIB, "worker reads what it sent before accept") ||
	    harness_send_pattern(p.afd, 10, 0, SC_MIB) ||
	    harness_recv_pattern(p.cfd, 10, 0, SC_MIB, "worker's client reads the answer") || shutdown(p.cfd, SHUT_WR) ||
	    harness_expect_eof(p.afd))
		goto out;
	ret = 0;
out:
	if (warm >= 0)
		close(warm);
	p.lfd = -1; /* the parent's, closed at exit */
	sc_close(&p);
	free(buf);
	return ret;
}

/* prefork_1m: a prefork server's worker connecting to the listener it
 * shares with its parent (which never accepts): after serving a first
 * connection of its own, it writes 1 MiB on a second one before accepting
 * it, as a worker proxying to its own server may. The kernel buffers it;
 * under fabsock the worker waited for a HELLO-ACK only its own accept()
 * could bring. */
static int sc_prefork_1m(void)
{
	char port[16];
	int lfd = sc_listen(port, sizeof(port));
	pid_t pid;

	if (lfd < 0)
		return -1;
	pid = fork();
	if (pid < 0)
		return harness_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		/* its own watchdog (alarms are not inherited): a hung worker
		 * must not outlive the test */
		harness_watchdog_start(SC_WATCHDOG_S - 5, NULL);
		_exit(sc_prefork_worker(lfd, port) || harness_failures() ? 1 : 0);
	}
	if (harness_wait_child(pid, "the worker", 0))
		return -1;
	close(lfd);
	return 0;
}

static const struct {
	const char *name;
	int (*run)(void);
} sc_scenarios[] = {
	{ "blocking_100", sc_blocking_100 },   { "blocking_1m", sc_blocking_1m },
	{ "accept_later", sc_accept_later },   { "nonblocking_100", sc_nonblocking_100 },
	{ "nonblocking_4m", sc_nonblocking_4m }, { "echo", sc_echo },
	{ "peer_late", sc_peer_late },     { "prefork_1m", sc_prefork_1m },
};

int main(int argc, char **argv)
{
	size_t n = sizeof(sc_scenarios) / sizeof(sc_scenarios[0]);

	if (argc == 2 && strcmp(argv[1], "list") == 0) {
		for (size_t i = 0; i < n; i++)
			printf("%s\n", sc_scenarios[i].name);
		return 0;
	}
	for (size_t i = 0; argc == 2 && i < n; i++) {
		if (strcmp(argv[1], sc_scenarios[i].name))
			continue;
		harness_set_name(sc_scenarios[i].name);
		harness_watchdog_start(SC_WATCHDOG_S, NULL);
		if (sc_scenarios[i].run() || harness_failures()) {
			if (!harness_failures())
				harness_fail("failed");
			return 1;
		}
		printf("PASS %s\n", sc_scenarios[i].name);
		return 0;
	}
	fprintf(stderr, "usage: fs_selfconn list | fs_selfconn SCENARIO\n");
	return 2;
}
