/* SPDX-License-Identifier: MIT */
/*
 * fs_tail: the end of a large response (issue 26). A server's event loop
 * writes a 4 MiB response in nonblocking writes as EPOLLOUT allows and
 * closes the socket while the end of it still waits for the reader, who
 * reads slowly, 16 KiB at a time; the reader must get every byte (the test
 * pattern, checked) and then EOF, the kernel's promise for bytes written
 * before close(). Scenarios (`fs_tail list`):
 *   close_live          close(), the server process lives on until the
 *                       client, after its EOF, connects again and says so
 *   close_exit          close(), then the server process ends at once
 *   sysclose_live       syscall(SYS_close, fd), as libuv (Node.js) closes
 *   sysclose_exit       the same, then the process ends
 *   rdhup_reader        close_live, read as haproxy reads: level-triggered
 *                       epoll with EPOLLRDHUP, and once RDHUP was reported
 *                       a read shorter than asked is taken as the end (the
 *                       kernel never returns less than it holds); reads of
 *                       odd sizes, so that they straddle the sender's
 *                       messages
 *   halfclose_request   the client sends its request and shuts its writing
 *                       side down (SHUT_WR); the server reads to that EOF,
 *                       then answers 4 MiB and closes
 *   halfclose_upload    the server shuts its writing side down first (a
 *                       proxy's leg whose other end finished); the client
 *                       goes on sending 4 MiB and closes; the server reads
 *                       every byte and the EOF, then closes
 *   answer_exit         the server speaks first without reading: it
 *                       accepts, waits until the client's decision is made
 *                       (answer_sync_accept), writes a short answer (ANSWER_BYTES, one
 *                       message within the first credit grant, so it waits
 *                       for nothing), closes and ends at once; the client
 *                       reads late. The server may be gone before the
 *                       client has even looked at its HELLO-ACK (its
 *                       fabric address names a region that is gone by
 *                       then): the answer and the EOF must still come
 *   answer_exit_lateack the same; the script makes the client take its
 *                       HELLO-ACK 300 ms late (FABSOCK_TEST_ACK_DELAY_MS),
 *                       so that the server is always gone by then
 * Every socket is nonblocking; every wait is bounded (poll timeouts, the
 * harness's watchdog). Output as the harness's (harness.h): `PASS name`,
 * `FAIL name: ...`, `info name: ...`, `connections=N`.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "harness.h"

#define TAIL_BYTES (4u << 20)
#define TAIL_KEY 26
#define TAIL_READ 16384
/* The reader pauses this long every TAIL_PAUSE_EVERY reads: slow enough
 * that the writer's queue waits for credit when it closes. */
#define TAIL_PAUSE_MS 2
#define TAIL_PAUSE_EVERY 4
/* A reader that starts this late finds a writer that closed (and, in the
 * _exit scenarios, ended) long before. */
#define TAIL_LATE_START_MS 400
#define TAIL_WAIT_MS 20000

static unsigned char *tail_data;

static int tail_close(int fd, bool raw)
{
	long ret = raw ? syscall(SYS_close, fd) : close(fd);

	if (ret)
		return harness_fail("%s: %s", raw ? "syscall(SYS_close)" : "close", strerror(errno));
	return 0;
}

/* The writer's event loop: writes DATA (LENGTH bytes) in nonblocking
 * writes of all that is left, as libuv does, waiting for EPOLLOUT after
 * each EAGAIN or partial write. Returns 0 or -1 (reported). */
static int tail_write_loop(int fd, const unsigned char *data, size_t length)
{
	int epfd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLOUT, .data.u64 = 7 };
	double deadline = harness_now_ms() + TAIL_WAIT_MS;
	size_t done = 0;
	unsigned waits = 0;

	if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev))
		return harness_fail("epoll: %s", strerror(errno));
	while (done < length) {
		ssize_t n = send(fd, data + done, length - done, MSG_NOSIGNAL);

		if (n > 0) {
			done += (size_t)n;
			if (done == length)
				break;
		} else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			close(epfd);
			return harness_fail("send after %zu bytes: %s", done, strerror(errno));
		}
		for (;;) {
			struct epoll_event out;
			int r = epoll_wait(epfd, &out, 1, harness_remaining_ms(deadline));

			if (r > 0 && (out.events & EPOLLOUT))
				break;
			if (r > 0 && (out.events & (EPOLLERR | EPOLLHUP))) {
				close(epfd);
				return harness_fail("EPOLLERR/HUP after %zu of %zu bytes", done, length);
			}
			if (r == 0 || harness_remaining_ms(deadline) == 0) {
				close(epfd);
				return harness_fail("not writable again within %d ms after %zu bytes", TAIL_WAIT_MS,
						    done);
			}
			if (r < 0 && errno != EINTR) {
				close(epfd);
				return harness_fail("epoll_wait: %s", strerror(errno));
			}
		}
		waits++;
	}
	close(epfd);
	harness_info("wrote %zu bytes, %u waits for EPOLLOUT", length, waits);
	return 0;
}

/* Reads (nonblocking, polling) until EOF in reads of READ_SIZE, pausing
 * now and then; checks the pattern and that exactly LENGTH bytes came. */
static int tail_read_slowly(int fd, size_t length, size_t read_size)
{
	unsigned char *buf = malloc(read_size);
	double deadline = harness_now_ms() + TAIL_WAIT_MS;
	uint64_t got = 0;
	unsigned reads = 0;
	int ret = -1;

	if (!buf)
		return harness_fail("out of memory");
	for (;;) {
		ssize_t n = recv(fd, buf, read_size, 0);

		if (n > 0) {
			if (got + (uint64_t)n > length) {
				harness_fail("%zu bytes more than the %zu sent", (size_t)(got + (uint64_t)n - length),
					     length);
				break;
			}
			if (harness_pattern_check(TAIL_KEY, got, buf, (size_t)n, "response") < 0)
				break;
			got += (uint64_t)n;
			if (++reads % TAIL_PAUSE_EVERY == 0)
				harness_sleep_ms(TAIL_PAUSE_MS);
			continue;
		}
		if (n == 0) {
			if (got == length)
				ret = 0;
			else
				harness_fail("EOF after %llu of %zu bytes (%zu missing)", (unsigned long long)got,
					     length, length - (size_t)got);
			break;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			harness_fail("recv after %llu of %zu bytes: %s", (unsigned long long)got, length,
				     strerror(errno));
			break;
		}
		if (harness_wait_fd(fd, POLLIN, harness_remaining_ms(deadline)) <= 0) {
			harness_fail("nothing readable within %d ms after %llu of %zu bytes", TAIL_WAIT_MS,
				     (unsigned long long)got, length);
			break;
		}
	}
	free(buf);
	return ret;
}

/* The client's word that it read everything: a second connection (the
 * first is closed by then), one byte. */
static int tail_client_done(void)
{
	int fd = harness_scenario_connect();
	int ret;

	if (fd < 0)
		return -1;
	ret = harness_send_byte(fd, 'a');
	close(fd);
	return ret;
}

static int tail_server_wait_done(void)
{
	int fd = harness_scenario_accept();
	int ret;

	if (fd < 0)
		return -1;
	ret = harness_expect_byte(fd, 'a');
	close(fd);
	return ret;
}

/* ---- the writer closes while its queue waits ------------------------------- */

static int tail_serve(int fd, bool raw_close, bool stay)
{
	if (harness_expect_byte(fd, 'g') < 0 || tail_write_loop(fd, tail_data, TAIL_BYTES) < 0)
		return -1;
	if (tail_close(fd, raw_close) < 0)
		return -1;
	/* Ending here is the process's exit, right after the close. */
	return stay ? tail_server_wait_done() : 0;
}

static int tail_fetch(int fd, bool late, bool stay)
{
	if (harness_send_byte(fd, 'g') < 0)
		return -1;
	if (late)
		harness_sleep_ms(TAIL_LATE_START_MS);
	if (tail_read_slowly(fd, TAIL_BYTES, TAIL_READ) < 0)
		return -1;
	close(fd);
	return stay ? tail_client_done() : 0;
}

/* ---- the server answers and ends before the client joins ------------------ */

/* Above the shm provider's inject size (4 KiB), below the pull size (16
 * KiB) and the chunk: one DATA message, then the FIN, both within the
 * first grant. */
#define ANSWER_BYTES 12000u

/* When the server answers. A server that speaks first waits only
 * FABSOCK_FIRST_SEND_WAIT_MS (5 ms) for its client's probe, and a client
 * that decides late (on a loaded machine its listener-record lookup came
 * after the server had answered, closed and withdrawn its record) rightly
 * stays on TCP (docs/design.md, Negotiation 5); this scenario is about an
 * offloaded answer's end. So the client, once its connect() returned (its
 * decision made, its probe sent), opens a second connection, which nobody
 * uses and which counts for neither side (raw calls: no harness count, no
 * offload); the server answers ANSWER_AFTER_MS after it accepted that one,
 * time for the probe's answer and the HELLO. */
#define ANSWER_AFTER_MS 200

/* Accepts the client's second connection (nonblocking listener) and
 * closes it. */
static int answer_sync_accept(void)
{
	double deadline = harness_now_ms() + TAIL_WAIT_MS;

	for (;;) {
		int fd = accept4(harness_listen_fd, NULL, NULL, SOCK_CLOEXEC);

		if (fd >= 0) {
			close(fd);
			return 0;
		}
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return harness_fail("accept of the second connection: %s", strerror(errno));
		if (harness_wait_fd(harness_listen_fd, POLLIN, harness_remaining_ms(deadline)) <= 0)
			return harness_fail("no second connection within %d ms", TAIL_WAIT_MS);
	}
}

static int answer_exit_server(int fd)
{
	if (answer_sync_accept() < 0)
		return -1;
	harness_sleep_ms(ANSWER_AFTER_MS);
	if (tail_write_loop(fd, tail_data, ANSWER_BYTES) < 0)
		return -1;
	return tail_close(fd, false); /* and the process ends */
}

static int answer_exit_client(int fd)
{
	const struct addrinfo *a = harness_server_address;
	int sync = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

	/* blocking: connected once it returns (the kernel's backlog) */
	if (sync < 0 || connect(sync, a->ai_addr, a->ai_addrlen))
		return harness_fail("the second connection: %s", strerror(errno));
	harness_sleep_ms(TAIL_LATE_START_MS);
	close(sync);
	if (tail_read_slowly(fd, ANSWER_BYTES, TAIL_READ) < 0)
		return -1;
	close(fd);
	return 0;
}

static int close_live_server(int fd) { return tail_serve(fd, false, true); }
static int close_live_client(int fd) { return tail_fetch(fd, false, true); }
static int close_exit_server(int fd) { return tail_serve(fd, false, false); }
static int close_exit_client(int fd) { return tail_fetch(fd, true, false); }
static int sysclose_live_server(int fd) { return tail_serve(fd, true, true); }
static int sysclose_live_client(int fd) { return tail_fetch(fd, false, true); }
static int sysclose_exit_server(int fd) { return tail_serve(fd, true, false); }
static int sysclose_exit_client(int fd) { return tail_fetch(fd, true, false); }

/* ---- haproxy's reader ------------------------------------------------------ */

/* Level-triggered epoll with EPOLLRDHUP; after an event with RDHUP, a read
 * shorter than asked ends the stream (haproxy's raw_sock_to_buf). Reads
 * alternate between sizes that are not multiples of anything the sender
 * uses. The stream must be whole at that point, and the next read EOF. */
static int rdhup_reader_client(int fd)
{
	static const size_t sizes[] = { 16384 + 1000, 7000, 65536 + 333, 16384 };
	int epfd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.u64 = 9 };
	unsigned char *buf = malloc(65536 + 333);
	double deadline = harness_now_ms() + TAIL_WAIT_MS;
	uint64_t got = 0;
	unsigned reads = 0, i = 0;
	bool rdhup = false, ended = false;
	int ret = -1;

	if (!buf || epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) || harness_send_byte(fd, 'g') < 0) {
		harness_fail("setup: %s", strerror(errno));
		goto out;
	}
	while (!ended) {
		struct epoll_event out;
		int r = epoll_wait(epfd, &out, 1, harness_remaining_ms(deadline));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			harness_fail("no event within %d ms after %llu bytes", TAIL_WAIT_MS, (unsigned long long)got);
			goto out;
		}
		rdhup = rdhup || (out.events & (EPOLLRDHUP | EPOLLHUP));
		for (;;) {
			size_t want = sizes[i++ % 4];
			ssize_t n = recv(fd, buf, want, 0);

			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				break;
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0) {
				harness_fail("recv after %llu bytes: %s", (unsigned long long)got, strerror(errno));
				goto out;
			}
			if (n == 0) {
				ended = true;
				break;
			}
			if (got + (uint64_t)n > TAIL_BYTES) {
				harness_fail("more than the %u bytes sent", TAIL_BYTES);
				goto out;
			}
			if (harness_pattern_check(TAIL_KEY, got, buf, (size_t)n, "response") < 0)
				goto out;
			got += (uint64_t)n;
			if (++reads % TAIL_PAUSE_EVERY == 0)
				harness_sleep_ms(TAIL_PAUSE_MS);
			if ((size_t)n < want) {
				/* "socket buffer exhausted": with RDHUP seen, the end */
				ended = rdhup;
				break;
			}
		}
	}
	if (got != TAIL_BYTES) {
		harness_fail("the stream ended (RDHUP and a short read, or EOF) after %llu of %u bytes (%llu missing)",
			     (unsigned long long)got, TAIL_BYTES, (unsigned long long)(TAIL_BYTES - got));
		goto out;
	}
	ret = harness_expect_eof(fd);
	close(fd);
	if (!ret)
		ret = tail_client_done();
out:
	if (epfd >= 0)
		close(epfd);
	free(buf);
	return ret;
}

/* ---- half-closed legs ------------------------------------------------------ */

#define TAIL_REQUEST 100000

/* The request comes with the client's FIN behind it; the answer goes the
 * other way after. */
static int halfclose_request_server(int fd)
{
	unsigned char *buf = malloc(TAIL_REQUEST);
	size_t done = 0;
	int ret;

	if (!buf)
		return harness_fail("out of memory");
	ret = harness_read_full(fd, buf, TAIL_REQUEST, &done);
	if (ret < 0)
		harness_fail("request: %zu of %u bytes: %s", done, TAIL_REQUEST, strerror(-ret));
	else
		ret = harness_pattern_check(TAIL_KEY + 1, 0, buf, TAIL_REQUEST, "request");
	free(buf);
	if (ret < 0 || harness_expect_eof(fd) < 0)
		return -1;
	if (tail_write_loop(fd, tail_data, TAIL_BYTES) < 0 || tail_close(fd, false) < 0)
		return -1;
	return tail_server_wait_done();
}

static int halfclose_request_client(int fd)
{
	if (harness_send_pattern(fd, TAIL_KEY + 1, 0, TAIL_REQUEST) < 0)
		return -1;
	if (shutdown(fd, SHUT_WR))
		return harness_fail("shutdown(SHUT_WR): %s", strerror(errno));
	if (tail_read_slowly(fd, TAIL_BYTES, TAIL_READ) < 0)
		return -1;
	close(fd);
	return tail_client_done();
}

/* The server's writing side ends first; the client's upload goes on, and
 * the client closes with its end still queued. */
static int halfclose_upload_server(int fd)
{
	/* (the client speaks first: a server that speaks first waits for
	 * its client's probe, FABSOCK_FIRST_SEND_WAIT_MS, not the point here) */
	if (harness_expect_byte(fd, 'u') < 0 || harness_send_byte(fd, 'h') < 0)
		return -1;
	if (shutdown(fd, SHUT_WR))
		return harness_fail("shutdown(SHUT_WR): %s", strerror(errno));
	if (tail_read_slowly(fd, TAIL_BYTES, TAIL_READ) < 0)
		return -1;
	return tail_close(fd, false);
}

static int halfclose_upload_client(int fd)
{
	if (harness_send_byte(fd, 'u') < 0 || harness_expect_byte(fd, 'h') < 0 || harness_expect_eof(fd) < 0)
		return -1;
	if (tail_write_loop(fd, tail_data, TAIL_BYTES) < 0)
		return -1;
	return tail_close(fd, false);
}

static const struct harness_scenario tail_scenarios[] = {
	{ "close_live", close_live_server, close_live_client, HARNESS_CLIENT_CLOSES_FD | HARNESS_SERVER_CLOSES_FD },
	{ "close_exit", close_exit_server, close_exit_client, HARNESS_CLIENT_CLOSES_FD | HARNESS_SERVER_CLOSES_FD },
	{ "sysclose_live", sysclose_live_server, sysclose_live_client, HARNESS_CLIENT_CLOSES_FD | HARNESS_SERVER_CLOSES_FD },
	{ "sysclose_exit", sysclose_exit_server, sysclose_exit_client, HARNESS_CLIENT_CLOSES_FD | HARNESS_SERVER_CLOSES_FD },
	{ "rdhup_reader", close_live_server, rdhup_reader_client, HARNESS_CLIENT_CLOSES_FD | HARNESS_SERVER_CLOSES_FD },
	{ "halfclose_request", halfclose_request_server, halfclose_request_client, HARNESS_CLIENT_CLOSES_FD | HARNESS_SERVER_CLOSES_FD },
	{ "halfclose_upload", halfclose_upload_server, halfclose_upload_client, HARNESS_CLIENT_CLOSES_FD | HARNESS_SERVER_CLOSES_FD },
	{ "answer_exit", answer_exit_server, answer_exit_client, HARNESS_CLIENT_CLOSES_FD | HARNESS_SERVER_CLOSES_FD },
	{ "answer_exit_lateack", answer_exit_server, answer_exit_client, HARNESS_CLIENT_CLOSES_FD | HARNESS_SERVER_CLOSES_FD },
};

static void tail_setup(void)
{
	tail_data = malloc(TAIL_BYTES);
	if (!tail_data) {
		fprintf(stderr, "fs_tail: out of memory\n");
		exit(2);
	}
	harness_pattern_fill(TAIL_KEY, 0, tail_data, TAIL_BYTES);
}

int main(int argc, char **argv)
{
	static const struct harness_program program = {
		.name = "fs_tail",
		.scenarios = tail_scenarios,
		.count = HARNESS_COUNT(tail_scenarios),
		.watchdog_seconds = 60,
		.nonblocking = true,
		.sigpipe_fails = true,
		.setup = tail_setup,
	};

	return harness_scenario_main(&program, argc, argv);
}
