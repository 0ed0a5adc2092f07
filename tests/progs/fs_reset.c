/* SPDX-License-Identifier: MIT */
/*
 * fs_reset: a stream fabsock cannot carry on must reach the application as
 * the kernel's reset does (issue 26): ECONNRESET on a read, EPIPE (and
 * SIGPIPE without MSG_NOSIGNAL) on a write, on both ends; never a clean end
 * of stream, never a hang, and every byte delivered before it the sender's.
 * Scenarios (`fs_reset list`):
 *   join_reset        the client's join of the server's stream fails after
 *                     its HELLO-ACK (e2e_reset sets the client's
 *                     FABSOCK_TEST_JOIN_FAIL to each errno a join can fail
 *                     with): the server, offloaded, writes RESET_ANSWER
 *                     bytes and then waits for the client's request; the
 *                     client writes its request and reads. Blocking sockets.
 *                     Both must see the reset: the client's first error (a
 *                     read's, or a write's before it) ECONNRESET (EPIPE for a
 *                     write), then an end of stream on a read, EPIPE on a
 *                     write, SIGPIPE without MSG_NOSIGNAL; the server's read
 *                     ECONNRESET, and EPIPE or ECONNRESET on its write after
 *   join_reset_epoll  the same, the client nonblocking, waiting in epoll:
 *                     the reset must be reported (EPOLLIN|EPOLLERR or
 *                     EPOLLHUP), not lost
 *   send_fail         both ends offloaded; the client's 4th data message
 *                     fails on the rail (e2e_reset sets its
 *                     FABSOCK_TEST_SEND_FAIL): its send reports ECONNRESET,
 *                     and the server, reading 1 MiB, must read an intact
 *                     prefix and then ECONNRESET while the client still
 *                     holds the connection open (FS_RESET_FLAG); then EPIPE
 *                     and one SIGPIPE on the client's next plain write
 *   recvonly_fork     a receive-only stream (the server answered, closed and
 *                     ended before the client took its HELLO-ACK: e2e_reset
 *                     sets FABSOCK_TEST_ACK_DELAY_MS) read by a child the
 *                     client forks after it settled: the child must read
 *                     the answer's bytes (a prefix of them) and then the
 *                     end of stream only after all of them, or a reset,
 *                     never a short clean end; no process dies by a signal
 *   recvonly_exec     the same stream; the client execs a reader of it
 *                     (this program, `exec-reader FD NAME`): the stream
 *                     cannot go back to TCP, and the reader must not read a
 *                     clean end short of the answer
 *   recvonly_fork_exec the same from a child the client forked
 * Every wait is bounded (SO_RCVTIMEO, poll timeouts, the harness's
 * watchdog). Output as the harness's: `PASS name`, `FAIL name: ...`,
 * `connections=N`.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define RESET_KEY 2626
#define RESET_ANSWER 12000u  /* one DATA message and the FIN: within the first grant */
#define RESET_REQUEST 1000u
#define RESET_WAIT_MS 15000  /* the peer's reset comes FABSOCK_PEER_GRACE_MS (1 s) after its RST */
#define RESET_LATE_MS 400    /* recvonly_fork: the client reads this late */
#define RESET_ANSWER_AFTER_MS 200

static bool reset_is(int err, int a, int b)
{
	return err == a || err == b;
}

static int reset_timeouts(int fd)
{
	struct timeval tv = { .tv_sec = RESET_WAIT_MS / 1000 };

	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)))
		return harness_fail("SO_RCVTIMEO/SO_SNDTIMEO: %s", strerror(errno));
	return 0;
}

/* One read of up to LEN bytes at offset *GOT of the answer, waiting in
 * poll for a nonblocking socket. Returns the read's result (errno kept);
 * bytes are checked against the pattern and counted in *GOT. */
static ssize_t reset_read(int fd, size_t *got, bool nonblocking)
{
	unsigned char buf[4096];
	double deadline = harness_now_ms() + RESET_WAIT_MS;
	ssize_t n;

	for (;;) {
		n = recv(fd, buf, sizeof(buf), 0);
		if (n >= 0 || !nonblocking || (errno != EAGAIN && errno != EWOULDBLOCK))
			break;
		if (harness_remaining_ms(deadline) == 0) {
			errno = ETIMEDOUT;
			return -1;
		}
		harness_wait_fd(fd, POLLIN, harness_remaining_ms(deadline));
	}
	if (n > 0) {
		int saved = errno;

		if (harness_pattern_check(RESET_KEY, *got, buf, (size_t)n, "the answer") < 0) {
			errno = EBADMSG;
			return -1;
		}
		*got += (size_t)n;
		errno = saved;
	}
	return n;
}

/* ---- join_reset ------------------------------------------------------------ */

/* When the server speaks. One that speaks first waits only
 * FABSOCK_FIRST_SEND_WAIT_MS for its client's probe, and under load it
 * spoke before the probe came and the connection rightly stayed on TCP
 * (1 run in 60 at load 8): the path under test never ran. So the client,
 * once its connect() has returned (its probe sent), opens a second
 * connection (raw calls: no harness count, never used), and the server
 * speaks RESET_ANSWER_AFTER_MS after it accepted that one
 * (docs/design.md, fs_tail's answer_exit). */
static int reset_server_sync(void)
{
	int sync = harness_scenario_accept();

	if (sync < 0)
		return -1;
	close(sync);
	harness_sleep_ms(RESET_ANSWER_AFTER_MS);
	return 0;
}

static int reset_client_sync(void)
{
	const struct addrinfo *a = harness_server_address;
	int sync = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

	/* blocking: connected once it returns (the kernel's backlog) */
	if (sync < 0 || connect(sync, a->ai_addr, a->ai_addrlen))
		return harness_fail("the second connection: %s", strerror(errno));
	close(sync);
	return 0;
}

static int join_reset_server(int fd)
{
	unsigned char *answer = malloc(RESET_ANSWER), req[RESET_REQUEST];
	size_t done = 0;
	ssize_t n;
	int err;

	if (!answer || reset_timeouts(fd) < 0 || reset_server_sync() < 0)
		return harness_fail("setup");
	harness_pattern_fill(RESET_KEY, 0, answer, RESET_ANSWER);
	/* The client may have reset already: a write then fails as the
	 * kernel's does after a reset. */
	err = harness_write_full(fd, answer, RESET_ANSWER, &done);
	if (err < 0 && !reset_is(-err, EPIPE, ECONNRESET)) {
		free(answer);
		return harness_fail("write of the answer after %zu bytes: %s", done, strerror(-err));
	}
	free(answer);
	n = recv(fd, req, sizeof(req), 0);
	err = errno;
	if (n == 0)
		return harness_fail("a clean end of stream where the client's connection was reset");
	if (n > 0)
		return harness_fail("%zd bytes of a request the client's reset dropped", n);
	if (err != ECONNRESET)
		return harness_fail("the read after the reset: %s, expected ECONNRESET", strerror(err));
	n = send(fd, "x", 1, MSG_NOSIGNAL);
	if (n != -1 || !reset_is(errno, EPIPE, ECONNRESET))
		return harness_fail("a write after the reset returned %zd (%s), expected EPIPE", n,
				    n < 0 ? strerror(errno) : "no error");
	harness_info("server: wrote %zu of %u bytes, then read ECONNRESET", done, RESET_ANSWER);
	return 0;
}

/* The client's side: its request, then reads until the reset; then the
 * kernel's answers after a reset. */
static int join_reset_client_io(int fd, bool nonblocking)
{
	unsigned char req[RESET_REQUEST];
	size_t got = 0, sent = 0;
	unsigned before = (unsigned)harness_sigpipe_count;
	bool reset = false;
	ssize_t n;

	harness_pattern_fill(RESET_KEY + 1, 0, req, sizeof(req));
	n = send(fd, req, sizeof(req), MSG_NOSIGNAL);
	if (n < 0 && reset_is(errno, ECONNRESET, EPIPE))
		reset = true; /* the reset came first: a write reports it */
	else if (n < 0 && !(nonblocking && reset_is(errno, EAGAIN, EWOULDBLOCK)))
		return harness_fail("the request: %s", strerror(errno));
	else if (n > 0)
		sent = (size_t)n;
	while (!reset) {
		n = reset_read(fd, &got, nonblocking);
		if (n > 0)
			continue;
		if (n == 0)
			return harness_fail("a clean end of stream after %zu bytes where the connection was reset", got);
		if (errno != ECONNRESET)
			return harness_fail("a read after %zu bytes: %s, expected ECONNRESET", got, strerror(errno));
		reset = true;
	}
	/* after a reset the kernel's socket reads an end of stream... */
	n = reset_read(fd, &got, nonblocking);
	if (n != 0)
		return harness_fail("the read after the reset returned %zd (%s), expected 0", n,
				    n < 0 ? strerror(errno) : "bytes");
	/* ...and fails writes with EPIPE, raising SIGPIPE without MSG_NOSIGNAL */
	n = send(fd, "x", 1, MSG_NOSIGNAL);
	if (n != -1 || errno != EPIPE)
		return harness_fail("a write (MSG_NOSIGNAL) after the reset returned %zd (%s), expected EPIPE", n,
				    n < 0 ? strerror(errno) : "no error");
	if ((unsigned)harness_sigpipe_count != before)
		return harness_fail("SIGPIPE for a write with MSG_NOSIGNAL");
	n = send(fd, "x", 1, 0);
	if (n != -1 || errno != EPIPE)
		return harness_fail("a write after the reset returned %zd (%s), expected EPIPE", n,
				    n < 0 ? strerror(errno) : "no error");
	if ((unsigned)harness_sigpipe_count != before + 1)
		return harness_fail("%u SIGPIPEs for one write without MSG_NOSIGNAL after the reset, expected 1",
				    (unsigned)harness_sigpipe_count - before);
	harness_info("client: request %zu of %u bytes taken, %zu answer bytes before the reset", sent, RESET_REQUEST,
		     got);
	return 0;
}

static int join_reset_client(int fd)
{
	if (reset_timeouts(fd) < 0 || reset_client_sync() < 0)
		return -1;
	return join_reset_client_io(fd, false);
}

static int join_reset_epoll_client(int fd)
{
	int epfd = epoll_create1(EPOLL_CLOEXEC), r;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.u64 = 5 }, out;

	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK))
		return harness_fail("O_NONBLOCK: %s", strerror(errno));
	if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev))
		return harness_fail("epoll: %s", strerror(errno));
	if (reset_client_sync() < 0)
		return -1;
	/* the request is held until the ACK; then wait for the reset */
	if (send(fd, "", 0, MSG_NOSIGNAL) < 0 && !reset_is(errno, ECONNRESET, EPIPE) && errno != EAGAIN)
		return harness_fail("an empty send: %s", strerror(errno));
	r = epoll_wait(epfd, &out, 1, RESET_WAIT_MS);
	close(epfd);
	if (r != 1)
		return harness_fail("epoll_wait returned %d (%s) within %d ms: the reset was not reported", r,
				    r < 0 ? strerror(errno) : "nothing", RESET_WAIT_MS);
	if (!(out.events & (EPOLLERR | EPOLLHUP | EPOLLIN)))
		return harness_fail("epoll reported 0x%x for the reset", out.events);
	return join_reset_client_io(fd, true);
}

/* ---- send_fail -------------------------------------------------------------- */

#define SEND_FAIL_BYTES (1u << 20)
/* The client writes SEND_FAIL_BYTES at a time until a send fails, at most
 * this many times: which data message is the Nth depends on how the
 * writes were cut into messages (a large one can be a single pulled
 * payload, and a write returns once its bytes are queued, before their
 * completions), so one write of 1 MiB could end before the 4th message's
 * completion failed (seen once under ASan). */
#define SEND_FAIL_WRITES 64u

/* FS_RESET_FLAG: a file the server creates once it read the reset; the
 * client keeps its socket open until then (a close would reset the
 * connection anyway: the test is that the reset comes without it). */
static int send_fail_flag_wait(void)
{
	const char *flag = getenv("FS_RESET_FLAG");
	double deadline = harness_now_ms() + RESET_WAIT_MS;

	if (!flag)
		return harness_fail("FS_RESET_FLAG is not set");
	while (access(flag, F_OK) != 0) {
		if (harness_remaining_ms(deadline) == 0)
			return harness_fail("the server did not read the reset within %d ms while this end stayed open",
					    RESET_WAIT_MS);
		harness_sleep_ms(20);
	}
	return 0;
}

static int send_fail_server(int fd)
{
	const char *flag = getenv("FS_RESET_FLAG");
	unsigned char *buf = malloc(65536);
	uint64_t got = 0;
	ssize_t n;
	int err, ffd;

	if (!buf || !flag || reset_timeouts(fd) < 0)
		return harness_fail("setup");
	for (;;) {
		n = recv(fd, buf, 65536, 0);
		if (n <= 0)
			break;
		if (harness_pattern_check(RESET_KEY, got, buf, (size_t)n, "the upload") < 0) {
			free(buf);
			return -1;
		}
		got += (uint64_t)n;
	}
	err = errno;
	free(buf);
	if (n == 0)
		return harness_fail("a clean end of stream after %llu bytes where the client's stream was reset",
				    (unsigned long long)got);
	if (err != ECONNRESET)
		return harness_fail("a read after %llu bytes: %s, expected ECONNRESET", (unsigned long long)got,
				    strerror(err));
	ffd = open(flag, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	if (ffd < 0)
		return harness_fail("%s: %s", flag, strerror(errno));
	close(ffd);
	n = send(fd, "x", 1, MSG_NOSIGNAL);
	if (n != -1 || !reset_is(errno, EPIPE, ECONNRESET))
		return harness_fail("a write after the reset returned %zd (%s), expected EPIPE", n,
				    n < 0 ? strerror(errno) : "no error");
	harness_info("server: %llu intact bytes, then ECONNRESET", (unsigned long long)got);
	return 0;
}

/* The client's Nth data message fails on the rail (e2e_reset sets its
 * FABSOCK_TEST_SEND_FAIL): its sends fail, and the server must read the
 * reset while the client still holds the connection open. */
static int send_fail_client(int fd)
{
	unsigned char *data = malloc(SEND_FAIL_BYTES);
	unsigned before = (unsigned)harness_sigpipe_count;
	uint64_t sent = 0;
	size_t done = 0;
	ssize_t n;
	int err = 0;

	if (!data || reset_timeouts(fd) < 0)
		return harness_fail("setup");
	for (unsigned i = 0; i < SEND_FAIL_WRITES && err == 0; i++) {
		harness_pattern_fill(RESET_KEY, sent, data, SEND_FAIL_BYTES);
		done = 0;
		err = harness_write_full(fd, data, SEND_FAIL_BYTES, &done);
		sent += done;
	}
	free(data);
	done = (size_t)sent;
	if (err == 0)
		return harness_fail("all %llu bytes sent: the send failure did not happen",
				    (unsigned long long)sent);
	if (!reset_is(-err, ECONNRESET, EPIPE))
		return harness_fail("the send after %zu bytes: %s, expected ECONNRESET", done, strerror(-err));
	if (send_fail_flag_wait() < 0)
		return -1;
	n = recv(fd, &err, 1, 0);
	if (n > 0 || (n < 0 && errno != ECONNRESET))
		return harness_fail("the read after the reset returned %zd (%s)", n, n < 0 ? strerror(errno) : "bytes");
	n = send(fd, "x", 1, 0);
	if (n != -1 || errno != EPIPE || (unsigned)harness_sigpipe_count != before + 1)
		return harness_fail("a write after the reset returned %zd (%s), %u SIGPIPEs: expected EPIPE and one", n,
				    n < 0 ? strerror(errno) : "no error", (unsigned)harness_sigpipe_count - before);
	harness_info("client: %zu bytes taken, then %s", done, strerror(-err));
	return 0;
}

/* ---- recvonly_fork --------------------------------------------------------- */

static int recvonly_fork_server(int fd)
{
	unsigned char *answer = malloc(RESET_ANSWER);
	size_t done = 0;
	int err;

	if (!answer || reset_server_sync() < 0)
		return harness_fail("setup");
	harness_pattern_fill(RESET_KEY, 0, answer, RESET_ANSWER);
	err = harness_write_full(fd, answer, RESET_ANSWER, &done);
	if (err < 0) {
		free(answer);
		return harness_fail("write of the answer after %zu bytes: %s", done, strerror(-err));
	}
	free(answer);
	return close(fd) ? harness_fail("close: %s", strerror(errno)) : 0; /* and the process ends */
}

static int recvonly_settle(int fd);

/* Reads FD (nonblocking) to its end: bytes of the answer, then the end of
 * stream only after all of them, or a reset. */
static int recvonly_read_all(int fd, const char *who)
{
	size_t got = 0;

	for (;;) {
		ssize_t n = reset_read(fd, &got, true);

		if (n > 0)
			continue;
		if (n == 0 && got == RESET_ANSWER) {
			harness_info("%s: all %zu bytes, then the end of stream", who, got);
			return 0;
		}
		if (n == 0)
			return harness_fail("%s: a clean end of stream after %zu of %u bytes", who, got, RESET_ANSWER);
		if (errno != ECONNRESET)
			return harness_fail("%s: a read after %zu bytes: %s", who, got, strerror(errno));
		n = reset_read(fd, &got, true);
		if (n != 0)
			return harness_fail("%s: the read after the reset returned %zd (%s), expected 0", who, n,
					    n < 0 ? strerror(errno) : "bytes");
		harness_info("%s: %zu bytes, then ECONNRESET", who, got);
		return 0;
	}
}

static int recvonly_exec_reader(int fd, const char *name);

/* The client's stream settled (receive-only by now, so that the child
 * inherits it offloaded), then a forked child reads it to its end or, with
 * EXEC, execs a reader of it (and asks the client for the stream). */
static int recvonly_forked(int fd, bool exec)
{
	pid_t pid;

	if (recvonly_settle(fd) < 0)
		return -1;
	pid = fork();
	if (pid < 0)
		return harness_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		if (exec)
			recvonly_exec_reader(fd, "recvonly_fork_exec");
		_exit(!exec && recvonly_read_all(fd, "child") == 0 ? 0 : 1);
	}
	return harness_wait_child(pid, exec ? "the child that exec'd a reader" : "the reading child", 0);
}

static int recvonly_fork_client(int fd)
{
	if (recvonly_forked(fd, false) < 0)
		return -1;
	/* what the child left, if anything: the parent's reads follow the
	 * same rule from where it stands (it may have all, or nothing) */
	{
		unsigned char buf[4096];
		ssize_t n;

		do
			n = recv(fd, buf, sizeof(buf), 0);
		while (n > 0);
		if (n < 0 && !reset_is(errno, ECONNRESET, EAGAIN))
			return harness_fail("the parent's read after the child's: %s", strerror(errno));
	}
	return 0;
}

/* ---- recvonly_exec, recvonly_fork_exec ------------------------------------ */

/* Runs this program again as `exec-reader FD NAME`, FD kept across the
 * exec. Returns only on failure. */
static int recvonly_exec_reader(int fd, const char *name)
{
	char fd_text[16];

	snprintf(fd_text, sizeof(fd_text), "%d", fd);
	if (fcntl(fd, F_SETFD, 0))
		return harness_fail("F_SETFD: %s", strerror(errno));
	fflush(stdout);
	execl("/proc/self/exe", "fs_reset", "exec-reader", fd_text, name, (char *)NULL);
	return harness_fail("exec: %s", strerror(errno));
}

/* The program that exec gave the socket to: it reads it to its end. */
static int recvonly_exec_main(int argc, char **argv)
{
	int fd = argc == 4 ? atoi(argv[2]) : -1;

	setvbuf(stdout, NULL, _IOLBF, 0);
	harness_set_name(argc == 4 ? argv[3] : "exec-reader");
	harness_watchdog_start(60, NULL);
	if (fd < 0 || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK))
		return harness_fail("no socket at fd %d", fd), 1;
	if (recvonly_read_all(fd, "exec'd") == 0 && !harness_failures()) {
		printf("PASS %s\n", argv[3]);
		return 0;
	}
	return 1;
}

/* The client's side up to the receive-only stream: its second
 * connection, the late look, the first peek (which settles it). */
static int recvonly_settle(int fd)
{
	const struct addrinfo *a = harness_server_address;
	int sync = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	double deadline;
	char byte;

	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK))
		return harness_fail("O_NONBLOCK: %s", strerror(errno));
	if (sync < 0 || connect(sync, a->ai_addr, a->ai_addrlen))
		return harness_fail("the second connection: %s", strerror(errno));
	harness_sleep_ms(RESET_LATE_MS);
	close(sync);
	deadline = harness_now_ms() + RESET_WAIT_MS;
	while (recv(fd, &byte, 1, MSG_PEEK) != 1) {
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return harness_fail("the first peek: %s", errno ? strerror(errno) : "end of stream");
		if (harness_remaining_ms(deadline) == 0)
			return harness_fail("no answer within %d ms", RESET_WAIT_MS);
		harness_wait_fd(fd, POLLIN, 50);
	}
	return 0;
}

/* The client execs a reader of the socket: the stream cannot go back to
 * TCP (its server ended), and the new program must not read a clean end. */
static int recvonly_exec_client(int fd)
{
	if (recvonly_settle(fd) < 0)
		return -1;
	return recvonly_exec_reader(fd, "recvonly_exec");
}

/* The same from a forked child, which asks the client for the stream. */
static int recvonly_fork_exec_client(int fd)
{
	return recvonly_forked(fd, true);
}

static const struct harness_scenario reset_scenarios[] = {
	{ "join_reset", join_reset_server, join_reset_client, 0 },
	{ "join_reset_epoll", join_reset_server, join_reset_epoll_client, 0 },
	{ "send_fail", send_fail_server, send_fail_client, 0 },
	{ "recvonly_fork", recvonly_fork_server, recvonly_fork_client, HARNESS_SERVER_CLOSES_FD },
	{ "recvonly_exec", recvonly_fork_server, recvonly_exec_client, HARNESS_SERVER_CLOSES_FD },
	{ "recvonly_fork_exec", recvonly_fork_server, recvonly_fork_exec_client, HARNESS_SERVER_CLOSES_FD },
};

int main(int argc, char **argv)
{
	static const struct harness_program program = {
		.name = "fs_reset",
		.scenarios = reset_scenarios,
		.count = HARNESS_COUNT(reset_scenarios),
		.watchdog_seconds = 60,
	};

	if (argc > 1 && !strcmp(argv[1], "exec-reader"))
		return recvonly_exec_main(argc, argv);
	return harness_scenario_main(&program, argc, argv);
}
