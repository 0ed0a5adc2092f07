/* SPDX-License-Identifier: MIT */
/*
 * fs_evloop: checks one event-loop semantic per run (nonblocking sockets,
 * nonblocking connect and accept, epoll in its level-triggered, edge-triggered
 * and one-shot modes, poll, select, their timeouts and signal behaviour), as
 * Linux kernel TCP implements it, so the same expectations can be held against
 * a process running under LD_PRELOAD=libfabsock.so. The script starts
 * `fs_evloop server PORT SCENARIO` (PORT 0 picks one; the server prints
 * `listening port=N` once it listens) and `fs_evloop client HOST PORT
 * SCENARIO`. Every socket is nonblocking (the listening socket too). Client and
 * server synchronize through the connection itself: the client sends small
 * commands ('w' + length: "write me that many bytes of the test stream", 'd':
 * "your turn", 'a': "done") and every wait is bounded, by poll timeouts, loop
 * counts and a SIGALRM watchdog. Each process prints `PASS name` or
 * `FAIL name: detail` lines, `info name: ...` measurements and finally
 * `connections=N` (how many TCP connections it opened or accepted), and exits
 * nonzero on any failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define EV_WATCHDOG_SECONDS 40
/* Bound for an event that must come promptly (data already sent, a drained buffer). */
#define EV_EVENT_WAIT_MS 5000
/* How long "nothing is reported" is watched. */
#define EV_QUIET_MS 200
/* The test stream repeats with this prime period: a lost, repeated or shifted 64 KiB block shows. */
#define EV_PATTERN_PERIOD 65521
#define EV_FILL_LIMIT_BYTES (256ull << 20)
#define EV_FILL_LIMIT_MS 20000
/* A timed wait of 300 ms must return after 250..1500 ms, using < 30 % CPU meanwhile. */
#define EV_TIMEOUT_MS 300
#define EV_TIMEOUT_LOW_MS 250
#define EV_TIMEOUT_HIGH_MS 1500
#define EV_CPU_LIMIT 0.30

static unsigned char pattern_table[2 * EV_PATTERN_PERIOD];
static volatile sig_atomic_t usr1_count;
static volatile sig_atomic_t alarm_count;

/* ---- reporting and small helpers --------------------------------------- */

static void ev_write_and_exit(const char *message)
{
	if (write(STDOUT_FILENO, message, strlen(message)) < 0)
		_exit(3);
	_exit(3);
}

static void ev_count_usr1(int signal_number)
{
	(void)signal_number;
	usr1_count++;
}

/* The eintr scenario's SIGALRM handler; the periodic timer also makes it the watchdog meanwhile. */
static void ev_count_alarm(int signal_number)
{
	(void)signal_number;
	if (++alarm_count > 100)
		ev_write_and_exit("FAIL eintr: 100 SIGALRMs (10 s) without the checks finishing\n");
}

/* User plus system CPU time of the whole process, in ms. */
static double ev_cpu_ms(void)
{
	struct rusage usage;
	getrusage(RUSAGE_SELF, &usage);
	return (double)(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e3 +
	       (double)(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e3;
}

/* The test stream: byte at stream offset i is pattern_table[i % period]. */
static void ev_pattern_init(void)
{
	for (size_t i = 0; i < sizeof(pattern_table); i++) {
		size_t index = i % EV_PATTERN_PERIOD;
		pattern_table[i] = (unsigned char)((index * 7 + 3) ^ (index >> 8) ^ (index >> 13));
	}
}

/* 0 if buffer holds the test stream from *offset on (and advances it), else fails naming where. */
static int ev_stream_check(const unsigned char *buffer, size_t length, uint64_t *offset, const char *what)
{
	for (size_t i = 0; i < length; i++) {
		unsigned char expected = pattern_table[(*offset + i) % EV_PATTERN_PERIOD];
		if (buffer[i] != expected)
			return harness_fail("%s: stream byte %llu is 0x%02x, expected 0x%02x", what,
				       (unsigned long long)(*offset + i), buffer[i], expected);
	}
	*offset += length;
	return 0;
}

static const char *ev_error_text(ssize_t result)
{
	return result < 0 ? strerror(errno) : result == 0 ? "0" : "data";
}

static bool ev_is_eagain(ssize_t result)
{
	return result < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Text of an epoll/poll event mask, for messages. */
static const char *ev_events_text(uint32_t events)
{
	static char text[128];
	static const struct {
		uint32_t bit;
		const char *name;
	} names[] = { { EPOLLIN, "IN" },   { EPOLLOUT, "OUT" }, { EPOLLRDHUP, "RDHUP" }, { EPOLLPRI, "PRI" },
		      { EPOLLERR, "ERR" }, { EPOLLHUP, "HUP" }, { EPOLLRDNORM, "RDNORM" }, { EPOLLWRNORM, "WRNORM" } };
	text[0] = '\0';
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (events & names[i].bit)
			snprintf(text + strlen(text), sizeof(text) - strlen(text), "%s%s", text[0] ? "|" : "",
				 names[i].name);
	if (!text[0])
		snprintf(text, sizeof(text), "0x%x", events);
	return text;
}

/* ---- bounded nonblocking I/O -------------------------------------------- */

/* Sends LENGTH bytes of the test stream from *offset on, waiting (bounded) while the socket is full. */
static int ev_send_stream(int fd, uint64_t *offset, uint64_t length)
{
	uint64_t end = *offset + length;
	double deadline = harness_now_ms() + HARNESS_PEER_WAIT_MS;
	while (*offset < end) {
		size_t chunk = end - *offset < EV_PATTERN_PERIOD ? (size_t)(end - *offset) : EV_PATTERN_PERIOD;
		ssize_t result = send(fd, pattern_table + *offset % EV_PATTERN_PERIOD, chunk, MSG_NOSIGNAL);
		if (result > 0) {
			*offset += (uint64_t)result;
		} else if (ev_is_eagain(result)) {
			if (harness_wait_fd(fd, POLLOUT, harness_remaining_ms(deadline)) <= 0)
				return harness_fail("send: not writable again within %d ms", HARNESS_PEER_WAIT_MS);
		} else if (result == 0 || errno != EINTR) {
			return harness_fail("send: %s", ev_error_text(result));
		}
	}
	return 0;
}

/* Receives exactly LENGTH bytes of the test stream from *offset on and checks them. */
static int ev_recv_stream(int fd, uint64_t *offset, size_t length, const char *what)
{
	static unsigned char buffer[EV_PATTERN_PERIOD];
	while (length > 0) {
		size_t chunk = length < sizeof(buffer) ? length : sizeof(buffer);
		if (harness_recv_exact(fd, buffer, chunk) < 0 || ev_stream_check(buffer, chunk, offset, what) < 0)
			return -1;
		length -= chunk;
	}
	return 0;
}

/* A recv on fd now must return -1 EAGAIN/EWOULDBLOCK. */
static int ev_expect_eagain(int fd, const char *when)
{
	char byte;
	ssize_t result = recv(fd, &byte, 1, 0);
	if (!ev_is_eagain(result))
		return harness_fail("recv %s returned %zd (%s), expected -1 EAGAIN", when, result, ev_error_text(result));
	return 0;
}

static int ev_so_error(int fd, int *error)
{
	socklen_t length = sizeof(*error);
	*error = -1;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, error, &length) < 0)
		return harness_fail("getsockopt(SO_ERROR): %s", strerror(errno));
	return 0;
}

/* ---- epoll helpers -------------------------------------------------------- */

static int ev_epoll_create(void)
{
	int epfd = epoll_create1(EPOLL_CLOEXEC);
	if (epfd < 0) {
		harness_fail("epoll_create1: %s", strerror(errno));
		exit(1);
	}
	return epfd;
}

static int ev_epoll_ctl(int epfd, int operation, int fd, uint32_t events, uint64_t data)
{
	struct epoll_event event = { .events = events, .data.u64 = data };
	if (epoll_ctl(epfd, operation, fd, &event) < 0)
		return harness_fail("epoll_ctl(%s, fd %d, %s): %s",
			       operation == EPOLL_CTL_ADD ? "ADD" : operation == EPOLL_CTL_MOD ? "MOD" : "DEL", fd,
			       ev_events_text(events), strerror(errno));
	return 0;
}

/* epoll_wait that resumes after EINTR with the time left: the count, or -1 (failed). */
static int ev_epoll_wait(int epfd, struct epoll_event *events, int capacity, int timeout_ms)
{
	double deadline = harness_now_ms() + timeout_ms;
	for (;;) {
		int count = epoll_wait(epfd, events, capacity, harness_remaining_ms(deadline));
		if (count >= 0)
			return count;
		if (errno != EINTR)
			return harness_fail("epoll_wait: %s", strerror(errno));
	}
}

/* Exactly one event within TIMEOUT_MS, carrying DATA and at least the bits of WANT: its events, or 0. */
static uint32_t ev_expect_event(int epfd, int timeout_ms, uint32_t want, uint64_t data, const char *what)
{
	struct epoll_event events[4];
	double start = harness_now_ms();
	int count = ev_epoll_wait(epfd, events, 4, timeout_ms);
	if (count < 0)
		return 0;
	if (count != 1) {
		harness_fail("%s: epoll_wait returned %d after %.0f ms, expected 1 event", what, count, harness_now_ms() - start);
		return 0;
	}
	if (events[0].data.u64 != data) {
		harness_fail("%s: event data 0x%llx, expected 0x%llx", what, (unsigned long long)events[0].data.u64,
			(unsigned long long)data);
		return 0;
	}
	if ((events[0].events & want) != want) {
		char reported[128];
		snprintf(reported, sizeof(reported), "%s", ev_events_text(events[0].events));
		harness_fail("%s: events %s lack %s", what, reported, ev_events_text(want & ~events[0].events));
		return 0;
	}
	return events[0].events;
}

/* epoll_wait for TIMEOUT_MS must report nothing. */
static int ev_expect_no_event(int epfd, int timeout_ms, const char *what)
{
	struct epoll_event events[4];
	int count = ev_epoll_wait(epfd, events, 4, timeout_ms);
	if (count < 0)
		return -1;
	if (count > 0)
		return harness_fail("%s: epoll_wait(%d ms) reported %d event(s), the first %s data 0x%llx, expected none",
			       what, timeout_ms, count, ev_events_text(events[0].events),
			       (unsigned long long)events[0].data.u64);
	return 0;
}

/* ---- connections and the command protocol ------------------------------ */

/* Asks the server for LENGTH more bytes of its test stream. */
static int ev_request(int fd, uint32_t length)
{
	unsigned char command[5] = { 'w' };
	uint32_t length_be = htonl(length);
	memcpy(command + 1, &length_be, 4);
	return harness_send_all(fd, command, sizeof(command));
}

/*
 * The server side of the command protocol: 'w' + 32-bit big-endian length
 * sends that much of the test stream (continuing at *offset); 'd' runs TURN
 * (the server's own checks, while the client waits) and answers 'd'; 'a'
 * ends, after which the caller closes the connection.
 */
static int ev_serve_requests(int fd, uint64_t *offset, int (*turn)(int fd))
{
	for (;;) {
		unsigned char command;
		uint32_t length_be;
		if (harness_recv_exact(fd, &command, 1) < 0)
			return -1;
		switch (command) {
		case 'a':
			return 0;
		case 'w':
			if (harness_recv_exact(fd, &length_be, 4) < 0 || ev_send_stream(fd, offset, ntohl(length_be)) < 0)
				return -1;
			break;
		case 'd':
			if ((turn && turn(fd) < 0) || harness_send_byte(fd, 'd') < 0)
				return -1;
			break;
		default:
			return harness_fail("unknown command byte 0x%02x", command);
		}
	}
}

static int ev_serve(int fd)
{
	uint64_t offset = 0;
	return ev_serve_requests(fd, &offset, NULL);
}

/* The client's end of a scenario whose server also runs checks: hand over with 'd', wait, finish. */
static int ev_server_turn_then_finish(int fd)
{
	if (harness_send_byte(fd, 'd') < 0 || harness_expect_byte(fd, 'd') < 0)
		return -1;
	return harness_finish_client(fd);
}

/* ---- scenarios --------------------------------------------------------- */

/*
 * nb_recv_eagain: recv and read on an empty nonblocking connected socket return
 * -1 EAGAIN, and epoll reports nothing. The client asks for 10 bytes; a
 * level-triggered EPOLLIN epoll set reports the socket, and keeps reporting it
 * while the bytes stay unread; the next recv returns bytes at once; after
 * reading all 10, recv is EAGAIN again and epoll quiet. The server checks
 * EAGAIN on its side too (the client sends nothing while it waits).
 */
static int nb_recv_eagain_server(int fd)
{
	unsigned char command[5];
	uint64_t offset = 0;
	if (harness_expect_nonblocking(fd, true, "the accepted socket") < 0 || harness_recv_exact(fd, command, 5) < 0)
		return -1;
	if (command[0] != 'w')
		return harness_fail("expected a 'w' request, got 0x%02x", command[0]);
	if (ev_expect_eagain(fd, "with the client waiting") < 0 || ev_send_stream(fd, &offset, 10) < 0)
		return -1;
	return ev_serve_requests(fd, &offset, NULL);
}

static int nb_recv_eagain_client(int fd)
{
	enum { TAG = 0x11 };
	unsigned char buffer[64];
	uint64_t offset = 0;
	ssize_t result;
	int epfd = ev_epoll_create(), status = -1;

	if (ev_expect_eagain(fd, "on an empty socket") < 0)
		goto out;
	result = read(fd, buffer, sizeof(buffer));
	if (!ev_is_eagain(result)) {
		harness_fail("read on an empty socket returned %zd (%s), expected -1 EAGAIN", result, ev_error_text(result));
		goto out;
	}
	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, TAG) < 0 || ev_expect_no_event(epfd, 0, "empty socket") < 0 ||
	    ev_request(fd, 10) < 0)
		goto out;
	if (!ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, TAG, "after the peer wrote") ||
	    !ev_expect_event(epfd, 0, EPOLLIN, TAG, "level-triggered, still unread"))
		goto out;
	result = recv(fd, buffer, sizeof(buffer), 0);
	if (result <= 0 || result > 10) {
		harness_fail("recv after EPOLLIN returned %zd (%s), expected 1..10", result, ev_error_text(result));
		goto out;
	}
	if (ev_stream_check(buffer, (size_t)result, &offset, "data") < 0 ||
	    ev_recv_stream(fd, &offset, 10 - (size_t)result, "data") < 0)
		goto out;
	if (ev_expect_eagain(fd, "after reading everything") < 0 || ev_expect_no_event(epfd, 0, "after reading") < 0)
		goto out;
	status = harness_finish_client(fd);
out:
	close(epfd);
	return status;
}

/*
 * nb_send_full / epollout_after_drain: the server (reader) first sends its
 * pid, then does not read. The client (sender) sends nonblocking until -1
 * EAGAIN and repeats while epoll still reports EPOLLOUT (bytes moving into
 * the reader's buffer free the sender's), until epoll_wait reports no EPOLLOUT
 * for 200 ms (at most 256 MiB / 20 s). (A small send may succeed again by
 * then: EPOLLOUT waits for a third of the buffer, send for any space.)
 * The client tells the reader to drain with SIGUSR1 (the stream itself is the
 * full direction); EPOLLOUT must then be reported within 5 s, and the client
 * sends 1 MiB more and shuts down its write side. The reader checks every byte
 * up to EOF and returns the count, which must equal what the client sent.
 * epollout_after_drain does the same with EPOLLET|EPOLLOUT: the initial
 * writable edge, then after the fill no edge for 200 ms, then after the drain
 * a new edge.
 */
static int send_full_reader(int fd)
{
	static unsigned char buffer[256 * 1024];
	uint32_t pid_be = htonl((uint32_t)getpid());
	uint64_t offset = 0, total_be;
	double deadline = harness_now_ms() + 30000, start;

	if (harness_send_all(fd, &pid_be, sizeof(pid_be)) < 0)
		return -1;
	/* Not a byte read until told; a hang-up here means the sender gave up. */
	while (usr1_count == 0) {
		int revents = harness_wait_fd(fd, POLLRDHUP, 10);
		if (revents < 0)
			return -1;
		if (revents)
			return harness_fail("the sender hung up (%s) before signalling the drain", ev_events_text((uint32_t)revents));
		if (harness_now_ms() > deadline)
			return harness_fail("no SIGUSR1 from the sender within 30 s");
	}
	start = harness_now_ms();
	deadline = start + 30000;
	for (;;) {
		ssize_t result = recv(fd, buffer, sizeof(buffer), 0);
		if (result > 0) {
			if (ev_stream_check(buffer, (size_t)result, &offset, "stream") < 0)
				return -1;
		} else if (result == 0) {
			break;
		} else if (ev_is_eagain(result)) {
			if (harness_wait_fd(fd, POLLIN, harness_remaining_ms(deadline)) <= 0)
				return harness_fail("drain: nothing readable within 30 s after %llu bytes",
					       (unsigned long long)offset);
		} else if (errno != EINTR) {
			return harness_fail("drain: recv: %s after %llu bytes", strerror(errno), (unsigned long long)offset);
		}
	}
	harness_info("reader drained %llu bytes to EOF in %.0f ms", (unsigned long long)offset, harness_now_ms() - start);
	total_be = ((uint64_t)htonl((uint32_t)(offset >> 32))) | ((uint64_t)htonl((uint32_t)offset) << 32);
	return harness_send_all(fd, &total_be, sizeof(total_be));
}

static int send_full_sender(int fd, bool edge_triggered)
{
	enum { TAG = 0x22 };
	uint32_t pid_be, events = EPOLLOUT | (edge_triggered ? EPOLLET : 0);
	uint64_t offset = 0, total_be, reader_total;
	int epfd = ev_epoll_create(), status = -1, rounds = 0;
	double start, drain_start;
	ssize_t result;

	if (harness_recv_exact(fd, &pid_be, sizeof(pid_be)) < 0 || ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, events, TAG) < 0)
		goto out;
	if (edge_triggered && !ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLOUT, TAG, "the initial writable edge"))
		goto out;
	start = harness_now_ms();
	for (;;) {
		struct epoll_event event;
		int count;
		for (;;) {
			result = send(fd, pattern_table + offset % EV_PATTERN_PERIOD, EV_PATTERN_PERIOD, MSG_NOSIGNAL);
			if (result > 0)
				offset += (uint64_t)result;
			else if (ev_is_eagain(result))
				break;
			else if (result == 0 || errno != EINTR) {
				harness_fail("send while filling: %s after %llu bytes", ev_error_text(result),
					(unsigned long long)offset);
				goto out;
			}
			if (offset > EV_FILL_LIMIT_BYTES || harness_now_ms() - start > EV_FILL_LIMIT_MS) {
				harness_fail("no EAGAIN after %llu bytes in %.0f ms (the reader is not reading)",
					(unsigned long long)offset, harness_now_ms() - start);
				goto out;
			}
		}
		count = ev_epoll_wait(epfd, &event, 1, EV_QUIET_MS);
		if (count < 0)
			goto out;
		if (count == 0)
			break;
		rounds++;
		if (offset > EV_FILL_LIMIT_BYTES || harness_now_ms() - start > EV_FILL_LIMIT_MS) {
			harness_fail("EPOLLOUT (%s) still reported after %llu bytes, %d rounds, %.0f ms",
				ev_events_text(event.events), (unsigned long long)offset, rounds, harness_now_ms() - start);
			goto out;
		}
	}
	harness_info("full after %llu bytes, %d refill rounds, %.0f ms; no EPOLLOUT for %d ms", (unsigned long long)offset,
		rounds, harness_now_ms() - start, EV_QUIET_MS);
	if (kill((pid_t)ntohl(pid_be), SIGUSR1) < 0) {
		harness_fail("kill(reader %u, SIGUSR1): %s", ntohl(pid_be), strerror(errno));
		goto out;
	}
	drain_start = harness_now_ms();
	if (!ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLOUT, TAG, "after the reader drained"))
		goto out;
	harness_info("EPOLLOUT %.1f ms after the drain started", harness_now_ms() - drain_start);
	if (ev_send_stream(fd, &offset, 1 << 20) < 0)
		goto out;
	if (shutdown(fd, SHUT_WR) < 0) {
		harness_fail("shutdown(SHUT_WR): %s", strerror(errno));
		goto out;
	}
	if (harness_recv_exact(fd, &total_be, sizeof(total_be)) < 0)
		goto out;
	reader_total = ((uint64_t)ntohl((uint32_t)total_be) << 32) | ntohl((uint32_t)(total_be >> 32));
	if (reader_total != offset) {
		harness_fail("the reader received %llu bytes, the sender sent %llu", (unsigned long long)reader_total,
			(unsigned long long)offset);
		goto out;
	}
	status = harness_expect_eof(fd);
out:
	close(epfd);
	return status;
}

static int nb_send_full_client(int fd)
{
	return send_full_sender(fd, false);
}

static int epollout_after_drain_client(int fd)
{
	return send_full_sender(fd, true);
}

/*
 * nb_connect: a nonblocking connect returns -1 EINPROGRESS (or 0 at once);
 * epoll (EPOLLOUT) then reports the socket writable without EPOLLERR/EPOLLHUP,
 * SO_ERROR is 0, and a 1000-byte request / 1000-byte response (the request
 * XOR 0x5a) arrive byte-exact.
 */
static int nb_connect_server(int fd)
{
	unsigned char buffer[1000];
	uint64_t offset = 0;
	if (harness_recv_exact(fd, buffer, sizeof(buffer)) < 0 || ev_stream_check(buffer, sizeof(buffer), &offset, "request") < 0)
		return -1;
	for (size_t i = 0; i < sizeof(buffer); i++)
		buffer[i] ^= 0x5a;
	if (harness_send_all(fd, buffer, sizeof(buffer)) < 0)
		return -1;
	return ev_serve(fd);
}

/* Waits (on EPFD, where FD is registered with TAG) for a nonblocking
 * connect() to complete: EPOLLOUT without EPOLLERR or EPOLLHUP, SO_ERROR 0.
 * Returns 0, or -1 after harness_fail. */
static int ev_connect_done(int epfd, int fd, uint64_t tag)
{
	uint32_t events = ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLOUT, tag, "connect completion");
	int error;

	if (!events)
		return -1;
	if (events & (EPOLLERR | EPOLLHUP))
		return harness_fail("connect completion reported %s", ev_events_text(events));
	if (ev_so_error(fd, &error) < 0)
		return -1;
	if (error != 0)
		return harness_fail("SO_ERROR after connect is %d (%s), expected 0", error, strerror(error));
	return 0;
}

static int nb_connect_client(int fd)
{
	enum { TAG = 0x33 };
	unsigned char reply[1000];
	uint64_t offset = 0;
	int epfd, result, status = -1;
	double start = harness_now_ms();

	(void)fd;
	fd = socket(harness_server_address->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return harness_fail("socket: %s", strerror(errno));
	epfd = ev_epoll_create();
	result = connect(fd, harness_server_address->ai_addr, harness_server_address->ai_addrlen);
	if (result < 0 && errno != EINPROGRESS) {
		harness_fail("nonblocking connect returned -1 %s, expected EINPROGRESS or 0", strerror(errno));
		goto out;
	}
	harness_info("connect returned %s", result == 0 ? "0 at once" : "-1 EINPROGRESS");
	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLOUT, TAG) < 0 || ev_connect_done(epfd, fd, TAG) < 0)
		goto out;
	harness_info("EPOLLOUT after %.1f ms", harness_now_ms() - start);
	harness_connections++;
	if (harness_expect_nonblocking(fd, true, "the connected socket") < 0 || ev_send_stream(fd, &offset, sizeof(reply)) < 0 ||
	    harness_recv_exact(fd, reply, sizeof(reply)) < 0)
		goto out;
	for (size_t i = 0; i < sizeof(reply); i++)
		if (reply[i] != (pattern_table[i] ^ 0x5a)) {
			harness_fail("reply byte %zu is 0x%02x, expected 0x%02x", i, reply[i], pattern_table[i] ^ 0x5a);
			goto out;
		}
	status = harness_finish_client(fd);
out:
	close(epfd);
	close(fd);
	return status;
}

/*
 * added_before_connect: nginx's upstream shape (ngx_event_connect_peer): a
 * nonblocking socket goes into the epoll set (EPOLLIN|EPOLLOUT|EPOLLET)
 * before its connect(), which sends it to kernel TCP (the script's rule
 * here; the connection history for a proxy). The client then waits for
 * the connection, sends 10 requests of 1000 bytes and checks every answer
 * byte, each wait an epoll_wait of that set; the script checks that those
 * waits were one kernel call each (stats epoll_bare_pending): the member
 * made for the fresh socket is let go of at the wait, not spun for (a
 * proxy's worker went through fabsock's rounds on every request).
 */
static int added_before_connect_client(int fd)
{
	enum { TAG = 0x34, ROUNDS = 10, SIZE = 1000 };
	uint64_t offset = 0;
	int epfd, result, status = -1;

	(void)fd;
	fd = socket(harness_server_address->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return harness_fail("socket: %s", strerror(errno));
	epfd = ev_epoll_create();
	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLOUT | EPOLLET, TAG) < 0)
		goto out;
	result = connect(fd, harness_server_address->ai_addr, harness_server_address->ai_addrlen);
	if (result < 0 && errno != EINPROGRESS) {
		harness_fail("nonblocking connect returned -1 %s, expected EINPROGRESS or 0", strerror(errno));
		goto out;
	}
	if (ev_connect_done(epfd, fd, TAG) < 0)
		goto out;
	harness_connections++;
	for (int i = 0; i < ROUNDS; i++) {
		uint64_t got = offset;

		if (ev_request(fd, SIZE) < 0)
			goto out;
		while (got < offset + SIZE) {
			uint64_t before = got;

			if (!ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, TAG, "an answer"))
				goto out;
			/* edge-triggered: read until EAGAIN */
			for (;;) {
				unsigned char buf[SIZE];
				ssize_t n = recv(fd, buf, (size_t)(offset + SIZE - got), 0);

				if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
					break;
				if (n <= 0) {
					harness_fail("recv of an answer returned %zd (%s)", n, n < 0 ? strerror(errno) : "EOF");
					goto out;
				}
				if (ev_stream_check(buf, (size_t)n, &got, "an answer") < 0)
					goto out;
				if (got == offset + SIZE)
					break;
			}
			if (got == before) {
				harness_fail("EPOLLIN reported but nothing to read");
				goto out;
			}
		}
		offset = got;
	}
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) {
		harness_fail("fcntl: %s", strerror(errno));
		goto out;
	}
	status = harness_finish_client(fd);
out:
	close(epfd);
	close(fd);
	return status;
}

/*
 * late_reader_et, late_reader_poll: a client writes on a fresh nonblocking
 * connection whose server does not read for EV_LATE_READ_MS (a busy server,
 * one that accepts many connections before serving them). Every send must
 * return at once - bytes taken or -1 EAGAIN - never wait for the server:
 * under fabsock the server's answer to the handshake comes with its first
 * read, and a send that waited for it stalled the client's whole event loop
 * (wrk against nginx: a thread stuck for seconds). The client sends
 * EV_LATE_BYTES of the test stream in 16 KiB writes, waiting for EPOLLOUT
 * with EPOLLET (late_reader_et) or POLLOUT with level-triggered poll()
 * (late_reader_poll) whenever a send says EAGAIN; no single send may take
 * EV_LATE_CALL_MS or more, and a level-triggered writer must not be invited
 * to spin (at most EV_LATE_EAGAIN_MAX sends answered EAGAIN). The server
 * then reads and checks every byte and answers 'k'.
 */
#define EV_LATE_READ_MS 2500
#define EV_LATE_CALL_MS 1000
#define EV_LATE_BYTES (4u << 20)
#define EV_LATE_EAGAIN_MAX 2000

static int late_reader_server(int fd)
{
	uint64_t offset = 0;
	harness_sleep_ms(EV_LATE_READ_MS);
	if (ev_recv_stream(fd, &offset, EV_LATE_BYTES, "late reader") < 0)
		return -1;
	return harness_send_byte(fd, 'k');
}

static int late_reader_writer(bool edge_triggered)
{
	enum { TAG = 0x44 };
	uint64_t offset = 0;
	double worst_ms = 0, start = harness_now_ms(), deadline = start + HARNESS_PEER_WAIT_MS;
	unsigned eagains = 0, waits = 0;
	int epfd = -1, error, status = -1;
	int fd = socket(harness_server_address->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return harness_fail("socket: %s", strerror(errno));
	if (connect(fd, harness_server_address->ai_addr, harness_server_address->ai_addrlen) < 0 && errno != EINPROGRESS) {
		harness_fail("nonblocking connect: %s", strerror(errno));
		goto out;
	}
	if (edge_triggered) {
		epfd = ev_epoll_create();
		if (epfd < 0 || ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLOUT | EPOLLIN | EPOLLET, TAG) < 0)
			goto out;
	}
	while (offset < EV_LATE_BYTES) {
		size_t chunk = EV_LATE_BYTES - offset < 16384 ? (size_t)(EV_LATE_BYTES - offset) : 16384;
		size_t at = offset % EV_PATTERN_PERIOD;
		double before = harness_now_ms(), took;
		ssize_t result = send(fd, pattern_table + at, chunk, MSG_NOSIGNAL);

		took = harness_now_ms() - before;
		if (took > worst_ms)
			worst_ms = took;
		if (took >= EV_LATE_CALL_MS) {
			harness_fail("a nonblocking send at byte %llu took %.0f ms (returned %s): it waited for the server",
				(unsigned long long)offset, took, ev_error_text(result));
			goto out;
		}
		if (result > 0) {
			offset += (uint64_t)result;
			continue;
		}
		if (!ev_is_eagain(result) && !(result < 0 && errno == ENOTCONN) && !(result < 0 && errno == EINTR)) {
			harness_fail("send at byte %llu: %s", (unsigned long long)offset, ev_error_text(result));
			goto out;
		}
		if (result < 0 && errno != EINTR)
			eagains++;
		if (eagains > EV_LATE_EAGAIN_MAX) {
			harness_fail("%u sends answered EAGAIN within %.0f ms: the writer was invited to spin", eagains,
				harness_now_ms() - start);
			goto out;
		}
		if (harness_now_ms() > deadline) {
			harness_fail("only %llu of %u bytes sent within %d ms", (unsigned long long)offset, EV_LATE_BYTES,
				HARNESS_PEER_WAIT_MS);
			goto out;
		}
		waits++;
		if (edge_triggered) {
			struct epoll_event event;
			if (ev_epoll_wait(epfd, &event, 1, harness_remaining_ms(deadline)) < 0)
				goto out;
		} else if (harness_wait_fd(fd, POLLOUT, harness_remaining_ms(deadline)) < 0) {
			goto out;
		}
	}
	if (ev_so_error(fd, &error) < 0 || error != 0) {
		harness_fail("SO_ERROR %d after sending", error);
		goto out;
	}
	harness_connections++;
	harness_info("sent %u bytes in %.0f ms: %u EAGAIN, %u waits, slowest send %.1f ms", EV_LATE_BYTES,
		harness_now_ms() - start, eagains, waits, worst_ms);
	if (harness_expect_byte(fd, 'k') < 0)
		goto out;
	status = 0;
out:
	if (epfd >= 0)
		close(epfd);
	close(fd);
	return status;
}

static int late_reader_et_client(int fd)
{
	(void)fd;
	return late_reader_writer(true);
}

static int late_reader_poll_client(int fd)
{
	(void)fd;
	return late_reader_writer(false);
}

/*
 * late_reader_shut: the same late server; the client writes
 * EV_LATE_SHUT_BYTES, then shutdown(SHUT_WR), which must return at once
 * (the kernel's never waits for the peer), then a send fails EPIPE. The
 * server, EV_LATE_READ_MS later, reads every byte and then EOF, answers
 * 'k' and closes; the client reads 'k' and EOF.
 */
#define EV_LATE_SHUT_BYTES 20000

static int late_reader_shut_server(int fd)
{
	uint64_t offset = 0;
	harness_sleep_ms(EV_LATE_READ_MS);
	if (ev_recv_stream(fd, &offset, EV_LATE_SHUT_BYTES, "late reader") < 0 || harness_expect_eof(fd) < 0)
		return -1;
	return harness_send_byte(fd, 'k');
}

static int late_reader_shut_client(int fd)
{
	uint64_t offset = 0;
	double before, took;
	ssize_t result;

	before = harness_now_ms();
	if (ev_send_stream(fd, &offset, EV_LATE_SHUT_BYTES) < 0)
		return -1;
	took = harness_now_ms() - before;
	if (took >= EV_LATE_CALL_MS)
		return harness_fail("sending %d bytes took %.0f ms: it waited for the server", EV_LATE_SHUT_BYTES, took);
	before = harness_now_ms();
	if (shutdown(fd, SHUT_WR) < 0)
		return harness_fail("shutdown(SHUT_WR): %s", strerror(errno));
	took = harness_now_ms() - before;
	if (took >= EV_LATE_CALL_MS)
		return harness_fail("shutdown(SHUT_WR) took %.0f ms: it waited for the server", took);
	result = send(fd, "x", 1, MSG_NOSIGNAL);
	if (!(result < 0 && errno == EPIPE))
		return harness_fail("send after shutdown(SHUT_WR) returned %zd (%s), expected -1 EPIPE", result,
			       ev_error_text(result));
	harness_info("sent %d bytes and shut down in %.1f ms", EV_LATE_SHUT_BYTES, took);
	if (harness_expect_byte(fd, 'k') < 0)
		return -1;
	return harness_expect_eof(fd);
}

/*
 * late_reader_blocking: the same late server; the client, switched to
 * blocking, sends EV_LATE_BLOCK_BYTES in one send(), which must return the
 * whole count, as the kernel's does (programs treat a short blocking write
 * as an error), although fabsock holds only part of it before the server's
 * first read; the server checks every byte.
 */
#define EV_LATE_BLOCK_BYTES 200000

static int late_reader_blocking_server(int fd)
{
	uint64_t offset = 0;
	harness_sleep_ms(EV_LATE_READ_MS);
	if (ev_recv_stream(fd, &offset, EV_LATE_BLOCK_BYTES, "late reader") < 0)
		return -1;
	return harness_send_byte(fd, 'k');
}

static int late_reader_blocking_client(int fd)
{
	static unsigned char data[EV_LATE_BLOCK_BYTES];
	int flags = fcntl(fd, F_GETFL);
	ssize_t result;

	if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
		return harness_fail("fcntl: %s", strerror(errno));
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = pattern_table[i % EV_PATTERN_PERIOD];
	result = send(fd, data, sizeof(data), MSG_NOSIGNAL);
	if (result != (ssize_t)sizeof(data))
		return harness_fail("a blocking send of %zu bytes returned %zd (%s), expected all of them", sizeof(data),
			       result, ev_error_text(result));
	return harness_expect_byte(fd, 'k');
}

/*
 * late_reader_close: the same late server; the client connects (blocking),
 * waits 100 ms and closes without writing (wrk's address check, a health
 * check), then opens a pipe, which takes the descriptor number (wrk's epoll
 * set does), and lives on. The server, EV_LATE_READ_MS later, reads an end
 * of stream - not a reset, not a refusal of the client's HELLO because its
 * descriptor names another file now (realapps_proxy saw nginx refuse wrk's
 * address check that way). The close returns at once, as the kernel's
 * does: fabsock finishes the handshake after it (fs_sock_bg_close).
 */
static int late_reader_close_server(int fd)
{
	harness_sleep_ms(EV_LATE_READ_MS);
	return harness_expect_eof(fd);
}

static int late_reader_close_client(int fd)
{
	double before, took;
	int p[2];

	fd = socket(harness_server_address->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return harness_fail("socket: %s", strerror(errno));
	if (connect(fd, harness_server_address->ai_addr, harness_server_address->ai_addrlen) < 0) {
		harness_fail("connect: %s", strerror(errno));
		close(fd);
		return -1;
	}
	harness_connections++;
	harness_sleep_ms(100);
	before = harness_now_ms();
	if (close(fd) < 0)
		return harness_fail("close: %s", strerror(errno));
	took = harness_now_ms() - before;
	if (took >= EV_LATE_CALL_MS)
		return harness_fail("close of a connection that carried nothing took %.0f ms: it waited for the server",
			       took);
	if (pipe(p) < 0)
		return harness_fail("pipe: %s", strerror(errno));
	harness_info("close took %.1f ms; descriptor %d %s", took, fd, p[0] == fd ? "reused" : "not reused");
	harness_sleep_ms(EV_LATE_READ_MS + 1000);
	close(p[0]);
	close(p[1]);
	return 0;
}

/*
 * late_reader_wclose: the same late server; the client writes
 * EV_LATE_SHUT_BYTES and closes at once (a fire-and-forget sender). The
 * close returns at once, as the kernel's does, and the server, reading
 * EV_LATE_READ_MS later, gets every byte and then the end of stream.
 */
static int late_reader_wclose_client(int fd)
{
	uint64_t offset = 0;
	double before, took;

	if (ev_send_stream(fd, &offset, EV_LATE_SHUT_BYTES) < 0)
		return -1;
	before = harness_now_ms();
	if (close(fd) < 0)
		return harness_fail("close: %s", strerror(errno));
	took = harness_now_ms() - before;
	if (took >= EV_LATE_CALL_MS)
		return harness_fail("close after writing took %.0f ms: it waited for the server", took);
	harness_info("close took %.1f ms", took);
	return 0;
}

/*
 * late_reader_exit: the same late server; the client writes
 * EV_LATE_SHUT_BYTES and ends with _exit() at once, without closing (a
 * forked child's usual way out). The kernel delivers what a process wrote
 * before it ended: the server, EV_LATE_READ_MS later, reads every byte and
 * then EOF. The client prints its own verdict before it ends.
 */
static int late_reader_exit_server(int fd)
{
	uint64_t offset = 0;
	harness_sleep_ms(EV_LATE_READ_MS);
	if (ev_recv_stream(fd, &offset, EV_LATE_SHUT_BYTES, "late reader") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int late_reader_exit_client(int fd)
{
	uint64_t offset = 0;

	if (ev_send_stream(fd, &offset, EV_LATE_SHUT_BYTES) < 0)
		return -1;
	printf("PASS %s\nconnections=%d\n", harness_name(), harness_connections);
	fflush(stdout);
	_exit(0);
}

/*
 * late_reader_exit_thread: as late_reader_exit, but when the process ends
 * another of its threads is blocked in recv() on the connection (a client
 * whose reader thread waits for the reply while the main thread finishes).
 * The kernel still delivers what was written: the server, EV_LATE_READ_MS
 * later, reads every byte and then EOF (under fabsock the waiting thread
 * holds the socket while it waits for the handshake's answer; the exit
 * must wait for that answer with it, not skip the socket).
 */
static void *late_reader_exit_thread_recv(void *arg)
{
	char byte;

	/* blocking: the server never writes, so this ends with the process */
	(void)recv(*(int *)arg, &byte, 1, 0);
	return NULL;
}

static int late_reader_exit_thread_client(int fd)
{
	static int thread_fd;
	uint64_t offset = 0;
	pthread_t reader;
	int error, flags;

	if (ev_send_stream(fd, &offset, EV_LATE_SHUT_BYTES) < 0)
		return -1;
	flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
		return harness_fail("fcntl: %s", strerror(errno));
	thread_fd = fd;
	error = pthread_create(&reader, NULL, late_reader_exit_thread_recv, &thread_fd);
	if (error)
		return harness_fail("pthread_create: %s", strerror(error));
	pthread_detach(reader); /* it ends with the process */
	harness_sleep_ms(200); /* the reader is blocked in recv() by now */
	printf("PASS %s\nconnections=%d\n", harness_name(), harness_connections);
	fflush(stdout);
	_exit(0);
}

/*
 * late_reader_exit_big: a reader that stops reading once the connection is
 * up (it takes the first byte and answers 'r'), and a writer that then
 * writes more than the reader's receive window lets through: 14 writes of
 * 64 KiB (FABSOCK_WINDOW takes 8 messages, the other 6 wait in the
 * writer's send queue, which holds 8, so every send returns), and ends
 * with _exit(). The script gives the writer FABSOCK_LINGER_SEC=1: its
 * process ends before the reader reads again, EV_LATE_READ_MS later. The
 * kernel keeps what the writer wrote in its buffers; under fabsock the
 * writer must have delivered every byte and its FIN before it ended, its
 * peer taking what its window did not allow (FS_MSG_CLOSING). The reader
 * reads every byte, then EOF.
 */
#define EV_LATE_BIG_BYTES (14u * EV_PATTERN_PERIOD)

static int late_reader_exit_big_server(int fd)
{
	uint64_t offset = 0;
	if (ev_recv_stream(fd, &offset, 1, "first byte") < 0 || harness_send_byte(fd, 'r') < 0)
		return -1;
	harness_sleep_ms(EV_LATE_READ_MS);
	if (ev_recv_stream(fd, &offset, EV_LATE_BIG_BYTES - 1, "late reader") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int late_reader_exit_big_client(int fd)
{
	uint64_t offset = 0;

	if (ev_send_stream(fd, &offset, 1) < 0 || harness_expect_byte(fd, 'r') < 0 ||
	    ev_send_stream(fd, &offset, EV_LATE_BIG_BYTES - 1) < 0)
		return -1;
	printf("PASS %s\nconnections=%d\n", harness_name(), harness_connections);
	fflush(stdout);
	_exit(0);
}

/*
 * nb_connect_refused (client only): the client learns a free port by binding
 * a socket to port 0 and closing it; a nonblocking connect there returns -1
 * EINPROGRESS (an immediate -1 ECONNREFUSED is accepted too), epoll reports
 * EPOLLERR or EPOLLHUP (with EPOLLOUT on Linux) within 5 s, and SO_ERROR is
 * ECONNREFUSED. The server accepts nothing: it only checks for 1.5 s that no
 * connection arrives (so the script can see it listen) and passes.
 */
static int nb_connect_refused_server(int fd)
{
	(void)fd;
	int revents = harness_wait_fd(harness_listen_fd, POLLIN, 1500);
	if (revents != 0)
		return harness_fail("the listening socket reported %s, expected no connection", ev_events_text((uint32_t)revents));
	int accepted = accept4(harness_listen_fd, NULL, NULL, SOCK_NONBLOCK);
	if (!ev_is_eagain(accepted))
		return harness_fail("accept4 with nothing pending returned %d (%s), expected -1 EAGAIN", accepted,
			       ev_error_text(accepted));
	return 0;
}

static int nb_connect_refused_client(int fd)
{
	enum { TAG = 0x44 };
	struct sockaddr_storage address;
	socklen_t length = sizeof(address);
	uint32_t events;
	int probe, epfd, error, result, status = -1;
	char port_text[16];

	(void)fd;
	/* A port nobody listens on: bind port 0 on the server's address, note it, close. */
	memcpy(&address, harness_server_address->ai_addr, harness_server_address->ai_addrlen);
	if (address.ss_family == AF_INET)
		((struct sockaddr_in *)&address)->sin_port = 0;
	else
		((struct sockaddr_in6 *)&address)->sin6_port = 0;
	probe = socket(address.ss_family, SOCK_STREAM, 0);
	if (probe < 0 || bind(probe, (struct sockaddr *)&address, harness_server_address->ai_addrlen) < 0 ||
	    getsockname(probe, (struct sockaddr *)&address, &length) < 0)
		return harness_fail("finding a free port: %s", strerror(errno));
	close(probe);
	getnameinfo((struct sockaddr *)&address, length, NULL, 0, port_text, sizeof(port_text), NI_NUMERICSERV);
	harness_info("connecting to free port %s", port_text);

	fd = socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return harness_fail("socket: %s", strerror(errno));
	epfd = ev_epoll_create();
	result = connect(fd, (struct sockaddr *)&address, length);
	if (result == 0) {
		harness_fail("connect to a port nobody listens on succeeded");
		goto out;
	}
	if (errno != EINPROGRESS && errno != ECONNREFUSED) {
		harness_fail("connect returned -1 %s, expected EINPROGRESS (or ECONNREFUSED)", strerror(errno));
		goto out;
	}
	harness_info("connect returned -1 %s", strerror(errno));
	bool refused_at_once = errno == ECONNREFUSED;
	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLOUT, TAG) < 0)
		goto out;
	events = ev_expect_event(epfd, EV_EVENT_WAIT_MS, 0, TAG, "refused connect");
	if (!events)
		goto out;
	harness_info("epoll reported %s", ev_events_text(events));
	if (!(events & (EPOLLERR | EPOLLHUP))) {
		harness_fail("refused connect reported %s, expected EPOLLERR or EPOLLHUP", ev_events_text(events));
		goto out;
	}
	if (!refused_at_once) {
		if (ev_so_error(fd, &error) < 0)
			goto out;
		if (error != ECONNREFUSED) {
			harness_fail("SO_ERROR is %d (%s), expected ECONNREFUSED", error, strerror(error));
			goto out;
		}
	}
	status = 0;
out:
	close(epfd);
	close(fd);
	return status;
}

/*
 * accept4_flags: with the listening socket nonblocking and no connection
 * pending yet (the server checks right after listen, before the script starts
 * the client), accept and accept4 return -1 EAGAIN. Once poll reports the
 * listener readable, accept4(SOCK_NONBLOCK|SOCK_CLOEXEC) returns a socket with
 * O_NONBLOCK and FD_CLOEXEC set, on which recv is EAGAIN and a 'h'/'a'
 * exchange works. The client checks its SOCK_NONBLOCK|SOCK_CLOEXEC socket's
 * flags after the nonblocking connect.
 */
static int accept4_flags_server(int fd)
{
	int result, flags, status = -1;

	(void)fd;
	if (harness_expect_nonblocking(harness_listen_fd, true, "the listening socket") < 0)
		return -1;
	result = accept(harness_listen_fd, NULL, NULL);
	if (!ev_is_eagain(result))
		return harness_fail("accept with nothing pending returned %d (%s), expected -1 EAGAIN", result,
			       ev_error_text(result));
	result = accept4(harness_listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (!ev_is_eagain(result))
		return harness_fail("accept4 with nothing pending returned %d (%s), expected -1 EAGAIN", result,
			       ev_error_text(result));
	/* the script starts the client only now (the listening socket shows
	 * up in ss before listen() has returned) */
	printf("accept-checked\n");
	fflush(stdout);
	if (harness_wait_fd(harness_listen_fd, POLLIN, HARNESS_PEER_WAIT_MS) <= 0)
		return harness_fail("the listening socket was not readable within %d ms", HARNESS_PEER_WAIT_MS);
	fd = accept4(harness_listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0)
		return harness_fail("accept4 after POLLIN: %s", strerror(errno));
	harness_connections++;
	flags = fcntl(fd, F_GETFD);
	if (flags < 0 || !(flags & FD_CLOEXEC)) {
		harness_fail("accept4(SOCK_CLOEXEC) result lacks FD_CLOEXEC (F_GETFD 0x%x)", flags);
		goto out;
	}
	if (harness_expect_nonblocking(fd, true, "accept4(SOCK_NONBLOCK) result") < 0 ||
	    ev_expect_eagain(fd, "on the accepted socket") < 0 || harness_send_byte(fd, 'h') < 0)
		goto out;
	status = ev_serve(fd);
out:
	close(fd);
	return status;
}

static int accept4_flags_client(int fd)
{
	int flags = fcntl(fd, F_GETFD);
	if (flags < 0 || !(flags & FD_CLOEXEC))
		return harness_fail("SOCK_CLOEXEC socket lacks FD_CLOEXEC after connect (F_GETFD 0x%x)", flags);
	if (harness_expect_nonblocking(fd, true, "SOCK_NONBLOCK socket after connect") < 0 || harness_expect_byte(fd, 'h') < 0)
		return -1;
	return harness_finish_client(fd);
}

/*
 * et_drain: with EPOLLET|EPOLLIN the client asks for 100 KiB; it waits for an
 * edge, reads until EAGAIN, and repeats until it has all 102400 bytes (each
 * wait after an EAGAIN must see a new edge while bytes are missing). Then
 * epoll_wait reports nothing for 200 ms. The client asks for 10 more bytes:
 * exactly one event is reported, a second epoll_wait (bytes still unread)
 * reports nothing, recv returns the 10 bytes then EAGAIN, and epoll stays quiet.
 */
static int et_drain_client(int fd)
{
	enum { TAG = 0x55, TOTAL = 100 * 1024 };
	static unsigned char buffer[65536];
	uint64_t offset = 0;
	int epfd = ev_epoll_create(), edges = 0, status = -1;
	ssize_t result;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLET, TAG) < 0 ||
	    ev_expect_no_event(epfd, 0, "empty socket") < 0 || ev_request(fd, TOTAL) < 0)
		goto out;
	while (offset < TOTAL) {
		if (!ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, TAG, "edge while bytes are missing"))
			goto out;
		edges++;
		while ((result = recv(fd, buffer, sizeof(buffer), 0)) > 0) {
			if (ev_stream_check(buffer, (size_t)result, &offset, "data") < 0)
				goto out;
			if (offset > TOTAL) {
				harness_fail("more than the %d bytes asked for", TOTAL);
				goto out;
			}
		}
		if (!ev_is_eagain(result)) {
			harness_fail("recv after %llu bytes returned %zd (%s), expected EAGAIN at the end",
				(unsigned long long)offset, result, ev_error_text(result));
			goto out;
		}
	}
	harness_info("read %d bytes in %d edges", TOTAL, edges);
	if (ev_expect_no_event(epfd, EV_QUIET_MS, "edge-triggered, after draining to EAGAIN") < 0 ||
	    ev_request(fd, 10) < 0)
		goto out;
	if (!ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, TAG, "10 new bytes") ||
	    ev_expect_no_event(epfd, 0, "edge-triggered, the same 10 bytes again") < 0)
		goto out;
	result = recv(fd, buffer, sizeof(buffer), 0);
	if (result != 10) {
		harness_fail("recv after the edge returned %zd (%s), expected the 10 bytes", result, ev_error_text(result));
		goto out;
	}
	if (ev_stream_check(buffer, 10, &offset, "data") < 0 || ev_expect_eagain(fd, "after the 10 bytes") < 0 ||
	    ev_expect_no_event(epfd, EV_QUIET_MS, "after reading the 10 bytes") < 0)
		goto out;
	status = harness_finish_client(fd);
out:
	close(epfd);
	return status;
}

/*
 * oneshot: with EPOLLONESHOT|EPOLLIN the first 10 bytes give one event. The
 * client reads them and asks for 10 more: epoll reports nothing for 200 ms
 * (the registration is disarmed), although poll() shows the bytes have
 * arrived. EPOLL_CTL_MOD re-arms it: the event is reported at once; after it,
 * with the bytes still unread, epoll is quiet again.
 */
static int oneshot_client(int fd)
{
	enum { TAG = 0x66 };
	uint64_t offset = 0;
	int epfd = ev_epoll_create(), status = -1, revents;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLONESHOT, TAG) < 0 || ev_request(fd, 10) < 0)
		goto out;
	if (!ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, TAG, "first write") ||
	    ev_recv_stream(fd, &offset, 10, "first write") < 0 || ev_request(fd, 10) < 0)
		goto out;
	if (ev_expect_no_event(epfd, EV_QUIET_MS, "one-shot, not re-armed") < 0)
		goto out;
	revents = harness_wait_fd(fd, POLLIN, EV_EVENT_WAIT_MS);
	if (!(revents > 0 && (revents & POLLIN))) {
		harness_fail("poll did not see the second write within %d ms (revents %d)", EV_EVENT_WAIT_MS, revents);
		goto out;
	}
	if (ev_epoll_ctl(epfd, EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLONESHOT, TAG) < 0 ||
	    !ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, TAG, "after EPOLL_CTL_MOD re-armed it") ||
	    ev_expect_no_event(epfd, 0, "one-shot, disarmed again") < 0)
		goto out;
	if (ev_recv_stream(fd, &offset, 10, "second write") < 0)
		goto out;
	status = harness_finish_client(fd);
out:
	close(epfd);
	return status;
}

/*
 * rdhup: after the client's 'g' the server writes 1000 bytes and
 * shutdown(SHUT_WR)s. The client, with EPOLLIN|EPOLLRDHUP requested, gets an
 * event with both (and neither EPOLLHUP nor EPOLLERR: only one direction is
 * shut); it reads 1000 bytes, then 0, then 0 again; epoll still reports
 * EPOLLIN|EPOLLRDHUP without EPOLLHUP. The client then writes 500 bytes back,
 * which the server reads exactly before EOF.
 */
static int rdhup_server(int fd)
{
	uint64_t sent = 0, received = 0;
	if (harness_expect_byte(fd, 'g') < 0 || ev_send_stream(fd, &sent, 1000) < 0)
		return -1;
	if (shutdown(fd, SHUT_WR) < 0)
		return harness_fail("shutdown(SHUT_WR): %s", strerror(errno));
	if (ev_recv_stream(fd, &received, 500, "reply after SHUT_WR") < 0)
		return -1;
	return harness_expect_eof(fd);
}

/* Waits (bounded, level-triggered) until an event carries EPOLLRDHUP: its events, or 0. */
static uint32_t ev_wait_rdhup(int epfd, uint64_t tag)
{
	double deadline = harness_now_ms() + EV_EVENT_WAIT_MS;
	for (;;) {
		struct epoll_event event;
		int count = ev_epoll_wait(epfd, &event, 1, harness_remaining_ms(deadline));
		if (count < 0)
			return 0;
		if (count == 0) {
			harness_fail("no EPOLLRDHUP within %d ms", EV_EVENT_WAIT_MS);
			return 0;
		}
		if (event.data.u64 != tag) {
			harness_fail("event data 0x%llx, expected 0x%llx", (unsigned long long)event.data.u64,
				(unsigned long long)tag);
			return 0;
		}
		if (event.events & EPOLLRDHUP)
			return event.events;
		harness_sleep_ms(1); /* EPOLLIN alone: the data came before the FIN */
	}
}

static int rdhup_client(int fd)
{
	enum { TAG = 0x77 };
	uint64_t received = 0, sent = 0;
	uint32_t events;
	int epfd = ev_epoll_create(), status = -1;
	char byte;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLRDHUP, TAG) < 0 ||
	    ev_expect_no_event(epfd, 0, "before the peer wrote") < 0 || harness_send_byte(fd, 'g') < 0)
		goto out;
	events = ev_wait_rdhup(epfd, TAG);
	if (!events)
		goto out;
	harness_info("peer shutdown reported as %s", ev_events_text(events));
	if (!(events & EPOLLIN) || (events & (EPOLLHUP | EPOLLERR))) {
		harness_fail("after the peer's SHUT_WR epoll reported %s, expected IN|RDHUP without HUP/ERR",
			ev_events_text(events));
		goto out;
	}
	if (ev_recv_stream(fd, &received, 1000, "data before SHUT_WR") < 0 || harness_expect_eof(fd) < 0)
		goto out;
	if (recv(fd, &byte, 1, 0) != 0) {
		harness_fail("a second recv after EOF did not return 0");
		goto out;
	}
	events = ev_expect_event(epfd, 0, EPOLLIN | EPOLLRDHUP, TAG, "after reading to EOF");
	if (!events)
		goto out;
	if (events & (EPOLLHUP | EPOLLERR)) {
		harness_fail("half-closed socket reports %s", ev_events_text(events));
		goto out;
	}
	status = ev_send_stream(fd, &sent, 500);
out:
	close(epfd);
	return status;
}

/*
 * peer_close_events: after the client's 'g' the server writes 1000 bytes and
 * close()s. The client (EPOLLIN|EPOLLRDHUP) gets EPOLLIN|EPOLLRDHUP, reads the
 * 1000 bytes then 0. It then writes 100 bytes every 10 ms with MSG_NOSIGNAL:
 * the first writes may succeed (the peer answers with a reset), then one
 * returns -1 EPIPE (within 5 s, no SIGPIPE); epoll then reports EPOLLERR or
 * EPOLLHUP within 5 s.
 */
static int peer_close_events_server(int fd)
{
	uint64_t sent = 0;
	if (harness_expect_byte(fd, 'g') < 0)
		return -1;
	return ev_send_stream(fd, &sent, 1000);
}

static int peer_close_events_client(int fd)
{
	enum { TAG = 0x88 };
	uint64_t received = 0;
	uint32_t events;
	int epfd = ev_epoll_create(), status = -1, successes = 0;
	double deadline;
	ssize_t result = 0;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLRDHUP, TAG) < 0 || harness_send_byte(fd, 'g') < 0)
		goto out;
	events = ev_wait_rdhup(epfd, TAG);
	if (!events)
		goto out;
	harness_info("peer close reported as %s", ev_events_text(events));
	if (!(events & EPOLLIN)) {
		harness_fail("after the peer's close epoll reported %s, expected EPOLLIN", ev_events_text(events));
		goto out;
	}
	if (ev_recv_stream(fd, &received, 1000, "data before close") < 0 || harness_expect_eof(fd) < 0)
		goto out;
	deadline = harness_now_ms() + EV_EVENT_WAIT_MS;
	while (harness_now_ms() < deadline) {
		result = send(fd, pattern_table, 100, MSG_NOSIGNAL);
		if (result < 0 && errno != EINTR && errno != EAGAIN)
			break;
		if (result > 0)
			successes++;
		harness_sleep_ms(10);
	}
	if (result >= 0 || errno != EPIPE) {
		harness_fail("writing to a closed peer: last send returned %zd (%s) after %d successes, expected -1 EPIPE",
			result, ev_error_text(result), successes);
		goto out;
	}
	harness_info("EPIPE after %d successful writes", successes);
	deadline = harness_now_ms() + EV_EVENT_WAIT_MS;
	for (;;) {
		struct epoll_event event;
		int count = ev_epoll_wait(epfd, &event, 1, harness_remaining_ms(deadline));
		if (count < 0)
			goto out;
		if (count == 0) {
			harness_fail("no EPOLLERR/EPOLLHUP within %d ms after EPIPE", EV_EVENT_WAIT_MS);
			goto out;
		}
		if (event.events & (EPOLLERR | EPOLLHUP)) {
			harness_info("after EPIPE epoll reports %s", ev_events_text(event.events));
			break;
		}
		harness_sleep_ms(1);
	}
	status = 0;
out:
	close(epfd);
	return status;
}

/*
 * data_unchanged: the event's epoll_data is returned exactly as registered:
 * u64 0xfeedfacecafebeef, then (EPOLL_CTL_MOD) a pointer, then the fd.
 */
static int data_unchanged_client(int fd)
{
	static int marker;
	uint64_t offset = 0;
	int epfd = ev_epoll_create(), status = -1, count;
	struct epoll_event event = { .events = EPOLLIN, .data.u64 = 0xfeedfacecafebeefull };

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, 0xfeedfacecafebeefull) < 0 || ev_request(fd, 10) < 0 ||
	    !ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, 0xfeedfacecafebeefull, "data.u64"))
		goto out;
	event.data.ptr = &marker;
	if (epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &event) < 0) {
		harness_fail("epoll_ctl(MOD, data.ptr): %s", strerror(errno));
		goto out;
	}
	memset(&event, 0, sizeof(event));
	count = ev_epoll_wait(epfd, &event, 1, EV_EVENT_WAIT_MS);
	if (count != 1 || event.data.ptr != &marker || !(event.events & EPOLLIN)) {
		harness_fail("data.ptr: epoll_wait returned %d, events %s, ptr %p, expected %p", count,
			ev_events_text(event.events), event.data.ptr, (void *)&marker);
		goto out;
	}
	event = (struct epoll_event){ .events = EPOLLIN, .data.fd = fd };
	if (epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &event) < 0) {
		harness_fail("epoll_ctl(MOD, data.fd): %s", strerror(errno));
		goto out;
	}
	memset(&event, 0, sizeof(event));
	count = ev_epoll_wait(epfd, &event, 1, EV_EVENT_WAIT_MS);
	if (count != 1 || event.data.fd != fd) {
		harness_fail("data.fd: epoll_wait returned %d, fd %d, expected %d", count, event.data.fd, fd);
		goto out;
	}
	if (ev_recv_stream(fd, &offset, 10, "data") < 0)
		goto out;
	status = harness_finish_client(fd);
out:
	close(epfd);
	return status;
}

/*
 * mixed_set: one epoll set holds the socket and a pipe's read end, each with
 * its own data. First, after a quiet spell (the script runs it under fabsock
 * with a short spin and IDLE_AFTER_MS=100, so the wait sleeps deeply with
 * every stream armed), a thread writes the pipe after 400 ms: only the pipe
 * is reported, within MIXED_QUIET_LATE_MS of the write (an epoll_wait woken
 * by the instance itself must ask the kernel: a version that left the
 * kernel's events for later spun on the readable instance until the wait's
 * timeout). Then a thread writes the pipe after 50 ms: only the pipe is
 * reported. The client asks for 10 bytes: only the socket is reported. Then
 * both at once (thread and request): both are reported, each with its data;
 * after reading both, nothing is.
 */
#define MIXED_QUIET_WRITE_MS 400
#define MIXED_QUIET_LATE_MS 1000
struct pipe_writer {
	pthread_t thread;
	int fd;
	int delay_ms;
};

static void *pipe_writer_run(void *argument)
{
	struct pipe_writer *writer = argument;
	harness_sleep_ms(writer->delay_ms);
	if (write(writer->fd, "p", 1) != 1)
		ev_write_and_exit("FAIL mixed_set: the thread's write to the pipe failed\n");
	return NULL;
}

static int pipe_writer_start(struct pipe_writer *writer, int fd, int delay_ms)
{
	writer->fd = fd;
	writer->delay_ms = delay_ms;
	int error = pthread_create(&writer->thread, NULL, pipe_writer_run, writer);
	if (error)
		return harness_fail("pthread_create: %s", strerror(error));
	return 0;
}

static int drain_pipe(int fd)
{
	char byte;
	if (read(fd, &byte, 1) != 1 || byte != 'p')
		return harness_fail("the pipe did not hold the thread's 'p'");
	return 0;
}

/* ev_expect_event for mixed_set: the event must also come within
 * MIXED_QUIET_LATE_MS of its cause, DELAY_MS after START. */
static bool mixed_expect(int epfd, uint64_t tag, const char *what, double start, int delay_ms)
{
	double late;

	if (!ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, tag, what))
		return false;
	late = harness_now_ms() - start - delay_ms;
	if (late > MIXED_QUIET_LATE_MS) {
		harness_fail("%s: reported %.0f ms after its cause, more than %d", what, late, MIXED_QUIET_LATE_MS);
		return false;
	}
	return true;
}

static int mixed_set_client(int fd)
{
	enum { SOCKET_TAG = 0x50c1, PIPE_TAG = 0x919e };
	struct pipe_writer writer;
	uint64_t offset = 0;
	int pipe_fds[2], epfd = ev_epoll_create(), status = -1;
	double deadline, start;
	bool socket_seen = false, pipe_seen = false;

	if (pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) < 0) {
		close(epfd);
		return harness_fail("pipe2: %s", strerror(errno));
	}
	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, SOCKET_TAG) < 0 ||
	    ev_epoll_ctl(epfd, EPOLL_CTL_ADD, pipe_fds[0], EPOLLIN, PIPE_TAG) < 0 ||
	    ev_expect_no_event(epfd, 0, "nothing written yet") < 0 ||
	    pipe_writer_start(&writer, pipe_fds[1], MIXED_QUIET_WRITE_MS) < 0)
		goto out;
	if (!mixed_expect(epfd, PIPE_TAG, "pipe only, after a quiet spell", harness_now_ms(), MIXED_QUIET_WRITE_MS))
		goto out_join;
	pthread_join(writer.thread, NULL);
	if (drain_pipe(pipe_fds[0]) < 0 || pipe_writer_start(&writer, pipe_fds[1], 50) < 0)
		goto out;
	if (!mixed_expect(epfd, PIPE_TAG, "pipe only", harness_now_ms(), 50))
		goto out_join;
	pthread_join(writer.thread, NULL);
	if (drain_pipe(pipe_fds[0]) < 0 || ev_request(fd, 10) < 0 ||
	    !mixed_expect(epfd, SOCKET_TAG, "socket only", harness_now_ms(), 0) ||
	    ev_recv_stream(fd, &offset, 10, "data") < 0)
		goto out;
	if (pipe_writer_start(&writer, pipe_fds[1], 50) < 0)
		goto out;
	if (ev_request(fd, 10) < 0)
		goto out_join;
	start = harness_now_ms();
	deadline = start + EV_EVENT_WAIT_MS;
	while (!(socket_seen && pipe_seen)) {
		struct epoll_event events[4];
		int count = ev_epoll_wait(epfd, events, 4, harness_remaining_ms(deadline));
		if (count <= 0) {
			if (count == 0)
				harness_fail("both ready: within %d ms saw socket %d pipe %d", EV_EVENT_WAIT_MS, socket_seen,
					pipe_seen);
			goto out_join;
		}
		for (int i = 0; i < count; i++) {
			if (events[i].data.u64 == SOCKET_TAG)
				socket_seen = true;
			else if (events[i].data.u64 == PIPE_TAG)
				pipe_seen = true;
			else {
				harness_fail("both ready: event with unknown data 0x%llx", (unsigned long long)events[i].data.u64);
				goto out_join;
			}
			if (!(events[i].events & EPOLLIN)) {
				harness_fail("both ready: event %s lacks EPOLLIN", ev_events_text(events[i].events));
				goto out_join;
			}
		}
		if (!(socket_seen && pipe_seen))
			harness_sleep_ms(1);
	}
	if (harness_now_ms() - start - 50 > MIXED_QUIET_LATE_MS) {
		harness_fail("both ready: reported %.0f ms after the pipe's write, more than %d",
			harness_now_ms() - start - 50, MIXED_QUIET_LATE_MS);
		goto out_join;
	}
	pthread_join(writer.thread, NULL);
	if (drain_pipe(pipe_fds[0]) < 0 || ev_recv_stream(fd, &offset, 10, "data") < 0 ||
	    ev_expect_no_event(epfd, 0, "after reading both") < 0)
		goto out;
	status = harness_finish_client(fd);
	goto out;
out_join:
	pthread_join(writer.thread, NULL);
out:
	close(pipe_fds[0]);
	close(pipe_fds[1]);
	close(epfd);
	return status;
}

/*
 * two_sets: the socket is in epoll sets A and B (each with its own data);
 * neither reports anything before data; after the client asks for 10 bytes
 * both report EPOLLIN with their own data. After reading, both are quiet.
 * EPOLL_CTL_DEL from A leaves B working: 10 more bytes are reported by B
 * only.
 */
static int two_sets_client(int fd)
{
	enum { TAG_A = 0xaa, TAG_B = 0xbb };
	uint64_t offset = 0;
	int set_a = ev_epoll_create(), set_b = ev_epoll_create(), status = -1;

	if (ev_epoll_ctl(set_a, EPOLL_CTL_ADD, fd, EPOLLIN, TAG_A) < 0 ||
	    ev_epoll_ctl(set_b, EPOLL_CTL_ADD, fd, EPOLLIN, TAG_B) < 0 || ev_expect_no_event(set_a, 0, "A, no data") < 0 ||
	    ev_expect_no_event(set_b, 0, "B, no data") < 0 || ev_request(fd, 10) < 0)
		goto out;
	if (!ev_expect_event(set_a, EV_EVENT_WAIT_MS, EPOLLIN, TAG_A, "set A") ||
	    !ev_expect_event(set_b, EV_EVENT_WAIT_MS, EPOLLIN, TAG_B, "set B"))
		goto out;
	if (ev_recv_stream(fd, &offset, 10, "data") < 0 || ev_expect_no_event(set_a, 0, "A after reading") < 0 ||
	    ev_expect_no_event(set_b, 0, "B after reading") < 0)
		goto out;
	if (ev_epoll_ctl(set_a, EPOLL_CTL_DEL, fd, 0, 0) < 0 || ev_request(fd, 10) < 0 ||
	    !ev_expect_event(set_b, EV_EVENT_WAIT_MS, EPOLLIN, TAG_B, "set B after DEL from A") ||
	    ev_expect_no_event(set_a, 0, "A after DEL") < 0 || ev_recv_stream(fd, &offset, 10, "data") < 0)
		goto out;
	status = harness_finish_client(fd);
out:
	close(set_a);
	close(set_b);
	return status;
}

/*
 * nested: epoll set A holds the socket, set B holds A's fd. Before data
 * poll(B) shows nothing; after the client asks for 10 bytes, poll(B, POLLIN)
 * reports POLLIN within 5 s, epoll_wait(B) reports A and epoll_wait(A) the
 * socket, each with its data. After reading, poll(B) and epoll_wait(A) are
 * quiet again.
 */
static int nested_client(int fd)
{
	enum { SOCKET_TAG = 0x50c, SET_TAG = 0x5e7 };
	uint64_t offset = 0;
	int set_a = ev_epoll_create(), set_b = ev_epoll_create(), status = -1, revents;

	if (ev_epoll_ctl(set_a, EPOLL_CTL_ADD, fd, EPOLLIN, SOCKET_TAG) < 0 ||
	    ev_epoll_ctl(set_b, EPOLL_CTL_ADD, set_a, EPOLLIN, SET_TAG) < 0)
		goto out;
	revents = harness_wait_fd(set_b, POLLIN, 0);
	if (revents != 0) {
		harness_fail("poll(B) before data reports %s", ev_events_text((uint32_t)revents));
		goto out;
	}
	if (ev_request(fd, 10) < 0)
		goto out;
	revents = harness_wait_fd(set_b, POLLIN, EV_EVENT_WAIT_MS);
	if (revents <= 0 || !(revents & POLLIN)) {
		harness_fail("poll(B, POLLIN) returned %d within %d ms, expected POLLIN", revents, EV_EVENT_WAIT_MS);
		goto out;
	}
	if (!ev_expect_event(set_b, 0, EPOLLIN, SET_TAG, "B reports A") ||
	    !ev_expect_event(set_a, 0, EPOLLIN, SOCKET_TAG, "A reports the socket"))
		goto out;
	if (ev_recv_stream(fd, &offset, 10, "data") < 0)
		goto out;
	revents = harness_wait_fd(set_b, POLLIN, 0);
	if (revents != 0) {
		harness_fail("poll(B) after reading reports %s", ev_events_text((uint32_t)revents));
		goto out;
	}
	if (ev_expect_no_event(set_a, 0, "A after reading") < 0 || ev_expect_no_event(set_b, 0, "B after reading") < 0)
		goto out;
	status = harness_finish_client(fd);
out:
	close(set_b);
	close(set_a);
	return status;
}

/*
 * nested_stale: as nested, but set A gets the number of a socket that
 * fabsock let go of and that was then closed where fabsock does not see it
 * (fclose of an fdopen()ed descriptor: glibc's own close): a connection of
 * this process to a listener of its own stays on kernel TCP (fabsock marks
 * the descriptor a plain socket, core/plain.h, so that an epoll_ctl of it
 * needs no fstat); epoll_create1 must drop that mark, or A would be taken
 * for a socket in B and B would never see A's offloaded member.
 */
static int nested_stale_client(int fd)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t slen = sizeof(sin);
	int lfd = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0), stale, status;
	FILE *f;

	if (lfd < 0 || c < 0 || bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(lfd, 4) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&sin, &slen) < 0 || connect(c, (struct sockaddr *)&sin, slen) < 0)
		return harness_fail("a connection to a listener of this process: %s", strerror(errno));
	stale = c;
	f = fdopen(c, "r+");
	if (!f)
		return harness_fail("fdopen: %s", strerror(errno));
	fclose(f);
	status = nested_client(fd);
	harness_info("the stale socket was fd %d", stale);
	close(lfd);
	return status;
}

/*
 * nested_reused: set A (holding the socket) is in set B; the client closes
 * A, its last fd, which takes it out of B, and a new set C - usually given
 * A's fd number - gets the socket. After the server's 10 bytes C reports
 * the socket, and B reports nothing for 200 ms: C was never added to it.
 */
static int nested_reused_client(int fd)
{
	enum { SOCKET_TAG = 0x50d, SET_TAG = 0x5e8 };
	uint64_t offset = 0;
	int set_a = ev_epoll_create(), set_b = ev_epoll_create(), set_c = -1, status = -1, a_number = set_a;

	if (ev_epoll_ctl(set_a, EPOLL_CTL_ADD, fd, EPOLLIN, SOCKET_TAG) < 0 ||
	    ev_epoll_ctl(set_b, EPOLL_CTL_ADD, set_a, EPOLLIN, SET_TAG) < 0)
		goto out;
	close(set_a);
	set_c = ev_epoll_create();
	harness_info("set A was fd %d, set C is fd %d", a_number, set_c);
	if (ev_epoll_ctl(set_c, EPOLL_CTL_ADD, fd, EPOLLIN, SOCKET_TAG) < 0 || ev_request(fd, 10) < 0)
		goto out;
	if (!ev_expect_event(set_c, EV_EVENT_WAIT_MS, EPOLLIN, SOCKET_TAG, "C reports the socket") ||
	    ev_expect_no_event(set_b, 200, "B, once its member A was closed") < 0 ||
	    ev_recv_stream(fd, &offset, 10, "data") < 0)
		goto out;
	status = harness_finish_client(fd);
out:
	close(set_b);
	if (set_c >= 0)
		close(set_c);
	return status;
}

/*
 * close_registered: the client's socket is in an epoll set; after its 'g' the
 * server writes 100 bytes every 20 ms. Once the first bytes are reported the
 * client close()s the socket without removing it from the set (closing the
 * last reference removes it): epoll_wait keeps working and reports nothing
 * for 500 ms. A second connection (often given the same fd number) is added
 * to the same set with new data; 10 bytes on it are reported with that data.
 * The server stops writing the first connection when its send fails (the
 * client's close reset it) and serves the second.
 */
static int close_registered_server(int fd)
{
	uint64_t sent = 0, offset = 0;
	double deadline = harness_now_ms() + HARNESS_PEER_WAIT_MS;
	int second = -1, status;
	bool writing = true;

	if (harness_expect_byte(fd, 'g') < 0)
		return -1;
	while (harness_now_ms() < deadline) {
		if (writing) {
			ssize_t result = send(fd, pattern_table + sent % EV_PATTERN_PERIOD, 100, MSG_NOSIGNAL);
			if (result > 0) {
				sent += (uint64_t)result;
			} else if (!ev_is_eagain(result) && !(result < 0 && errno == EINTR)) {
				harness_info("first connection: send failed with %s after %llu bytes", ev_error_text(result),
					(unsigned long long)sent);
				writing = false;
			}
		}
		int revents = harness_wait_fd(harness_listen_fd, POLLIN, 20);
		if (revents < 0)
			return -1;
		if (revents) {
			second = accept4(harness_listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
			if (second >= 0)
				break;
			if (!ev_is_eagain(second))
				return harness_fail("accept4: %s", strerror(errno));
		}
	}
	if (second < 0)
		return harness_fail("no second connection within %d ms", HARNESS_PEER_WAIT_MS);
	harness_connections++;
	status = ev_serve_requests(second, &offset, NULL);
	close(second);
	return status;
}

static int close_registered_client(int fd)
{
	enum { FIRST_TAG = 0xc1, SECOND_TAG = 0xc2 };
	uint64_t offset = 0;
	int epfd = ev_epoll_create(), first_fd = fd, status = -1;
	double deadline;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, FIRST_TAG) < 0 || harness_send_byte(fd, 'g') < 0 ||
	    !ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, FIRST_TAG, "the peer's first bytes")) {
		close(fd);
		goto out;
	}
	close(fd);
	deadline = harness_now_ms() + 500;
	for (int remaining; (remaining = harness_remaining_ms(deadline)) > 1;)
		if (ev_expect_no_event(epfd, remaining, "after closing the registered fd") < 0)
			goto out;
	fd = harness_scenario_connect();
	if (fd < 0)
		goto out;
	harness_info("first connection fd %d, second fd %d", first_fd, fd);
	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, SECOND_TAG) < 0 || ev_request(fd, 10) < 0 ||
	    !ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, SECOND_TAG, "second connection") ||
	    ev_recv_stream(fd, &offset, 10, "second connection") < 0)
		goto out_close;
	status = harness_finish_client(fd);
out_close:
	close(fd);
out:
	close(epfd);
	return status;
}

/*
 * timeouts (both sides, one after the other, on the connected socket with no
 * data): epoll_wait(300 ms) with the socket in the set, poll(300 ms) and
 * select(300 ms) on the socket, and select(0, NULL, NULL, NULL, 300 ms) each
 * return 0 after 250..1500 ms, and the process uses < 30 % of that time in
 * CPU (user + system, getrusage RUSAGE_SELF): they sleep, not spin.
 */
static int timed_check(const char *what, int result, double start, double cpu_start)
{
	double elapsed = harness_now_ms() - start, cpu = ev_cpu_ms() - cpu_start;
	harness_info("%s returned %d after %.1f ms, CPU %.1f ms", what, result, elapsed, cpu);
	if (result != 0)
		return harness_fail("%s returned %d (%s), expected 0 (timeout)", what, result,
			       result < 0 ? strerror(errno) : "ready");
	if (elapsed < EV_TIMEOUT_LOW_MS || elapsed > EV_TIMEOUT_HIGH_MS)
		return harness_fail("%s took %.1f ms, expected %d..%d", what, elapsed, EV_TIMEOUT_LOW_MS, EV_TIMEOUT_HIGH_MS);
	if (cpu > EV_CPU_LIMIT * elapsed)
		return harness_fail("%s used %.1f ms CPU in %.1f ms (more than %.0f %%): it spins", what, cpu, elapsed,
			       EV_CPU_LIMIT * 100);
	return 0;
}

static int timeouts_check(int fd)
{
	struct epoll_event event;
	struct pollfd entry = { .fd = fd, .events = POLLIN };
	fd_set readable;
	struct timeval timeout;
	double start, cpu_start;
	int epfd = ev_epoll_create(), result, status = -1;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, 1) < 0)
		goto out;
	cpu_start = ev_cpu_ms(), start = harness_now_ms();
	result = epoll_wait(epfd, &event, 1, EV_TIMEOUT_MS);
	if (timed_check("epoll_wait", result, start, cpu_start) < 0)
		goto out;
	cpu_start = ev_cpu_ms(), start = harness_now_ms();
	result = poll(&entry, 1, EV_TIMEOUT_MS);
	if (timed_check("poll", result, start, cpu_start) < 0)
		goto out;
	FD_ZERO(&readable);
	FD_SET(fd, &readable);
	timeout = (struct timeval){ 0, EV_TIMEOUT_MS * 1000 };
	cpu_start = ev_cpu_ms(), start = harness_now_ms();
	result = select(fd + 1, &readable, NULL, NULL, &timeout);
	if (timed_check("select on the socket", result, start, cpu_start) < 0)
		goto out;
	timeout = (struct timeval){ 0, EV_TIMEOUT_MS * 1000 };
	cpu_start = ev_cpu_ms(), start = harness_now_ms();
	result = select(0, NULL, NULL, NULL, &timeout);
	if (timed_check("select(0, NULL, NULL, NULL)", result, start, cpu_start) < 0)
		goto out;
	status = 0;
out:
	close(epfd);
	return status;
}

static int timeouts_client(int fd)
{
	if (timeouts_check(fd) < 0)
		return -1;
	return ev_server_turn_then_finish(fd);
}

static int timeouts_server(int fd)
{
	uint64_t offset = 0;
	return ev_serve_requests(fd, &offset, timeouts_check);
}

/*
 * eintr (both sides, one after the other, on the connected socket with no
 * data): with a SIGALRM handler installed without SA_RESTART and a 100 ms
 * interval timer, epoll_wait(-1), poll(-1) and select(NULL timeout) each
 * return -1 EINTR, and the handler ran meanwhile.
 */
static int eintr_check(int fd)
{
	static const struct itimerval every_100_ms = { { 0, 100000 }, { 0, 100000 } }, stop = { { 0, 0 }, { 0, 0 } };
	struct epoll_event event;
	struct pollfd entry = { .fd = fd, .events = POLLIN };
	fd_set readable;
	int epfd = ev_epoll_create(), result, status = -1;
	const char *what;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, 1) < 0) {
		close(epfd);
		return -1;
	}
	alarm(0);
	alarm_count = 0;
	harness_set_handler(SIGALRM, ev_count_alarm, 0);
	setitimer(ITIMER_REAL, &every_100_ms, NULL);
	for (int call = 0; call < 3; call++) {
		int count_before = alarm_count;
		double start = harness_now_ms();
		switch (call) {
		case 0:
			what = "epoll_wait(-1)";
			result = epoll_wait(epfd, &event, 1, -1);
			break;
		case 1:
			what = "poll(-1)";
			result = poll(&entry, 1, -1);
			break;
		default:
			what = "select(NULL timeout)";
			FD_ZERO(&readable);
			FD_SET(fd, &readable);
			result = select(fd + 1, &readable, NULL, NULL, NULL);
			break;
		}
		int error = errno;
		harness_info("%s returned %d (%s) after %.1f ms", what, result, result < 0 ? strerror(error) : "",
			harness_now_ms() - start);
		if (result != -1 || error != EINTR) {
			harness_fail("%s returned %d (%s), expected -1 EINTR", what, result, result < 0 ? strerror(error) : "");
			goto out;
		}
		if (alarm_count == count_before) {
			harness_fail("%s returned EINTR but the SIGALRM handler did not run", what);
			goto out;
		}
	}
	status = 0;
out:
	setitimer(ITIMER_REAL, &stop, NULL);
	harness_watchdog_rearm();
	close(epfd);
	return status;
}

static int eintr_client(int fd)
{
	if (eintr_check(fd) < 0)
		return -1;
	return ev_server_turn_then_finish(fd);
}

static int eintr_server(int fd)
{
	uint64_t offset = 0;
	return ev_serve_requests(fd, &offset, eintr_check);
}

/*
 * sigmask (both sides, one after the other, on the connected socket with no
 * data): SIGUSR1 is blocked in the thread. For each of epoll_pwait, ppoll and
 * pselect: with SIGUSR1 unblocked in the call's mask, a thread sending
 * SIGUSR1 to the waiting thread (pthread_kill) after 100 ms makes the call
 * return -1 EINTR with the handler run; with SIGUSR1 left blocked in the
 * call's mask, the call times out (0 after 250..1500 ms for 300 ms), the
 * handler does not run and the signal stays pending (sigtimedwait takes it).
 */
struct delayed_signal {
	pthread_t thread;
	pthread_t target;
};

static void *delayed_signal_run(void *argument)
{
	struct delayed_signal *delayed = argument;
	harness_sleep_ms(100);
	pthread_kill(delayed->target, SIGUSR1);
	return NULL;
}

static int sigmask_call(int kind, int fd, int epfd, const sigset_t *mask, int timeout_ms)
{
	struct epoll_event event;
	struct pollfd entry = { .fd = fd, .events = POLLIN };
	struct timespec timeout = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
	fd_set readable;

	switch (kind) {
	case 0:
		return epoll_pwait(epfd, &event, 1, timeout_ms, mask);
	case 1:
		return ppoll(&entry, 1, &timeout, mask);
	default:
		FD_ZERO(&readable);
		FD_SET(fd, &readable);
		return pselect(fd + 1, &readable, NULL, NULL, &timeout, mask);
	}
}

static int sigmask_check(int fd)
{
	static const char *const names[] = { "epoll_pwait", "ppoll", "pselect" };
	sigset_t usr1, saved, open_mask, closed_mask, pending;
	struct timespec no_wait = { 0, 0 };
	int epfd = ev_epoll_create(), status = -1;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, 1) < 0) {
		close(epfd);
		return -1;
	}
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &usr1, &saved);
	pthread_sigmask(SIG_SETMASK, NULL, &closed_mask);
	open_mask = closed_mask;
	sigdelset(&open_mask, SIGUSR1);
	for (int kind = 0; kind < 3; kind++) {
		for (int unblocked = 1; unblocked >= 0; unblocked--) {
			struct delayed_signal delayed = { .target = pthread_self() };
			int count_before = usr1_count, result, error, spawn;
			double start = harness_now_ms(), elapsed;

			spawn = pthread_create(&delayed.thread, NULL, delayed_signal_run, &delayed);
			if (spawn) {
				harness_fail("pthread_create: %s", strerror(spawn));
				goto out;
			}
			result = sigmask_call(kind, fd, epfd, unblocked ? &open_mask : &closed_mask,
					      unblocked ? EV_EVENT_WAIT_MS : EV_TIMEOUT_MS);
			error = errno;
			elapsed = harness_now_ms() - start;
			pthread_join(delayed.thread, NULL);
			harness_info("%s, SIGUSR1 %s in its mask: returned %d (%s) after %.1f ms", names[kind],
				unblocked ? "unblocked" : "blocked", result, result < 0 ? strerror(error) : "",
				elapsed);
			if (unblocked) {
				if (result != -1 || error != EINTR) {
					harness_fail("%s with SIGUSR1 unblocked returned %d (%s), expected -1 EINTR", names[kind],
						result, result < 0 ? strerror(error) : "");
					goto out;
				}
				if (usr1_count == count_before) {
					harness_fail("%s returned EINTR but the SIGUSR1 handler did not run", names[kind]);
					goto out;
				}
				continue;
			}
			if (result != 0) {
				harness_fail("%s with SIGUSR1 blocked returned %d (%s), expected 0 (timeout)", names[kind],
					result, result < 0 ? strerror(error) : "ready");
				goto out;
			}
			if (elapsed < EV_TIMEOUT_LOW_MS || elapsed > EV_TIMEOUT_HIGH_MS) {
				harness_fail("%s with SIGUSR1 blocked took %.1f ms, expected %d..%d", names[kind], elapsed,
					EV_TIMEOUT_LOW_MS, EV_TIMEOUT_HIGH_MS);
				goto out;
			}
			if (usr1_count != count_before) {
				harness_fail("%s: the SIGUSR1 handler ran although the call's mask blocked it", names[kind]);
				goto out;
			}
			sigpending(&pending);
			if (!sigismember(&pending, SIGUSR1) || sigtimedwait(&usr1, NULL, &no_wait) != SIGUSR1) {
				harness_fail("%s: SIGUSR1 was not left pending", names[kind]);
				goto out;
			}
		}
	}
	status = 0;
out:
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	close(epfd);
	return status;
}

static int sigmask_client(int fd)
{
	if (sigmask_check(fd) < 0)
		return -1;
	return ev_server_turn_then_finish(fd);
}

static int sigmask_server(int fd)
{
	uint64_t offset = 0;
	return ev_serve_requests(fd, &offset, sigmask_check);
}

/*
 * epoll_pwait2 (glibc 2.35+, kernel 5.11+; otherwise an info line and PASS):
 * both sides: a 300 ms timespec timeout with the quiet socket in the set
 * returns 0 after 250..1500 ms, sleeping. The client then asks for 1 byte:
 * epoll_pwait2 with a 5 s timeout reports it, and with a NULL (infinite)
 * timeout reports it again at once while it stays unread.
 */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#define EV_HAVE_EPOLL_PWAIT2 1
#endif

/* 0 checked, 1 not checkable here (libc or kernel lacks epoll_pwait2), -1 failed. */
static int epoll_pwait2_timeout(int fd)
{
#ifdef EV_HAVE_EPOLL_PWAIT2
	struct timespec timeout = { 0, EV_TIMEOUT_MS * 1000000L };
	struct epoll_event event;
	int epfd = ev_epoll_create(), result, status = -1;
	double start, cpu_start;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, 1) < 0)
		goto out;
	cpu_start = ev_cpu_ms(), start = harness_now_ms();
	result = epoll_pwait2(epfd, &event, 1, &timeout, NULL);
	if (result < 0 && errno == ENOSYS) {
		harness_info("epoll_pwait2: ENOSYS (kernel older than 5.11); not checked");
		status = 1;
		goto out;
	}
	status = timed_check("epoll_pwait2", result, start, cpu_start);
out:
	close(epfd);
	return status;
#else
	(void)fd;
	harness_info("this libc has no epoll_pwait2; not checked");
	return 1;
#endif
}

static int epoll_pwait2_check(int fd)
{
	return epoll_pwait2_timeout(fd) < 0 ? -1 : 0;
}

#ifdef EV_HAVE_EPOLL_PWAIT2
static int epoll_pwait2_reports(int fd)
{
	enum { TAG = 0x2a };
	struct timespec timeout = { EV_EVENT_WAIT_MS / 1000, 0 };
	struct epoll_event event = { 0 };
	uint64_t offset = 0;
	int epfd = ev_epoll_create(), status = -1, count;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, TAG) < 0 || ev_request(fd, 1) < 0)
		goto out;
	count = epoll_pwait2(epfd, &event, 1, &timeout, NULL);
	if (count != 1 || event.data.u64 != TAG || !(event.events & EPOLLIN)) {
		harness_fail("epoll_pwait2(5 s) with 1 byte coming returned %d, events %s, data 0x%llx", count,
			ev_events_text(event.events), (unsigned long long)event.data.u64);
		goto out;
	}
	event = (struct epoll_event){ 0 };
	count = epoll_pwait2(epfd, &event, 1, NULL, NULL);
	if (count != 1 || event.data.u64 != TAG || !(event.events & EPOLLIN)) {
		harness_fail("epoll_pwait2(NULL timeout) with 1 byte unread returned %d, events %s", count,
			ev_events_text(event.events));
		goto out;
	}
	status = ev_recv_stream(fd, &offset, 1, "data");
out:
	close(epfd);
	return status;
}
#endif

static int epoll_pwait2_client(int fd)
{
	int checked = epoll_pwait2_timeout(fd);
	if (checked < 0)
		return -1;
#ifdef EV_HAVE_EPOLL_PWAIT2
	if (checked == 0 && epoll_pwait2_reports(fd) < 0)
		return -1;
#endif
	return ev_server_turn_then_finish(fd);
}

static int epoll_pwait2_server(int fd)
{
	uint64_t offset = 0;
	return ev_serve_requests(fd, &offset, epoll_pwait2_check);
}

/*
 * ppoll_pselect_data: the waits with a signal mask see data arriving, not only
 * signals. The client asks for 10 bytes and waits for them with ppoll (5 s
 * timeout, an empty sigmask), reads them, asks again and waits with pselect.
 * Each wait returns 1 with the socket readable, and the bytes are the stream's.
 */
static int ppoll_pselect_data_client(int fd)
{
	struct timespec timeout = { EV_EVENT_WAIT_MS / 1000, 0 };
	sigset_t empty;
	uint64_t offset = 0;

	sigemptyset(&empty);
	if (ev_request(fd, 10) < 0)
		return -1;
	{
		struct pollfd entry = { .fd = fd, .events = POLLIN };
		int result = ppoll(&entry, 1, &timeout, &empty);

		if (result != 1 || !(entry.revents & POLLIN))
			return harness_fail("ppoll returned %d (revents 0x%x), expected 1 with POLLIN", result, entry.revents);
	}
	if (ev_recv_stream(fd, &offset, 10, "data after ppoll") < 0 || ev_request(fd, 10) < 0)
		return -1;
	{
		fd_set readable;
		int result;

		FD_ZERO(&readable);
		FD_SET(fd, &readable);
		result = pselect(fd + 1, &readable, NULL, NULL, &timeout, &empty);
		if (result != 1 || !FD_ISSET(fd, &readable))
			return harness_fail("pselect returned %d, expected 1 with the socket readable", result);
	}
	if (ev_recv_stream(fd, &offset, 10, "data after pselect") < 0)
		return -1;
	return harness_finish_client(fd);
}


/*
 * member_added_while_waiting: one thread waits in epoll_wait (8 s) on a set
 * that holds only a pipe; meanwhile the main thread has 10 bytes sent to the
 * connection and adds it to that set. The waiting thread must report it
 * within 3 s (an event loop whose worker threads add connections to the
 * listener thread's set: Apache's event MPM), not sleep out its timeout.
 */
struct ev_waiter {
	int epfd;
	int count;
	uint64_t data;
	double elapsed_ms;
};

static void *ev_waiter_main(void *arg)
{
	struct ev_waiter *w = arg;
	struct epoll_event event;
	double t0 = harness_now_ms();

	do
		w->count = epoll_wait(w->epfd, &event, 1, 8000);
	while (w->count < 0 && errno == EINTR);
	w->elapsed_ms = harness_now_ms() - t0;
	w->data = w->count > 0 ? event.data.u64 : 0;
	return NULL;
}

/*
 * member_added_while_bare: the same, but the set had a socket of
 * fabsock's before (one made, added and closed: under the preload the
 * instance keeps its record with no member), so the waiter sleeps in the
 * one kernel call of a set without members (EPOLL_BARE) and must be woken
 * by the member's arrival; e2e_evloop checks epoll_bare_woken.
 */
static int member_added_client(int fd, bool had_member)
{
	enum { TAG_PIPE = 0x1, TAG_SOCKET = 0x2, TAG_GONE = 0x3 };
	struct ev_waiter w = { .epfd = ev_epoll_create() };
	uint64_t offset = 0;
	pthread_t thread;
	int pipes[2] = { -1, -1 }, status = -1;

	if (w.epfd < 0 || pipe(pipes) != 0 || ev_epoll_ctl(w.epfd, EPOLL_CTL_ADD, pipes[0], EPOLLIN, TAG_PIPE) < 0)
		goto out;
	if (had_member) {
		int gone = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);

		if (gone < 0 || ev_epoll_ctl(w.epfd, EPOLL_CTL_ADD, gone, EPOLLIN, TAG_GONE) < 0) {
			harness_fail("a socket to add and close: %s", strerror(errno));
			if (gone >= 0)
				close(gone);
			goto out;
		}
		close(gone);
	}
	if (pthread_create(&thread, NULL, ev_waiter_main, &w) != 0) {
		harness_fail("pthread_create failed");
		goto out;
	}
	harness_sleep_ms(200); /* the waiter is asleep in epoll_wait by now */
	if (ev_request(fd, 10) < 0 || harness_wait_fd(fd, POLLIN, EV_EVENT_WAIT_MS) <= 0 ||
	    ev_epoll_ctl(w.epfd, EPOLL_CTL_ADD, fd, EPOLLIN, TAG_SOCKET) < 0) {
		pthread_join(thread, NULL);
		goto out;
	}
	pthread_join(thread, NULL);
	harness_info("the waiter returned %d event(s) after %.0f ms", w.count, w.elapsed_ms);
	if (w.count != 1 || w.data != TAG_SOCKET || w.elapsed_ms > 3000) {
		harness_fail("waiter: %d event(s), data 0x%llx after %.0f ms; expected the socket's within 3 s", w.count,
			(unsigned long long)w.data, w.elapsed_ms);
		goto out;
	}
	if (ev_recv_stream(fd, &offset, 10, "data") < 0)
		goto out;
	status = harness_finish_client(fd);
out:
	if (pipes[0] >= 0) {
		close(pipes[0]);
		close(pipes[1]);
	}
	if (w.epfd >= 0)
		close(w.epfd);
	return status;
}

static int member_added_while_waiting_client(int fd)
{
	return member_added_client(fd, false);
}

static int member_added_while_bare_client(int fd)
{
	return member_added_client(fd, true);
}

/*
 * ctl_storm: for 1.5 s one thread adds sockets to a set and deletes or
 * closes them again while another waits on the set: every event it gets
 * must carry data the application registered (EV_STORM_MARK | fd), never a
 * value of its own: an event for an entry removed between the kernel's
 * answer and its return.
 */
#define EV_STORM_MARK (0x5e50ull << 48)

struct ev_storm {
	int epfd;
	int stop;
	unsigned long events, bad;
	uint64_t bad_data;
};

static void *ev_storm_waiter(void *arg)
{
	struct ev_storm *st = arg;
	struct epoll_event events[16];

	while (!__atomic_load_n(&st->stop, __ATOMIC_ACQUIRE)) {
		int n = epoll_wait(st->epfd, events, 16, 1);

		for (int i = 0; i < n; i++) {
			st->events++;
			if ((events[i].data.u64 & (0xffffull << 48)) != EV_STORM_MARK) {
				st->bad++;
				st->bad_data = events[i].data.u64;
			}
		}
	}
	return NULL;
}

static int ctl_storm_client(int fd)
{
	struct ev_storm st = { .epfd = ev_epoll_create() };
	unsigned long cycles = 0;
	pthread_t thread;
	double end;

	if (st.epfd < 0)
		return -1;
	if (pthread_create(&thread, NULL, ev_storm_waiter, &st) != 0) {
		close(st.epfd);
		return harness_fail("pthread_create failed");
	}
	end = harness_now_ms() + 1500;
	while (harness_now_ms() < end) {
		int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		struct epoll_event event = { .events = EPOLLOUT, .data.u64 = EV_STORM_MARK | (uint64_t)s };

		if (s < 0)
			break;
		/* a fresh socket is writable at once (EPOLLOUT | EPOLLHUP) */
		epoll_ctl(st.epfd, EPOLL_CTL_ADD, s, &event);
		if (cycles % 2)
			epoll_ctl(st.epfd, EPOLL_CTL_DEL, s, NULL);
		close(s);
		cycles++;
	}
	__atomic_store_n(&st.stop, 1, __ATOMIC_RELEASE);
	pthread_join(thread, NULL);
	close(st.epfd);
	harness_info("%lu add/remove cycles, %lu events, %lu with foreign data", cycles, st.events, st.bad);
	if (st.bad)
		return harness_fail("%lu events carried data the application never registered (e.g. 0x%llx)", st.bad,
			       (unsigned long long)st.bad_data);
	return harness_finish_client(fd);
}


/*
 * readd: the socket goes into the set for one request and out again, 300
 * times with a new epoll_data each time (redis-benchmark's and hiredis's
 * event loops add a socket for one write or read and take it out after).
 * Every request's event carries that round's data, every byte is checked.
 * Then, with the socket out of the set: a second DEL and a MOD fail ENOENT;
 * bytes that arrive while it is out are reported by the next ADD (edge-
 * triggered, at once); an ADD of a member fails EEXIST; a dup of it added,
 * taken out and closed leaves nothing behind: a new socket that reuses its
 * number is added without error and reports with its own data only. The
 * script also checks (fabsock) that the re-adds took no kernel call.
 */
#define EV_READD_ROUNDS 300

static int readd_client(int fd)
{
	enum { LATE_TAG = 0x1a7e, DUP_TAG = 0xd0, NEW_TAG = 0x4e };
	struct epoll_event event = { .events = EPOLLIN };
	uint64_t offset = 0;
	int epfd = ev_epoll_create(), status = -1, dup_fd = -1, new_fd = -1;

	for (unsigned round = 0; round < EV_READD_ROUNDS; round++) {
		char what[48];
		uint64_t tag = 0x5eed0000u + round;

		snprintf(what, sizeof(what), "round %u", round);
		if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, round % 2 ? EPOLLIN : EPOLLIN | EPOLLET, tag) < 0 ||
		    ev_request(fd, 100 + round) < 0 || !ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, tag, what) ||
		    ev_recv_stream(fd, &offset, 100 + round, what) < 0 || ev_epoll_ctl(epfd, EPOLL_CTL_DEL, fd, 0, 0) < 0)
			goto out;
	}
	if (epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL) == 0 || errno != ENOENT) {
		harness_fail("a second EPOLL_CTL_DEL returned %s, expected ENOENT", errno == ENOENT ? "0" : strerror(errno));
		goto out;
	}
	if (epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &event) == 0 || errno != ENOENT) {
		harness_fail("EPOLL_CTL_MOD after DEL returned %s, expected ENOENT", errno == ENOENT ? "0" : strerror(errno));
		goto out;
	}
	/* bytes that arrive while the socket is out of the set */
	if (ev_request(fd, 777) < 0 || harness_wait_fd(fd, POLLIN, EV_EVENT_WAIT_MS) <= 0 ||
	    ev_expect_no_event(epfd, 100, "socket out of the set") < 0 ||
	    ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLET, LATE_TAG) < 0 ||
	    !ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, LATE_TAG, "bytes that came while out of the set") ||
	    ev_recv_stream(fd, &offset, 777, "bytes that came while out of the set") < 0)
		goto out;
	event.data.u64 = LATE_TAG;
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &event) == 0 || errno != EEXIST) {
		harness_fail("a second EPOLL_CTL_ADD returned %s, expected EEXIST", errno == EEXIST ? "0" : strerror(errno));
		goto out;
	}
	if (ev_epoll_ctl(epfd, EPOLL_CTL_DEL, fd, 0, 0) < 0)
		goto out;
	/* a dup, in and out of the set, then closed: its number reused */
	dup_fd = dup(fd);
	if (dup_fd < 0) {
		harness_fail("dup: %s", strerror(errno));
		goto out;
	}
	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, dup_fd, EPOLLIN, DUP_TAG) < 0 ||
	    ev_epoll_ctl(epfd, EPOLL_CTL_DEL, dup_fd, 0, 0) < 0)
		goto out;
	close(dup_fd);
	new_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (new_fd < 0) {
		harness_fail("socket: %s", strerror(errno));
		goto out;
	}
	harness_info("dup fd %d, new socket fd %d", dup_fd, new_fd);
	dup_fd = -1;
	/* an unconnected TCP socket reports EPOLLOUT | EPOLLHUP */
	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, new_fd, EPOLLOUT, NEW_TAG) < 0 ||
	    !ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLOUT, NEW_TAG, "a new socket on the dup's number") ||
	    ev_epoll_ctl(epfd, EPOLL_CTL_DEL, new_fd, 0, 0) < 0 ||
	    ev_expect_no_event(epfd, 100, "every socket out of the set") < 0)
		goto out;
	/* and the connection still works, in the set again */
	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, LATE_TAG + 1) < 0 || ev_request(fd, 5000) < 0 ||
	    !ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, LATE_TAG + 1, "back in the set") ||
	    ev_recv_stream(fd, &offset, 5000, "back in the set") < 0)
		goto out;
	harness_info("%u add/remove rounds, %llu bytes checked", EV_READD_ROUNDS, (unsigned long long)offset);
	status = harness_finish_client(fd);
out:
	if (dup_fd >= 0)
		close(dup_fd);
	if (new_fd >= 0)
		close(new_fd);
	close(epfd);
	return status;
}

/*
 * listener_closed_first: the server closes its listening socket right after
 * accept() (socat without fork, inetd-style one-shot servers) and then waits
 * for requests with poll(); the client sends its probe only 150 ms after its
 * connect() (the script sets FABSOCK_TEST_PROBE_DELAY_MS for this scenario),
 * so it arrives after the close. It must still be answered at once, for
 * the connection to offload: the script checks the offloaded counts.
 */
static int listener_closed_first_server(int fd)
{
	close(harness_listen_fd);
	harness_listen_fd = -1;
	return ev_serve(fd);
}

/* One request of 1000 bytes, checked, and the end. */
static int one_request_client(int fd)
{
	uint64_t offset = 0;

	if (ev_request(fd, 1000) < 0 || harness_wait_fd(fd, POLLIN, EV_EVENT_WAIT_MS) <= 0 ||
	    ev_recv_stream(fd, &offset, 1000, "data") < 0)
		return -1;
	return harness_finish_client(fd);
}

static int listener_closed_first_client(int fd)
{
	return one_request_client(fd);
}

/*
 * probes_by_poll, probes_by_epoll: the script runs both ends with
 * FABSOCK_TEST_SERVICE_PROBES=0 (the server's service thread answers no
 * probe, as on a host too busy to run it in time) and
 * FABSOCK_TEST_PROBE_DELAY_MS=100 (the client's probe comes after the
 * accept). The server waits for the first request in poll() (in
 * epoll_wait) before it reads anything: that wait must answer the probe, or
 * the client gives up on it and the connection stays on TCP (the script
 * checks both ends offloaded).
 */
static int probes_by_poll_server(int fd)
{
	if (harness_wait_fd(fd, POLLIN, HARNESS_PEER_WAIT_MS) <= 0)
		return harness_fail("poll: no request within %d ms", HARNESS_PEER_WAIT_MS);
	return ev_serve(fd);
}

static int probes_by_epoll_server(int fd)
{
	int epfd = ev_epoll_create();

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, 0x9b) < 0 ||
	    !ev_expect_event(epfd, HARNESS_PEER_WAIT_MS, EPOLLIN, 0x9b, "the first request")) {
		close(epfd);
		return -1;
	}
	close(epfd);
	return ev_serve(fd);
}


/*
 * short_read_edge: the reader behaves as nginx does with EPOLLRDHUP: one
 * edge-triggered registration, reads of 3000 bytes, and a read shorter
 * than asked taken to mean "drained" (true of kernel TCP), after which it
 * waits for the next edge. 2 MiB are asked for in one request and the
 * reader starts 300 ms later, when everything the window admits has
 * arrived and no arrival is left to make an edge; every byte must come,
 * each wait ending within 5 s.
 */
static int short_read_edge_client(int fd)
{
	enum { READ_SIZE = 3000, TOTAL = 2 << 20 };
	static unsigned char buffer[READ_SIZE];
	int epfd = ev_epoll_create(), status = -1;
	uint64_t offset = 0;
	size_t got = 0;
	unsigned waits = 0, short_reads = 0;
	double longest_wait = 0;

	if (epfd < 0 || ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLRDHUP | EPOLLET, 1) < 0 ||
	    ev_request(fd, TOTAL) < 0)
		goto out;
	/* let the first chunks arrive and settle (a busy reader, as nginx
	 * writing downstream): then no arrival is left to make an edge */
	harness_sleep_ms(300);
	while (got < TOTAL) {
		struct epoll_event event;
		int n;

		double t0 = harness_now_ms();

		do
			n = epoll_wait(epfd, &event, 1, EV_EVENT_WAIT_MS);
		while (n < 0 && errno == EINTR);
		waits++;
		if (harness_now_ms() - t0 > longest_wait)
			longest_wait = harness_now_ms() - t0;
		if (n != 1) {
			harness_fail("no edge within %d ms after %zu of %d bytes (%u short reads)", EV_EVENT_WAIT_MS, got, TOTAL,
				short_reads);
			goto out;
		}
		for (;;) {
			ssize_t r = recv(fd, buffer, sizeof(buffer), 0);

			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0 && errno == EAGAIN)
				break;
			if (r <= 0) {
				harness_fail("recv after %zu bytes: %zd (%s)", got, r, r < 0 ? strerror(errno) : "EOF");
				goto out;
			}
			if (ev_stream_check(buffer, (size_t)r, &offset, "data") < 0)
				goto out;
			got += (size_t)r;
			if (r < READ_SIZE) {
				short_reads++;
				break; /* drained, as nginx concludes */
			}
		}
	}
	harness_info("%u waits, %u short reads, longest wait %.1f ms", waits, short_reads, longest_wait);
	status = harness_finish_client(fd);
out:
	if (epfd >= 0)
		close(epfd);
	return status;
}

/* vanished_peer: the client's process is killed while the server waits in
 * epoll_wait (level-triggered EPOLLIN) on its connection. The kernel sends
 * a FIN for a killed process: EOF at once. Offloaded, only the control
 * connection closes (no FIN on the stream): the grace for its last
 * messages, then a reset, which epoll must report by itself - the time it
 * takes is no stream message, and the wait must not sleep through it. */
static int vanished_peer_server(int fd)
{
	enum { TAG = 0x99 };
	int epfd = ev_epoll_create(), status = -1;
	double start;
	uint32_t events;
	ssize_t result;
	char byte;

	if (harness_expect_byte(fd, 'v') < 0 || ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, TAG) < 0 ||
	    harness_send_byte(fd, 'k') < 0)
		goto out;
	start = harness_now_ms();
	events = ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, TAG, "after the peer's process was killed");
	if (!events)
		goto out;
	result = recv(fd, &byte, 1, 0);
	if (!(result == 0 || (result < 0 && errno == ECONNRESET))) {
		harness_fail("recv after the peer vanished returned %s, expected 0 or -1 ECONNRESET",
			ev_error_text(result));
		goto out;
	}
	harness_info("the vanished peer reported as %s after %.0f ms, then recv %s", ev_events_text(events),
		harness_now_ms() - start, result == 0 ? "EOF" : "ECONNRESET");
	status = 0;
out:
	close(epfd);
	return status;
}

static int vanished_peer_client(int fd)
{
	int ready[2], status = -1;
	char byte;
	pid_t pid;

	(void)fd;
	if (pipe(ready) < 0)
		return harness_fail("pipe: %s", strerror(errno));
	pid = fork();
	if (pid == 0) {
		int c = harness_connect(harness_server_address, SOCK_NONBLOCK | SOCK_CLOEXEC);

		close(ready[0]);
		if (c < 0 || harness_send_byte(c, 'v') < 0 || harness_expect_byte(c, 'k') < 0 ||
		    write(ready[1], "k", 1) != 1)
			_exit(1);
		sleep(30); /* killed long before */
		_exit(1);
	}
	close(ready[1]);
	if (pid > 0) {
		/* the script removes what fabsock of a killed process leaves */
		printf("child-pid %d\n", (int)pid);
		fflush(stdout);
	}
	if (pid > 0 && read(ready[0], &byte, 1) == 1)
		status = 0;
	else
		harness_fail("the child did not reach the server");
	if (pid > 0)
		kill(pid, SIGKILL);
	if (harness_wait_child(pid, "the vanishing peer", SIGKILL) < 0)
		status = -1;
	close(ready[0]);
	return status;
}

/*
 * close_forked: a server's accepted socket in its epoll set settles as
 * plain TCP (the script runs this scenario's clients on TCP by a rule, so
 * no probe comes: the client's first bytes settle it); the server then
 * forks a child that keeps the socket open and closes its own descriptor.
 * The kernel keeps an epoll entry as long as its file is open, whoever
 * holds it, and goes on reporting it with the data it was registered
 * with: while the client keeps writing to the connection the child holds,
 * the parent's epoll_wait reports the closed fd's data, level-triggered,
 * as under the kernel (fabsock used to take its entry out: nothing was
 * reported), and does not spin meanwhile (a stale entry with fabsock's
 * tag would make every wait return at once with nothing to report). Then
 * the child goes, and the entry with the file.
 */
#define CLOSE_FORKED_WATCH_MS 300
static int close_forked_server(int fd)
{
	enum { TAG = 0xf0 };
	int epfd = ev_epoll_create(), hold[2] = { -1, -1 }, status = -1;
	double start, cpu_start, elapsed, cpu;
	pid_t pid;
	char byte;

	if (ev_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, EPOLLIN, TAG) < 0 ||
	    !ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, TAG, "the client's 'g'") ||
	    harness_expect_byte(fd, 'g') < 0 || pipe2(hold, O_CLOEXEC) < 0) {
		close(fd);
		goto out;
	}
	pid = fork();
	if (pid == 0) {
		/* holds the connection until the parent closes the pipe */
		close(hold[1]);
		while (read(hold[0], &byte, 1) < 0 && errno == EINTR)
			;
		_exit(0);
	}
	close(hold[0]);
	hold[0] = -1;
	close(fd);
	if (pid < 0) {
		harness_fail("fork: %s", strerror(errno));
		goto out;
	}
	/* the client's next bytes: reported with the closed fd's data */
	if (!ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, TAG, "the closed fd whose file the child holds"))
		goto out_child;
	/* level-triggered, unread: reported at every wait, without spinning
	 * in between (each wait returns at once, as the kernel's) */
	cpu_start = ev_cpu_ms();
	start = harness_now_ms();
	while ((elapsed = harness_now_ms() - start) < CLOSE_FORKED_WATCH_MS) {
		if (!ev_expect_event(epfd, EV_EVENT_WAIT_MS, EPOLLIN, TAG, "the closed fd, still unread"))
			goto out_child;
		harness_sleep_ms(20);
	}
	cpu = ev_cpu_ms() - cpu_start;
	harness_info("the closed fd reported for %.0f ms, %.0f ms of CPU", elapsed, cpu);
	if (cpu > EV_CPU_LIMIT * elapsed) {
		harness_fail("used %.0f ms of CPU in %.0f ms of waits on the closed fd (limit %.0f %%)", cpu, elapsed,
			EV_CPU_LIMIT * 100);
		goto out_child;
	}
	status = 0;
out_child:
	close(hold[1]);
	hold[1] = -1;
	if (harness_wait_child(pid, "the child holding the connection", 0) < 0)
		status = -1;
out:
	if (hold[0] >= 0)
		close(hold[0]);
	if (hold[1] >= 0)
		close(hold[1]);
	close(epfd);
	return status;
}

/* Sends 'g', then a byte every 20 ms until the connection ends (the
 * server's child leaves) or HARNESS_PEER_WAIT_MS. */
static int close_forked_client(int fd)
{
	double deadline = harness_now_ms() + HARNESS_PEER_WAIT_MS;
	unsigned sent = 0;

	if (harness_send_byte(fd, 'g') < 0)
		return -1;
	while (harness_now_ms() < deadline) {
		char byte;
		ssize_t result;

		harness_sleep_ms(20);
		result = recv(fd, &byte, 1, MSG_DONTWAIT);
		if (result == 0 || (result < 0 && errno == ECONNRESET))
			break; /* the child is gone */
		if (result > 0)
			return harness_fail("the server sent 0x%02x", (unsigned char)byte);
		if (send(fd, "x", 1, MSG_NOSIGNAL) == 1)
			sent++;
		else if (errno == EPIPE || errno == ECONNRESET)
			break;
	}
	if (harness_now_ms() >= deadline)
		return harness_fail("the connection did not end within %d ms", HARNESS_PEER_WAIT_MS);
	harness_info("sent %u bytes while the server's child held the connection", sent);
	return sent >= 5 ? 0 : harness_fail("only %u bytes sent while the child held the connection", sent);
}

/* ---- the scenario table -------------------------------------------------- */

static const struct harness_scenario scenarios[] = {
	{ "nb_recv_eagain", nb_recv_eagain_server, nb_recv_eagain_client, 0 },
	{ "ppoll_pselect_data", ev_serve, ppoll_pselect_data_client, 0 },
	{ "nb_send_full", send_full_reader, nb_send_full_client, 0 },
	{ "nb_connect", nb_connect_server, nb_connect_client, HARNESS_CLIENT_CONNECTS_ITSELF },
	{ "added_before_connect", ev_serve, added_before_connect_client, HARNESS_CLIENT_CONNECTS_ITSELF },
	{ "late_reader_et", late_reader_server, late_reader_et_client, HARNESS_CLIENT_CONNECTS_ITSELF },
	{ "late_reader_poll", late_reader_server, late_reader_poll_client, HARNESS_CLIENT_CONNECTS_ITSELF },
	{ "late_reader_shut", late_reader_shut_server, late_reader_shut_client, 0 },
	{ "late_reader_blocking", late_reader_blocking_server, late_reader_blocking_client, 0 },
	{ "late_reader_close", late_reader_close_server, late_reader_close_client, HARNESS_CLIENT_CONNECTS_ITSELF },
	{ "late_reader_exit", late_reader_exit_server, late_reader_exit_client, HARNESS_CLIENT_CLOSES_FD },
	{ "late_reader_wclose", late_reader_exit_server, late_reader_wclose_client, HARNESS_CLIENT_CLOSES_FD },
	{ "late_reader_exit_big", late_reader_exit_big_server, late_reader_exit_big_client, HARNESS_CLIENT_CLOSES_FD },
	{ "late_reader_exit_thread", late_reader_exit_server, late_reader_exit_thread_client, HARNESS_CLIENT_CLOSES_FD },
	{ "nb_connect_refused", nb_connect_refused_server, nb_connect_refused_client,
	  HARNESS_CLIENT_CONNECTS_ITSELF | HARNESS_SERVER_ACCEPTS_ITSELF },
	{ "accept4_flags", accept4_flags_server, accept4_flags_client, HARNESS_SERVER_ACCEPTS_ITSELF },
	{ "et_drain", ev_serve, et_drain_client, 0 },
	{ "oneshot", ev_serve, oneshot_client, 0 },
	{ "epollout_after_drain", send_full_reader, epollout_after_drain_client, 0 },
	{ "rdhup", rdhup_server, rdhup_client, 0 },
	{ "peer_close_events", peer_close_events_server, peer_close_events_client, 0 },
	{ "data_unchanged", ev_serve, data_unchanged_client, 0 },
	{ "mixed_set", ev_serve, mixed_set_client, 0 },
	{ "two_sets", ev_serve, two_sets_client, 0 },
	{ "nested", ev_serve, nested_client, 0 },
	{ "nested_stale", ev_serve, nested_stale_client, 0 },
	{ "nested_reused", ev_serve, nested_reused_client, 0 },
	{ "close_registered", close_registered_server, close_registered_client, HARNESS_CLIENT_CLOSES_FD },
	{ "timeouts", timeouts_server, timeouts_client, 0 },
	{ "eintr", eintr_server, eintr_client, 0 },
	{ "sigmask", sigmask_server, sigmask_client, 0 },
	{ "epoll_pwait2", epoll_pwait2_server, epoll_pwait2_client, 0 },
	{ "member_added_while_waiting", ev_serve, member_added_while_waiting_client, 0 },
	{ "member_added_while_bare", ev_serve, member_added_while_bare_client, 0 },
	{ "ctl_storm", ev_serve, ctl_storm_client, 0 },
	{ "listener_closed_first", listener_closed_first_server, listener_closed_first_client, 0 },
	{ "readd", ev_serve, readd_client, 0 },
	{ "probes_by_poll", probes_by_poll_server, one_request_client, 0 },
	{ "probes_by_epoll", probes_by_epoll_server, one_request_client, 0 },
	{ "short_read_edge", ev_serve, short_read_edge_client, 0 },
	{ "vanished_peer", vanished_peer_server, vanished_peer_client, HARNESS_CLIENT_CONNECTS_ITSELF },
	{ "close_forked", close_forked_server, close_forked_client, HARNESS_SERVER_CLOSES_FD },
};

/* ---- main -------------------------------------------------------------- */

/* Before any socket: the test stream, and SIGUSR1 counted (the drain cue and
 * sigmask's signal), without SA_RESTART so that it interrupts waits. */
static void ev_setup(void)
{
	ev_pattern_init();
	harness_set_handler(SIGUSR1, ev_count_usr1, 0);
}

static const struct harness_program program = {
	.name = "fs_evloop",
	.scenarios = scenarios,
	.count = HARNESS_COUNT(scenarios),
	.watchdog_seconds = EV_WATCHDOG_SECONDS,
	.nonblocking = true,
	.sigpipe_fails = true,
	.setup = ev_setup,
};

int main(int argc, char **argv)
{
	return harness_scenario_main(&program, argc, argv);
}
