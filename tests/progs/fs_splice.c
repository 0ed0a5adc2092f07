/* SPDX-License-Identifier: MIT */
/*
 * fs_splice: splice() between a socket and a pipe (issue 26, "calls fabsock
 * does not see"), with the same expectations with and without the preload.
 * The client sends SPLICE_BYTES through splice(pipe -> socket) and shuts
 * its writing side down (splice is each side's first call: the
 * handshake settles inside it); the server takes them through splice(socket ->
 * pipe) until splice returns 0 (the EOF), then answers SPLICE_BYTES the same
 * way back and shuts down; the client takes them through splice(socket ->
 * pipe) to its EOF. A thread at each pipe's far end feeds it with write()
 * or drains it with read(), checking every byte against the test pattern
 * of a key the client draws at random (getrandom) and splices first: byte
 * exact, so no lost, repeated or reordered byte goes unseen (stronger than
 * a digest of the whole). The splicing side also checks the pipe's own end:
 * splice from the pipe returns 0 once its feeder closed it. Scenarios
 * (`fs_splice list`):
 *   blocking_page       blocking socket and pipe, the pipe at its least
 *                       (F_SETPIPE_SZ 1: one page), so every call moves at
 *                       most a page and the pipe is full all the time
 *   blocking_mib        the same with a 1 MiB pipe
 *   nonblock_page       O_NONBLOCK socket, SPLICE_F_NONBLOCK|SPLICE_F_MORE
 *                       on every call (the pipe's end itself stays
 *                       blocking: only the flag makes it nonblocking), a
 *                       poll loop on EAGAIN; at least one EAGAIN must be
 *                       seen on each side
 *   nonblock_mib        the same with a 1 MiB pipe, O_NONBLOCK on the pipe
 *                       end too
 *   onethread           one thread splices from the socket into a blocking
 *                       pipe (default size) and reads the pipe itself,
 *                       leaving 100 bytes in it each time: the splice must
 *                       move what fits and never wait for its own reader
 *   reset               the server resets the connection (SO_LINGER 0) with
 *                       the client's splice(socket -> pipe) waiting: it
 *                       returns ECONNRESET; then splice(pipe -> socket)
 *                       returns EPIPE and raises SIGPIPE
 *   misuse              on a connection that carried bytes (offloaded under
 *                       the preload): the kernel's errno for each misuse
 *                       (socket to socket EINVAL, an offset on the pipe's
 *                       side ESPIPE and on the socket's EINVAL, a pipe end
 *                       of the wrong direction EBADF, bad flags EINVAL, a
 *                       regular file for the pipe EINVAL, length 0 is 0),
 *                       and no byte of the stream lost to any of them
 * Output as the harness's (harness.h), plus `info <name>: eagain=N` lines.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define SPLICE_BYTES (8u << 20)
#define SPLICE_IO (64u << 10) /* the pipe workers' read and write size */

static bool opt_nonblock;   /* O_NONBLOCK socket, SPLICE_F_NONBLOCK */
static bool opt_pipe_nb;    /* O_NONBLOCK on the spliced pipe end too */
static int opt_pipe_size;   /* F_SETPIPE_SZ */
static uint64_t stream_key; /* the client's upload; the server answers with key + 1 */

/* ---- the pipe's far end ------------------------------------------------- */

struct pipe_job {
	int fd;
	bool feed;      /* write KEY's pattern into FD, else read and check it */
	bool key_first; /* KEY itself (8 bytes) goes first: a reader learns it */
	uint64_t key;
	size_t length;  /* what a feeder writes (besides the key) */
	size_t moved;   /* pattern bytes moved */
	size_t key_got;
	int failed;
};

/* A reader's first bytes when the key comes first: they complete it. */
static size_t take_key(struct pipe_job *job, const unsigned char *buf, size_t n)
{
	size_t k = sizeof(job->key) - job->key_got;

	if (!job->key_first || !k)
		return 0;
	if (k > n)
		k = n;
	memcpy((unsigned char *)&job->key + job->key_got, buf, k);
	job->key_got += k;
	return k;
}

static void *pipe_worker(void *arg)
{
	struct pipe_job *job = arg;
	static __thread unsigned char buf[SPLICE_IO];

	if (job->feed && job->key_first) {
		memcpy(buf, &job->key, sizeof(job->key));
		if (write(job->fd, buf, sizeof(job->key)) != (ssize_t)sizeof(job->key)) {
			harness_fail("pipe write: %s", strerror(errno));
			job->failed = 1;
		}
	}
	while (!job->failed) {
		size_t want = SPLICE_IO, skip = 0;
		ssize_t n;

		if (job->feed) {
			if (job->moved == job->length)
				break;
			if (want > job->length - job->moved)
				want = job->length - job->moved;
			harness_pattern_fill(job->key, job->moved, buf, want);
			n = write(job->fd, buf, want);
		} else {
			n = read(job->fd, buf, want);
			if (n > 0)
				skip = take_key(job, buf, (size_t)n);
			if (n > 0 && harness_pattern_check(job->key, job->moved, buf + skip, (size_t)n - skip,
							   "spliced bytes") < 0) {
				job->failed = 1;
				break;
			}
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			harness_fail("pipe %s: %s", job->feed ? "write" : "read", strerror(errno));
			job->failed = 1;
			break;
		}
		if (n == 0)
			break; /* the reader's end of file */
		job->moved += (size_t)n - skip;
	}
	close(job->fd);
	return NULL;
}

/* A pipe, sized, with a worker on the end that is not spliced. SPLICE_END
 * gets the other end (made nonblocking with opt_pipe_nb). */
static int pipe_start(struct pipe_job *job, pthread_t *thread, bool feed, bool key_first, uint64_t key,
		      size_t length, int *splice_end)
{
	int p[2];

	if (pipe(p) < 0)
		return harness_fail("pipe: %s", strerror(errno));
	if (fcntl(p[1], F_SETPIPE_SZ, opt_pipe_size) < 0)
		return harness_fail("F_SETPIPE_SZ %d: %s", opt_pipe_size, strerror(errno));
	*job = (struct pipe_job){
		.fd = feed ? p[1] : p[0], .feed = feed, .key_first = key_first, .key = key, .length = length,
	};
	*splice_end = feed ? p[0] : p[1];
	if (opt_pipe_nb && fcntl(*splice_end, F_SETFL, O_NONBLOCK) < 0)
		return harness_fail("O_NONBLOCK on the pipe: %s", strerror(errno));
	if (pthread_create(thread, NULL, pipe_worker, job)) {
		close(p[0]);
		close(p[1]);
		return harness_fail("pthread_create failed");
	}
	return 0;
}

/* ---- the spliced side --------------------------------------------------- */

/* After EAGAIN: waits for the pipe end (EVENTS) and then the socket
 * (SOCK_EVENTS), each bounded. */
static int wait_both(int pipe_end, short events, int sock, short sock_events)
{
	if (harness_wait_fd(pipe_end, events, HARNESS_PEER_WAIT_MS) < 0 ||
	    harness_wait_fd(sock, sock_events, HARNESS_PEER_WAIT_MS) < 0)
		return -1;
	return 0;
}

static unsigned splice_flags(void)
{
	return opt_nonblock ? SPLICE_F_NONBLOCK | SPLICE_F_MORE : SPLICE_F_MOVE;
}

/* What one direction's splice calls did. */
struct splice_run {
	size_t moved;
	unsigned long calls, eagain;
};

/* splice() between the pipe end PIPE_END and the socket FD, pipe -> socket
 * with TO_SOCKET (else socket -> pipe), until it returns 0: the pipe empty
 * and its feeder gone, or the peer's EOF. More than LENGTH bytes, an error,
 * or EAGAIN still after 4 peer waits in all fail; after EAGAIN (nonblocking
 * only) it waits for both ends. */
static int splice_until_end(int pipe_end, int fd, bool to_socket, size_t length, struct splice_run *run)
{
	const char *what = to_socket ? "splice(pipe -> socket)" : "splice(socket -> pipe)";
	double deadline = harness_now_ms() + 4 * HARNESS_PEER_WAIT_MS;
	int ret = 0;

	while (ret == 0) {
		ssize_t n = to_socket ? splice(pipe_end, NULL, fd, NULL, SPLICE_BYTES, splice_flags())
				      : splice(fd, NULL, pipe_end, NULL, 1u << 20, splice_flags());

		run->calls++;
		if (n > 0) {
			run->moved += (size_t)n;
			if (run->moved > length)
				ret = harness_fail("%s moved %zu bytes, %zu were %s", what, run->moved, length,
						   to_socket ? "in the pipe" : "sent");
		} else if (n == 0) {
			break;
		} else if (errno == EAGAIN && opt_nonblock) {
			run->eagain++;
			if (harness_now_ms() > deadline)
				ret = harness_fail("%s: no progress at %zu of %zu bytes", what, run->moved, length);
			else if (wait_both(pipe_end, to_socket ? POLLIN : POLLOUT, fd, to_socket ? POLLOUT : POLLIN) < 0)
				ret = -1;
		} else if (errno != EINTR) {
			ret = harness_fail("%s at %zu of %zu bytes: %s", what, run->moved, length, strerror(errno));
		}
	}
	return ret;
}

/* LENGTH bytes of KEY's pattern through splice(pipe -> FD), after KEY
 * itself with KEY_FIRST. */
static int splice_send(int fd, bool key_first, uint64_t key, size_t length)
{
	struct pipe_job job;
	struct splice_run run = { 0 };
	pthread_t thread;
	int in, ret;

	if (pipe_start(&job, &thread, true, key_first, key, length, &in) < 0)
		return -1;
	length += key_first ? sizeof(key) : 0;
	ret = splice_until_end(in, fd, true, length, &run);
	close(in); /* (first: a feeder a failed splice left blocked gets EPIPE) */
	pthread_join(thread, NULL);
	if (ret == 0 && run.moved != length)
		ret = harness_fail("splice(pipe -> socket) returned 0 after %zu of %zu bytes", run.moved, length);
	if (job.failed)
		ret = -1;
	harness_info("sent %zu bytes in %lu splice calls, eagain=%lu", run.moved, run.calls, run.eagain);
	if (ret == 0 && opt_nonblock && opt_pipe_size <= 4096 && !run.eagain)
		ret = harness_fail("a nonblocking splice onto the socket through a one-page pipe never saw EAGAIN");
	return ret;
}

/* splice(FD -> pipe) until it returns 0; the bytes must be LENGTH of
 * KEY's pattern, after KEY itself with KEY_FIRST (*KEY is then learnt). */
static int splice_recv(int fd, bool key_first, uint64_t *key, size_t length)
{
	struct pipe_job job;
	struct splice_run run = { 0 };
	pthread_t thread;
	int out, ret;

	if (pipe_start(&job, &thread, false, key_first, *key, 0, &out) < 0)
		return -1;
	length += key_first ? sizeof(*key) : 0;
	ret = splice_until_end(out, fd, false, length, &run);
	close(out);
	pthread_join(thread, NULL);
	if (ret == 0 && run.moved != length)
		ret = harness_fail("splice(socket -> pipe) returned 0 (EOF) after %zu of %zu bytes", run.moved, length);
	if (ret == 0 && job.moved + job.key_got != run.moved)
		ret = harness_fail("the pipe's reader got %zu bytes, splice said %zu", job.moved + job.key_got, run.moved);
	*key = job.key;
	if (job.failed)
		ret = -1;
	harness_info("received %zu bytes in %lu splice calls, eagain=%lu", run.moved, run.calls, run.eagain);
	if (ret == 0 && opt_nonblock && !run.eagain)
		ret = harness_fail("a nonblocking splice from the socket never saw EAGAIN");
	return ret;
}

static int set_socket_nonblock(int fd)
{
	if (opt_nonblock && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0)
		return harness_fail("O_NONBLOCK: %s", strerror(errno));
	return 0;
}

/* Splice is each side's first call on the connection: the key comes
 * through it, first in the upload, so a connection still negotiating
 * settles inside splice. */
static int transfer_server(int fd)
{
	uint64_t key = 0;

	if (set_socket_nonblock(fd) < 0 || splice_recv(fd, true, &key, SPLICE_BYTES) < 0 ||
	    splice_send(fd, false, key + 1, SPLICE_BYTES) < 0)
		return -1;
	if (shutdown(fd, SHUT_WR) < 0)
		return harness_fail("shutdown: %s", strerror(errno));
	return 0;
}

static int transfer_client(int fd)
{
	uint64_t key;

	if (getrandom(&stream_key, sizeof(stream_key), 0) != sizeof(stream_key))
		return harness_fail("getrandom: %s", strerror(errno));
	harness_info("key %#llx", (unsigned long long)stream_key);
	if (set_socket_nonblock(fd) < 0 || splice_send(fd, true, stream_key, SPLICE_BYTES) < 0)
		return -1;
	if (shutdown(fd, SHUT_WR) < 0)
		return harness_fail("shutdown: %s", strerror(errno));
	key = stream_key + 1;
	return splice_recv(fd, false, &key, SPLICE_BYTES);
}

/* One thread splices from the socket into a blocking pipe and reads the
 * pipe itself, leaving part of a page in it each time: the pipe's buffers
 * then take less than its size less what it holds, and a splice that
 * waited for room it had counted on would wait for its own thread. */
static int onethread_server(int fd)
{
	if (harness_send_pattern(fd, 91, 0, 1u << 20) < 0)
		return -1;
	if (shutdown(fd, SHUT_WR) < 0)
		return harness_fail("shutdown: %s", strerror(errno));
	return harness_expect_eof(fd);
}

static int onethread_client(int fd)
{
	static unsigned char buf[1u << 16];
	size_t total = 0, in_pipe = 0;
	unsigned long calls = 0;
	int p[2];

	if (pipe(p) < 0)
		return harness_fail("pipe: %s", strerror(errno));
	for (;;) {
		ssize_t n = splice(fd, NULL, p[1], NULL, 1u << 20, 0), r;
		size_t take;

		calls++;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return harness_fail("splice(socket -> pipe) at %zu bytes: %s", total, strerror(errno));
		in_pipe += (size_t)n;
		/* read all but 100 bytes (all at the end), in pieces that split pages */
		take = n == 0 ? in_pipe : in_pipe > 100 ? in_pipe - 100 : 0;
		while (take) {
			r = read(p[0], buf, take < 3000 ? take : 3000);
			if (r <= 0)
				return harness_fail("pipe read: %s", r < 0 ? strerror(errno) : "EOF");
			if (harness_pattern_check(91, total, buf, (size_t)r, "spliced bytes") < 0)
				return -1;
			total += (size_t)r;
			in_pipe -= (size_t)r;
			take -= (size_t)r;
		}
		if (n == 0)
			break;
	}
	close(p[0]);
	close(p[1]);
	harness_info("received %zu bytes in %lu splice calls", total, calls);
	if (total != 1u << 20)
		return harness_fail("splice's EOF after %zu of %u bytes", total, 1u << 20);
	return 0;
}

/* ---- errors --------------------------------------------------------------- */

static int reset_server(int fd)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };

	if (harness_expect_byte(fd, 'r') < 0 || harness_send_byte(fd, 'R') < 0)
		return -1;
	harness_sleep_ms(300); /* the client waits in splice by now */
	if (setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) < 0)
		return harness_fail("SO_LINGER: %s", strerror(errno));
	close(fd);
	return 0;
}

static int reset_client(int fd)
{
	int p[2];
	ssize_t n;

	if (harness_send_byte(fd, 'r') < 0 || harness_expect_byte(fd, 'R') < 0)
		return -1;
	if (pipe(p) < 0)
		return harness_fail("pipe: %s", strerror(errno));
	n = splice(fd, NULL, p[1], NULL, 4096, 0);
	if (n != -1 || errno != ECONNRESET)
		harness_fail("splice(socket -> pipe) after the peer's reset: %zd (%s), expected ECONNRESET", n,
			     n < 0 ? strerror(errno) : "no error");
	if (write(p[1], "after", 5) != 5)
		return harness_fail("pipe write: %s", strerror(errno));
	harness_sigpipe_count = 0;
	n = splice(p[0], NULL, fd, NULL, 5, 0);
	if (n != -1 || errno != EPIPE)
		harness_fail("splice(pipe -> socket) after the reset: %zd (%s), expected EPIPE", n,
			     n < 0 ? strerror(errno) : "no error");
	else if (harness_sigpipe_count != 1)
		harness_fail("splice's EPIPE raised %d SIGPIPEs, expected 1 (as the kernel's)", (int)harness_sigpipe_count);
	harness_sigpipe_count = 0; /* (counted here, not a failure) */
	close(p[0]);
	close(p[1]);
	return harness_failures() ? -1 : 0;
}

static int misuse_server(int fd)
{
	/* bytes 0-4096 first (they settle the connection), then the rest after
	 * the client's misuses */
	if (harness_send_pattern(fd, 77, 0, 4096) < 0 || harness_expect_byte(fd, 'm') < 0 ||
	    harness_send_pattern(fd, 77, 4096, 4096) < 0)
		return -1;
	return harness_expect_eof(fd);
}

#define EXPECT_ERR(call, err)                                                                                   \
	do {                                                                                                     \
		ssize_t r_ = (call);                                                                             \
		if (r_ != -1 || errno != (err))                                                                  \
			harness_fail("%s: %zd (%s), expected %s", #call, r_, r_ < 0 ? strerror(errno) : "no error", \
				     strerror(err));                                                             \
	} while (0)

static int misuse_client(int fd)
{
	loff_t off = 0;
	int p[2], file;
	ssize_t n;

	if (harness_recv_pattern(fd, 77, 0, 4096, "first bytes") < 0)
		return -1;
	if (pipe(p) < 0)
		return harness_fail("pipe: %s", strerror(errno));
	file = open("/proc/self/exe", O_RDONLY);
	EXPECT_ERR(splice(fd, NULL, fd, NULL, 10, 0), EINVAL);
	EXPECT_ERR(splice(fd, &off, p[1], NULL, 10, 0), EINVAL);
	EXPECT_ERR(splice(fd, NULL, p[1], &off, 10, 0), ESPIPE);
	EXPECT_ERR(splice(p[0], &off, fd, NULL, 10, 0), ESPIPE);
	EXPECT_ERR(splice(p[0], NULL, fd, &off, 10, 0), EINVAL);
	EXPECT_ERR(splice(fd, NULL, p[0], NULL, 10, 0), EBADF);
	EXPECT_ERR(splice(p[1], NULL, fd, NULL, 10, 0), EBADF);
	EXPECT_ERR(splice(fd, NULL, p[1], NULL, 10, 0x100), EINVAL);
	EXPECT_ERR(splice(file, NULL, fd, NULL, 10, 0), EINVAL);
	EXPECT_ERR(splice(fd, NULL, 1000000, NULL, 10, 0), EBADF);
	n = splice(fd, NULL, p[1], NULL, 0, 0);
	if (n != 0)
		harness_fail("splice of length 0: %zd (%s), expected 0", n, n < 0 ? strerror(errno) : "");
	close(file);
	close(p[0]);
	close(p[1]);
	if (harness_send_byte(fd, 'm') < 0 || harness_recv_pattern(fd, 77, 4096, 4096, "bytes after the misuses") < 0)
		return -1;
	if (shutdown(fd, SHUT_WR) < 0)
		return harness_fail("shutdown: %s", strerror(errno));
	return harness_failures() ? -1 : 0;
}

static const struct harness_scenario splice_scenarios[] = {
	{ "blocking_page", transfer_server, transfer_client, 0 },
	{ "blocking_mib", transfer_server, transfer_client, 0 },
	{ "nonblock_page", transfer_server, transfer_client, 0 },
	{ "nonblock_mib", transfer_server, transfer_client, 0 },
	{ "onethread", onethread_server, onethread_client, 0 },
	{ "reset", reset_server, reset_client, HARNESS_SERVER_CLOSES_FD },
	{ "misuse", misuse_server, misuse_client, 0 },
};

static void splice_setup(void)
{
	const char *name = harness_name();

	opt_nonblock = !strncmp(name, "nonblock", 8);
	opt_pipe_size = strstr(name, "_mib") ? 1 << 20 : 1;
	opt_pipe_nb = opt_nonblock && opt_pipe_size > 4096;
}

int main(int argc, char **argv)
{
	static const struct harness_program program = {
		.name = "fs_splice",
		.scenarios = splice_scenarios,
		.count = HARNESS_COUNT(splice_scenarios),
		.watchdog_seconds = 120,
		.setup = splice_setup,
	};

	return harness_scenario_main(&program, argc, argv);
}
