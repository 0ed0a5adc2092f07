/* SPDX-License-Identifier: MIT */
/*
 * fs_shortconn: COUNT short connections in a row, each a REQ-byte request
 * and a REPLY-byte answer, then close (e2e_tcpfirst2: TCP first's waitless
 * handshake). The request of connection i is a pseudo-random stream seeded
 * by i; the answer is seeded by i and the request's last byte, so that a
 * byte added, lost or moved at either end's head shows in the content, not
 * only in the counts. Each side checks what it reads itself, and writes
 * what it sent and read to OUTDIR/SIDE.sent and OUTDIR/SIDE.recv for the
 * script's sha256 comparison.
 * Usage: fs_shortconn server|client PORT COUNT REQ REPLY OUTDIR [first] [nb]
 *   first  (both sides) the server writes its answer before it reads the
 *          request
 *   nb     (client) nonblocking connect and I/O through poll
 *   oneway (both sides) no answer: the client writes its request and
 *          closes without reading; the server reads it to its end
 *   waitdone (client) before it exits, wait (up to 60 s) for the server's
 *          OUTDIR/server.done, which the server makes when it is done: the
 *          client's process outlives its closed connections
 *   ep     (both sides) nonblocking sockets in an epoll set (EPOLLIN |
 *          EPOLLOUT | EPOLLRDHUP, edge-triggered), as nginx keeps them: the
 *          server adds each accepted socket, the client adds its socket
 *          before connect() (nginx's upstream connections); a call that
 *          returns EAGAIN waits in epoll_wait. Nothing is taken out: the
 *          close takes the socket out of the set
 * Prints "result ok" and exits 0, or "result FAIL ..." and exits 1; a
 * watchdog (120 s) ends a hang with exit 2.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define SC_MAX 1048576

static const char *side;
static bool nonblock;
static int epfd = -1; /* ep: the epoll set */
static FILE *sent_file, *recv_file;

static void fail(const char *what, unsigned i)
{
	printf("%s: result FAIL %s (connection %u, errno %d %s)\n", side, what, i, errno, strerror(errno));
	fflush(stdout);
	exit(1);
}

static void on_alarm(int sig)
{
	static const char line[] = "result FAIL watchdog: 120 s\n";

	(void)sig;
	if (write(1, line, sizeof(line) - 1) < 0) {
		/* nothing left to tell */
	}
	_exit(2);
}

static void fill(uint8_t *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x1234567;

	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (uint8_t)(x >> 24);
	}
}

/* ep: after EAGAIN, waits (30 s at most) for the set's next event (its
 * only member is the connection). */
static void ep_wait(unsigned i)
{
	struct epoll_event ev[4];
	int n;

	do
		n = epoll_wait(epfd, ev, 4, 30000);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		fail("epoll_wait timed out", i);
}

static void ep_add(int fd, unsigned i)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.fd = fd };

	if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev))
		fail("epoll_ctl", i);
}

static void wait_for(int fd, short events, unsigned i)
{
	struct pollfd p = { .fd = fd, .events = events };

	if (!nonblock || epfd >= 0)
		return;
	if (poll(&p, 1, 30000) != 1)
		fail("poll timed out", i);
}

static void write_all(int fd, const uint8_t *buf, size_t len, unsigned i)
{
	for (size_t done = 0; done < len;) {
		ssize_t n;

		wait_for(fd, POLLOUT, i);
		n = send(fd, buf + done, len - done, MSG_NOSIGNAL);
		if (n < 0 && (errno == EINTR || (nonblock && errno == EAGAIN))) {
			if (errno == EAGAIN && epfd >= 0)
				ep_wait(i);
			continue;
		}
		if (n <= 0)
			fail("send", i);
		done += (size_t)n;
	}
	if (fwrite(buf, 1, len, sent_file) != len)
		fail("fwrite", i);
}

/* Reads exactly LEN bytes, in reads of varying size (1 byte first: a head
 * stripped wrongly shows at once), then checks the end of stream. */
static void read_exact(int fd, uint8_t *buf, size_t len, bool want_eof, unsigned i)
{
	size_t done = 0;
	unsigned k = 0;

	while (done < len) {
		size_t want = k == 0 ? 1 : (k % 3 == 1 ? 7 : len - done);
		ssize_t n;

		if (want > len - done)
			want = len - done;
		wait_for(fd, POLLIN, i);
		n = recv(fd, buf + done, want, 0);
		if (n < 0 && (errno == EINTR || (nonblock && errno == EAGAIN))) {
			if (errno == EAGAIN && epfd >= 0)
				ep_wait(i);
			continue;
		}
		if (n == 0)
			fail("early end of stream", i);
		if (n < 0)
			fail("recv", i);
		done += (size_t)n;
		k++;
	}
	if (fwrite(buf, 1, len, recv_file) != len)
		fail("fwrite", i);
	if (want_eof) {
		uint8_t extra;
		ssize_t n;

		for (;;) {
			wait_for(fd, POLLIN, i);
			n = recv(fd, &extra, 1, 0);
			if (n < 0 && (errno == EINTR || (nonblock && errno == EAGAIN))) {
				if (errno == EAGAIN && epfd >= 0)
					ep_wait(i);
				continue;
			}
			break;
		}
		if (n != 0)
			fail("bytes past the answer, or no end of stream", i);
	}
}

static void check(const uint8_t *got, const uint8_t *want, size_t len, const char *what, unsigned i)
{
	if (memcmp(got, want, len)) {
		for (size_t j = 0; j < len; j++)
			if (got[j] != want[j]) {
				printf("%s: result FAIL %s differs at byte %zu of connection %u (%02x, not %02x)\n", side, what,
				       j, i, got[j], want[j]);
				fflush(stdout);
				exit(1);
			}
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	static uint8_t req[SC_MAX], reply[SC_MAX], got[SC_MAX];
	unsigned count;
	size_t req_len, reply_len;
	bool server_first = false, oneway = false, waitdone = false;
	char path[4096];
	int one = 1;

	if (argc < 7) {
		fprintf(stderr, "usage: fs_shortconn server|client PORT COUNT REQ REPLY OUTDIR [first|nb|oneway|waitdone|ep]\n");
		return 1;
	}
	side = argv[1];
	a.sin_port = htons((uint16_t)atoi(argv[2]));
	count = (unsigned)strtoul(argv[3], NULL, 10);
	req_len = strtoul(argv[4], NULL, 10);
	reply_len = strtoul(argv[5], NULL, 10);
	if (!req_len || !reply_len || req_len > SC_MAX || reply_len > SC_MAX)
		return 1;
	for (int k = 7; k < argc; k++) {
		server_first |= !strcmp(argv[k], "first");
		nonblock |= !strcmp(argv[k], "nb");
		oneway |= !strcmp(argv[k], "oneway");
		waitdone |= !strcmp(argv[k], "waitdone");
		if (!strcmp(argv[k], "ep")) {
			nonblock = true;
			epfd = epoll_create1(EPOLL_CLOEXEC);
			if (epfd < 0)
				fail("epoll_create1", 0);
		}
	}
	signal(SIGALRM, on_alarm);
	alarm(120);
	snprintf(path, sizeof(path), "%s/%s.sent", argv[6], side);
	sent_file = fopen(path, "w");
	snprintf(path, sizeof(path), "%s/%s.recv", argv[6], side);
	recv_file = fopen(path, "w");
	if (!sent_file || !recv_file)
		fail("fopen", 0);
	if (!strcmp(side, "server")) {
		int ls = socket(AF_INET, SOCK_STREAM, 0);

		setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) || listen(ls, 128))
			fail("listen", 0);
		printf("server: listening\n");
		fflush(stdout);
		for (unsigned i = 0; i < count; i++) {
			int fd = accept4(ls, NULL, NULL, epfd >= 0 ? SOCK_NONBLOCK : 0);

			if (fd < 0)
				fail("accept", i);
			if (epfd >= 0)
				ep_add(fd, i);
			fill(req, req_len, 2 * (uint64_t)i + 1);
			/* server first: the answer cannot depend on the request */
			fill(reply, reply_len, 2 * (uint64_t)i + 2 + (server_first ? 0 : req[req_len - 1]));
			if (server_first && !oneway)
				write_all(fd, reply, reply_len, i);
			read_exact(fd, got, req_len, oneway, i);
			check(got, req, req_len, "the request", i);
			if (!server_first && !oneway)
				write_all(fd, reply, reply_len, i);
			close(fd);
		}
		close(ls);
		snprintf(path, sizeof(path), "%s/server.done", argv[6]);
		fclose(fopen(path, "w"));
	} else {
		for (unsigned i = 0; i < count; i++) {
			int fd = socket(AF_INET, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0);

			if (fd < 0)
				fail("socket", i);
			if (epfd >= 0)
				ep_add(fd, i); /* before connect(), as nginx's upstream */
			if (connect(fd, (struct sockaddr *)&a, sizeof(a)) && !(nonblock && errno == EINPROGRESS))
				fail("connect", i);
			fill(req, req_len, 2 * (uint64_t)i + 1);
			fill(reply, reply_len, 2 * (uint64_t)i + 2 + (server_first ? 0 : req[req_len - 1]));
			write_all(fd, req, req_len, i);
			if (!oneway) {
				read_exact(fd, got, reply_len, true, i);
				check(got, reply, reply_len, "the answer", i);
			}
			close(fd);
		}
	}
	if (waitdone) {
		snprintf(path, sizeof(path), "%s/server.done", argv[6]);
		for (int t = 0; t < 6000 && access(path, F_OK); t++)
			usleep(10000);
	}
	if (fclose(sent_file) || fclose(recv_file))
		fail("fclose", count);
	printf("%s: %u connections result ok\n", side, count);
	return 0;
}
