/* SPDX-License-Identifier: MIT */
/*
 * fs_pingpong: request/response pairs, for the step-back rule
 * (core/stepback.h, e2e_stepback).
 *
 *   fs_pingpong server [DELAY_US]
 *       An echo server on 127.0.0.1, an ephemeral port ("listening
 *       port=P"), a thread per connection with blocking calls: reads what
 *       came (at most 64 KiB), sleeps DELAY_US (a server that thinks before
 *       it answers: its client's waits outlast any spin), writes it back;
 *       at EOF closes. On SIGTERM prints "accepted=N" and exits 0.
 *   fs_pingpong client PORT CONNS ROUNDS SIZE [--poll] [--gap-us N] [--think-us T]
 *       CONNS threads, each with its own connection to 127.0.0.1:PORT (an
 *       echo server: this one, or fs_scale server's epoll loop). ROUNDS
 *       times each sleeps N us (--gap-us: a client that thinks between
 *       requests, so its server's waits outlast any spin), writes SIZE bytes
 *       of a pattern keyed by its index and reads them back, checking every
 *       byte (with --poll, a poll() for POLLIN before every read, as libpq
 *       does; with --think-us T, every odd round sleeps T us between its
 *       write and its read: its answer comes while it is busy, not
 *       waiting for it, and it prints "max_turn_ms=M round=R", the longest
 *       round after the first, which may still wait for the handshake).
 *       Then it shuts its sending side down (SHUT_WR), must read
 *       EOF with nothing before it, and closes. Per connection it prints
 *       "conn I tcp_in=N tcp_out=M fnv=H": the kernel's TCP_INFO counts of
 *       payload received and sent (tcpi_bytes_received, tcpi_bytes_acked:
 *       what went over kernel TCP, the HELLO and its ACK included) and the
 *       checksum of what it read; then "PASS pingpong" (or FAIL lines;
 *       exit 1).
 * Plain blocking calls: the same program runs under kernel TCP and the
 * preload.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define PP_MAX_CONNS 256
#define PP_MAX_SIZE (1u << 20)

struct pp_conn {
	pthread_t thread;
	unsigned index;
	uint64_t tcp_in, tcp_out, fnv;
	uint64_t max_turn_ns; /* the longest round after the first (write to the whole echo read) */
	unsigned max_turn_round;
	bool ok;
};

static struct addrinfo *pp_target;
static unsigned pp_rounds;
static size_t pp_size;
static bool pp_poll;
static unsigned pp_gap_us;
static unsigned pp_think_us;

static void *pp_run(void *arg)
{
	struct pp_conn *c = arg;
	uint64_t key = 0x5eb0000ull + c->index, off = 0;
	char *out = malloc(pp_size), *in = malloc(pp_size);
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	int fd;

	c->fnv = HARNESS_FNV1A_OFFSET;
	if (!out || !in) {
		harness_fail("conn %u: out of memory", c->index);
		goto out;
	}
	fd = harness_connect(pp_target, 0);
	if (fd < 0) {
		harness_fail("conn %u: connect failed", c->index);
		goto out;
	}
	for (unsigned r = 0; r < pp_rounds; r++, off += pp_size) {
		size_t done = 0;
		int ret;

		struct timespec t0, t1;
		uint64_t turn_ns;

		if (pp_gap_us)
			harness_sleep_ms(pp_gap_us / 1000.0);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		harness_pattern_fill(key, off, out, pp_size);
		if ((ret = harness_write_full(fd, out, pp_size, NULL))) {
			harness_fail("conn %u round %u: write: %s", c->index, r, strerror(-ret));
			goto close;
		}
		if (pp_think_us && (r & 1))
			harness_sleep_ms(pp_think_us / 1000.0);
		while (done < pp_size) {
			ssize_t n;

			if (pp_poll && harness_wait_fd(fd, POLLIN, HARNESS_PEER_WAIT_MS) <= 0) {
				harness_fail("conn %u round %u: poll saw no answer", c->index, r);
				goto close;
			}
			n = recv(fd, in + done, pp_size - done, 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				harness_fail("conn %u round %u: read %zd (%s) after %zu of %zu bytes", c->index, r, n,
					     n ? strerror(errno) : "EOF", done, pp_size);
				goto close;
			}
			done += (size_t)n;
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
		turn_ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000ull + (uint64_t)t1.tv_nsec - (uint64_t)t0.tv_nsec;
		/* the first round may still wait for the handshake's end */
		if (r && turn_ns > c->max_turn_ns)
			c->max_turn_ns = turn_ns, c->max_turn_round = r;
		if (harness_pattern_check(key, off, in, pp_size, "echo"))
			goto close;
		c->fnv = harness_fnv1a(c->fnv, in, pp_size);
	}
	/* half-close: the server's EOF must follow, with nothing before it */
	if (shutdown(fd, SHUT_WR)) {
		harness_fail("conn %u: shutdown: %s", c->index, strerror(errno));
		goto close;
	}
	if (harness_expect_eof(fd))
		goto close;
	memset(&ti, 0, sizeof(ti));
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0) {
		c->tcp_in = ti.tcpi_bytes_received;
		c->tcp_out = ti.tcpi_bytes_acked;
	}
	c->ok = true;
close:
	close(fd);
out:
	free(out);
	free(in);
	return NULL;
}

static int pp_client(int argc, char **argv)
{
	static struct pp_conn conns[PP_MAX_CONNS];
	uint64_t n_conns, rounds, size;
	uint64_t max_turn_ns = 0;
	unsigned max_turn_round = 0;
	bool all = true;

	if (harness_parse_size(argv[3], PP_MAX_CONNS, &n_conns) || !n_conns ||
	    harness_parse_size(argv[4], 100000000, &rounds) || harness_parse_size(argv[5], PP_MAX_SIZE, &size) ||
	    !size)
		return 2;
	for (int i = 6; i < argc; i++) {
		uint64_t v;

		if (strcmp(argv[i], "--poll") == 0)
			pp_poll = true;
		else if (strcmp(argv[i], "--gap-us") == 0 && i + 1 < argc && !harness_parse_size(argv[i + 1], 10000000, &v))
			pp_gap_us = (unsigned)v, i++;
		else if (strcmp(argv[i], "--think-us") == 0 && i + 1 < argc &&
			 !harness_parse_size(argv[i + 1], 10000000, &v))
			pp_think_us = (unsigned)v, i++;
		else
			return 2;
	}
	pp_rounds = (unsigned)rounds;
	pp_size = (size_t)size;
	pp_target = harness_resolve("127.0.0.1", argv[2], AF_INET);
	if (!pp_target)
		return 1;
	for (unsigned i = 0; i < n_conns; i++) {
		conns[i].index = i;
		if (pthread_create(&conns[i].thread, NULL, pp_run, &conns[i])) {
			harness_fail("pthread_create");
			n_conns = i;
			break;
		}
	}
	for (unsigned i = 0; i < n_conns; i++) {
		pthread_join(conns[i].thread, NULL);
		printf("conn %u tcp_in=%" PRIu64 " tcp_out=%" PRIu64 " fnv=%016" PRIx64 " %s\n", i, conns[i].tcp_in,
		       conns[i].tcp_out, conns[i].fnv, conns[i].ok ? "ok" : "failed");
		all = all && conns[i].ok;
		if (conns[i].max_turn_ns > max_turn_ns)
			max_turn_ns = conns[i].max_turn_ns, max_turn_round = conns[i].max_turn_round;
	}
	if (pp_think_us)
		printf("max_turn_ms=%.3f round=%u\n", max_turn_ns / 1e6, max_turn_round);
	if (all && !harness_failures())
		printf("PASS pingpong\n");
	fflush(stdout);
	return all && !harness_failures() ? 0 : 1;
}

/* ---- server -------------------------------------------------------------- */

static volatile sig_atomic_t pp_stop;
static unsigned pp_delay_us;

static void pp_on_term(int sig)
{
	(void)sig;
	pp_stop = 1;
}

static void *pp_serve(void *arg)
{
	int fd = (int)(intptr_t)arg;
	static __thread char buf[65536];

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (pp_delay_us)
			harness_sleep_ms(pp_delay_us / 1000.0);
		if (harness_write_full(fd, buf, (size_t)n, NULL))
			break;
	}
	close(fd);
	return NULL;
}

static int pp_server(int argc, char **argv)
{
	unsigned long accepted = 0;
	uint64_t v = 0;
	int lfd;

	if (argc > 2 && harness_parse_size(argv[2], 10000000, &v))
		return 2;
	pp_delay_us = (unsigned)v;
	harness_set_handler(SIGTERM, pp_on_term, 0);
	lfd = harness_listen(AF_INET, "127.0.0.1", "0", 0, 256);
	if (lfd < 0)
		return 1;
	printf("listening port=%u\n", harness_local_port(lfd));
	fflush(stdout);
	while (!pp_stop) {
		pthread_attr_t attr;
		pthread_t t;
		int c = accept(lfd, NULL, NULL);

		if (c < 0)
			continue; /* EINTR: SIGTERM */
		accepted++;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &attr, pp_serve, (void *)(intptr_t)c))
			close(c);
		pthread_attr_destroy(&attr);
	}
	printf("accepted=%lu\n", accepted);
	fflush(stdout);
	exit(0);
}

int main(int argc, char **argv)
{
	harness_set_name("pingpong");
	harness_watchdog_start(300, NULL);
	if (argc >= 2 && strcmp(argv[1], "server") == 0) {
		int ret = pp_server(argc, argv);

		if (ret != 2)
			return ret;
	}
	if (argc >= 6 && strcmp(argv[1], "client") == 0) {
		int ret = pp_client(argc, argv);

		if (ret != 2)
			return ret;
	}
	fprintf(stderr, "usage: fs_pingpong server [DELAY_US] | client PORT CONNS ROUNDS SIZE [--poll] [--gap-us N]\n");
	return 2;
}
