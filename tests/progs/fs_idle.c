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
 * it listens.
 *
 *   fs_idle server [--port P] [--ready-file F] [--mode recv|epoll] [--conns N]
 *   fs_idle client HOST PORT [--mode recv|epoll] [--conns N] [--idle-s T] [--delay-ms D]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fullio.h"

#define HELLO_SIZE 16
#define MAX_CONNS 256

static bool is_server, use_epoll;
static unsigned conns = 8, idle_s = 15, delay_ms;
static const char *host = "127.0.0.1", *port = "0", *ready_file;
static int fds[MAX_CONNS];
static struct timespec q_sent; /* client: when the first 'q' went out */

static void mark_q_sent(void)
{
	clock_gettime(CLOCK_MONOTONIC, &q_sent);
}

static void print_wake(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	printf("wake_ms %.3f\n", (double)(now.tv_sec - q_sent.tv_sec) * 1e3 + (double)(now.tv_nsec - q_sent.tv_nsec) / 1e6);
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

	if (fullio_read(fd, &c, 1) || c != 'q') {
		fprintf(stderr, "fs_idle: fd %d: no 'q' at the end of the idle phase\n", fd);
		exit(1);
	}
	if (is_server && fullio_write(fd, "q", 1))
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
	struct timespec start;

	if (ep < 0)
		die("epoll_create1");
	for (unsigned i = 0; i < conns; i++) {
		ev.events = EPOLLIN;
		ev.data.fd = fds[i];
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev))
			die("epoll_ctl");
	}
	clock_gettime(CLOCK_MONOTONIC, &start);
	while (left) {
		int timeout = -1, n;

		if (!sent) {
			struct timespec now;
			long ms;

			clock_gettime(CLOCK_MONOTONIC, &now);
			ms = (long)idle_s * 1000 - ((now.tv_sec - start.tv_sec) * 1000 +
						    (now.tv_nsec - start.tv_nsec) / 1000000);
			if (ms <= 0) {
				mark_q_sent();
				for (unsigned i = 0; i < conns; i++)
					if (fullio_write(fds[i], "q", 1))
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
			if (fullio_read(events[i].data.fd, &c, 1) || c != 'q') {
				fprintf(stderr, "fs_idle: fd %d: no 'q' at the end\n", events[i].data.fd);
				exit(1);
			}
			if (is_server && fullio_write(events[i].data.fd, "q", 1))
				die("echo q");
			epoll_ctl(ep, EPOLL_CTL_DEL, events[i].data.fd, NULL);
			left--;
		}
	}
	if (!is_server)
		print_wake();
	close(ep);
}

static void recv_idle(void)
{
	pthread_t threads[MAX_CONNS];

	for (unsigned i = 0; i < conns; i++)
		if (pthread_create(&threads[i], NULL, recv_thread, &fds[i]))
			die("pthread_create");
	if (!is_server) {
		struct timespec t = { .tv_sec = idle_s };

		while (nanosleep(&t, &t) && errno == EINTR)
			;
		mark_q_sent();
		for (unsigned i = 0; i < conns; i++)
			if (fullio_write(fds[i], "q", 1))
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
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				    .sin_port = htons((uint16_t)atoi(port)) };
	socklen_t alen = sizeof(addr);
	int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
	char hello[HELLO_SIZE];

	if (ls < 0)
		die("socket");
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(ls, (struct sockaddr *)&addr, sizeof(addr)) || listen(ls, MAX_CONNS))
		die("bind/listen");
	if (getsockname(ls, (struct sockaddr *)&addr, &alen))
		die("getsockname");
	if (ready_file) {
		char tmp[4096];
		FILE *f;

		snprintf(tmp, sizeof(tmp), "%s.tmp", ready_file);
		f = fopen(tmp, "w");
		if (!f || fprintf(f, "%u\n", ntohs(addr.sin_port)) < 0 || fclose(f) || rename(tmp, ready_file))
			die("ready file");
	}
	for (unsigned i = 0; i < conns; i++) {
		fds[i] = accept(ls, NULL, NULL);
		if (fds[i] < 0)
			die("accept");
		if (fullio_read(fds[i], hello, sizeof(hello)) || fullio_write(fds[i], hello, sizeof(hello)))
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
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai;
	char hello[HELLO_SIZE], back[HELLO_SIZE];
	double first_ms = 0;

	if (getaddrinfo(host, port, &hints, &ai))
		die("getaddrinfo");
	for (unsigned i = 0; i < conns; i++) {
		struct timespec t0, t1;
		double ms;

		fds[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (fds[i] < 0 || connect(fds[i], ai->ai_addr, ai->ai_addrlen))
			die("connect");
		if (delay_ms) {
			struct timespec t = { .tv_sec = delay_ms / 1000, .tv_nsec = (long)(delay_ms % 1000) * 1000000 };

			while (nanosleep(&t, &t) && errno == EINTR)
				;
		}
		clock_gettime(CLOCK_MONOTONIC, &t0);
		snprintf(hello, sizeof(hello), "fs_idle %7u", i % 10000000u); /* 7 digits at most */
		if (fullio_write(fds[i], hello, sizeof(hello)) || fullio_read(fds[i], back, sizeof(back)) ||
		    memcmp(hello, back, sizeof(hello)))
			die("hello");
		clock_gettime(CLOCK_MONOTONIC, &t1);
		ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
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

int main(int argc, char **argv)
{
	int i = 2;

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
			conns = (unsigned)atoi(v);
		else if (strcmp(argv[i], "--idle-s") == 0)
			idle_s = (unsigned)atoi(v);
		else if (strcmp(argv[i], "--delay-ms") == 0 && !is_server)
			delay_ms = (unsigned)atoi(v);
		else
			usage();
		i++;
	}
	if (conns < 1 || conns > MAX_CONNS)
		usage();
	if (is_server)
		run_server();
	else
		run_client();
	return 0;
}
