/* SPDX-License-Identifier: MIT */
/*
 * fabsock-netbench: the small client/server behind the rows of `fabsock bench`
 * that no packaged tool measures. It uses only plain blocking POSIX sockets
 * and threads, so it behaves the same with and without
 * LD_PRELOAD=libfabsock.so, and it never links fabsock itself.
 *
 *   fabsock-netbench server [--bind ADDR] [--port P] [--ready-file F]
 *   fabsock-netbench pingpong  HOST PORT [--size BYTES] [--seconds T]
 *   fabsock-netbench connect   HOST PORT [--count N]
 *   fabsock-netbench hold      HOST PORT [--conns K]
 *   fabsock-netbench slowwrite HOST PORT [--seconds T]
 *   fabsock-netbench threads   HOST PORT [--conns K] [--delay-us D] [--seconds T]
 *   fabsock-netbench download  HOST PORT [--size W] [--read-size R] [--bytes N] [--count K]
 *
 * Every client connection starts with an 8-byte request (operation, size;
 * network byte order) that tells the server's per-connection thread what to do:
 *   ECHO size: read `size` bytes, write them back, until EOF (ping-pong,
 *              connection setup, idle connections);
 *   RSS:       per byte received, answer the server's VmRSS in KiB (8 bytes);
 *   SINK size: answer the server's pid (4 bytes), then read at most `size`
 *              bytes every millisecond until EOF (a slow reader);
 *   SLOW delay: read 64 bytes, sleep `delay` microseconds (a server that
 *              computes its answer), write them back, until EOF;
 *   DOWNLOAD size: per 8-byte count N received (network byte order), write N
 *              bytes of a fixed pattern in writes of `size` bytes, until EOF
 *              (a file served by a program that writes in small pieces: a
 *              proxy's buffers, a database's rows).
 * `download` asks for K downloads of N bytes, one after another on one
 * connection, reads them R bytes at a time (curl reads 100 KiB, many clients
 * 16 KiB), checks every byte, and prints the rate over all and the median
 * download's time.
 * `threads` runs K client threads in one process, each with its own
 * connection (SLOW), each waiting for its answer in poll() before it reads
 * it: a multi-threaded client (pgbench -j, a worker pool) whose waits
 * outlast a spin. It prints round trips per second per thread and the
 * round-trip percentiles over all threads.
 * Each client prints one line of key=value pairs on stdout; the bench parses
 * it. Latencies are one-way: round trip / 2, like sockperf and fi_pingpong.
 * The server exits through exit() on SIGINT or SIGTERM, so a preloaded
 * library's exit handlers (FABSOCK_STATS) run.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fullio.h"

enum netbench_op { OP_ECHO = 1, OP_RSS = 2, OP_SINK = 3, OP_SLOW = 4, OP_DOWNLOAD = 5 };

#define REQUEST_SIZE 8
#define MAX_MESSAGE (64u << 20)
#define MAX_HOLD 4096
#define SINK_SLEEP_NS 1000000L /* the slow reader's pause between reads */
#define SINK_CHUNK 16384u      /* ... and its largest read: about 16 MB/s */
#define WRITE_BLOCK 65536u     /* slowwrite's write size */
#define SLOW_SIZE 64u          /* a SLOW connection's message */
#define MAX_DELAY_US 1000000u
#define MAX_THREADS 64
#define MAX_DOWNLOAD (1ull << 40)

static volatile sig_atomic_t stop_requested;

static void die(const char *what)
{
	fprintf(stderr, "fabsock-netbench: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now_sec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* VmRSS of a process in KiB, or -1. */
static long rss_kib(pid_t pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/status");
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static void encode_request(unsigned char *out, uint32_t op, uint32_t size)
{
	uint32_t words[2] = { htonl(op), htonl(size) };

	memcpy(out, words, sizeof(words));
}

/* ------------------------------------------------------------------------ */
/* Server: one thread per connection. */

static void serve_echo(int fd, uint32_t size)
{
	char *buf = malloc(size ? size : 1);

	if (!buf)
		return;
	while (fullio_read(fd, buf, size) == 0 && fullio_write(fd, buf, size) == 0)
		;
	free(buf);
}

static void serve_rss(int fd)
{
	char byte;

	while (fullio_read(fd, &byte, 1) == 0) {
		uint64_t kib = (uint64_t)rss_kib(0);

		if (fullio_write(fd, &kib, sizeof(kib)) < 0)
			break;
	}
}

static void serve_sink(int fd, uint32_t size)
{
	const struct timespec pause = { 0, SINK_SLEEP_NS };
	uint32_t pid = (uint32_t)getpid();
	char *buf;

	if (size == 0 || size > SINK_CHUNK)
		size = SINK_CHUNK;
	buf = malloc(size);
	if (!buf || fullio_write(fd, &pid, sizeof(pid)) < 0) {
		free(buf);
		return;
	}
	for (;;) {
		ssize_t n = recv(fd, buf, size, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		nanosleep(&pause, NULL);
	}
	free(buf);
}

static void serve_slow(int fd, uint32_t delay_us)
{
	const struct timespec pause = { 0, (long)delay_us * 1000L };
	char buf[SLOW_SIZE];

	while (fullio_read(fd, buf, sizeof(buf)) == 0) {
		if (delay_us)
			nanosleep(&pause, NULL);
		if (fullio_write(fd, buf, sizeof(buf)) < 0)
			break;
	}
}

/* The byte at offset O of every download written in pieces of W bytes:
 * PATTERN[O % W], the pattern never lining up with the pieces' starts. */
static void fill_pattern(unsigned char *buf, uint32_t w)
{
	for (uint32_t j = 0; j < w; j++)
		buf[j] = (unsigned char)(j * 7u + 1u + j / 251u);
}

static void serve_download(int fd, uint32_t w)
{
	unsigned char *buf = malloc(w), count[8];

	if (!buf)
		return;
	fill_pattern(buf, w);
	while (fullio_read(fd, count, sizeof(count)) == 0) {
		uint32_t words[2];
		uint64_t n;

		memcpy(words, count, sizeof(words));
		n = (uint64_t)ntohl(words[0]) << 32 | ntohl(words[1]);
		if (n > MAX_DOWNLOAD)
			break;
		for (uint64_t done = 0; done < n;) {
			uint32_t k = n - done < w ? (uint32_t)(n - done) : w;

			if (fullio_write(fd, buf, k) < 0)
				goto out;
			done += k;
		}
	}
out:
	free(buf);
}

static void *serve_connection(void *arg)
{
	int fd = (int)(intptr_t)arg;
	unsigned char request[REQUEST_SIZE];
	uint32_t words[2];

	if (fullio_read(fd, request, sizeof(request)) == 0) {
		memcpy(words, request, sizeof(words));
		uint32_t op = ntohl(words[0]), size = ntohl(words[1]);

		if (op == OP_ECHO && size <= MAX_MESSAGE)
			serve_echo(fd, size);
		else if (op == OP_RSS)
			serve_rss(fd);
		else if (op == OP_SINK)
			serve_sink(fd, size);
		else if (op == OP_SLOW && size < MAX_DELAY_US)
			serve_slow(fd, size);
		else if (op == OP_DOWNLOAD && size >= 1 && size <= MAX_MESSAGE)
			serve_download(fd, size);
	}
	close(fd);
	return NULL;
}

static void on_stop_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

static int run_server(const char *bind_addr, int port, const char *ready_file)
{
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	socklen_t len = sizeof(addr);
	struct sigaction sa = { .sa_handler = on_stop_signal };
	pthread_attr_t attr;
	int lfd, one = 1;

	/* No SA_RESTART: accept() returns EINTR and the loop sees the flag. */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (inet_pton(AF_INET, bind_addr, &addr.sin_addr) != 1) {
		fprintf(stderr, "fabsock-netbench: --bind %s is not an IPv4 address\n", bind_addr);
		return 2;
	}
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (lfd < 0)
		die("socket");
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
		die("bind");
	if (listen(lfd, 1024) < 0)
		die("listen");
	if (getsockname(lfd, (struct sockaddr *)&addr, &len) < 0)
		die("getsockname");
	if (ready_file) {
		FILE *f = fopen(ready_file, "w");

		if (!f)
			die(ready_file);
		fprintf(f, "%d\n", ntohs(addr.sin_port));
		fclose(f);
	}
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	while (!stop_requested) {
		int fd = accept(lfd, NULL, NULL);
		pthread_t thread;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			die("accept");
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (pthread_create(&thread, &attr, serve_connection, (void *)(intptr_t)fd) != 0) {
			close(fd);
			fprintf(stderr, "fabsock-netbench: pthread_create failed\n");
		}
	}
	close(lfd);
	exit(0);
}

/* ------------------------------------------------------------------------ */
/* Clients */

static const char *opt_host, *opt_port;

static int connect_to(void)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res, *ai;
	int fd = -1, one = 1, rc;

	rc = getaddrinfo(opt_host, opt_port, &hints, &res);
	if (rc != 0) {
		fprintf(stderr, "fabsock-netbench: %s:%s: %s\n", opt_host, opt_port, gai_strerror(rc));
		exit(1);
	}
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
		if (fd < 0)
			continue;
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		die("connect");
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static int compare_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Sorted samples: the value below which a fraction p of them lie. */
static double percentile(const double *sorted, size_t n, double p)
{
	size_t i = (size_t)(p * (double)(n - 1) + 0.5);

	return sorted[i < n ? i : n - 1];
}

static int run_pingpong(uint32_t size, double seconds)
{
	unsigned char request[REQUEST_SIZE];
	size_t n = 0, cap = 1 << 16, warmup = 100, i;
	double *rtt = malloc(cap * sizeof(*rtt)), start, t0, sum = 0;
	char *buf = malloc(size);
	int fd = connect_to();

	if (!rtt || !buf)
		die("malloc");
	memset(buf, 'x', size);
	encode_request(request, OP_ECHO, size);
	if (fullio_write(fd, request, sizeof(request)) < 0)
		die("send request");
	for (i = 0; i < warmup; i++)
		if (fullio_write(fd, buf, size) < 0 || fullio_read(fd, buf, size) < 0)
			die("warm-up round trip");
	start = now_sec();
	do {
		t0 = now_sec();
		if (fullio_write(fd, buf, size) < 0 || fullio_read(fd, buf, size) < 0)
			die("round trip");
		if (n == cap) {
			cap *= 2;
			rtt = realloc(rtt, cap * sizeof(*rtt));
			if (!rtt)
				die("realloc");
		}
		rtt[n] = (now_sec() - t0) * 1e6 / 2; /* one-way, usec */
		sum += rtt[n++];
	} while (now_sec() - start < seconds);
	close(fd);
	qsort(rtt, n, sizeof(*rtt), compare_double);
	printf("size=%u iterations=%zu avg_usec=%.3f p50_usec=%.3f p99_usec=%.3f\n", size, n,
	       sum / (double)n, percentile(rtt, n, 0.50), percentile(rtt, n, 0.99));
	free(rtt);
	free(buf);
	return 0;
}

struct thread_run {
	pthread_t thread;
	uint32_t delay_us;
	double seconds;
	double *rtt; /* usec */
	size_t n, cap;
};

static void *threads_one(void *arg)
{
	struct thread_run *r = arg;
	unsigned char request[REQUEST_SIZE];
	char buf[SLOW_SIZE];
	double start, t0;
	int fd = connect_to();

	memset(buf, 'y', sizeof(buf));
	encode_request(request, OP_SLOW, r->delay_us);
	if (fullio_write(fd, request, sizeof(request)) < 0)
		die("send request");
	start = now_sec();
	do {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		t0 = now_sec();
		if (fullio_write(fd, buf, sizeof(buf)) < 0)
			die("send");
		while (poll(&p, 1, -1) < 0)
			if (errno != EINTR)
				die("poll");
		if (fullio_read(fd, buf, sizeof(buf)) < 0)
			die("receive");
		if (r->n == r->cap) {
			r->cap = r->cap ? 2 * r->cap : 4096;
			r->rtt = realloc(r->rtt, r->cap * sizeof(*r->rtt));
			if (!r->rtt)
				die("realloc");
		}
		r->rtt[r->n++] = (now_sec() - t0) * 1e6;
	} while (now_sec() - start < r->seconds);
	close(fd);
	return NULL;
}

static int run_threads(unsigned conns, uint32_t delay_us, double seconds)
{
	struct thread_run runs[MAX_THREADS] = { 0 };
	double *all;
	size_t total = 0;

	for (unsigned i = 0; i < conns; i++) {
		runs[i].delay_us = delay_us;
		runs[i].seconds = seconds;
		if (pthread_create(&runs[i].thread, NULL, threads_one, &runs[i]) != 0)
			die("pthread_create");
	}
	for (unsigned i = 0; i < conns; i++) {
		pthread_join(runs[i].thread, NULL);
		total += runs[i].n;
	}
	all = malloc((total ? total : 1) * sizeof(*all));
	if (!all || !total)
		die("no round trips");
	total = 0;
	for (unsigned i = 0; i < conns; i++) {
		memcpy(all + total, runs[i].rtt, runs[i].n * sizeof(*all));
		total += runs[i].n;
		free(runs[i].rtt);
	}
	qsort(all, total, sizeof(*all), compare_double);
	printf("threads=%u delay_usec=%u round_trips=%zu per_thread_rps=%.1f p50_usec=%.1f p90_usec=%.1f "
	       "p99_usec=%.1f\n",
	       conns, delay_us, total, (double)total / conns / seconds, percentile(all, total, 0.50),
	       percentile(all, total, 0.90), percentile(all, total, 0.99));
	free(all);
	return 0;
}

/* One connection: connect, request + 1 byte, 1 byte back, close. The
 * byte differs from one connection to the next, and the echo must be it. */
static double one_connection(void)
{
	static unsigned seq;
	unsigned char msg[REQUEST_SIZE + 1], sent = (unsigned char)(seq++ * 131u + 7u);
	double t0 = now_sec();
	int fd = connect_to();

	encode_request(msg, OP_ECHO, 1);
	msg[REQUEST_SIZE] = sent;
	if (fullio_write(fd, msg, sizeof(msg)) < 0 || fullio_read(fd, msg, 1) < 0)
		die("connection round trip");
	if (msg[0] != sent) {
		fprintf(stderr, "fabsock-netbench: connection %u: echoed byte %#x, sent %#x\n", seq, msg[0], sent);
		exit(1);
	}
	close(fd);
	return (now_sec() - t0) * 1e6;
}

static int run_connect(unsigned count)
{
	double *usec = malloc(count * sizeof(*usec)), start, total, sum = 0;
	unsigned i;

	if (!usec || count == 0)
		die("malloc");
	/* Not timed: the first connections create the library's engine. */
	for (i = 0; i < 10; i++)
		one_connection();
	start = now_sec();
	for (i = 0; i < count; i++) {
		usec[i] = one_connection();
		sum += usec[i];
	}
	total = now_sec() - start;
	qsort(usec, count, sizeof(*usec), compare_double);
	printf("connections=%u seconds=%.3f per_sec=%.1f avg_usec=%.2f p50_usec=%.2f p99_usec=%.2f\n", count,
	       total, count / total, sum / count, percentile(usec, count, 0.50), percentile(usec, count, 0.99));
	free(usec);
	return 0;
}

static long query_server_rss(int control)
{
	uint64_t kib;
	char byte = 'r';

	if (fullio_write(control, &byte, 1) < 0 || fullio_read(control, &kib, sizeof(kib)) < 0)
		die("server RSS query");
	return (long)kib;
}

static int run_hold(unsigned conns)
{
	static int fds[MAX_HOLD];
	unsigned char msg[REQUEST_SIZE + 1];
	long before, client_one, server_one, client_all, server_all;
	const struct timespec settle = { 0, 300 * 1000000L };
	int control;
	unsigned i;

	if (conns == 0 || conns > MAX_HOLD) {
		fprintf(stderr, "fabsock-netbench: --conns must be 1..%d\n", MAX_HOLD);
		return 2;
	}
	before = rss_kib(0);
	control = connect_to();
	encode_request(msg, OP_RSS, 0);
	if (fullio_write(control, msg, REQUEST_SIZE) < 0)
		die("send request");
	server_one = query_server_rss(control);
	client_one = rss_kib(0);
	for (i = 0; i < conns; i++) {
		fds[i] = connect_to();
		encode_request(msg, OP_ECHO, 1);
		msg[REQUEST_SIZE] = 'h';
		if (fullio_write(fds[i], msg, sizeof(msg)) < 0 || fullio_read(fds[i], msg, 1) < 0)
			die("connection round trip");
	}
	nanosleep(&settle, NULL);
	server_all = query_server_rss(control);
	client_all = rss_kib(0);
	printf("conns=%u client_rss_before_kib=%ld client_rss_one_kib=%ld client_rss_all_kib=%ld "
	       "server_rss_one_kib=%ld server_rss_all_kib=%ld\n",
	       conns, before, client_one, client_all, server_one, server_all);
	for (i = 0; i < conns; i++)
		close(fds[i]);
	close(control);
	return 0;
}

static int run_slowwrite(double seconds)
{
	unsigned char request[REQUEST_SIZE];
	long peak[2][2] = { { 0, 0 }, { 0, 0 } }; /* [first/second half][client/server] */
	char *block = calloc(1, WRITE_BLOCK);
	double start, next_sample, t;
	unsigned long long bytes = 0;
	uint32_t server_pid;
	int fd = connect_to();

	if (!block)
		die("calloc");
	encode_request(request, OP_SINK, SINK_CHUNK);
	if (fullio_write(fd, request, sizeof(request)) < 0 || fullio_read(fd, &server_pid, sizeof(server_pid)) < 0)
		die("sink request");
	start = now_sec();
	next_sample = start;
	while ((t = now_sec()) - start < seconds) {
		if (t >= next_sample) {
			int half = (t - start) >= seconds / 2;
			long c = rss_kib(0), s = rss_kib((pid_t)server_pid);

			if (c > peak[half][0])
				peak[half][0] = c;
			if (s > peak[half][1])
				peak[half][1] = s;
			next_sample = t + 0.1;
		}
		if (fullio_write(fd, block, WRITE_BLOCK) < 0)
			die("send");
		bytes += WRITE_BLOCK;
	}
	close(fd);
	printf("seconds=%.1f bytes=%llu client_peak1_kib=%ld client_peak2_kib=%ld server_peak1_kib=%ld "
	       "server_peak2_kib=%ld\n",
	       seconds, bytes, peak[0][0], peak[1][0], peak[0][1], peak[1][1]);
	free(block);
	return 0;
}

/* K downloads of N bytes written in pieces of W, read R bytes at a time,
 * every byte checked against the pattern. */
static int run_download(uint32_t w, uint32_t r, uint64_t n, unsigned k)
{
	unsigned char request[REQUEST_SIZE], *pattern = malloc(w), *buf = malloc(r);
	double *ms = malloc(k * sizeof(*ms)), start, total;
	int fd = connect_to();

	if (!pattern || !buf || !ms)
		die("malloc");
	fill_pattern(pattern, w);
	encode_request(request, OP_DOWNLOAD, w);
	if (fullio_write(fd, request, sizeof(request)) < 0)
		die("send request");
	start = now_sec();
	for (unsigned i = 0; i < k; i++) {
		uint32_t words[2] = { htonl((uint32_t)(n >> 32)), htonl((uint32_t)n) };
		double t0 = now_sec();
		uint64_t got = 0;

		if (fullio_write(fd, words, sizeof(words)) < 0)
			die("send count");
		while (got < n) {
			size_t want = n - got < r ? (size_t)(n - got) : r;
			ssize_t m = read(fd, buf, want);

			if (m < 0 && errno == EINTR)
				continue;
			if (m <= 0) {
				fprintf(stderr, "fabsock-netbench: download %u: %s after %llu of %llu bytes\n", i,
					m ? strerror(errno) : "EOF", (unsigned long long)got, (unsigned long long)n);
				exit(1);
			}
			for (size_t off = 0; off < (size_t)m;) {
				size_t at = (size_t)((got + off) % w), piece = w - at < (size_t)m - off ? w - at : (size_t)m - off;

				if (memcmp(buf + off, pattern + at, piece) != 0) {
					fprintf(stderr, "fabsock-netbench: download %u: bytes differ near offset %llu\n", i,
						(unsigned long long)(got + off));
					exit(1);
				}
				off += piece;
			}
			got += (uint64_t)m;
		}
		ms[i] = (now_sec() - t0) * 1e3;
	}
	total = now_sec() - start;
	close(fd);
	qsort(ms, k, sizeof(*ms), compare_double);
	printf("write_size=%u read_size=%u bytes=%llu downloads=%u mb_per_sec=%.1f p50_ms=%.3f min_ms=%.3f\n", w, r,
	       (unsigned long long)n, k, (double)n * k / total / 1e6, percentile(ms, k, 0.50), ms[0]);
	free(ms);
	free(buf);
	free(pattern);
	return 0;
}

/* ------------------------------------------------------------------------ */

static void usage(void)
{
	fprintf(stderr, "usage: fabsock-netbench server [--bind ADDR] [--port P] [--ready-file F]\n"
			"       fabsock-netbench pingpong  HOST PORT [--size BYTES] [--seconds T]\n"
			"       fabsock-netbench connect   HOST PORT [--count N]\n"
			"       fabsock-netbench hold      HOST PORT [--conns K]\n"
			"       fabsock-netbench slowwrite HOST PORT [--seconds T]\n"
			"       fabsock-netbench threads   HOST PORT [--conns K] [--delay-us D] [--seconds T]\n"
			"       fabsock-netbench download  HOST PORT [--size W] [--read-size R] [--bytes N] [--count K]\n");
	exit(2);
}

static unsigned long parse_number(const char *name, const char *text, unsigned long max)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(text, &end, 10);
	if (errno || end == text || *end || v > max) {
		fprintf(stderr, "fabsock-netbench: %s '%s' is not a number up to %lu\n", name, text, max);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	const char *cmd, *bind_addr = "127.0.0.1", *ready_file = NULL;
	unsigned long size = 64, count = 1000, conns = 64, port = 0, delay_us = 150, read_size = 102400;
	unsigned long long bytes = 4ull << 20;
	double seconds = 2;
	int i = 2;

	if (argc < 2)
		usage();
	cmd = argv[1];
	if (strcmp(cmd, "server") != 0) {
		if (argc < 4)
			usage();
		opt_host = argv[2];
		opt_port = argv[3];
		i = 4;
	}
	for (; i < argc; i += 2) {
		const char *name = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			usage();
		if (strcmp(name, "--bind") == 0)
			bind_addr = v;
		else if (strcmp(name, "--port") == 0)
			port = parse_number(name, v, 65535);
		else if (strcmp(name, "--ready-file") == 0)
			ready_file = v;
		else if (strcmp(name, "--size") == 0)
			size = parse_number(name, v, MAX_MESSAGE);
		else if (strcmp(name, "--read-size") == 0)
			read_size = parse_number(name, v, MAX_MESSAGE);
		else if (strcmp(name, "--bytes") == 0)
			bytes = parse_number(name, v, (unsigned long)MAX_DOWNLOAD);
		else if (strcmp(name, "--count") == 0)
			count = parse_number(name, v, 10000000);
		else if (strcmp(name, "--conns") == 0)
			conns = parse_number(name, v, MAX_HOLD);
		else if (strcmp(name, "--delay-us") == 0)
			delay_us = parse_number(name, v, MAX_DELAY_US - 1);
		else if (strcmp(name, "--seconds") == 0) {
			char *end;

			seconds = strtod(v, &end);
			if (*end || !(seconds > 0 && seconds <= 3600)) {
				fprintf(stderr, "fabsock-netbench: --seconds '%s' is not in (0, 3600]\n", v);
				return 2;
			}
		} else
			usage();
	}
	if (strcmp(cmd, "server") == 0)
		return run_server(bind_addr, (int)port, ready_file);
	if (strcmp(cmd, "pingpong") == 0)
		return run_pingpong(size ? (uint32_t)size : 1, seconds);
	if (strcmp(cmd, "connect") == 0)
		return run_connect((unsigned)count);
	if (strcmp(cmd, "hold") == 0)
		return run_hold((unsigned)conns);
	if (strcmp(cmd, "slowwrite") == 0)
		return run_slowwrite(seconds);
	if (strcmp(cmd, "download") == 0) {
		/* --size is the server's write size here (64 unless given) and
		 * --count the number of downloads (1000 unless given) */
		if (size < 1 || read_size < 1 || bytes < 1 || count < 1 || count > 100000) {
			fprintf(stderr, "fabsock-netbench: download takes --size, --read-size, --bytes >= 1 and "
					"--count 1..100000\n");
			return 2;
		}
		return run_download((uint32_t)size, (uint32_t)read_size, bytes, (unsigned)count);
	}
	if (strcmp(cmd, "threads") == 0) {
		if (conns < 1 || conns > MAX_THREADS) {
			fprintf(stderr, "fabsock-netbench: threads takes --conns 1..%d\n", MAX_THREADS);
			return 2;
		}
		return run_threads((unsigned)conns, (uint32_t)delay_us, seconds);
	}
	usage();
	return 2;
}
