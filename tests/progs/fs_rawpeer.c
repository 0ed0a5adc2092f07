/* SPDX-License-Identifier: MIT */
/*
 * fs_rawpeer: a deliberately misbehaving client for a fabsock listener.
 * It speaks the probe and HELLO formats of core/wire.h by hand (never under
 * the preload) and checks that a preloaded echo server (`fs_rawpeer serve`,
 * which echoes every byte of every connection; fs_stream's server verifies
 * its own framing, so it cannot serve foreign bytes) never hands it, or its
 * application, anything but the bytes the protocol allows:
 * malformed or spoofed probes get no YES, a stream whose first bytes are not
 * a valid HELLO is plain TCP (echoed byte-exact), a HELLO on a connection the
 * server did not answer YES for is application data, a well-formed HELLO
 * with a garbage fabric address is refused (HELLO-ACK with a nonzero status)
 * or the connection is closed, and the server keeps serving throughout.
 *
 *   fs_rawpeer HOST PORT CASE [--hello-timeout-ms N] [--seed N]   (no preload)
 *   fs_rawpeer HOST PORT good_client [--bytes N]                 (preloaded)
 *   fs_rawpeer serve [--port P] [--bind ADDR] [--ready-file F]   (preloaded)
 *
 * good_client is the well-behaved counterpart run after the abuse: it sends
 * --bytes (default 8M) of a checked pattern and verifies the echo with plain
 * blocking calls. serve ends by exit(0) on SIGTERM/SIGINT, so the preload's
 * exit-time stats line is printed.
 *
 * CASE is one of the names in fs_rawpeer_cases[] or "all". Every case prints
 * "PASS <case>: ..." or "FAIL <case>: ..." lines on stdout; the exit status
 * is 1 if any FAIL was printed, 2 on a usage error. Every wait is bounded by
 * poll() timeouts, and alarm() ends a run that somehow still hangs.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/wire.h"
#include "tests/progs/harness.h"

/* How long one probe attempt waits for its answer, and how many attempts a
 * case makes before it concludes the server said nothing. */
#define RP_PROBE_WAIT_MS 400
#define RP_PROBE_TRIES 3
/* Generous bound for an echo of a few KiB on loopback. */
#define RP_ECHO_TIMEOUT_MS 5000
#define RP_CONNECT_TIMEOUT_MS 3000
/* Datagrams of udp_garbage are sent in batches, one socket each, so every
 * reply can be tied to the exact request it answers. */
#define RP_GARBAGE_BATCH 64
#define RP_GARBAGE_RANDOM 200
#define RP_GARBAGE_MAX_LEN 2000
#define RP_FLOOD_COUNT 5000
#define RP_RUN_ALARM_SEC 240
/* A broken server can get hundreds of datagrams wrong: show only so many. */
#define RP_FAIL_LINES_MAX 10

struct rp_ctx {
	struct sockaddr_storage server; /* HOST:PORT, also the probe's UDP target */
	socklen_t server_len;
	uint16_t port;
	int hello_timeout_ms;
	uint64_t rng;
	int fails;
	int passes;
};

/* ---- reporting --------------------------------------------------------- */

static void rp_pass(struct rp_ctx *ctx, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void rp_fail(struct rp_ctx *ctx, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* One "KIND NAME: detail" line, flushed (a case's lines must precede a crash). */
static void rp_line(const char *kind, const char *name, const char *fmt, va_list ap)
{
	char detail[1024];

	vsnprintf(detail, sizeof(detail), fmt, ap);
	printf("%s %s: %s\n", kind, name, detail);
	fflush(stdout);
}

static void rp_pass(struct rp_ctx *ctx, const char *name, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	rp_line("PASS", name, fmt, ap);
	va_end(ap);
	ctx->passes++;
}

static void rp_fail(struct rp_ctx *ctx, const char *name, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	rp_line("FAIL", name, fmt, ap);
	va_end(ap);
	ctx->fails++;
}

static void rp_note(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rp_note(const char *name, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	rp_line("note", name, fmt, ap);
	va_end(ap);
}

/* ---- small utilities --------------------------------------------------- */

static int64_t rp_now_ms(void)
{
	return (int64_t)harness_now_ms();
}

/* xorshift64*: reproducible from --seed, good enough for fuzz bytes. */
static uint64_t rp_rand(struct rp_ctx *ctx)
{
	ctx->rng ^= ctx->rng >> 12;
	ctx->rng ^= ctx->rng << 25;
	ctx->rng ^= ctx->rng >> 27;
	return ctx->rng * 0x2545f4914f6cdd1dull;
}

static void rp_fill_random(struct rp_ctx *ctx, uint8_t *buf, size_t len)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(rp_rand(ctx) >> 32);
}

/* Bytes that can never start a HELLO: the first one is not 'F'. */
static void rp_fill_non_hello(struct rp_ctx *ctx, uint8_t *buf, size_t len)
{
	rp_fill_random(ctx, buf, len);
	if (len > 0 && buf[0] == (uint8_t)(FS_WIRE_HELLO_MAGIC >> 24))
		buf[0] ^= 0x80;
}

/* The 16-byte address field of a probe: IPv6 as is, IPv4 v4-mapped. */
static int rp_sockaddr_to16(const struct sockaddr_storage *ss, uint8_t out[16], uint16_t *port)
{
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;

		memset(out, 0, 10);
		out[10] = 0xff;
		out[11] = 0xff;
		memcpy(out + 12, &sin->sin_addr, 4);
		if (port)
			*port = ntohs(sin->sin_port);
		return 0;
	}
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ss;

		memcpy(out, &sin6->sin6_addr, 16);
		if (port)
			*port = ntohs(sin6->sin6_port);
		return 0;
	}
	return -EAFNOSUPPORT;
}

/* The host id as fabsock is expected to send it: the 16 bytes of the boot id
 * UUID. Only the bad-address case cares (a matching host id means a refusal
 * must come from the address, not from FS_NAK_HOST); zeros if unreadable. */
static void rp_host_id(uint8_t out[16])
{
	char text[64];
	size_t n = 0;
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

	memset(out, 0, 16);
	if (!f)
		return;
	if (fgets(text, sizeof(text), f)) {
		for (const char *p = text; *p && n < 32; p++) {
			int v;

			if (*p >= '0' && *p <= '9')
				v = *p - '0';
			else if (*p >= 'a' && *p <= 'f')
				v = *p - 'a' + 10;
			else if (*p >= 'A' && *p <= 'F')
				v = *p - 'A' + 10;
			else
				continue;
			out[n / 2] = (uint8_t)(out[n / 2] | (n % 2 ? v : v << 4));
			n++;
		}
	}
	fclose(f);
}

/* ---- TCP --------------------------------------------------------------- */

/* A nonblocking TCP socket connected to the server, or -1 (reported). */
static int rp_tcp_connect(struct rp_ctx *ctx, const char *name)
{
	int fd = socket(ctx->server.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct pollfd pfd;
	int err = 0;
	socklen_t elen = sizeof(err);

	if (fd < 0) {
		rp_fail(ctx, name, "socket: %s", strerror(errno));
		return -1;
	}
	if (connect(fd, (const struct sockaddr *)&ctx->server, ctx->server_len) < 0 && errno != EINPROGRESS) {
		rp_fail(ctx, name, "connect: %s", strerror(errno));
		close(fd);
		return -1;
	}
	pfd.fd = fd;
	pfd.events = POLLOUT;
	if (poll(&pfd, 1, RP_CONNECT_TIMEOUT_MS) != 1) {
		rp_fail(ctx, name, "connect did not complete within %d ms", RP_CONNECT_TIMEOUT_MS);
		close(fd);
		return -1;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0 || err != 0) {
		rp_fail(ctx, name, "connect: %s", strerror(err ? err : errno));
		close(fd);
		return -1;
	}
	return fd;
}

enum rp_io_end { RP_IO_DONE, RP_IO_EOF, RP_IO_RESET, RP_IO_TIMEOUT, RP_IO_ERROR };

static const char *rp_io_end_name(enum rp_io_end end)
{
	switch (end) {
	case RP_IO_DONE: return "done";
	case RP_IO_EOF: return "EOF";
	case RP_IO_RESET: return "connection reset";
	case RP_IO_TIMEOUT: return "timeout";
	case RP_IO_ERROR: return "error";
	}
	return "?";
}

static enum rp_io_end rp_errno_end(int err)
{
	return (err == ECONNRESET || err == EPIPE) ? RP_IO_RESET : RP_IO_ERROR;
}

/*
 * Sends SEND_LEN bytes of SEND while reading into RECV until WANT bytes have
 * come back (WANT may be 0: just send), EOF, an error, or the deadline.
 * Reading while sending keeps an echo server from stalling on a full socket.
 * *GOT returns the bytes read.
 */
static enum rp_io_end rp_exchange(int fd, const uint8_t *send_buf, size_t send_len, uint8_t *recv_buf,
				  size_t want, size_t *got, int timeout_ms)
{
	int64_t deadline = rp_now_ms() + timeout_ms;
	size_t sent = 0;

	*got = 0;
	while (sent < send_len || *got < want) {
		struct pollfd pfd = { .fd = fd, .events = 0 };
		int n;

		if (sent < send_len)
			pfd.events |= POLLOUT;
		if (*got < want)
			pfd.events |= POLLIN;
		n = poll(&pfd, 1, harness_remaining_ms(deadline));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return RP_IO_ERROR;
		if (n == 0)
			return RP_IO_TIMEOUT;
		if ((pfd.revents & POLLOUT) && sent < send_len) {
			ssize_t w = send(fd, send_buf + sent, send_len - sent, MSG_NOSIGNAL);

			if (w < 0 && errno != EAGAIN && errno != EINTR)
				return rp_errno_end(errno);
			if (w > 0)
				sent += (size_t)w;
		}
		if ((pfd.revents & (POLLIN | POLLHUP | POLLERR)) && *got < want) {
			ssize_t r = recv(fd, recv_buf + *got, want - *got, 0);

			if (r == 0)
				return RP_IO_EOF;
			if (r < 0 && errno != EAGAIN && errno != EINTR)
				return rp_errno_end(errno);
			if (r > 0)
				*got += (size_t)r;
		} else if ((pfd.revents & (POLLHUP | POLLERR)) && !(pfd.revents & POLLOUT)) {
			int err = 0;
			socklen_t elen = sizeof(err);

			getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
			return err ? rp_errno_end(err) : RP_IO_EOF;
		}
	}
	return RP_IO_DONE;
}

/* Index of the first byte where A and B differ, or LEN. */
static size_t rp_first_diff(const uint8_t *a, const uint8_t *b, size_t len)
{
	size_t i = 0;

	while (i < len && a[i] == b[i])
		i++;
	return i;
}

/* Sends LEN bytes and expects exactly them back. Returns true on success,
 * false after describing the difference in WHY. */
static bool rp_echo_check(int fd, const uint8_t *data, size_t len, int timeout_ms, char *why, size_t whylen)
{
	uint8_t *back = malloc(len ? len : 1);
	size_t got = 0, diff;
	enum rp_io_end end;

	if (!back) {
		snprintf(why, whylen, "out of memory");
		return false;
	}
	end = rp_exchange(fd, data, len, back, len, &got, timeout_ms);
	if (end != RP_IO_DONE) {
		snprintf(why, whylen, "%zu of %zu bytes echoed, then %s", got, len, rp_io_end_name(end));
		free(back);
		return false;
	}
	diff = rp_first_diff(data, back, len);
	if (diff != len) {
		snprintf(why, whylen, "echo differs at byte %zu (sent 0x%02x, got 0x%02x)", diff, data[diff],
			 back[diff]);
		free(back);
		return false;
	}
	free(back);
	return true;
}

/* Echo check of LEN fresh non-HELLO bytes; reports FAIL itself. */
static bool rp_echo_more(struct rp_ctx *ctx, const char *name, int fd, size_t len, const char *what)
{
	uint8_t *data = malloc(len);
	char why[160];
	bool ok;

	if (!data) {
		rp_fail(ctx, name, "out of memory");
		return false;
	}
	rp_fill_non_hello(ctx, data, len);
	ok = rp_echo_check(fd, data, len, RP_ECHO_TIMEOUT_MS, why, sizeof(why));
	if (!ok)
		rp_fail(ctx, name, "%s: %s", what, why);
	free(data);
	return ok;
}

/* "Does the server still serve?": a fresh connection without a probe. */
static bool rp_server_alive(struct rp_ctx *ctx, const char *name)
{
	int fd = rp_tcp_connect(ctx, name);
	bool ok;

	if (fd < 0)
		return false;
	ok = rp_echo_more(ctx, name, fd, 1000, "fresh connection after the case");
	close(fd);
	return ok;
}

/* ---- probe ------------------------------------------------------------- */

/* An ASK that truthfully describes TCP socket FD. */
static int rp_probe_for(int fd, uint64_t nonce, struct fs_probe *probe)
{
	struct sockaddr_storage local;
	socklen_t len = sizeof(local);

	memset(probe, 0, sizeof(*probe));
	if (getsockname(fd, (struct sockaddr *)&local, &len) < 0)
		return -errno;
	probe->type = FS_PROBE_ASK;
	probe->nonce = nonce;
	probe->wait_ms = RP_PROBE_WAIT_MS * RP_PROBE_TRIES;
	return rp_sockaddr_to16(&local, probe->client_addr, &probe->client_port);
}

static int rp_udp_socket(struct rp_ctx *ctx)
{
	return socket(ctx->server.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
}

enum rp_answer { RP_ANSWER_NONE, RP_ANSWER_YES, RP_ANSWER_NO, RP_ANSWER_BAD };

/*
 * Sends the encoded probe from UDP socket UFD (up to RP_PROBE_TRIES times)
 * and waits for an answer with its nonce. An answer that is larger than the
 * question, not a well-formed probe, not YES/NO or of another nonce is
 * RP_ANSWER_BAD, described in WHY.
 */
static enum rp_answer rp_probe_ask(struct rp_ctx *ctx, int ufd, const struct fs_probe *ask, char *why,
				   size_t whylen)
{
	uint8_t req[FS_WIRE_PROBE_LEN];
	int tries;

	snprintf(why, whylen, "no answer");
	if (fs_wire_probe_encode(ask, req, sizeof(req)) != FS_WIRE_PROBE_LEN) {
		snprintf(why, whylen, "cannot encode probe");
		return RP_ANSWER_BAD;
	}
	for (tries = 0; tries < RP_PROBE_TRIES; tries++) {
		int64_t deadline = rp_now_ms() + RP_PROBE_WAIT_MS;

		if (sendto(ufd, req, sizeof(req), 0, (const struct sockaddr *)&ctx->server, ctx->server_len) < 0) {
			snprintf(why, whylen, "sendto: %s", strerror(errno));
			return RP_ANSWER_BAD;
		}
		for (;;) {
			struct pollfd pfd = { .fd = ufd, .events = POLLIN };
			uint8_t rep[RP_GARBAGE_MAX_LEN + 64];
			struct fs_probe ans;
			ssize_t r;
			int n = poll(&pfd, 1, harness_remaining_ms(deadline));

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break;
			r = recv(ufd, rep, sizeof(rep), 0);
			if (r < 0) {
				/* ECONNREFUSED: an ICMP port unreachable, nothing listens. */
				if (errno == ECONNREFUSED) {
					snprintf(why, whylen, "UDP port unreachable (no listener bound the probe port)");
					continue;
				}
				if (errno == EAGAIN || errno == EINTR)
					continue;
				snprintf(why, whylen, "recv: %s", strerror(errno));
				return RP_ANSWER_BAD;
			}
			if ((size_t)r > sizeof(req)) {
				snprintf(why, whylen, "answer of %zd bytes to a %zu-byte question", r, sizeof(req));
				return RP_ANSWER_BAD;
			}
			if (fs_wire_probe_decode(rep, (size_t)r, &ans) < 0 ||
			    (ans.type != FS_PROBE_YES && ans.type != FS_PROBE_NO)) {
				snprintf(why, whylen, "answer of %zd bytes is not a YES/NO probe", r);
				return RP_ANSWER_BAD;
			}
			if (ans.nonce != ask->nonce) {
				/* A late answer to an earlier try carries the same nonce;
				 * anything else is somebody else's answer. */
				snprintf(why, whylen, "answer with nonce %016" PRIx64 ", asked %016" PRIx64,
					 ans.nonce, ask->nonce);
				return RP_ANSWER_BAD;
			}
			return ans.type == FS_PROBE_YES ? RP_ANSWER_YES : RP_ANSWER_NO;
		}
	}
	return RP_ANSWER_NONE;
}

/* Probes for TCP socket FD and requires YES; *NONCE returns the nonce. */
static bool rp_get_yes(struct rp_ctx *ctx, const char *name, int fd, uint64_t *nonce)
{
	struct fs_probe ask;
	enum rp_answer ans;
	char why[160];
	int ufd = rp_udp_socket(ctx);

	if (ufd < 0) {
		rp_fail(ctx, name, "udp socket: %s", strerror(errno));
		return false;
	}
	*nonce = rp_rand(ctx) | 1;
	if (rp_probe_for(fd, *nonce, &ask) < 0) {
		rp_fail(ctx, name, "getsockname of the TCP socket failed");
		close(ufd);
		return false;
	}
	ans = rp_probe_ask(ctx, ufd, &ask, why, sizeof(why));
	close(ufd);
	if (ans == RP_ANSWER_YES)
		return true;
	rp_fail(ctx, name, "probe for a fresh connection: expected YES, got %s",
		ans == RP_ANSWER_NO ? "NO" : why);
	return false;
}

/* ---- HELLO ------------------------------------------------------------- */

/* A valid HELLO (correct CRC) offering shm with a random 16-byte address. */
/* A HELLO for NONCE; its fabric address is ADDR (ADDR_LEN bytes), or 16
 * random bytes when ADDR is NULL. */
static int rp_hello_build_addr(struct rp_ctx *ctx, uint64_t nonce, uint8_t *buf, size_t len, uint64_t *token,
			       const void *addr, size_t addr_len)
{
	struct fs_hello hello;

	memset(&hello, 0, sizeof(hello));
	hello.magic = FS_WIRE_HELLO_MAGIC;
	hello.status = FS_NAK_NONE;
	hello.token = rp_rand(ctx) | 1;
	hello.nonce = nonce;
	hello.stream_id = 1;
	hello.window = 8;
	hello.chunk = 65536;
	rp_host_id(hello.host_id);
	hello.provider = FS_PROV_SHM;
	if (addr && addr_len <= sizeof(hello.addr)) {
		hello.addr_len = (uint16_t)addr_len;
		memcpy(hello.addr, addr, addr_len);
	} else {
		hello.addr_len = 16;
		rp_fill_random(ctx, hello.addr, hello.addr_len);
	}
	if (token)
		*token = hello.token;
	return fs_wire_hello_encode(&hello, buf, len);
}

static int rp_hello_build(struct rp_ctx *ctx, uint64_t nonce, uint8_t *buf, size_t len, uint64_t *token)
{
	return rp_hello_build_addr(ctx, nonce, buf, len, token, NULL, 0);
}

/* ---- cases ------------------------------------------------------------- */

/* One datagram of udp_garbage and what an answer to it may look like. */
struct rp_dgram {
	uint8_t *buf;
	size_t len;
	bool may_answer; /* a well-formed ASK whose claimed address is our own */
	uint64_t nonce;
	int fd;
};

static int rp_case_udp_garbage(struct rp_ctx *ctx, const char *name)
{
	struct rp_dgram *dg;
	struct fs_probe ask, parsed;
	uint8_t valid[FS_WIRE_PROBE_LEN], own_addr[16];
	size_t count = 0, max, i, answered = 0, bad = 0;
	int tcp_fd, fails_before = ctx->fails;

	tcp_fd = rp_tcp_connect(ctx, name);
	if (tcp_fd < 0)
		return -1;
	if (rp_probe_for(tcp_fd, rp_rand(ctx), &ask) < 0 || fs_wire_probe_encode(&ask, valid, sizeof(valid)) < 0) {
		rp_fail(ctx, name, "cannot build the reference probe");
		close(tcp_fd);
		return -1;
	}
	memcpy(own_addr, ask.client_addr, 16);

	/* Random sizes, valid-ASK truncations 0..39, longer ASKs, and one
	 * bit-flip of the valid ASK for each of its 320 bits. */
	max = RP_GARBAGE_RANDOM + FS_WIRE_PROBE_LEN + 3 + FS_WIRE_PROBE_LEN * 8;
	dg = calloc(max, sizeof(*dg));
	if (!dg) {
		rp_fail(ctx, name, "out of memory");
		close(tcp_fd);
		return -1;
	}
	for (i = 0; i < RP_GARBAGE_RANDOM; i++, count++) {
		dg[count].len = (size_t)(rp_rand(ctx) % (RP_GARBAGE_MAX_LEN + 1));
		dg[count].buf = malloc(dg[count].len + 1);
		rp_fill_random(ctx, dg[count].buf, dg[count].len);
		/* Every fourth starts like a probe to get past a magic check. */
		if (i % 4 == 0 && dg[count].len >= 6)
			memcpy(dg[count].buf, valid, 6);
	}
	for (i = 0; i < FS_WIRE_PROBE_LEN; i++, count++) {
		dg[count].len = i;
		dg[count].buf = malloc(i + 1);
		memcpy(dg[count].buf, valid, i);
	}
	{
		static const size_t longer[] = { FS_WIRE_PROBE_LEN + 1, 64, RP_GARBAGE_MAX_LEN };

		for (i = 0; i < sizeof(longer) / sizeof(longer[0]); i++, count++) {
			dg[count].len = longer[i];
			dg[count].buf = calloc(1, longer[i]);
			memcpy(dg[count].buf, valid, FS_WIRE_PROBE_LEN);
		}
	}
	for (i = 0; i < FS_WIRE_PROBE_LEN * 8; i++, count++) {
		dg[count].len = FS_WIRE_PROBE_LEN;
		dg[count].buf = malloc(FS_WIRE_PROBE_LEN);
		memcpy(dg[count].buf, valid, FS_WIRE_PROBE_LEN);
		dg[count].buf[i / 8] ^= (uint8_t)(1u << (i % 8));
	}
	for (i = 0; i < count; i++) {
		if (!dg[i].buf) {
			rp_fail(ctx, name, "out of memory");
			goto out;
		}
		if (fs_wire_probe_decode(dg[i].buf, dg[i].len, &parsed) == 0 && parsed.type == FS_PROBE_ASK &&
		    !memcmp(parsed.client_addr, own_addr, 16)) {
			dg[i].may_answer = true;
			dg[i].nonce = parsed.nonce;
		}
	}

	for (size_t start = 0; start < count; start += RP_GARBAGE_BATCH) {
		size_t end = start + RP_GARBAGE_BATCH < count ? start + RP_GARBAGE_BATCH : count;

		for (i = start; i < end; i++) {
			dg[i].fd = rp_udp_socket(ctx);
			if (dg[i].fd < 0) {
				rp_fail(ctx, name, "udp socket: %s", strerror(errno));
				continue;
			}
			if (sendto(dg[i].fd, dg[i].buf, dg[i].len, 0, (const struct sockaddr *)&ctx->server,
				   ctx->server_len) < 0 && errno != ECONNREFUSED)
				rp_fail(ctx, name, "sendto of %zu bytes: %s", dg[i].len, strerror(errno));
		}
		/* Answers come within the probe timeout or not at all. */
		usleep(250 * 1000);
		for (i = start; i < end; i++) {
			uint8_t rep[RP_GARBAGE_MAX_LEN + 64];
			ssize_t r;

			if (dg[i].fd < 0)
				continue;
			while ((r = recv(dg[i].fd, rep, sizeof(rep), 0)) >= 0 || errno == ECONNREFUSED) {
				if (r < 0)
					continue; /* ICMP error consumed; look for more */
				answered++;
				if ((size_t)r > dg[i].len) {
					if (bad++ < RP_FAIL_LINES_MAX)
						rp_fail(ctx, name, "datagram #%zu of %zu bytes got a %zd-byte answer", i,
							dg[i].len, r);
				} else if (fs_wire_probe_decode(rep, (size_t)r, &parsed) < 0 ||
					   (parsed.type != FS_PROBE_YES && parsed.type != FS_PROBE_NO)) {
					if (bad++ < RP_FAIL_LINES_MAX)
						rp_fail(ctx, name, "datagram #%zu got an answer that is not a YES/NO probe", i);
				} else if (!dg[i].may_answer) {
					if (bad++ < RP_FAIL_LINES_MAX)
						rp_fail(ctx, name,
							"datagram #%zu (%zu bytes, not a well-formed ASK from its sender) was answered %s",
							i, dg[i].len, parsed.type == FS_PROBE_YES ? "YES" : "NO");
				} else if (parsed.nonce != dg[i].nonce) {
					if (bad++ < RP_FAIL_LINES_MAX)
						rp_fail(ctx, name, "datagram #%zu answered with a foreign nonce", i);
				}
			}
			close(dg[i].fd);
			dg[i].fd = -1;
		}
	}

	/* The connection the valid probes described must still work (some
	 * bit-flipped ASKs were valid, so it may have been answered YES), and
	 * so must a fresh one. */
	if (bad > RP_FAIL_LINES_MAX)
		rp_fail(ctx, name, "%zu wrong answers in all (first %d shown)", bad, RP_FAIL_LINES_MAX);
	rp_echo_more(ctx, name, tcp_fd, 1000, "the probed connection after the garbage");
	rp_server_alive(ctx, name);
	if (ctx->fails == fails_before)
		rp_pass(ctx, name, "%zu datagrams sent, %zu answered, all answers well-formed and no larger than the question; server still echoes",
			count, answered);
out:
	for (i = 0; i < count; i++)
		free(dg[i].buf);
	free(dg);
	close(tcp_fd);
	return 0;
}

/* A probe whose claimed client address is not where it comes from. */
static int rp_case_spoofed(struct rp_ctx *ctx, const char *name)
{
	struct fs_probe ask;
	enum rp_answer ans;
	char why[160];
	int tcp_fd, ufd, fails_before = ctx->fails;
	int variants = 0;

	tcp_fd = rp_tcp_connect(ctx, name);
	if (tcp_fd < 0)
		return -1;

	/* A: the real TCP port, someone else's address, from our own address. */
	ufd = rp_udp_socket(ctx);
	if (ufd < 0 || rp_probe_for(tcp_fd, rp_rand(ctx), &ask) < 0) {
		rp_fail(ctx, name, "cannot set up the probe");
		goto out;
	}
	if (ctx->server.ss_family == AF_INET) {
		static const uint8_t foreign4[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 254, 253, 252 };

		memcpy(ask.client_addr, foreign4, 16);
	} else {
		static const uint8_t foreign6[16] = { 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x42 };

		memcpy(ask.client_addr, foreign6, 16);
	}
	ans = rp_probe_ask(ctx, ufd, &ask, why, sizeof(why));
	close(ufd);
	variants++;
	if (ans == RP_ANSWER_YES)
		rp_fail(ctx, name, "probe claiming a foreign address was answered YES");
	else if (ans == RP_ANSWER_BAD)
		rp_fail(ctx, name, "probe claiming a foreign address: %s", why);
	else if (ans == RP_ANSWER_NO)
		rp_note(name, "probe claiming a foreign address was answered NO (expected silence)");

	/* B: claims exactly our real connection, sent from another loopback
	 * address (127.0.0.2): the probe a local attacker would forge. */
	if (ctx->server.ss_family == AF_INET &&
	    (ntohl(((struct sockaddr_in *)&ctx->server)->sin_addr.s_addr) >> 24) == 127) {
		struct sockaddr_in other = { .sin_family = AF_INET };

		other.sin_addr.s_addr = htonl(0x7f000002);
		ufd = rp_udp_socket(ctx);
		if (ufd >= 0 && bind(ufd, (struct sockaddr *)&other, sizeof(other)) == 0 &&
		    rp_probe_for(tcp_fd, rp_rand(ctx), &ask) == 0) {
			ans = rp_probe_ask(ctx, ufd, &ask, why, sizeof(why));
			variants++;
			if (ans == RP_ANSWER_YES)
				rp_fail(ctx, name, "probe for our connection sent from 127.0.0.2 was answered YES");
			else if (ans == RP_ANSWER_BAD)
				rp_fail(ctx, name, "probe from 127.0.0.2: %s", why);
			else if (ans == RP_ANSWER_NO)
				rp_note(name, "probe from 127.0.0.2 was answered NO (expected silence)");
		} else {
			rp_note(name, "cannot bind 127.0.0.2; forged-source variant skipped");
		}
		if (ufd >= 0)
			close(ufd);
	}

	/* The connection was never legitimately probed: plain TCP, echoed. */
	rp_echo_more(ctx, name, tcp_fd, 1000, "data on the connection after spoofed probes");
	if (ctx->fails == fails_before)
		rp_pass(ctx, name, "%d spoofed probe variant(s) got no YES; the connection echoes as plain TCP", variants);
out:
	close(tcp_fd);
	return 0;
}

static int rp_case_garbage_after_yes(struct rp_ctx *ctx, const char *name)
{
	uint8_t data[4096];
	uint64_t nonce;
	char why[160];
	int fd = rp_tcp_connect(ctx, name);

	if (fd < 0)
		return -1;
	if (!rp_get_yes(ctx, name, fd, &nonce))
		goto out;
	rp_fill_non_hello(ctx, data, sizeof(data));
	if (!rp_echo_check(fd, data, sizeof(data), RP_ECHO_TIMEOUT_MS, why, sizeof(why))) {
		rp_fail(ctx, name, "4 KiB of non-HELLO bytes after YES: %s", why);
		goto out;
	}
	if (rp_echo_more(ctx, name, fd, 1000, "more bytes afterwards"))
		rp_pass(ctx, name, "4 KiB of non-HELLO bytes after YES echoed byte-exact");
out:
	close(fd);
	return 0;
}

static int rp_case_truncated_hello(struct rp_ctx *ctx, const char *name)
{
	uint8_t hello[FS_WIRE_HELLO_MAX], back[20];
	uint64_t nonce;
	size_t got;
	int64_t start;
	enum rp_io_end end;
	int limit = ctx->hello_timeout_ms + 2000;
	int fd = rp_tcp_connect(ctx, name);

	if (fd < 0)
		return -1;
	if (!rp_get_yes(ctx, name, fd, &nonce))
		goto out;
	if (rp_hello_build(ctx, nonce, hello, sizeof(hello), NULL) < (int)sizeof(back)) {
		rp_fail(ctx, name, "cannot build a HELLO");
		goto out;
	}
	start = rp_now_ms();
	end = rp_exchange(fd, hello, sizeof(back), back, sizeof(back), &got, limit);
	if (end != RP_IO_DONE) {
		rp_fail(ctx, name, "first 20 bytes of a HELLO: %zu echoed within %d ms, then %s", got, limit,
			rp_io_end_name(end));
		goto out;
	}
	if (memcmp(back, hello, sizeof(back)) != 0) {
		rp_fail(ctx, name, "the 20 bytes came back changed (byte %zu)",
			rp_first_diff(hello, back, sizeof(back)));
		goto out;
	}
	if (rp_echo_more(ctx, name, fd, 1000, "bytes after the truncated HELLO"))
		rp_pass(ctx, name, "20-byte HELLO prefix echoed as data after %lld ms (hello timeout %d ms); later bytes echo",
			(long long)(rp_now_ms() - start), ctx->hello_timeout_ms);
out:
	close(fd);
	return 0;
}

static int rp_case_bad_crc_hello(struct rp_ctx *ctx, const char *name)
{
	uint8_t hello[FS_WIRE_HELLO_MAX];
	uint64_t nonce;
	char why[160];
	int len, fd = rp_tcp_connect(ctx, name);

	if (fd < 0)
		return -1;
	if (!rp_get_yes(ctx, name, fd, &nonce))
		goto out;
	len = rp_hello_build(ctx, nonce, hello, sizeof(hello), NULL);
	if (len < FS_WIRE_HELLO_MIN) {
		rp_fail(ctx, name, "cannot build a HELLO");
		goto out;
	}
	hello[len - 2] ^= 0x5a; /* inside the CRC */
	if (!rp_echo_check(fd, hello, (size_t)len, ctx->hello_timeout_ms + RP_ECHO_TIMEOUT_MS, why, sizeof(why))) {
		rp_fail(ctx, name, "HELLO with a wrong CRC: %s", why);
		goto out;
	}
	if (rp_echo_more(ctx, name, fd, 1000, "bytes after the bad HELLO"))
		rp_pass(ctx, name, "%d-byte HELLO with a wrong CRC echoed byte-exact as data", len);
out:
	close(fd);
	return 0;
}

static int rp_case_oversized_hello(struct rp_ctx *ctx, const char *name)
{
	uint8_t data[4096], back[sizeof(data)];
	uint64_t nonce;
	size_t got;
	enum rp_io_end end;
	int fd = rp_tcp_connect(ctx, name);

	if (fd < 0)
		return -1;
	if (!rp_get_yes(ctx, name, fd, &nonce))
		goto out;
	/* A HELLO header that claims 65535 bytes, then random bytes. */
	rp_fill_random(ctx, data, sizeof(data));
	data[0] = 'F';
	data[1] = 'S';
	data[2] = 'B';
	data[3] = 'H';
	data[4] = FS_WIRE_VERSION;
	data[5] = 0;
	data[6] = 0xff;
	data[7] = 0xff;
	end = rp_exchange(fd, data, sizeof(data), back, sizeof(back), &got,
			  ctx->hello_timeout_ms + RP_ECHO_TIMEOUT_MS);
	if (end == RP_IO_DONE) {
		size_t diff = rp_first_diff(data, back, sizeof(back));

		if (diff != sizeof(back))
			rp_fail(ctx, name, "echo differs at byte %zu", diff);
		else
			rp_pass(ctx, name, "HELLO header claiming 65535 bytes echoed byte-exact as data");
	} else if ((end == RP_IO_EOF || end == RP_IO_RESET) && rp_first_diff(data, back, got) == got) {
		rp_pass(ctx, name, "connection closed (%s) after %zu correct echoed bytes", rp_io_end_name(end), got);
	} else {
		rp_fail(ctx, name, "%zu bytes echoed, then %s", got, rp_io_end_name(end));
	}
out:
	close(fd);
	return 0;
}

/*
 * Reads the answer to a HELLO: a HELLO-ACK (returns its length and fills
 * ACK), the connection's end (0, *END says how) or something else (-1, the
 * bytes in BUF, *GOT of them, say what). Bounded by TIMEOUT_MS.
 */
static int rp_read_ack(int fd, uint8_t *buf, size_t cap, size_t *got, struct fs_hello *ack,
		       enum rp_io_end *end, int timeout_ms)
{
	int64_t deadline = rp_now_ms() + timeout_ms;

	*got = 0;
	for (;;) {
		size_t n;
		int rc;

		*end = rp_exchange(fd, NULL, 0, buf + *got, 1, &n, harness_remaining_ms(deadline));
		if (*end != RP_IO_DONE)
			return *got == 0 ? 0 : -1;
		*got += n;
		rc = fs_wire_hello_decode(buf, *got, FS_WIRE_ACK_MAGIC, ack);
		if (rc > 0)
			return rc;
		if (rc < 0 || *got == cap)
			return -1;
	}
}

/* After a YES, a HELLO whose fabric address is ADDR (NULL: 16 random
 * bytes): the server must refuse it with a NAK and echo later bytes over
 * TCP. */
static int rp_refused_address(struct rp_ctx *ctx, const char *name, const void *addr, size_t addr_len)
{
	uint8_t hello[FS_WIRE_HELLO_MAX], back[FS_WIRE_HELLO_MAX];
	struct fs_hello ack;
	uint64_t nonce, token;
	size_t got;
	enum rp_io_end end;
	int len, rc, fd = rp_tcp_connect(ctx, name);

	if (fd < 0)
		return -1;
	if (!rp_get_yes(ctx, name, fd, &nonce))
		goto out;
	len = rp_hello_build_addr(ctx, nonce, hello, sizeof(hello), &token, addr, addr_len);
	if (len < FS_WIRE_HELLO_MIN) {
		rp_fail(ctx, name, "cannot build a HELLO");
		goto out;
	}
	end = rp_exchange(fd, hello, (size_t)len, NULL, 0, &got, RP_ECHO_TIMEOUT_MS);
	if (end != RP_IO_DONE) {
		rp_fail(ctx, name, "sending the HELLO: %s", rp_io_end_name(end));
		goto out;
	}
	rc = rp_read_ack(fd, back, sizeof(back), &got, &ack, &end, ctx->hello_timeout_ms + 3000);
	if (rc == 0) {
		if (end == RP_IO_EOF || end == RP_IO_RESET)
			rp_pass(ctx, name, "server closed the connection (%s) instead of answering", rp_io_end_name(end));
		else
			rp_fail(ctx, name, "no HELLO-ACK and no close within %d ms (%s)",
				ctx->hello_timeout_ms + 3000, rp_io_end_name(end));
		goto out;
	}
	if (rc < 0) {
		if (got > 0 && rp_first_diff(back, hello, got) == got)
			rp_fail(ctx, name, "a well-formed HELLO was echoed back as data (%zu bytes) instead of refused", got);
		else
			rp_fail(ctx, name, "answer is not a HELLO-ACK (%zu bytes, %s)", got, rp_io_end_name(end));
		goto out;
	}
	if (ack.status == FS_NAK_NONE) {
		rp_fail(ctx, name, "HELLO with a foreign or garbage shm address was accepted (ACK status 0)");
		goto out;
	}
	if (ack.token != token) {
		rp_fail(ctx, name, "NAK carries token %016" PRIx64 ", the HELLO had %016" PRIx64, ack.token, token);
		goto out;
	}
	/* Refused: both ends stay on TCP and the application saw neither message. */
	if (rp_echo_more(ctx, name, fd, 1000, "bytes after the NAK"))
		rp_pass(ctx, name, "NAK status %u (%s); later bytes echo over TCP", ack.status, fs_nak_name(ack.status));
out:
	close(fd);
	return 0;
}

static int rp_case_bad_address_hello(struct rp_ctx *ctx, const char *name)
{
	return rp_refused_address(ctx, name, NULL, 0);
}

/* A HELLO naming a file in /dev/shm that is no fabsock region, owned by
 * the server's own user (this test runs both as one user): 4 KiB of random
 * bytes, as another program's segment would be. libfabric would map it as
 * a peer region and crash in fi_av_insert (issue 16, item 1). */
static int rp_case_foreign_region_hello(struct rp_ctx *ctx, const char *name)
{
	char region[64], addr[80];
	uint8_t junk[4096];
	int fd, ret;

	snprintf(region, sizeof(region), "fsrawpeer-%d-segment", (int)getpid());
	snprintf(addr, sizeof(addr), "fi_shm://%s", region);
	{
		char path[96];

		snprintf(path, sizeof(path), "/dev/shm/%s", region);
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		rp_fill_random(ctx, junk, sizeof(junk));
		if (fd < 0 || write(fd, junk, sizeof(junk)) != (ssize_t)sizeof(junk)) {
			rp_fail(ctx, name, "cannot write %s: %s", path, strerror(errno));
			if (fd >= 0)
				close(fd);
			unlink(path);
			return 0;
		}
		close(fd);
		ret = rp_refused_address(ctx, name, addr, strlen(addr) + 1);
		unlink(path);
	}
	return ret;
}

/* A HELLO naming a real fabsock region of our own user that belongs to
 * another process (the server's own, say): its owner and name pass, but the
 * kernel knows that process does not hold this connection (issue 16). */
static int rp_case_stolen_region_hello(struct rp_ctx *ctx, const char *name)
{
	char addr[300] = "";
	DIR *dir = opendir("/dev/shm");
	struct dirent *de;

	while (dir && (de = readdir(dir))) {
		char path[300];
		struct stat st;

		if (strncmp(de->d_name, "fabsock-", 8) != 0 || strchr(de->d_name, ':') == NULL ||
		    strncmp(de->d_name, "fabsock-probe", 13) == 0 || strlen(de->d_name) > 200)
			continue;
		snprintf(path, sizeof(path), "/dev/shm/%s", de->d_name);
		if (lstat(path, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
			continue;
		snprintf(addr, sizeof(addr), "fi_shm://%s", de->d_name);
		break;
	}
	if (dir)
		closedir(dir);
	if (!addr[0]) {
		rp_fail(ctx, name, "no fabsock region of uid %u in /dev/shm to name", (unsigned)geteuid());
		return 0;
	}
	printf("naming %s\n", addr);
	return rp_refused_address(ctx, name, addr, strlen(addr) + 1);
}

static int rp_case_hello_without_probe(struct rp_ctx *ctx, const char *name)
{
	uint8_t hello[FS_WIRE_HELLO_MAX], back[FS_WIRE_HELLO_MAX];
	struct fs_hello ack;
	size_t got;
	enum rp_io_end end;
	int len, fd = rp_tcp_connect(ctx, name);

	if (fd < 0)
		return -1;
	/* Nonce 0 is what a HELLO looks like when a rule skipped the probe. */
	len = rp_hello_build(ctx, 0, hello, sizeof(hello), NULL);
	if (len < FS_WIRE_HELLO_MIN) {
		rp_fail(ctx, name, "cannot build a HELLO");
		goto out;
	}
	end = rp_exchange(fd, hello, (size_t)len, back, (size_t)len, &got,
			  ctx->hello_timeout_ms + RP_ECHO_TIMEOUT_MS);
	if (end != RP_IO_DONE) {
		rp_fail(ctx, name, "%zu of %d HELLO bytes echoed, then %s", got, len, rp_io_end_name(end));
		goto out;
	}
	if (memcmp(back, hello, (size_t)len) != 0) {
		if (fs_wire_hello_decode(back, got, FS_WIRE_ACK_MAGIC, &ack) > 0)
			rp_fail(ctx, name, "server answered a HELLO on an unprobed connection with a HELLO-ACK (status %u)",
				ack.status);
		else
			rp_fail(ctx, name, "echo differs at byte %zu", rp_first_diff(hello, back, (size_t)len));
		goto out;
	}
	if (rp_echo_more(ctx, name, fd, 1000, "bytes after the HELLO"))
		rp_pass(ctx, name, "HELLO on an unprobed connection delivered to the application as %d data bytes", len);
out:
	close(fd);
	return 0;
}

/* Counts one answer to the flood: a YES, a NO, or bad (too long, not a
 * probe, or a nonce the flood never sent). */
static void rp_flood_count(const uint8_t *reply, size_t length, uint64_t base, size_t *yes, size_t *no, size_t *bad)
{
	struct fs_probe answer;

	if (length > FS_WIRE_PROBE_LEN || fs_wire_probe_decode(reply, length, &answer) < 0 ||
	    answer.nonce - base >= RP_FLOOD_COUNT)
		(*bad)++;
	else if (answer.type == FS_PROBE_YES)
		(*yes)++;
	else if (answer.type == FS_PROBE_NO)
		(*no)++;
	else
		(*bad)++;
}

static int rp_case_probe_flood(struct rp_ctx *ctx, const char *name)
{
	struct fs_probe ask;
	uint8_t req[FS_WIRE_PROBE_LEN], rep[RP_GARBAGE_MAX_LEN];
	uint64_t base = rp_rand(ctx) & ~0xffffull;
	size_t sent = 0, yes = 0, no = 0, bad = 0;
	int64_t start, deadline;
	int tcp_fd, ufd, fails_before = ctx->fails;

	tcp_fd = rp_tcp_connect(ctx, name);
	if (tcp_fd < 0)
		return -1;
	ufd = rp_udp_socket(ctx);
	if (ufd < 0 || rp_probe_for(tcp_fd, 0, &ask) < 0) {
		rp_fail(ctx, name, "cannot set up the flood");
		goto out;
	}

	start = rp_now_ms();
	deadline = start + 20000;
	while (sent < RP_FLOOD_COUNT && rp_now_ms() < deadline) {
		ssize_t r;

		ask.nonce = base + sent;
		fs_wire_probe_encode(&ask, req, sizeof(req));
		if (sendto(ufd, req, sizeof(req), 0, (const struct sockaddr *)&ctx->server, ctx->server_len) < 0) {
			if (errno == EAGAIN || errno == ENOBUFS || errno == ECONNREFUSED) {
				struct pollfd pfd = { .fd = ufd, .events = POLLOUT };

				poll(&pfd, 1, 10);
				continue;
			}
			rp_fail(ctx, name, "sendto: %s", strerror(errno));
			break;
		}
		sent++;
		/* Drain answers as we go so our receive buffer does not drop them. */
		while ((r = recv(ufd, rep, sizeof(rep), 0)) >= 0 || errno == ECONNREFUSED) {
			if (r < 0)
				continue;
			rp_flood_count(rep, (size_t)r, base, &yes, &no, &bad);
		}
	}
	/* Late answers. */
	deadline = rp_now_ms() + 500;
	for (;;) {
		struct pollfd pfd = { .fd = ufd, .events = POLLIN };
		ssize_t r;

		if (poll(&pfd, 1, harness_remaining_ms(deadline)) <= 0)
			break;
		r = recv(ufd, rep, sizeof(rep), 0);
		if (r < 0)
			continue;
		rp_flood_count(rep, (size_t)r, base, &yes, &no, &bad);
	}
	if (sent < RP_FLOOD_COUNT)
		rp_fail(ctx, name, "only %zu of %d probes could be sent in 20 s", sent, RP_FLOOD_COUNT);
	if (bad)
		rp_fail(ctx, name, "%zu malformed, oversized or foreign answers", bad);
	rp_echo_more(ctx, name, tcp_fd, 1000, "the flooded connection");
	rp_server_alive(ctx, name);
	if (ctx->fails == fails_before)
		rp_pass(ctx, name, "%zu probes in %lld ms: %zu YES, %zu NO, %zu unanswered; server still echoes", sent,
			(long long)(rp_now_ms() - start), yes, no, sent - yes - no);
out:
	if (ufd >= 0)
		close(ufd);
	close(tcp_fd);
	return 0;
}

/*
 * probe_storm: well-formed probes as fast as one socket sends them, for
 * $FS_STORM_SEC seconds (default 3, at most 60), each claiming our address
 * and a random port, none answered by us (a rate limit's worth and more:
 * the listener answers FS_PROBE_RATE_PER_SEC a second). Prints the count,
 * the rate, and when the storm began and ended on CLOCK_MONOTONIC (seconds), for the
 * script to measure how long a legitimate client stays off the fabric.
 */
static int rp_parse_uint(const char *text, unsigned long max, unsigned long *out);

static int rp_case_probe_storm(struct rp_ctx *ctx, const char *name)
{
	struct fs_probe ask;
	uint8_t req[FS_WIRE_PROBE_LEN];
	const char *env = getenv("FS_STORM_SEC");
	unsigned long seconds = 3;
	int64_t start, end;
	size_t sent = 0;
	int tcp_fd, ufd, small = 4096;

	if (env && (rp_parse_uint(env, 60, &seconds) != 0 || seconds == 0)) {
		rp_fail(ctx, name, "FS_STORM_SEC=%s: 1 to 60 seconds", env);
		return 0;
	}
	tcp_fd = rp_tcp_connect(ctx, name); /* for our own address */
	if (tcp_fd < 0)
		return -1;
	ufd = socket(ctx->server.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (ufd < 0 || rp_probe_for(tcp_fd, 0, &ask) < 0 ||
	    connect(ufd, (const struct sockaddr *)&ctx->server, ctx->server_len) < 0) {
		rp_fail(ctx, name, "cannot set up the storm: %s", strerror(errno));
		goto out;
	}
	setsockopt(ufd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)); /* answers: dropped */
	start = rp_now_ms();
	end = start + (int64_t)seconds * 1000;
	while (rp_now_ms() < end) {
		for (int burst = 0; burst < 256; burst++) {
			ask.nonce = rp_rand(ctx);
			ask.client_port = (uint16_t)(1024 + rp_rand(ctx) % 64000);
			fs_wire_probe_encode(&ask, req, sizeof(req));
			if (send(ufd, req, sizeof(req), MSG_DONTWAIT) == (ssize_t)sizeof(req))
				sent++;
		}
	}
	end = rp_now_ms();
	rp_pass(ctx, name, "%zu probes in %lld ms, rate=%.0f started_at=%.3f ended_at=%.3f", sent,
		(long long)(end - start), (double)sent * 1000.0 / (double)(end - start > 0 ? end - start : 1),
		(double)start / 1000.0, (double)end / 1000.0);
out:
	if (ufd >= 0)
		close(ufd);
	close(tcp_fd);
	return 0;
}

/* ---- the well-behaved side: run these under the preload ---------------- */

/* Byte I of the good client's stream: cheap, position-keyed, never a HELLO. */
static inline uint8_t rp_stream_byte(uint64_t i)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull;

	x ^= x >> 29;
	return (uint8_t)(x ^ (x >> 17));
}

struct rp_writer {
	int fd;
	uint64_t bytes;
	uint64_t sent;
	uint64_t hash;
	int err;
};

/* Sends the pattern in varying sizes with plain blocking calls, then half-
 * closes so the echo server sees EOF after exactly BYTES. */
static void *rp_writer_main(void *argument)
{
	struct rp_writer *w = argument;
	static uint8_t buf[65536];
	uint64_t size_state = 0x12345;

	w->hash = HARNESS_FNV1A_OFFSET;
	while (w->sent < w->bytes) {
		size_t len, done = 0;

		size_state = size_state * 6364136223846793005ull + 1442695040888963407ull;
		len = 1 + (size_t)((size_state >> 33) % sizeof(buf));
		if (len > w->bytes - w->sent)
			len = (size_t)(w->bytes - w->sent);
		for (size_t i = 0; i < len; i++)
			buf[i] = rp_stream_byte(w->sent + i);
		while (done < len) {
			ssize_t r = (size_state & 1) ? write(w->fd, buf + done, len - done)
						     : send(w->fd, buf + done, len - done, MSG_NOSIGNAL);

			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				w->err = r < 0 ? errno : EPIPE;
				return NULL;
			}
			done += (size_t)r;
		}
		w->hash = harness_fnv1a(w->hash, buf, len);
		w->sent += len;
	}
	if (shutdown(w->fd, SHUT_WR) < 0)
		w->err = errno;
	return NULL;
}

/*
 * good_client: a well-behaved client meant to run under the preload. One
 * blocking connection; a writer thread sends --bytes of a position-keyed
 * pattern while this thread reads the echo, checks every byte and requires
 * EOF right after the last one. No poll, no nonblocking mode.
 */
static int rp_case_good_client(struct rp_ctx *ctx, const char *name, uint64_t bytes)
{
	static uint8_t buf[65536];
	struct rp_writer writer = { .bytes = bytes };
	pthread_t thread;
	uint64_t received = 0, hash = HARNESS_FNV1A_OFFSET;
	int64_t start = rp_now_ms();
	bool ok = true;
	int fd = socket(ctx->server.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || connect(fd, (const struct sockaddr *)&ctx->server, ctx->server_len) < 0) {
		rp_fail(ctx, name, "connect: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	writer.fd = fd;
	if (pthread_create(&thread, NULL, rp_writer_main, &writer) != 0) {
		rp_fail(ctx, name, "pthread_create failed");
		close(fd);
		return -1;
	}
	for (;;) {
		ssize_t r = read(fd, buf, sizeof(buf));

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rp_fail(ctx, name, "read after %" PRIu64 " bytes: %s", received, strerror(errno));
			ok = false;
			break;
		}
		if (r == 0)
			break;
		for (ssize_t i = 0; i < r && ok; i++) {
			if (received + (uint64_t)i >= bytes) {
				rp_fail(ctx, name, "more than the %" PRIu64 " bytes sent came back", bytes);
				ok = false;
			} else if (buf[i] != rp_stream_byte(received + (uint64_t)i)) {
				rp_fail(ctx, name, "echo differs at offset %" PRIu64, received + (uint64_t)i);
				ok = false;
			}
		}
		if (!ok)
			break;
		hash = harness_fnv1a(hash, buf, (size_t)r);
		received += (uint64_t)r;
	}
	if (!ok)
		shutdown(fd, SHUT_RDWR); /* unblocks the writer */
	pthread_join(thread, NULL);
	close(fd);
	if (!ok)
		return 0;
	if (writer.err)
		rp_fail(ctx, name, "write after %" PRIu64 " bytes: %s", writer.sent, strerror(writer.err));
	else if (received != bytes)
		rp_fail(ctx, name, "EOF after %" PRIu64 " of %" PRIu64 " bytes", received, bytes);
	else if (hash != writer.hash)
		rp_fail(ctx, name, "checksum of the echo %016" PRIx64 " != sent %016" PRIx64, hash, writer.hash);
	else
		rp_pass(ctx, name, "%" PRIu64 " bytes echoed in %lld ms, fnv1a %016" PRIx64, bytes,
			(long long)(rp_now_ms() - start), hash);
	return 0;
}

/* Echo server: one detached thread per connection, plain blocking calls. */
static void *rp_echo_conn_main(void *argument)
{
	int fd = (int)(intptr_t)argument;
	static __thread uint8_t buf[65536];

	for (;;) {
		ssize_t r = recv(fd, buf, sizeof(buf), 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0 || harness_write_full(fd, buf, (size_t)r, NULL) < 0)
			break;
	}
	close(fd);
	return NULL;
}

/* Ends the server by a normal exit() (so the preload's exit-time stats are
 * printed) when SIGTERM or SIGINT arrives; both are blocked elsewhere. */
static void *rp_signal_main(void *argument)
{
	sigset_t *set = argument;
	int sig = 0;

	sigwait(set, &sig);
	fflush(stdout);
	exit(0);
	return NULL;
}

static int rp_serve(int argc, char **argv)
{
	const char *port = "0", *bind_addr = "127.0.0.1", *ready_file = NULL;
	static sigset_t stop_set;
	pthread_t thread;
	char text[32];
	unsigned bound_port;
	int fd;

	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--port") && i + 1 < argc)
			port = argv[++i];
		else if (!strcmp(argv[i], "--bind") && i + 1 < argc)
			bind_addr = argv[++i];
		else if (!strcmp(argv[i], "--ready-file") && i + 1 < argc)
			ready_file = argv[++i];
		else
			return 2;
	}
	sigemptyset(&stop_set);
	sigaddset(&stop_set, SIGTERM);
	sigaddset(&stop_set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &stop_set, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (pthread_create(&thread, NULL, rp_signal_main, &stop_set) != 0)
		return 1;

	harness_report_to_stderr("fs_rawpeer serve");
	fd = harness_listen(AF_UNSPEC, bind_addr, port, SOCK_CLOEXEC, 128);
	if (fd < 0)
		return 1;
	bound_port = harness_local_port(fd);
	printf("listening port=%u\n", bound_port);
	fflush(stdout);
	snprintf(text, sizeof(text), "%u\n", bound_port);
	if (ready_file && harness_write_file_atomically(ready_file, text) != 0) {
		fprintf(stderr, "fs_rawpeer serve: cannot write %s\n", ready_file);
		return 1;
	}
	for (;;) {
		pthread_attr_t attr;
		int cfd = accept(fd, NULL, NULL);

		if (cfd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
				if (errno == EMFILE || errno == ENFILE)
					usleep(10000);
				continue;
			}
			fprintf(stderr, "fs_rawpeer serve: accept: %s\n", strerror(errno));
			return 1;
		}
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&thread, &attr, rp_echo_conn_main, (void *)(intptr_t)cfd) != 0)
			close(cfd);
		pthread_attr_destroy(&attr);
	}
}

/* ---- command line ------------------------------------------------------ */

struct rp_case {
	const char *name;
	int (*run)(struct rp_ctx *ctx, const char *name);
};

/* In the order "all" runs them: the flood first, so that whatever rate
 * limit it trips has expired by the time the other cases need a YES. */
static const struct rp_case fs_rawpeer_cases[] = {
	{ "probe_flood", rp_case_probe_flood },
	{ "udp_garbage", rp_case_udp_garbage },
	{ "spoofed", rp_case_spoofed },
	{ "garbage_after_yes", rp_case_garbage_after_yes },
	{ "truncated_hello", rp_case_truncated_hello },
	{ "bad_crc_hello", rp_case_bad_crc_hello },
	{ "oversized_hello", rp_case_oversized_hello },
	{ "bad_address_hello", rp_case_bad_address_hello },
	{ "foreign_region_hello", rp_case_foreign_region_hello },
	{ "hello_without_probe", rp_case_hello_without_probe },
	{ "stolen_region_hello", rp_case_stolen_region_hello },
	{ "probe_storm", rp_case_probe_storm },
};
#define RP_CASE_COUNT (sizeof(fs_rawpeer_cases) / sizeof(fs_rawpeer_cases[0]))

static void rp_usage(void)
{
	fprintf(stderr,
		"usage: fs_rawpeer HOST PORT CASE [--hello-timeout-ms N] [--seed N]   (never under the preload)\n"
		"       fs_rawpeer HOST PORT good_client [--bytes N]                 (under the preload)\n"
		"       fs_rawpeer serve [--port P] [--bind ADDR] [--ready-file F]   (echo server, under the preload)\n"
		"CASE: all");
	for (size_t i = 0; i < RP_CASE_COUNT; i++)
		fprintf(stderr, " | %s", fs_rawpeer_cases[i].name);
	fprintf(stderr, "\n--hello-timeout-ms defaults to $FABSOCK_HELLO_TIMEOUT_MS, else 5000\n");
}

static int rp_parse_uint(const char *text, unsigned long max, unsigned long *out)
{
	char *end;

	errno = 0;
	*out = strtoul(text, &end, 10);
	if (errno || end == text || *end || *out > max || text[0] == '-')
		return -1;
	return 0;
}

/* A byte count with an optional K, M or G suffix (binary), 1 B..1 TiB. */
static int rp_parse_bytes(const char *text, uint64_t *out)
{
	uint64_t value;

	if (harness_parse_size(text, 1ull << 40, &value) < 0 || value == 0)
		return -1;
	*out = value;
	return 0;
}

int main(int argc, char **argv)
{
	struct rp_ctx ctx = { .hello_timeout_ms = 5000 };
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	const char *host, *port_text, *case_name, *env;
	uint64_t good_bytes = 8ull << 20;
	unsigned long v;
	bool ran = false;
	int i, rc;

	if (argc >= 2 && !strcmp(argv[1], "serve")) {
		rc = rp_serve(argc, argv);
		if (rc == 2)
			rp_usage();
		return rc;
	}
	if (argc < 4) {
		rp_usage();
		return 2;
	}
	host = argv[1];
	port_text = argv[2];
	case_name = argv[3];
	env = getenv("FABSOCK_HELLO_TIMEOUT_MS");
	if (env && rp_parse_uint(env, 600000, &v) == 0)
		ctx.hello_timeout_ms = (int)v;
	ctx.rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
	for (i = 4; i < argc; i++) {
		if (!strcmp(argv[i], "--hello-timeout-ms") && i + 1 < argc && rp_parse_uint(argv[i + 1], 600000, &v) == 0) {
			ctx.hello_timeout_ms = (int)v;
			i++;
		} else if (!strcmp(argv[i], "--seed") && i + 1 < argc && rp_parse_uint(argv[i + 1], ~0ul, &v) == 0) {
			ctx.rng = v ? v : 1;
			i++;
		} else if (!strcmp(argv[i], "--bytes") && i + 1 < argc && rp_parse_bytes(argv[i + 1], &good_bytes) == 0) {
			i++;
		} else {
			rp_usage();
			return 2;
		}
	}
	if (rp_parse_uint(port_text, 65535, &v) != 0 || v == 0) {
		fprintf(stderr, "fs_rawpeer: bad port '%s'\n", port_text);
		return 2;
	}
	ctx.port = (uint16_t)v;
	rc = getaddrinfo(host, port_text, &hints, &ai);
	if (rc != 0 || !ai) {
		fprintf(stderr, "fs_rawpeer: %s: %s\n", host, gai_strerror(rc));
		return 2;
	}
	memcpy(&ctx.server, ai->ai_addr, ai->ai_addrlen);
	ctx.server_len = ai->ai_addrlen;
	freeaddrinfo(ai);

	signal(SIGPIPE, SIG_IGN);
	alarm(RP_RUN_ALARM_SEC); /* last resort: every wait below is bounded */

	if (!strcmp(case_name, "good_client")) {
		rp_case_good_client(&ctx, case_name, good_bytes);
		ran = true;
	} else {
		printf("fs_rawpeer: seed %" PRIu64 ", hello timeout %d ms\n", ctx.rng, ctx.hello_timeout_ms);
		if (getenv("LD_PRELOAD") && strstr(getenv("LD_PRELOAD"), "fabsock"))
			printf("note: the raw cases are meant to run without the preload\n");
	}
	for (size_t c = 0; c < RP_CASE_COUNT && !ran; c++) {
		if (strcmp(case_name, "all") && strcmp(case_name, fs_rawpeer_cases[c].name))
			continue;
		if (!strcmp(case_name, "all") && !strcmp(fs_rawpeer_cases[c].name, "probe_storm"))
			continue; /* seconds of load: only when asked for (e2e_probestorm) */
		if (!strcmp(case_name, "all") && !strcmp(fs_rawpeer_cases[c].name, "stolen_region_hello"))
			continue; /* needs a live fabsock region of its user (e2e_planted) */
		fs_rawpeer_cases[c].run(&ctx, fs_rawpeer_cases[c].name);
		if (strcmp(case_name, "all"))
			ran = true;
	}
	if (!ran && strcmp(case_name, "all")) {
		fprintf(stderr, "fs_rawpeer: unknown case '%s'\n", case_name);
		rp_usage();
		return 2;
	}
	printf("fs_rawpeer: %d passed, %d failed\n", ctx.passes, ctx.fails);
	return ctx.fails ? 1 : 0;
}
