/* SPDX-License-Identifier: MIT */
/*
 * fs_scale: many concurrent connections through one server process (issue
 * 14's measure: how many streams one process offloads, and what an idle
 * connection costs in memory on each end).
 *
 *   fs_scale server
 *       One epoll loop (level-triggered, nonblocking) on 127.0.0.1, an
 *       ephemeral port: prints "listening port=P", echoes every byte of every
 *       connection, and on SIGTERM prints "accepted=A closed=C" and leaves by
 *       exit(0) (so a preloaded library's exit handlers run).
 *   fs_scale client PORT N SIZE GOFILE
 *       Opens N connections one after another; on each, writes SIZE bytes of
 *       a pattern keyed by the connection's index and reads the echo back,
 *       checking every byte. After the first N/10 (N >= 100) it
 *       prints "part M rss_kib=R" and waits until GOFILE.part exists (so a
 *       caller can read the server's memory there too: what a connection
 *       costs is the slope between the two points, what is left is the
 *       process's fixed overhead). All N stay open; it prints
 *       "held N setup_ms=T rss_before_kib=R0 rss_held_kib=R1" and waits until
 *       GOFILE exists (at most 300 s), then closes them all and prints
 *       "PASS client N" (or FAIL lines; exit 1).
 *   fs_scale paced PORT[,PORT...] N ROUNDS GAP_US [GOFILE]
 *       First one warm-up connection and echo to every server (untimed:
 *       the rails of both ends open, 200-350 ms under ASan); with GOFILE,
 *       prints "warm" and waits until GOFILE exists. Then opens N
 *       connections (as the client does) and ROUNDS times: on each
 *       connection in turn one 64-byte request and its echo, checked; then
 *       GAP_US of sleep. A process that waits on its peers more than it
 *       computes, like the hundreds of PostgreSQL backends pgbench drives:
 *       the doorbell carries every wake-up. Before the rounds, one echo per
 *       connection (round 0: it also finishes the handshake), checked and
 *       held to the same bounds, its longest time printed apart. Prints
 *       "paced rounds=R conns=N max_rtt_ms=X slow=S lost=L first_ms=F"
 *       (S: round trips over SC_SLOW_MS; L: over SC_LOST_MS, which a lost
 *       ring shows as: an armed sleeper's safety slice is 250 ms, and each
 *       such round trip is printed; F: the longest first echo) and "PASS
 *       paced" (or FAIL lines; exit 1).
 *   fs_scale paced PORT[,PORT...] N ROUNDS GAP_US GOFILE THREADS
 *       The same with THREADS threads after the warm-up, each with N
 *       connections of its own, each waiting for every echo in poll()
 *       before it reads (pgbench -j's shape: several threads of one process
 *       in poll at once, each on its own connections; each round starts
 *       in every thread at once, at a barrier). The counts and the
 *       line are summed over the threads; "paced" lines as above.
 * Plain blocking calls in the client, epoll in the server: the same program
 * runs under kernel TCP and under the preload.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define SC_MAX_CONNS 65536
#define SC_MAX_PORTS 1024
#define SC_MAX_SIZE (1u << 20)
#define SC_GO_WAIT_SEC 300

static volatile sig_atomic_t sc_stop;

static void sc_on_term(int sig)
{
	(void)sig;
	sc_stop = 1;
}

static long sc_rss_kib(void)
{
	return harness_status_kib("VmRSS");
}

static int sc_server(void)
{
	static char buf[65536];
	struct epoll_event ev, events[256];
	long accepted = 0, closed = 0;
	int lfd, ep;

	harness_set_handler(SIGTERM, sc_on_term, 0);
	harness_set_handler(SIGINT, sc_on_term, 0);
	lfd = harness_listen(AF_INET, "127.0.0.1", "0", SOCK_NONBLOCK, 4096);
	if (lfd < 0)
		return 1;
	ep = epoll_create1(0);
	if (ep < 0)
		return perror("epoll_create1"), 1;
	ev.events = EPOLLIN;
	ev.data.fd = lfd;
	if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev))
		return perror("epoll_ctl"), 1;
	printf("listening port=%u\n", harness_local_port(lfd));
	fflush(stdout);
	while (!sc_stop) {
		int n = epoll_wait(ep, events, 256, 200);

		for (int i = 0; i < n; i++) {
			int fd = events[i].data.fd;

			if (fd == lfd) {
				int c;

				while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
					ev.events = EPOLLIN;
					ev.data.fd = c;
					if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev)) {
						perror("epoll_ctl add");
						close(c);
						continue;
					}
					accepted++;
				}
				continue;
			}
			for (;;) {
				ssize_t r = recv(fd, buf, sizeof(buf), 0);

				if (r > 0) {
					/* echo it all (a blocking wait for room is fine:
					 * the client reads its echo before writing more) */
					int flags = fcntl(fd, F_GETFL);

					fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
					if (harness_write_full(fd, buf, (size_t)r, NULL) < 0)
						r = -1;
					fcntl(fd, F_SETFL, flags);
					if (r > 0)
						continue;
				}
				if (r < 0 && (errno == EAGAIN || errno == EINTR))
					break;
				epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
				close(fd);
				closed++;
				break;
			}
		}
	}
	printf("accepted=%ld closed=%ld\n", accepted, closed);
	fflush(stdout);
	exit(0);
}

/* The loopback address of each port, for connect (PORTS[I] -> TARGETS[I]). */
static int sc_targets(const int *ports, unsigned nports, struct addrinfo **targets)
{
	for (unsigned i = 0; i < nports; i++) {
		char text[16];

		snprintf(text, sizeof(text), "%d", ports[i]);
		targets[i] = harness_resolve("127.0.0.1", text, AF_INET);
		if (!targets[i])
			return -1;
	}
	return 0;
}

/* Waits until PATH exists (at most SC_GO_WAIT_SEC). */
static int sc_wait_file(const char *path)
{
	for (int waited = 0; access(path, F_OK) != 0; waited++) {
		if (waited > SC_GO_WAIT_SEC * 20) {
			printf("FAIL nobody said go (%s) in %d s\n", path, SC_GO_WAIT_SEC);
			return -1;
		}
		usleep(50000);
	}
	return 0;
}

/* Connection I goes to PORTS[I % NPORTS]: with several servers, one client
 * process has as many peer processes. */
static int sc_client(const int *ports, unsigned nports, unsigned n, size_t size, const char *gofile)
{
	static struct addrinfo *targets[SC_MAX_PORTS];
	char partfile[4096];
	uint8_t *out = malloc(size), *in = malloc(size);
	int *fds = calloc(n, sizeof(*fds));
	long rss_before, rss_held;
	unsigned fails = 0;
	double t0, setup, paused = 0;

	if (!out || !in || !fds)
		return fprintf(stderr, "out of memory\n"), 1;
	if (sc_targets(ports, nports, targets) < 0)
		return 1;
	rss_before = sc_rss_kib();
	t0 = harness_now_ms();
	for (unsigned i = 0; i < n; i++) {
		int result;

		fds[i] = harness_connect(targets[i % nports], 0);
		if (fds[i] < 0) {
			printf("FAIL connection %u: not connected\n", i);
			return 1;
		}
		harness_pattern_fill(i, 0, out, size);
		result = harness_write_full(fds[i], out, size, NULL);
		if (result == 0)
			result = harness_read_full(fds[i], in, size, NULL);
		if (result < 0) {
			printf("FAIL connection %u: echo: %s\n", i, result == -ENODATA ? "EOF" : strerror(-result));
			return 1;
		}
		if (harness_pattern_mismatch(i, 0, in, size) != size && fails++ < 5)
			printf("FAIL connection %u: the echo differs\n", i);
		if (n >= 100 && i + 1 == n / 10) {
			printf("part %u rss_kib=%ld\n", i + 1, sc_rss_kib());
			fflush(stdout);
			snprintf(partfile, sizeof(partfile), "%s.part", gofile);
			paused = harness_now_ms();
			if (sc_wait_file(partfile))
				return 1;
			paused = harness_now_ms() - paused;
		}
	}
	setup = harness_now_ms() - t0 - paused;
	rss_held = sc_rss_kib();
	printf("held %u setup_ms=%.0f rss_before_kib=%ld rss_held_kib=%ld\n", n, setup, rss_before, rss_held);
	fflush(stdout);
	if (sc_wait_file(gofile))
		return 1;
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
	if (fails)
		return 1;
	printf("PASS client %u\n", n);
	return 0;
}

#define SC_PACED_SIZE 64
#define SC_SLOW_MS 100.0
/* A round trip this long is a lost doorbell ring: the sleeper it missed
 * wakes at the end of its safety slice (FS_BELL_SLICE_MS, 250 ms, counted
 * from when it went to sleep, just after its request or its last answer);
 * a scheduling hiccup on a loaded machine stays well under it. */
#define SC_LOST_MS 200.0

/* One 64-byte request KEY on FD and its echo, checked: the round trip in
 * ms, or -1 (a FAIL line printed). With POLL_FIRST the echo is waited for
 * in poll() before it is read (the threaded shape). */
static double sc_echo(int fd, uint64_t key, const char *what, bool poll_first)
{
	uint8_t out[SC_PACED_SIZE], in[SC_PACED_SIZE];
	double t0 = harness_now_ms(), rtt;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int result, r;

	harness_pattern_fill(key, 0, out, sizeof(out));
	result = harness_write_full(fd, out, sizeof(out), NULL);
	if (result == 0 && poll_first) {
		do
			r = poll(&p, 1, 5000);
		while (r < 0 && errno == EINTR);
		if (r <= 0) {
			printf("FAIL %s: poll %s\n", what, r == 0 ? "timed out (5 s)" : strerror(errno));
			return -1;
		}
	}
	if (result == 0)
		result = harness_read_full(fd, in, sizeof(in), NULL);
	if (result < 0) {
		printf("FAIL %s: %s\n", what, result == -ENODATA ? "EOF" : strerror(-result));
		return -1;
	}
	rtt = harness_now_ms() - t0;
	if (harness_pattern_mismatch(key, 0, in, sizeof(in)) != sizeof(in)) {
		printf("FAIL %s: the echo differs\n", what);
		return -1;
	}
	return rtt;
}

struct sc_paced_thread {
	pthread_t tid;
	unsigned index, n, rounds, gap_us;
	bool poll_first;
	pthread_barrier_t *round_start; /* threaded: every round starts together */
	int *fds;
	double max_rtt, first_ms;
	unsigned slow, lost, fails;
};

/* The rounds of one thread (or of the process): round 0 is each
 * connection's first echo (it also finishes the handshake), timed apart
 * (first_ms) but held to the same bounds. */
static void *sc_paced_run(void *arg)
{
	struct sc_paced_thread *t = arg;
	char what[80];

	for (unsigned r = 0; r <= t->rounds; r++) {
		/* threaded: the threads send each round's first request at once,
		 * so their waits overlap by construction, not by the scheduler's
		 * chance (which a loaded machine took away: deep_beside=0); a
		 * thread that failed goes on meeting the others here */
		if (t->round_start)
			pthread_barrier_wait(t->round_start);
		else if (t->fails)
			break;
		for (unsigned i = 0; i < t->n && !t->fails; i++) {
			double rtt;

			snprintf(what, sizeof(what), "thread %u round %u connection %u", t->index, r, i);
			rtt = sc_echo(t->fds[i], (uint64_t)(t->index * t->n + i) << 32 | r, what, t->poll_first);
			if (rtt < 0) {
				t->fails++;
				break;
			}
			if (r == 0 && rtt > t->first_ms)
				t->first_ms = rtt;
			if (r > 0 && rtt > t->max_rtt)
				t->max_rtt = rtt;
			if (rtt > SC_SLOW_MS)
				t->slow++;
			if (rtt > SC_LOST_MS) {
				t->lost++;
				printf("lost? thread %u round %u connection %u: %.3f ms\n", t->index, r, i, rtt);
			}
		}
		usleep(t->gap_us);
	}
	return NULL;
}

#define SC_MAX_THREADS 16

static int sc_paced(const int *ports, unsigned nports, unsigned n, unsigned rounds, unsigned gap_us,
		    const char *gofile, unsigned threads)
{
	static struct addrinfo *targets[SC_MAX_PORTS];
	int *fds = calloc((size_t)n * threads, sizeof(*fds));
	int warm[SC_MAX_PORTS];
	double max_rtt = 0, first_ms = 0;
	unsigned slow = 0, lost = 0, fails = 0;
	char what[64];

	if (!fds)
		return perror("calloc"), 1;
	if (sc_targets(ports, nports, targets) < 0)
		return 1;
	/* Warm-up: one connection and one echo to every server, so that every
	 * process has opened its rail (libfabric's load and its shm region,
	 * 200-350 ms under ASan when nine start together) and knows its peers
	 * before anything is timed; with GOFILE, then "warm" and wait for it,
	 * so that no other client's warm-up stalls a server during the timed
	 * part. Kept open to the end. */
	for (unsigned p = 0; p < nports; p++) {
		warm[p] = harness_connect(targets[p], 0);
		snprintf(what, sizeof(what), "warm-up echo to server %u", p);
		if (warm[p] < 0 || sc_echo(warm[p], (uint64_t)0xffff << 32 | p, what, false) < 0) {
			printf("FAIL warm-up connection to server %u\n", p);
			return 1;
		}
	}
	if (gofile) {
		printf("warm\n");
		fflush(stdout);
		if (sc_wait_file(gofile))
			return 1;
	}
	{
		static struct sc_paced_thread th[SC_MAX_THREADS];
		static pthread_barrier_t round_start;

		if (threads > 1 && pthread_barrier_init(&round_start, NULL, threads)) {
			printf("FAIL pthread_barrier_init\n");
			return 1;
		}

		for (unsigned i = 0; i < n * threads; i++) {
			fds[i] = harness_connect(targets[i % nports], 0);
			if (fds[i] < 0) {
				printf("FAIL connect %u: not connected\n", i);
				return 1;
			}
		}
		for (unsigned k = 0; k < threads; k++) {
			th[k] = (struct sc_paced_thread){ .index = k, .n = n, .rounds = rounds, .gap_us = gap_us,
							  .poll_first = threads > 1, .fds = fds + (size_t)k * n,
							  .round_start = threads > 1 ? &round_start : NULL };
			if (threads > 1 && pthread_create(&th[k].tid, NULL, sc_paced_run, &th[k])) {
				printf("FAIL pthread_create\n");
				return 1;
			}
		}
		if (threads == 1)
			sc_paced_run(&th[0]);
		for (unsigned k = 0; k < threads; k++) {
			if (threads > 1)
				pthread_join(th[k].tid, NULL);
			fails += th[k].fails;
			slow += th[k].slow;
			lost += th[k].lost;
			if (th[k].max_rtt > max_rtt)
				max_rtt = th[k].max_rtt;
			if (th[k].first_ms > first_ms)
				first_ms = th[k].first_ms;
		}
		for (unsigned i = 0; i < n * threads; i++)
			close(fds[i]);
		n *= threads;
	}
	for (unsigned p = 0; p < nports; p++)
		close(warm[p]);
	free(fds);
	printf("paced rounds=%u conns=%u max_rtt_ms=%.3f slow=%u lost=%u first_ms=%.3f\n", rounds, n, max_rtt, slow,
	       lost, first_ms);
	if (fails)
		return 1;
	printf("PASS paced\n");
	return 0;
}

/* PORT[,PORT...] into PORTS; the count, or 0 when malformed. */
static unsigned sc_ports(char *p, int *ports)
{
	unsigned nports = 0;
	char *end;

	for (;;) {
		long port = strtol(p, &end, 10);

		if (end == p || port <= 0 || port > 65535 || nports == SC_MAX_PORTS)
			return 0;
		ports[nports++] = (int)port;
		if (*end != ',')
			break;
		p = end + 1;
	}
	return *end ? 0 : nports;
}

int main(int argc, char **argv)
{
	harness_set_name(argc > 1 ? argv[1] : "fs_scale");
	if (argc == 2 && strcmp(argv[1], "server") == 0)
		return sc_server();
	if (argc == 6 && strcmp(argv[1], "client") == 0) {
		static int ports[SC_MAX_PORTS];
		long n = atol(argv[3]), size = atol(argv[4]);
		unsigned nports = sc_ports(argv[2], ports);

		if (!nports || n <= 0 || n > SC_MAX_CONNS || size <= 0 || size > SC_MAX_SIZE) {
			fprintf(stderr, "fs_scale: bad PORT[,PORT...] (at most %d), N (1..%d) or SIZE (1..%u)\n",
				SC_MAX_PORTS, SC_MAX_CONNS, SC_MAX_SIZE);
			return 2;
		}
		return sc_client(ports, nports, (unsigned)n, (size_t)size, argv[5]);
	}
	if (argc >= 6 && argc <= 8 && strcmp(argv[1], "paced") == 0) {
		static int ports[SC_MAX_PORTS];
		long n = atol(argv[3]), rounds = atol(argv[4]), gap = atol(argv[5]), threads = argc == 8 ? atol(argv[7]) : 1;
		unsigned nports = sc_ports(argv[2], ports);

		if (!nports || n <= 0 || n > SC_MAX_CONNS || rounds <= 0 || rounds > 1000000 || gap < 0 || gap > 1000000 ||
		    threads < 1 || threads > SC_MAX_THREADS || n * threads > SC_MAX_CONNS) {
			fprintf(stderr, "fs_scale: bad PORT[,PORT...], N, ROUNDS (1..1000000), GAP_US (0..1000000) or "
					"THREADS (1..%d)\n", SC_MAX_THREADS);
			return 2;
		}
		return sc_paced(ports, nports, (unsigned)n, (unsigned)rounds, (unsigned)gap, argc >= 7 ? argv[6] : NULL,
				(unsigned)threads);
	}
	fprintf(stderr, "usage: fs_scale server | fs_scale client PORT[,PORT...] N SIZE GOFILE | "
			"fs_scale paced PORT[,PORT...] N ROUNDS GAP_US [GOFILE [THREADS]]\n");
	return 2;
}
