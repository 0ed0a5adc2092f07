/* SPDX-License-Identifier: MIT */
/*
 * fs_idle: holds N TCP connections open and idle, for measuring what an idle
 * connection costs in CPU. The client opens N connections, sends a 16-byte
 * hello on each and reads the server's 16-byte answer; then both sides sit
 * idle for --idle-s seconds, either
 *   --mode recv:  one thread per connection blocked in recv(), or
 *   --mode epoll: one thread in epoll_wait() on all the connections;
 * after which the client sends one byte 'q' on each connection, the server
 * echoes it, and both exit (0 on success). The client prints "wake_ms X":
 * how long the exchange of the 'q's took, the first message after a quiet
 * spell (what an idle waiter's sleep costs in latency). With --delay-ms D the
 * client waits D ms between connect() and its first byte on each connection
 * (a client that connects ahead of use, a pool) and prints "first_ms X": the
 * slowest of those first round trips. The client prints "idle" on stdout
 * when the idle phase starts, the server writes its port to --ready-file once
 * it listens. SIGUSR1 to the client ends its idle phase before --idle-s has
 * passed (e2e_idle_cpu: once its measurement window has closed, the rest of
 * the phase was a wait with nothing measured); without it nothing changes.
 *
 *   fs_idle server [--port P] [--ready-file F] [--mode recv|epoll] [--conns N]
 *   fs_idle client HOST PORT [--mode recv|epoll] [--conns N] [--idle-s T] [--delay-ms D]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define HELLO_SIZE 16
#define MAX_CONNS 256

static bool is_server, use_epoll;
static unsigned conns = 8, idle_s = 15, delay_ms;
static const char *host = "127.0.0.1", *port = "0", *ready_file;
static int fds[MAX_CONNS];
static double q_sent_ms; /* client: when the first 'q' went out */
static volatile sig_atomic_t idle_end_asked; /* client: SIGUSR1 came */

static void ask_idle_end(int signal_number)
{
	(void)signal_number;
	idle_end_asked = 1;
}

static void mark_q_sent(void)
{
	q_sent_ms = harness_now_ms();
}

static void print_wake(void)
{
	printf("wake_ms %.3f\n", harness_now_ms() - q_sent_ms);
}

static void die(const char *what)
{
	fprintf(stderr, "fs_idle: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* Idle phase, recv mode: blocks in recv() until the 'q' (the client's
 * 'q' on the server, the server's echo of it on the client). */
static void *recv_thread(void *arg)
{
	int fd = *(int *)arg;
	char c;

	if (harness_read_full(fd, &c, 1, NULL) || c != 'q') {
		fprintf(stderr, "fs_idle: fd %d: no 'q' at the end of the idle phase\n", fd);
		exit(1);
	}
	if (is_server && harness_write_full(fd, "q", 1, NULL))
		die("echo q");
	return NULL;
}

/* Idle phase, epoll mode: waits for one 'q' per connection. The client's
 * wait has a timeout (the end of the idle phase), the server's none. */
static void epoll_idle(void)
{
	struct epoll_event ev, events[64];
	unsigned left = conns;
	bool sent = is_server;
	int ep = epoll_create1(0);
	double start;

	if (ep < 0)
		die("epoll_create1");
	for (unsigned i = 0; i < conns; i++) {
		ev.events = EPOLLIN;
		ev.data.fd = fds[i];
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev))
			die("epoll_ctl");
	}
	start = harness_now_ms();
	while (left) {
		int timeout = -1, n;

		if (!sent) {
			long ms = (long)idle_s * 1000 - (long)(harness_now_ms() - start);

			if (ms <= 0 || idle_end_asked) {
				mark_q_sent();
				for (unsigned i = 0; i < conns; i++)
					if (harness_write_full(fds[i], "q", 1, NULL))
						die("send q");
				sent = true;
				continue;
			}
			timeout = (int)ms;
		}
		n = epoll_wait(ep, events, 64, timeout);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("epoll_wait");
		for (int i = 0; i < n; i++) {
			char c;

			if (!sent) {
				fprintf(stderr, "fs_idle: fd %d readable during the idle phase\n", events[i].data.fd);
				exit(1);
			}
			if (harness_read_full(events[i].data.fd, &c, 1, NULL) || c != 'q') {
				fprintf(stderr, "fs_idle: fd %d: no 'q' at the end\n", events[i].data.fd);
				exit(1);
			}
			if (is_server && harness_write_full(events[i].data.fd, "q", 1, NULL))
				die("echo q");
			epoll_ctl(ep, EPOLL_CTL_DEL, events[i].data.fd, NULL);
			left--;
		}
	}
	if (!is_server)
		print_wake();
	close(ep);
}

/* The client's idle phase in recv mode: sleeps --idle-s seconds, or until
 * SIGUSR1 (the handler interrupts nanosleep; the recv threads block it, so
 * the main thread is the one it reaches). */
static void idle_sleep(void)
{
	double left = idle_s * 1000.0, end = harness_now_ms() + left;
	struct timespec delay;

	while (!idle_end_asked && left > 0) {
		delay.tv_sec = (time_t)(left / 1000);
		delay.tv_nsec = (long)((left - (double)delay.tv_sec * 1000) * 1e6);
		if (nanosleep(&delay, NULL) == 0)
			break;
		left = end - harness_now_ms();
	}
}

static void recv_idle(void)
{
	pthread_t threads[MAX_CONNS];
	sigset_t usr1, old;

	/* the recv threads never take SIGUSR1 (a recv it interrupted would
	 * fail with EINTR) */
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &usr1, &old);
	for (unsigned i = 0; i < conns; i++)
		if (pthread_create(&threads[i], NULL, recv_thread, &fds[i]))
			die("pthread_create");
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!is_server) {
		idle_sleep();
		mark_q_sent();
		for (unsigned i = 0; i < conns; i++)
			if (harness_write_full(fds[i], "q", 1, NULL))
				die("send q");
		/* the server's echo ends each recv thread */
		for (unsigned i = 0; i < conns; i++)
			pthread_join(threads[i], NULL);
		print_wake();
	} else {
		for (unsigned i = 0; i < conns; i++)
			pthread_join(threads[i], NULL);
	}
}

static void run_server(void)
{
	int ls = harness_listen(AF_INET, "127.0.0.1", port, 0, MAX_CONNS);
	char hello[HELLO_SIZE], text[32];

	if (ls < 0)
		exit(1);
	if (ready_file) {
		snprintf(text, sizeof(text), "%u\n", harness_local_port(ls));
		if (harness_write_file_atomically(ready_file, text))
			die("ready file");
	}
	for (unsigned i = 0; i < conns; i++) {
		fds[i] = harness_accept(ls, -1, 0, NULL, NULL);
		if (fds[i] < 0)
			exit(1);
		if (harness_read_full(fds[i], hello, sizeof(hello), NULL) ||
		    harness_write_full(fds[i], hello, sizeof(hello), NULL))
			die("hello");
	}
	close(ls);
	if (use_epoll)
		epoll_idle();
	else
		recv_idle();
}

static void run_client(void)
{
	struct addrinfo *ai = harness_resolve(host, port, AF_INET);
	char hello[HELLO_SIZE], back[HELLO_SIZE];
	double first_ms = 0;

	if (!ai)
		exit(1);
	for (unsigned i = 0; i < conns; i++) {
		double start, ms;

		fds[i] = harness_connect(ai, 0);
		if (fds[i] < 0)
			exit(1);
		harness_sleep_ms(delay_ms);
		start = harness_now_ms();
		snprintf(hello, sizeof(hello), "fs_idle %7u", i % 10000000u); /* 7 digits at most */
		if (harness_write_full(fds[i], hello, sizeof(hello), NULL) ||
		    harness_read_full(fds[i], back, sizeof(back), NULL) || memcmp(hello, back, sizeof(hello)))
			die("hello");
		ms = harness_now_ms() - start;
		if (ms > first_ms)
			first_ms = ms;
	}
	freeaddrinfo(ai);
	if (delay_ms)
		printf("first_ms %.3f\n", first_ms);
	printf("idle\n");
	fflush(stdout);
	if (use_epoll)
		epoll_idle();
	else
		recv_idle();
	printf("done\n");
}

static void usage(void)
{
	fprintf(stderr, "usage: fs_idle server [--port P] [--ready-file F] [--mode recv|epoll] [--conns N]\n"
			"       fs_idle client HOST PORT [--mode recv|epoll] [--conns N] [--idle-s T] [--delay-ms D]\n");
	exit(2);
}

/* A count for an option; a bad one is a usage error. */
static unsigned parse_count(const char *text)
{
	uint64_t value;

	if (harness_parse_size(text, UINT32_MAX, &value) < 0)
		usage();
	return (unsigned)value;
}

int main(int argc, char **argv)
{
	int i = 2;

	harness_report_to_stderr("fs_idle");

	if (argc < 2)
		usage();
	if (strcmp(argv[1], "server") == 0) {
		is_server = true;
	} else if (strcmp(argv[1], "client") == 0 && argc >= 4) {
		host = argv[2];
		port = argv[3];
		i = 4;
	} else {
		usage();
	}
	for (; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			usage();
		if (strcmp(argv[i], "--port") == 0 && is_server)
			port = v;
		else if (strcmp(argv[i], "--ready-file") == 0)
			ready_file = v;
		else if (strcmp(argv[i], "--mode") == 0 && (strcmp(v, "recv") == 0 || strcmp(v, "epoll") == 0))
			use_epoll = strcmp(v, "epoll") == 0;
		else if (strcmp(argv[i], "--conns") == 0)
			conns = parse_count(v);
		else if (strcmp(argv[i], "--idle-s") == 0)
			idle_s = parse_count(v);
		else if (strcmp(argv[i], "--delay-ms") == 0 && !is_server)
			delay_ms = parse_count(v);
		else
			usage();
		i++;
	}
	if (conns < 1 || conns > MAX_CONNS)
		usage();
	/* no SA_RESTART: the handler ends the client's nanosleep or
	 * epoll_wait with EINTR, and the idle phase with it */
	if (!is_server && harness_set_handler(SIGUSR1, ask_idle_end, 0))
		die("sigaction SIGUSR1");
	if (is_server)
		run_server();
	else
		run_client();
	return 0;
}
