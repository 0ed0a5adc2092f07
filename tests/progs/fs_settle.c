/* SPDX-License-Identifier: MIT */
/*
 * fs_settle: a connection that settles on kernel TCP after the negotiation
 * began (the server runs as another user, a rule refuses it, the provider
 * failed and the HELLO is empty) while both ends wait in epoll_wait, and
 * change what they wait for once it settled, as event loops do
 * (memcaslap, redis-benchmark: write interest for the request, read
 * interest for the answer). Whatever settles the socket (a send, a recv,
 * fabsock's service thread, a look of epoll_wait), each readiness change
 * must reach the application with its own events and data, once.
 *
 *   fs_settle server PORT MODE   (prints `listening port=N`)
 *   fs_settle client PORT MODE
 *
 * MODE is lt, et or oneshot: how the client waits for the stream. The
 * client: connects, adds the socket for EPOLLOUT (data 5) and waits for it
 * (the server answers the HELLO only SERVER_HOLD_MS after its accept), waits
 * SETTLE_WAIT_MS (the answer comes, fabsock settles the socket by itself),
 * sends its 4-byte request and tries a recv, then moves the socket to read interest
 * with new data (6): DEL and ADD (lt), MOD with EPOLLET (et) or with
 * EPOLLONESHOT, re-armed after each event (oneshot). An eventfd and a
 * pipe in the same set are written by a thread meanwhile. The client reads
 * the server's stream (STREAM_BYTES of the harness pattern in chunks, with
 * pauses) to EOF; every event must carry data 6, 0xE or 0xF and only
 * events that were asked for (EPOLLOUT after the move means the move was
 * undone). The server: accepts, adds the connection for EPOLLIN (data 1),
 * reads the request, then moves it to EPOLLOUT (DEL and ADD, data 2) and
 * writes each chunk when told writable, then closes. Every wait is bounded
 * (EVENT_WAIT_MS per event, a 30 s alarm); a busy loop (more than
 * MAX_WAKEUPS returns of epoll_wait) fails. Prints `PASS side mode` or
 * FAIL lines, exits nonzero on a failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define STREAM_KEY 0x5e771eull
#define CHUNK_BYTES (16u << 10)
#define CHUNKS 64u
#define STREAM_BYTES ((uint64_t)CHUNK_BYTES * CHUNKS)
#define CHUNK_PAUSE_MS 4
#define EVENT_WAIT_MS 5000
#define SETTLE_WAIT_MS 600
#define SERVER_HOLD_MS 300
#define MAX_WAKEUPS 20000
#define ALARM_SECONDS 30
#define DATA_OLD 5
#define DATA_SOCK 6
#define DATA_EVENTFD 0xE
#define DATA_PIPE 0xF

enum settle_mode { MODE_LT, MODE_ET, MODE_ONESHOT };
/* lt-busy: lt without the client's SETTLE_WAIT_MS, so that it waits in
 * epoll_wait (read interest) while fabsock's service thread settles the
 * socket: its looks at the member race the release (e2e_settle's
 * "release" setup widens that moment with FABSOCK_TEST_RELEASE_DELAY_US) */
static bool busy;

static enum settle_mode mode;
static const char *mode_name;
static int wake_evfd = -1, wake_pipe[2] = { -1, -1 };

static void on_alarm(int sig)
{
	static const char line[] = "FAIL alarm: the run did not end in time\n";
	ssize_t n = write(STDOUT_FILENO, line, sizeof(line) - 1);

	(void)sig;
	(void)n;
	_exit(3);
}

static int set_nonblock(int fd)
{
	int flags = fcntl(fd, F_GETFL, 0);

	return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static int ctl(int epfd, int op, int fd, uint32_t events, uint64_t data, const char *what)
{
	struct epoll_event ev = { .events = events, .data.u64 = data };

	if (epoll_ctl(epfd, op, fd, op == EPOLL_CTL_DEL ? NULL : &ev) == 0)
		return 0;
	return harness_fail("%s: epoll_ctl: %s", what, strerror(errno));
}

/* One epoll_wait of at most EVENT_WAIT_MS, counted against MAX_WAKEUPS.
 * Returns the count, 0 at the timeout (reported), -1 (reported). */
static int wait_events(int epfd, struct epoll_event *evs, int max, unsigned *wakeups, const char *what)
{
	int n;

	do
		n = epoll_wait(epfd, evs, max, EVENT_WAIT_MS);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return harness_fail("%s: epoll_wait: %s", what, strerror(errno));
	if (n == 0)
		return harness_fail("%s: nothing reported in %d ms", what, EVENT_WAIT_MS), 0;
	if (++*wakeups > MAX_WAKEUPS)
		return harness_fail("%s: %u wake-ups: a busy loop (an event nobody asked for?)", what, *wakeups);
	return n;
}

/* ---- server ---------------------------------------------------------------- */

static int serve(const char *port)
{
	int lfd = harness_listen(AF_INET, "127.0.0.1", port, 0, 8), fd, epfd;
	struct epoll_event evs[4];
	unsigned wakeups = 0;
	char request[4];
	size_t got = 0;
	static unsigned char chunk[CHUNK_BYTES];

	if (lfd < 0)
		return 1;
	printf("listening port=%u\n", harness_local_port(lfd));
	fflush(stdout);
	fd = harness_accept(lfd, 20000, 0, NULL, NULL);
	if (fd < 0 || set_nonblock(fd) || (epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
		return 1;
	/* the client waits in epoll_wait before its HELLO is answered */
	harness_sleep_ms(SERVER_HOLD_MS);
	if (ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, 1, "server add"))
		return 1;
	while (got < sizeof(request)) {
		int n = wait_events(epfd, evs, 4, &wakeups, "server request");
		ssize_t r;

		if (n <= 0)
			return 1;
		if (evs[0].data.u64 != 1 || !(evs[0].events & EPOLLIN))
			return harness_fail("server: event %#x data %llu, expected EPOLLIN data 1", evs[0].events,
					    (unsigned long long)evs[0].data.u64);
		r = recv(fd, request + got, sizeof(request) - got, 0);
		if (r == 0)
			return harness_fail("server: EOF before the request");
		if (r < 0 && errno != EAGAIN)
			return harness_fail("server: recv: %s", strerror(errno));
		if (r > 0)
			got += (size_t)r;
	}
	if (memcmp(request, "go!\n", 4))
		return harness_fail("server: request %.4s, expected go!", request);
	/* settled by now: read interest becomes write interest */
	if (ctl(epfd, EPOLL_CTL_DEL, fd, 0, 0, "server del") || ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLOUT, 2, "server add out"))
		return 1;
	for (uint64_t off = 0; off < STREAM_BYTES;) {
		int n = wait_events(epfd, evs, 4, &wakeups, "server writable");
		ssize_t w;

		if (n <= 0)
			return 1;
		if (evs[0].data.u64 != 2 || (evs[0].events & ~(uint32_t)(EPOLLOUT | EPOLLERR | EPOLLHUP)) ||
		    !(evs[0].events & EPOLLOUT))
			return harness_fail("server: event %#x data %llu, expected EPOLLOUT data 2", evs[0].events,
					    (unsigned long long)evs[0].data.u64);
		harness_pattern_fill(STREAM_KEY, off, chunk, CHUNK_BYTES - off % CHUNK_BYTES);
		w = send(fd, chunk, CHUNK_BYTES - off % CHUNK_BYTES, MSG_NOSIGNAL);
		if (w < 0 && errno != EAGAIN)
			return harness_fail("server: send: %s", strerror(errno));
		if (w > 0) {
			off += (uint64_t)w;
			if (off % CHUNK_BYTES == 0)
				harness_sleep_ms(CHUNK_PAUSE_MS); /* the reader waits again */
		}
	}
	harness_info("server: %llu bytes sent, %u wake-ups", (unsigned long long)STREAM_BYTES, wakeups);
	close(epfd);
	close(fd);
	close(lfd);
	printf("PASS server %s\n", mode_name);
	return 0;
}

/* ---- client ---------------------------------------------------------------- */

static void *waker(void *arg)
{
	uint64_t one = 1;
	ssize_t n;

	(void)arg;
	/* lt-busy: the client's epoll_wait returns every 2 ms while its
	 * socket settles (the server answers the HELLO SERVER_HOLD_MS after
	 * its accept), and each call looks at the pending member, as an
	 * event loop with other busy connections does (memcaslap's 16) */
	for (unsigned i = 0; busy && i < 2 * SERVER_HOLD_MS / 2; i++) {
		n = write(wake_evfd, &one, sizeof(one));
		harness_sleep_ms(2);
	}
	harness_sleep_ms(60);
	n = write(wake_pipe[1], "p", 1);
	harness_sleep_ms(120);
	n = write(wake_evfd, &one, sizeof(one));
	(void)n;
	return NULL;
}

static uint32_t read_events(void)
{
	uint32_t ev = EPOLLIN | EPOLLRDHUP;

	if (mode == MODE_ET)
		ev |= EPOLLET;
	if (mode == MODE_ONESHOT)
		ev |= EPOLLONESHOT;
	return ev;
}

/* Reads what is there (all of it: an edge-triggered reader must drain) and
 * checks it against the stream. Returns 1 at EOF, 0, or -1 (reported). */
static int drain(int fd, uint64_t *off)
{
	static unsigned char buf[64 << 10];

	for (;;) {
		ssize_t r = recv(fd, buf, sizeof(buf), 0);

		if (r == 0)
			return 1;
		if (r < 0)
			return errno == EAGAIN ? 0 : harness_fail("client: recv: %s", strerror(errno));
		if (*off + (uint64_t)r > STREAM_BYTES)
			return harness_fail("client: %llu bytes, more than the %llu sent",
					    (unsigned long long)(*off + (uint64_t)r), (unsigned long long)STREAM_BYTES);
		if (harness_pattern_check(STREAM_KEY, *off, buf, (size_t)r, "client stream"))
			return -1;
		*off += (uint64_t)r;
	}
}

static int client(const char *port)
{
	struct addrinfo *ai = harness_resolve("127.0.0.1", port, AF_INET);
	struct epoll_event evs[8];
	unsigned wakeups = 0;
	bool eof = false, saw_evfd = false, saw_pipe = false;
	uint64_t off = 0;
	pthread_t thread;
	char byte;
	int fd, epfd, n;
	ssize_t r;

	if (!ai || (fd = harness_connect(ai, 0)) < 0)
		return 1;
	freeaddrinfo(ai);
	if (set_nonblock(fd) || (epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
	    (wake_evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 || pipe2(wake_pipe, O_NONBLOCK | O_CLOEXEC))
		return harness_fail("client: setup: %s", strerror(errno));
	if (ctl(epfd, EPOLL_CTL_ADD, wake_evfd, EPOLLIN, DATA_EVENTFD, "client add eventfd") ||
	    ctl(epfd, EPOLL_CTL_ADD, wake_pipe[0], EPOLLIN, DATA_PIPE, "client add pipe"))
		return 1;
	/* in the set while still negotiating (the server answers its HELLO
	 * only SERVER_HOLD_MS after its accept) */
	if (ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLOUT | (mode == MODE_ET ? EPOLLET : 0), DATA_OLD, "client add out"))
		return 1;
	n = wait_events(epfd, evs, 8, &wakeups, "client writable");
	if (n <= 0)
		return 1;
	if (n != 1 || evs[0].data.u64 != DATA_OLD || !(evs[0].events & EPOLLOUT))
		return harness_fail("client: %d events, first %#x data %llu, expected EPOLLOUT data %d", n,
				    evs[0].events, (unsigned long long)evs[0].data.u64, DATA_OLD);
	/* the server's answer to the HELLO (a NAK, an empty HELLO) comes in,
	 * and fabsock settles the socket on TCP by itself meanwhile */
	if (!busy)
		harness_sleep_ms(SETTLE_WAIT_MS);
	if (harness_send_all(fd, "go!\n", 4))
		return 1;
	/* a receive with nothing there yet settles the socket too */
	r = recv(fd, &byte, 0, MSG_DONTWAIT);
	(void)r;
	if (mode == MODE_LT) {
		if (ctl(epfd, EPOLL_CTL_DEL, fd, 0, 0, "client del") ||
		    ctl(epfd, EPOLL_CTL_ADD, fd, read_events(), DATA_SOCK, "client add in"))
			return 1;
	} else if (ctl(epfd, EPOLL_CTL_MOD, fd, read_events(), DATA_SOCK, "client mod in")) {
		return 1;
	}
	if (pthread_create(&thread, NULL, waker, NULL))
		return harness_fail("client: pthread_create failed");
	while (!eof || !saw_evfd || !saw_pipe) {
		n = wait_events(epfd, evs, 8, &wakeups, eof ? "client wake-ups" : "client stream");
		if (n <= 0)
			break;
		for (int i = 0; i < n; i++) {
			uint64_t v;

			if (evs[i].data.u64 == DATA_EVENTFD) {
				if (evs[i].events != EPOLLIN || read(wake_evfd, &v, sizeof(v)) != sizeof(v))
					return harness_fail("client: eventfd event %#x", evs[i].events);
				saw_evfd = true;
				continue;
			}
			if (evs[i].data.u64 == DATA_PIPE) {
				if (evs[i].events != EPOLLIN || read(wake_pipe[0], &byte, 1) != 1)
					return harness_fail("client: pipe event %#x", evs[i].events);
				saw_pipe = true;
				continue;
			}
			if (evs[i].data.u64 != DATA_SOCK)
				return harness_fail("client: event %#x with data %llu (the registration of before)",
						    evs[i].events, (unsigned long long)evs[i].data.u64);
			if (evs[i].events & ~(uint32_t)(EPOLLIN | EPOLLRDHUP | EPOLLHUP))
				return harness_fail("client: socket event %#x, asked for %#x only", evs[i].events,
						    read_events());
			if (eof)
				return harness_fail("client: socket event %#x after EOF was read", evs[i].events);
			switch (drain(fd, &off)) {
			case 1:
				eof = true;
				/* the kernel would keep reporting EOF: out of the set */
				if (ctl(epfd, EPOLL_CTL_DEL, fd, 0, 0, "client del at EOF"))
					return 1;
				break;
			case 0:
				if (mode == MODE_ONESHOT &&
				    ctl(epfd, EPOLL_CTL_MOD, fd, read_events(), DATA_SOCK, "client re-arm"))
					return 1;
				break;
			default:
				return 1;
			}
		}
	}
	pthread_join(thread, NULL);
	if (!eof || off != STREAM_BYTES || !saw_evfd || !saw_pipe)
		return harness_fail("client: eof %d, %llu of %llu bytes, eventfd %d, pipe %d", eof,
				    (unsigned long long)off, (unsigned long long)STREAM_BYTES, saw_evfd, saw_pipe);
	harness_info("client: %llu bytes checked, %u wake-ups", (unsigned long long)off, wakeups);
	close(fd);
	close(epfd);
	printf("PASS client %s\n", mode_name);
	return 0;
}

int main(int argc, char **argv)
{
	int ret;

	if (argc != 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: fs_settle server|client PORT lt|et|oneshot|lt-busy\n");
		return 2;
	}
	mode_name = argv[3];
	if (!strcmp(mode_name, "lt"))
		mode = MODE_LT;
	else if (!strcmp(mode_name, "et"))
		mode = MODE_ET;
	else if (!strcmp(mode_name, "oneshot"))
		mode = MODE_ONESHOT;
	else if (!strcmp(mode_name, "lt-busy"))
		mode = MODE_LT, busy = true;
	else
		return fprintf(stderr, "fs_settle: unknown mode %s\n", mode_name), 2;
	harness_set_name(argv[1]);
	signal(SIGALRM, on_alarm);
	alarm(ALARM_SECONDS);
	ret = strcmp(argv[1], "server") ? client(argv[2]) : serve(argv[2]);
	fflush(stdout);
	return ret || harness_failures() ? 1 : 0;
}
