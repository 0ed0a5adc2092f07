/* SPDX-License-Identifier: MIT */
/*
 * fs_tcpfirst: one connection carrying BYTES each way at once, in mixed
 * write and read sizes, for e2e_tcpfirst (FABSOCK_TCP_FIRST: the bytes start
 * on TCP and move to the fabric at an agreed offset). Each side writes a
 * pseudo-random stream of its own (xorshift, seeded by its side), shuts its
 * sending side down, and reads the peer's to its end. What it sent goes to
 * OUTDIR/SIDE.sent, what it read to OUTDIR/SIDE.recv, for the script to
 * compare with sha256sum (OUTDIR "-": no files, for timing runs); the reader also checks every byte against the
 * peer's stream itself. MODE says how:
 *   block     a writer thread and a blocking reader (with a MSG_PEEK now and
 *             then, whose bytes must be the ones the next read returns)
 *   epoll-lt  one thread, a nonblocking socket in level-triggered epoll
 *   epoll-et  the same, edge-triggered (every read and write to EAGAIN)
 * Usage: fs_tcpfirst server PORT MODE OUTDIR BYTES
 *        fs_tcpfirst client PORT MODE OUTDIR BYTES
 * Prints "result ok" and exits 0, or "result FAIL ..." and exits 1; a
 * watchdog (60 s) ends a hang with exit 2.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define TF_MAX_IO (96 * 1024)

static const char *side;
static int sock_fd = -1;
static uint64_t total_bytes;
static FILE *sent_file, *recv_file;

static void fail(const char *what)
{
	printf("%s: result FAIL %s (errno %d %s)\n", side, what, errno, strerror(errno));
	fflush(stdout);
	exit(1);
}

static void on_alarm(int sig)
{
	static const char line[] = "result FAIL watchdog: 60 s\n";

	(void)sig;
	if (write(1, line, sizeof(line) - 1) < 0) {
		/* nothing left to tell */
	}
	_exit(2);
}

/* A side's byte stream: byte I of SEED's stream, as a generator. */
struct tf_gen {
	uint64_t x;
	uint64_t word;
	unsigned left;
};

static void gen_init(struct tf_gen *g, uint64_t seed)
{
	g->x = seed * 0x9e3779b97f4a7c15ull | 1;
	g->left = 0;
}

static uint8_t gen_byte(struct tf_gen *g)
{
	uint8_t b;

	if (!g->left) {
		g->x ^= g->x << 13;
		g->x ^= g->x >> 7;
		g->x ^= g->x << 17;
		g->word = g->x;
		g->left = 8;
	}
	b = (uint8_t)g->word;
	g->word >>= 8;
	g->left--;
	return b;
}

/* Sizes: mostly mixed up to TF_MAX_IO, some tiny ones. */
static size_t pick_size(uint64_t *r)
{
	*r ^= *r << 13;
	*r ^= *r >> 7;
	*r ^= *r << 17;
	switch (*r % 4) {
	case 0:
		return 1 + (size_t)(*r >> 8) % 100;
	case 1:
		return 1 + (size_t)(*r >> 8) % 4096;
	default:
		return 1 + (size_t)(*r >> 8) % TF_MAX_IO;
	}
}

struct tf_side {
	struct tf_gen out_gen, in_gen;
	uint64_t sent, got, rng;
	uint8_t out_buf[TF_MAX_IO];
	size_t out_len, out_off; /* the current write: OUT_BUF[OUT_OFF..OUT_LEN) */
	uint8_t in_buf[TF_MAX_IO];
	bool out_done, in_done;
};

static struct tf_side S;

static void fill_next_write(void)
{
	size_t n = pick_size(&S.rng);

	if (n > total_bytes - S.sent)
		n = (size_t)(total_bytes - S.sent);
	for (size_t i = 0; i < n; i++)
		S.out_buf[i] = gen_byte(&S.out_gen);
	S.out_len = n;
	S.out_off = 0;
}

/* Checks and keeps N bytes the reader got. */
static void take_in(const uint8_t *buf, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (buf[i] != gen_byte(&S.in_gen)) {
			char what[96];

			snprintf(what, sizeof(what), "byte %llu differs from the peer's stream",
				 (unsigned long long)(S.got + i));
			errno = 0;
			fail(what);
		}
	if (recv_file && fwrite(buf, 1, n, recv_file) != n)
		fail("write recv file");
	S.got += n;
	if (S.got > total_bytes)
		fail("more bytes than the peer sent");
}

/* Writes what is left of the current write; false on EAGAIN. */
static bool write_some(void)
{
	while (S.sent < total_bytes) {
		ssize_t n;

		if (S.out_off == S.out_len)
			fill_next_write();
		n = (S.rng & 1) ? send(sock_fd, S.out_buf + S.out_off, S.out_len - S.out_off, MSG_NOSIGNAL)
				: write(sock_fd, S.out_buf + S.out_off, S.out_len - S.out_off);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return false;
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail("send");
		if (sent_file && fwrite(S.out_buf + S.out_off, 1, (size_t)n, sent_file) != (size_t)n)
			fail("write sent file");
		S.out_off += (size_t)n;
		S.sent += (uint64_t)n;
	}
	if (!S.out_done) {
		if (shutdown(sock_fd, SHUT_WR))
			fail("shutdown");
		S.out_done = true;
	}
	return true;
}

static void *writer_thread(void *arg)
{
	(void)arg;
	write_some();
	return NULL;
}

static bool is_server;

static void run_block(void)
{
	pthread_t t;
	bool writing = false;
	uint64_t r = S.rng ^ 0x5555;

	for (;;) {
		/* the client writes once the server's first bytes came (after
		 * its ACK: its direction then starts on TCP too) */
		if (!writing && (is_server || S.got)) {
			if (pthread_create(&t, NULL, writer_thread, NULL))
				fail("pthread_create");
			writing = true;
		}
		size_t want = pick_size(&r);
		ssize_t n;

		if ((r >> 20) % 16 == 0) {
			/* a peek, then the read: the same bytes */
			static uint8_t peeked[TF_MAX_IO];
			ssize_t p = recv(sock_fd, peeked, want, MSG_PEEK);

			if (p < 0 && errno == EINTR)
				continue;
			if (p < 0)
				fail("recv MSG_PEEK");
			n = recv(sock_fd, S.in_buf, (size_t)p, 0);
			if (p > 0 && (n <= 0 || memcmp(peeked, S.in_buf, (size_t)n) != 0)) {
				errno = 0;
				fail("a read after MSG_PEEK returned other bytes");
			}
		} else {
			n = read(sock_fd, S.in_buf, want);
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			fail("read");
		if (n == 0)
			break;
		take_in(S.in_buf, (size_t)n);
	}
	S.in_done = true;
	if (!writing) {
		errno = 0;
		fail("the peer's stream ended before it began");
	}
	pthread_join(t, NULL);
}

static void run_epoll(bool et)
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	/* the client writes once the server's first bytes came (run_block) */
	struct epoll_event ev = { .events = EPOLLIN | (is_server ? EPOLLOUT : 0) | EPOLLRDHUP | (et ? EPOLLET : 0) };
	bool want_out = is_server;
	uint64_t r = S.rng ^ 0xaaaa;

	if (ep < 0 || fcntl(sock_fd, F_SETFL, fcntl(sock_fd, F_GETFL) | O_NONBLOCK))
		fail("epoll/nonblock");
	if (epoll_ctl(ep, EPOLL_CTL_ADD, sock_fd, &ev))
		fail("epoll_ctl ADD");
	while (!S.in_done || !S.out_done) {
		struct epoll_event got[4];
		int k = epoll_wait(ep, got, 4, 10000);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			fail("epoll_wait");
		if (k == 0) {
			errno = 0;
			fail("epoll_wait: 10 s without an event");
		}
		for (int i = 0; i < k; i++) {
			if ((got[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && !S.in_done) {
				for (;;) {
					ssize_t n = read(sock_fd, S.in_buf, pick_size(&r));

					if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
						break;
					if (n < 0 && errno == EINTR)
						continue;
					if (n < 0)
						fail("read");
					if (n == 0) {
						S.in_done = true;
						break;
					}
					take_in(S.in_buf, (size_t)n);
					if (!et)
						break; /* level-triggered: the next wait says if more is there */
				}
			}
			if ((got[i].events & EPOLLOUT) && !S.out_done)
				write_some();
		}
		if (!want_out && !S.out_done && S.got) {
			ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | (et ? EPOLLET : 0);
			if (epoll_ctl(ep, EPOLL_CTL_MOD, sock_fd, &ev))
				fail("epoll_ctl MOD");
			want_out = true;
		}
		if (S.out_done && want_out) {
			ev.events = EPOLLIN | EPOLLRDHUP | (et ? EPOLLET : 0);
			if (epoll_ctl(ep, EPOLL_CTL_MOD, sock_fd, &ev))
				fail("epoll_ctl MOD");
			want_out = false;
		}
	}
	close(ep);
}

static FILE *open_out(const char *dir, const char *what)
{
	char path[512];
	FILE *f;

	if (strcmp(dir, "-") == 0)
		return NULL; /* timing runs: the byte checks only */
	snprintf(path, sizeof(path), "%s/%s.%s", dir, side, what);
	f = fopen(path, "w");
	if (!f)
		fail(path);
	return f;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	bool server;
	const char *mode;

	if (argc != 6) {
		fprintf(stderr, "usage: %s server|client PORT MODE OUTDIR BYTES\n", argv[0]);
		return 2;
	}
	side = argv[1];
	server = is_server = strcmp(side, "server") == 0;
	a.sin_port = htons((uint16_t)atoi(argv[2]));
	mode = argv[3];
	total_bytes = strtoull(argv[5], NULL, 10);
	signal(SIGALRM, on_alarm);
	alarm(60);
	setvbuf(stdout, NULL, _IOLBF, 0);
	sent_file = open_out(argv[4], "sent");
	recv_file = open_out(argv[4], "recv");
	/* each side's stream, and the one it expects from its peer */
	gen_init(&S.out_gen, server ? 2 : 1);
	gen_init(&S.in_gen, server ? 1 : 2);
	S.rng = server ? 0x1234567 : 0x7654321;
	if (server) {
		int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

		if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
		    bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 4))
			fail("listen");
		printf("server: listening\n");
		sock_fd = accept(l, NULL, NULL);
		if (sock_fd < 0)
			fail("accept");
		close(l);
	} else {
		sock_fd = socket(AF_INET, SOCK_STREAM, 0);
		if (sock_fd < 0 || connect(sock_fd, (struct sockaddr *)&a, sizeof(a)))
			fail("connect");
	}
	if (strcmp(mode, "block") == 0)
		run_block();
	else if (strcmp(mode, "epoll-lt") == 0)
		run_epoll(false);
	else if (strcmp(mode, "epoll-et") == 0)
		run_epoll(true);
	else
		fail("unknown mode");
	if (S.got != total_bytes) {
		char what[96];

		snprintf(what, sizeof(what), "read %llu bytes, expected %llu", (unsigned long long)S.got,
			 (unsigned long long)total_bytes);
		errno = 0;
		fail(what);
	}
	if (sent_file)
		fclose(sent_file);
	if (recv_file)
		fclose(recv_file);
	{
		/* the kernel's own count of this connection: every byte it
		 * received once, and the bytes it sent again (the script's
		 * allowance beside N: a loaded machine's loopback drops and
		 * retransmits segments, which the nft counter sees twice) */
		struct tcp_info ti;
		socklen_t len = sizeof(ti);

		memset(&ti, 0, sizeof(ti));
		if (getsockopt(sock_fd, IPPROTO_TCP, TCP_INFO, &ti, &len))
			fail("TCP_INFO");
		printf("%s: tcp_info bytes_received=%llu bytes_retrans=%llu\n", side,
		       (unsigned long long)ti.tcpi_bytes_received, (unsigned long long)ti.tcpi_bytes_retrans);
	}
	close(sock_fd);
	printf("%s: sent %llu got %llu result ok\n", side, (unsigned long long)S.sent, (unsigned long long)S.got);
	return 0;
}
