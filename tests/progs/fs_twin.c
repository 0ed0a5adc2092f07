/* SPDX-License-Identifier: MIT */
/*
 * fs_twin: the probe's UDP twin and the application's own use of the port
 * (issue 26). Run under the preload (both sides), driven by
 * tests/scripts/e2e_twin.sh:
 *
 *   fs_twin relisten-server PORT ROUNDS DIR
 *   fs_twin relisten-client PORT ROUNDS DIR
 *     Each round the server listens on PORT (a new socket), accepts one
 *     connection, echoes BYTES, keeps the connection open and closes the
 *     listener. The client connects once per round (when DIR/ready-N
 *     exists), checks the echo and reads from TCP_INFO whether the kernel
 *     connection carried it; it keeps every connection open and checks a
 *     second echo on each at the end (old connections live on).
 *
 *   fs_twin dns-server PORT ORDER DIR      ORDER: udp-first | tcp-first
 *     A DNS-like server: a UDP socket and a TCP listener on the same port
 *     number, made in ORDER (both binds must succeed). UDP: every datagram
 *     is answered "A:" + itself; a datagram that is a fabsock probe (40
 *     bytes, the probe magic) is counted: it must never come. TCP: echoes
 *     BYTES per connection. When DIR/close-udp exists it closes its UDP
 *     socket and writes DIR/udp-closed; on SIGTERM it prints
 *     "probes_seen=N udp_answered=N tcp_conns=N" and exits.
 *   fs_twin dns-client PORT NCONN QUERIES
 *     QUERIES UDP queries (each answered within 2 s, in one try), then
 *     NCONN TCP connections echoing BYTES; prints one line per connection,
 *     "conn N ok=1 offloaded=0|1".
 *
 * Exit status: 0, or 1 after any "FAIL" line.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BYTES (1u << 20)
#define MAX_CONNS 64
#define PROBE_LEN 40
#define PROBE_MAGIC 0x46534250u

static int fails;

static void fail(const char *what)
{
	printf("FAIL %s (errno %d %s)\n", what, errno, strerror(errno));
	fflush(stdout);
	fails++;
}

static bool exists(const char *dir, const char *name)
{
	char path[512];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return stat(path, &st) == 0;
}

static void touch(const char *dir, const char *name)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	if (f)
		fclose(f);
}

static bool wait_file(const char *dir, const char *name, int seconds)
{
	for (int i = 0; i < seconds * 100; i++) {
		if (exists(dir, name))
			return true;
		usleep(10000);
	}
	return false;
}

static struct sockaddr_in loopback(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static bool write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		p += w;
		n -= (size_t)w;
	}
	return true;
}

static bool read_all(int fd, uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		p += r;
		n -= (size_t)r;
	}
	return true;
}

static void pattern(uint8_t *buf, size_t n, unsigned seed)
{
	uint32_t x = 2654435761u * (seed + 1);

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		buf[i] = (uint8_t)x;
	}
}

/* The server side of one echo: BYTES in, the same back. */
static bool echo_serve(int fd)
{
	static uint8_t buf[BYTES];

	return read_all(fd, buf, BYTES) && write_all(fd, buf, BYTES);
}

/* The client side: BYTES of pattern SEED out, compared when back. Sets
 * *OFFLOADED from TCP_INFO: the kernel connection carried less than the
 * payload each way. The echo is small enough to sit in socket buffers, so
 * write-all-then-read-all cannot deadlock on TCP. */
static bool echo_check(int fd, unsigned seed, int *offloaded)
{
	static uint8_t out[BYTES], in[BYTES];
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	pattern(out, BYTES, seed);
	if (!write_all(fd, out, BYTES) || !read_all(fd, in, BYTES) || memcmp(in, out, BYTES) != 0)
		return false;
	memset(&ti, 0, sizeof(ti));
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len))
		return false;
	*offloaded = ti.tcpi_bytes_acked < BYTES && ti.tcpi_bytes_received < BYTES;
	return true;
}

static int tcp_listener(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_ANY);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 64)) {
		fail("tcp listener");
		return -1;
	}
	return fd;
}

static int tcp_connect(int port)
{
	struct sockaddr_in a = loopback(port);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		fail("connect");
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* ---- close and listen again --------------------------------------------- */

static int relisten_server(int port, int rounds, const char *dir)
{
	int conns[MAX_CONNS], n = 0;

	for (int r = 0; r < rounds && r < MAX_CONNS; r++) {
		char name[32];
		int l = tcp_listener(port), c;

		if (l < 0)
			return 1;
		snprintf(name, sizeof(name), "ready-%d", r);
		touch(dir, name);
		c = accept(l, NULL, NULL);
		if (c < 0) {
			fail("accept");
			return 1;
		}
		if (!echo_serve(c))
			fail("server echo");
		conns[n++] = c;
		close(l); /* the connection lives on */
	}
	/* every connection still works: a second echo on each, in order */
	for (int i = 0; i < n; i++) {
		if (!echo_serve(conns[i]))
			fail("server second echo");
		close(conns[i]);
	}
	return fails ? 1 : 0;
}

static int relisten_client(int port, int rounds, const char *dir)
{
	int conns[MAX_CONNS], n = 0, offloaded_all = 0;

	for (int r = 0; r < rounds && r < MAX_CONNS; r++) {
		char name[32];
		int c, off = 0;

		snprintf(name, sizeof(name), "ready-%d", r);
		if (!wait_file(dir, name, 30)) {
			fail("the server's round did not come");
			return 1;
		}
		c = tcp_connect(port);
		if (c < 0)
			return 1;
		if (!echo_check(c, (unsigned)r, &off))
			fail("echo");
		printf("round %d offloaded=%d\n", r, off);
		fflush(stdout);
		offloaded_all += off;
		conns[n++] = c;
	}
	for (int i = 0; i < n; i++) {
		int off = 0;

		if (!echo_check(conns[i], 1000u + (unsigned)i, &off))
			fail("second echo");
		close(conns[i]);
	}
	printf("offloaded=%d of %d\n", offloaded_all, n);
	return fails ? 1 : 0;
}

/* ---- a DNS-like server: one port number, TCP and UDP ------------------- */

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

static int udp_socket(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int one = 1, fd = socket(AF_INET, SOCK_DGRAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_ANY);
	/* as iperf3 and many servers do: SO_REUSEADDR must not let a twin in */
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, (struct sockaddr *)&a, sizeof(a))) {
		fail("udp bind");
		return -1;
	}
	return fd;
}

static int dns_server(int port, const char *order, const char *dir)
{
	int udp = -1, tcp = -1;
	unsigned probes_seen = 0, answered = 0, conns = 0;
	struct sigaction sa = { .sa_handler = on_term };

	sigaction(SIGTERM, &sa, NULL);
	if (!strcmp(order, "udp-first")) {
		udp = udp_socket(port);
		tcp = tcp_listener(port);
	} else {
		tcp = tcp_listener(port);
		udp = udp_socket(port);
	}
	if (udp < 0 || tcp < 0)
		return 1;
	touch(dir, "ready");
	while (!stop) {
		struct pollfd p[2] = { { .fd = tcp, .events = POLLIN }, { .fd = udp, .events = POLLIN } };
		int n = poll(p, udp >= 0 ? 2 : 1, 50);

		if (udp >= 0 && exists(dir, "close-udp")) {
			close(udp);
			udp = -1;
			touch(dir, "udp-closed");
			continue;
		}
		if (n <= 0)
			continue;
		if (p[0].revents & POLLIN) {
			int c = accept(tcp, NULL, NULL);

			if (c >= 0) {
				if (!echo_serve(c))
					fail("server echo");
				conns++;
				close(c);
			}
		}
		if (udp >= 0 && (p[1].revents & POLLIN)) {
			uint8_t buf[2048], reply[2050];
			struct sockaddr_storage from;
			socklen_t flen = sizeof(from);
			ssize_t r = recvfrom(udp, buf, sizeof(buf), 0, (struct sockaddr *)&from, &flen);

			if (r == PROBE_LEN && ((uint32_t)buf[0] << 24 | (uint32_t)buf[1] << 16 | (uint32_t)buf[2] << 8 | buf[3]) ==
						      PROBE_MAGIC) {
				probes_seen++;
				printf("FAIL the application's UDP socket received a fabsock probe\n");
				fflush(stdout);
				fails++;
			} else if (r >= 0) {
				reply[0] = 'A';
				reply[1] = ':';
				memcpy(reply + 2, buf, (size_t)r);
				if (sendto(udp, reply, (size_t)r + 2, 0, (struct sockaddr *)&from, flen) == r + 2)
					answered++;
			}
		}
	}
	printf("probes_seen=%u udp_answered=%u tcp_conns=%u\n", probes_seen, answered, conns);
	fflush(stdout);
	return fails ? 1 : 0;
}

static int dns_client(int port, int nconn, int queries)
{
	struct sockaddr_in a = loopback(port);
	int udp = socket(AF_INET, SOCK_DGRAM, 0), ok_queries = 0;

	for (int q = 0; q < queries; q++) {
		char msg[64], want[70], got[128];
		struct pollfd p = { .fd = udp, .events = POLLIN };
		ssize_t r = -1;

		snprintf(msg, sizeof(msg), "query-%d-%d", (int)getpid(), q);
		snprintf(want, sizeof(want), "A:%s", msg);
		if (sendto(udp, msg, strlen(msg), 0, (struct sockaddr *)&a, sizeof(a)) < 0) {
			fail("udp send");
			continue;
		}
		if (poll(&p, 1, 2000) == 1)
			r = recv(udp, got, sizeof(got) - 1, 0);
		if (r == (ssize_t)strlen(want) && !memcmp(got, want, (size_t)r))
			ok_queries++;
	}
	close(udp);
	if (queries) {
		printf("udp answered=%d of %d\n", ok_queries, queries);
		if (ok_queries != queries) {
			printf("FAIL UDP queries lost\n");
			fails++;
		}
	}
	for (int i = 0; i < nconn; i++) {
		int c = tcp_connect(port), off = 0, ok;

		if (c < 0)
			return 1;
		ok = echo_check(c, (unsigned)i, &off);
		if (!ok)
			fail("echo");
		printf("conn %d ok=%d offloaded=%d\n", i, ok, off);
		fflush(stdout);
		close(c);
	}
	return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
	int ret = 2;

	alarm(120);
	if (argc == 5 && !strcmp(argv[1], "relisten-server"))
		ret = relisten_server(atoi(argv[2]), atoi(argv[3]), argv[4]);
	else if (argc == 5 && !strcmp(argv[1], "relisten-client"))
		ret = relisten_client(atoi(argv[2]), atoi(argv[3]), argv[4]);
	else if (argc == 5 && !strcmp(argv[1], "dns-server"))
		ret = dns_server(atoi(argv[2]), argv[3], argv[4]);
	else if (argc == 5 && !strcmp(argv[1], "dns-client"))
		ret = dns_client(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	else
		fprintf(stderr, "usage: see the comment at the top of %s\n", __FILE__);
	return ret;
}
