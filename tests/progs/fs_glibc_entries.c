/* SPDX-License-Identifier: MIT */
/*
 * fs_glibc_entries: the C library's other ways into a socket (issue 26),
 * each called by its own name so the program binds to that symbol: fcntl64
 * (what glibc >= 2.28 programs built with large-file support call for
 * fcntl: python3's socket.dup(), liblber's O_NONBLOCK), recvmmsg/sendmmsg,
 * preadv2/pwritev2, POSIX AIO (aio_write, aio_read: the stream goes back to
 * TCP first; aio_write and lio_listio at once after a nonblocking connect:
 * the connection stays on TCP); and a stream that breaks (bytes written on the kernel
 * socket behind fabsock's back, then a close) reaching the reader as
 * ECONNRESET, never as an end of stream. Run like fs_semantics (`server
 * PORT SCENARIO`, `client HOST PORT SCENARIO`, `list`; harness.h); the same
 * expectations hold for kernel TCP and for fabsock, except where a
 * scenario says what the kernel does instead.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "harness.h"

#define KEY 26

/* Whether this process runs under fabsock (what a reset looks like
 * depends on it: see control_reset). */
static bool under_fabsock(void)
{
	const char *p = getenv("LD_PRELOAD");

	return p && strstr(p, "libfabsock");
}

/*
 * fcntl64_dup: the client sends 1000 bytes, duplicates its socket with
 * fcntl64(F_DUPFD_CLOEXEC), closes the original and sends 1 MiB through the
 * duplicate (python3's socket.dup() then close()); the server checks every
 * byte of the 1000 + 1 MiB and an FNV-1a sum of them, then the usual end.
 */
#define DUP_FIRST 1000u
#define DUP_REST (1u << 20)

static int fcntl64_dup_server(int fd)
{
	static unsigned char buf[DUP_FIRST + DUP_REST];
	uint64_t sum, want;

	if (harness_recv_exact(fd, buf, sizeof(buf)) < 0)
		return harness_fail("fcntl64_dup: fewer than %u bytes arrived", DUP_FIRST + DUP_REST);
	if (harness_pattern_check(KEY, 0, buf, sizeof(buf), "fcntl64_dup data") < 0)
		return -1;
	sum = harness_fnv1a(HARNESS_FNV1A_OFFSET, buf, sizeof(buf));
	harness_pattern_fill(KEY, 0, buf, sizeof(buf));
	want = harness_fnv1a(HARNESS_FNV1A_OFFSET, buf, sizeof(buf));
	if (sum != want)
		return harness_fail("fcntl64_dup: checksum %016llx, expected %016llx", (unsigned long long)sum,
				    (unsigned long long)want);
	harness_info("fcntl64_dup: %u bytes, fnv1a %016llx", DUP_FIRST + DUP_REST, (unsigned long long)sum);
	if (harness_expect_byte(fd, 'a') < 0)
		return -1;
	return 0;
}

static int fcntl64_dup_client(int fd)
{
	int copy;

	if (harness_send_pattern(fd, KEY, 0, DUP_FIRST) < 0)
		return -1;
	copy = fcntl64(fd, F_DUPFD_CLOEXEC, 0);
	if (copy < 0)
		return harness_fail("fcntl64(F_DUPFD_CLOEXEC): %s", strerror(errno));
	if (!(fcntl64(copy, F_GETFD) & FD_CLOEXEC))
		return harness_fail("the fcntl64 duplicate has no FD_CLOEXEC");
	if (close(fd) != 0)
		return harness_fail("close of the original: %s", strerror(errno));
	if (harness_send_pattern(copy, KEY, DUP_FIRST, DUP_REST) < 0)
		return -1;
	if (harness_finish_client(copy) < 0)
		return -1;
	return close(copy) == 0 ? 0 : harness_fail("close of the duplicate: %s", strerror(errno));
}

/*
 * fcntl64_nonblock: once a byte went each way, the client's first (the
 * connection is up, and offloaded under fabsock: a server that spoke first
 * might settle it as TCP before a slow probe's answer, the fallback the
 * server-first rule makes), the client sets O_NONBLOCK with fcntl64: a recv
 * with nothing to read is -1 EAGAIN at once, not a wait. Blocking again
 * (fcntl64), it reads the byte the server sends after 200 ms.
 */
static int fcntl64_nonblock_server(int fd)
{
	if (harness_expect_byte(fd, 'y') < 0 || harness_send_byte(fd, 'x') < 0)
		return -1;
	harness_sleep_ms(200);
	if (harness_send_byte(fd, 'z') < 0 || harness_expect_byte(fd, 'a') < 0)
		return -1;
	return 0;
}

static int fcntl64_nonblock_client(int fd)
{
	char byte;
	double start;
	ssize_t n;
	int flags;

	if (harness_send_byte(fd, 'y') < 0 || harness_expect_byte(fd, 'x') < 0)
		return -1;
	flags = fcntl64(fd, F_GETFL);
	if (flags < 0 || fcntl64(fd, F_SETFL, flags | O_NONBLOCK) != 0)
		return harness_fail("fcntl64(F_SETFL, O_NONBLOCK): %s", strerror(errno));
	start = harness_now_ms();
	n = recv(fd, &byte, 1, 0);
	if (n != -1 || (errno != EAGAIN && errno != EWOULDBLOCK))
		return harness_fail("recv on an empty nonblocking socket returned %zd (%s), expected -1 EAGAIN", n,
				    n < 0 ? strerror(errno) : "data");
	if (harness_now_ms() - start > 100)
		return harness_fail("recv on an empty nonblocking socket took %.0f ms", harness_now_ms() - start);
	n = read(fd, &byte, 1);
	if (n != -1 || (errno != EAGAIN && errno != EWOULDBLOCK))
		return harness_fail("read on an empty nonblocking socket returned %zd, expected -1 EAGAIN", n);
	if (fcntl64(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
		return harness_fail("fcntl64(F_SETFL, blocking): %s", strerror(errno));
	if (harness_expect_byte(fd, 'z') < 0)
		return -1;
	return harness_finish_client(fd);
}

/*
 * mmsg: the client sends 64 KiB in batches of four messages with sendmmsg
 * (each call's count and lengths checked: a blocking socket takes them
 * whole), and one last chunk with pwritev2 at offset -1; the server reads
 * with recvmmsg(MSG_WAITFORONE) into four buffers until it has the batches,
 * then with preadv2 at offset -1, and checks every byte in order. Both
 * check that pwritev2/preadv2 at offset 0 is ESPIPE (the kernel's answer
 * for a socket). First, a nonblocking recvmmsg with nothing to read is
 * EAGAIN (the client sends 'c', then waits for the server's 's').
 */
#define MMSG_BATCHES (64u << 10)
#define MMSG_TAIL 3000u

static int mmsg_server(int fd)
{
	static unsigned char got[MMSG_BATCHES + MMSG_TAIL];
	unsigned char part[4][1500];
	size_t have = 0;
	unsigned calls = 0;
	struct iovec iov;

	{
		/* the client sends nothing after its 'c' before 's': a
		 * nonblocking recvmmsg has nothing to read, EAGAIN ('c' first:
		 * a server that spoke first could settle on TCP, the
		 * server-first rule, before a slow probe's answer) */
		struct mmsghdr one = { 0 };
		unsigned char byte;
		struct iovec b = { .iov_base = &byte, .iov_len = 1 };
		int n;

		if (harness_expect_byte(fd, 'c') < 0)
			return -1;
		one.msg_hdr.msg_iov = &b;
		one.msg_hdr.msg_iovlen = 1;
		n = recvmmsg(fd, &one, 1, MSG_DONTWAIT, NULL);
		if (n != -1 || (errno != EAGAIN && errno != EWOULDBLOCK))
			return harness_fail("recvmmsg(MSG_DONTWAIT) with nothing to read returned %d (%s)", n,
					    n < 0 ? strerror(errno) : "data");
		if (harness_send_byte(fd, 's') < 0)
			return -1;
	}

	while (have < MMSG_BATCHES) {
		struct mmsghdr vec[4];
		struct iovec iovs[4];
		int n;

		size_t room = MMSG_BATCHES - have;
		unsigned count = 0;

		/* never more room than the batches have left: the tail that
		 * follows is preadv2's */
		memset(vec, 0, sizeof(vec));
		for (int i = 0; i < 4 && room; i++) {
			iovs[i].iov_base = part[i];
			iovs[i].iov_len = room < sizeof(part[i]) ? room : sizeof(part[i]);
			room -= iovs[i].iov_len;
			vec[i].msg_hdr.msg_iov = &iovs[i];
			vec[i].msg_hdr.msg_iovlen = 1;
			count++;
		}
		n = recvmmsg(fd, vec, count, MSG_WAITFORONE, NULL);
		calls++;
		if (n < 1 || n > (int)count)
			return harness_fail("recvmmsg returned %d (%s) with %zu of %u bytes read", n,
					    n < 0 ? strerror(errno) : "count", have, MMSG_BATCHES);
		for (int i = 0; i < n; i++) {
			if (vec[i].msg_len == 0 || vec[i].msg_len > iovs[i].iov_len)
				return harness_fail("recvmmsg message %d: msg_len %u", i, vec[i].msg_len);
			if (have + vec[i].msg_len > MMSG_BATCHES)
				return harness_fail("recvmmsg read past the batches");
			memcpy(got + have, part[i], vec[i].msg_len);
			have += vec[i].msg_len;
			/* with MSG_WAITFORONE the rest are nonblocking: a short
			 * one means the socket was drained, and nothing follows */
			if (have == MMSG_BATCHES && i != n - 1)
				return harness_fail("recvmmsg: messages after the last byte");
		}
	}
	iov.iov_base = got + MMSG_BATCHES;
	iov.iov_len = MMSG_TAIL;
	if (preadv2(fd, &iov, 1, 0, 0) != -1 || errno != ESPIPE)
		return harness_fail("preadv2 at offset 0 on a socket: not ESPIPE (%s)", strerror(errno));
	for (size_t tail = 0; tail < MMSG_TAIL;) {
		ssize_t n;

		iov.iov_base = got + MMSG_BATCHES + tail;
		iov.iov_len = MMSG_TAIL - tail;
		n = preadv2(fd, &iov, 1, -1, 0);
		if (n <= 0)
			return harness_fail("preadv2 at offset -1 returned %zd (%s) after %zu of %u bytes", n,
					    n < 0 ? strerror(errno) : "EOF", tail, MMSG_TAIL);
		tail += (size_t)n;
	}
	if (harness_pattern_check(KEY, 0, got, sizeof(got), "mmsg data") < 0)
		return -1;
	harness_info("mmsg: %zu bytes in %u recvmmsg calls, then preadv2", have, calls);
	return harness_expect_byte(fd, 'a');
}

static int mmsg_client(int fd)
{
	static unsigned char data[MMSG_BATCHES + MMSG_TAIL];
	size_t sent = 0;
	struct iovec iov;
	ssize_t n;

	harness_pattern_fill(KEY, 0, data, sizeof(data));
	if (harness_send_byte(fd, 'c') < 0 || harness_expect_byte(fd, 's') < 0)
		return -1;
	while (sent < MMSG_BATCHES) {
		struct mmsghdr vec[4];
		struct iovec iovs[4];
		size_t lens[4] = { 1000, 1, 4096, 2500 }, in_batch = 0;
		unsigned count = 0;
		int k;

		memset(vec, 0, sizeof(vec));
		for (unsigned i = 0; i < 4 && sent + in_batch < MMSG_BATCHES; i++) {
			size_t len = lens[i] < MMSG_BATCHES - sent - in_batch ? lens[i] : MMSG_BATCHES - sent - in_batch;

			iovs[i].iov_base = data + sent + in_batch;
			iovs[i].iov_len = len;
			vec[i].msg_hdr.msg_iov = &iovs[i];
			vec[i].msg_hdr.msg_iovlen = 1;
			in_batch += len;
			count++;
		}
		k = sendmmsg(fd, vec, count, MSG_NOSIGNAL);
		if (k != (int)count)
			return harness_fail("sendmmsg of %u messages returned %d (%s)", count, k,
					    k < 0 ? strerror(errno) : "count");
		for (unsigned i = 0; i < count; i++)
			if (vec[i].msg_len != iovs[i].iov_len)
				return harness_fail("sendmmsg message %u: msg_len %u, expected %zu", i, vec[i].msg_len,
						    iovs[i].iov_len);
		sent += in_batch;
	}
	iov.iov_base = data + MMSG_BATCHES;
	iov.iov_len = MMSG_TAIL;
	if (pwritev2(fd, &iov, 1, 0, 0) != -1 || errno != ESPIPE)
		return harness_fail("pwritev2 at offset 0 on a socket: not ESPIPE (%s)", strerror(errno));
	n = pwritev2(fd, &iov, 1, -1, 0);
	if (n != MMSG_TAIL)
		return harness_fail("pwritev2 at offset -1 returned %zd (%s)", n, n < 0 ? strerror(errno) : "short");
	return harness_finish_client(fd);
}

/*
 * control_reset: the client sends 1000 bytes, waits for the server's 'r'
 * (it read them: under fabsock the stream is offloaded), writes 16 bytes on
 * the kernel socket with the raw system call (past every wrapper: what a
 * descriptor fabsock never saw does) and closes. Under fabsock those bytes
 * arrive on the control connection and its FIN over the fabric: the stream
 * is broken, and the server, reading only after both arrived (300 ms
 * later), must get -1 ECONNRESET, not 0; a second read is then 0, as after
 * a kernel reset. Under kernel TCP the 16 bytes are data: the server reads
 * them, then the end of stream.
 */
static const char control_garbage[16] = "not for fabsock!";

static int control_reset_server(int fd)
{
	unsigned char buf[64];
	ssize_t n;

	if (harness_recv_pattern(fd, KEY, 0, 1000, "control_reset data") < 0 || harness_send_byte(fd, 'r') < 0)
		return -1;
	harness_sleep_ms(300);
	n = recv(fd, buf, sizeof(buf), 0);
	if (!under_fabsock()) {
		if (n != (ssize_t)sizeof(control_garbage) || memcmp(buf, control_garbage, sizeof(control_garbage)))
			return harness_fail("kernel TCP: read %zd bytes, expected the client's 16", n);
		return harness_expect_eof(fd);
	}
	if (n == 0)
		return harness_fail("a broken stream read as a clean end of stream (0), expected -1 ECONNRESET");
	if (n != -1 || errno != ECONNRESET)
		return harness_fail("recv on a broken stream returned %zd (%s), expected -1 ECONNRESET", n,
				    n < 0 ? strerror(errno) : "data");
	n = recv(fd, buf, sizeof(buf), 0);
	if (n != 0)
		return harness_fail("recv after the reset returned %zd (%s), expected 0", n,
				    n < 0 ? strerror(errno) : "data");
	return 0;
}

static int control_reset_client(int fd)
{
	if (harness_send_pattern(fd, KEY, 0, 1000) < 0 || harness_expect_byte(fd, 'r') < 0)
		return -1;
	if (syscall(SYS_write, fd, control_garbage, sizeof(control_garbage)) != (long)sizeof(control_garbage))
		return harness_fail("raw write: %s", strerror(errno));
	return close(fd) == 0 ? 0 : harness_fail("close: %s", strerror(errno));
}

/*
 * aio: the client sends 64 KiB with send() (over the fabric under
 * fabsock) and waits for the server's sync byte, then sends 256 KiB with
 * aio_write and reads the server's 64 KiB answer with aio_read. glibc's
 * helper threads read and write with its internal calls, which no wrapper
 * sees: fabsock hands the stream back to TCP at aio_write (e2e_semantics
 * judges it as a hand-back scenario). Every byte is checked.
 */
#define AIO_FIRST (64u << 10)
#define AIO_REST (256u << 10)
#define AIO_ANSWER (64u << 10)

static int aio_server(int fd)
{
	if (harness_recv_pattern(fd, KEY + 5, 0, AIO_FIRST, "aio: the first bytes") < 0 ||
	    harness_send_byte(fd, 's') < 0 ||
	    harness_recv_pattern(fd, KEY + 5, AIO_FIRST, AIO_REST, "aio: the bytes of aio_write") < 0 ||
	    harness_send_pattern(fd, KEY + 6, 0, AIO_ANSWER) < 0)
		return -1;
	return harness_expect_byte(fd, 'a');
}

/* One aio request on CB, waited for (bounded): its aio_return, or -1
 * (reported); with EAGAIN_OK, the request's EAGAIN (a nonblocking socket
 * full, or not connected yet) is -EAGAIN, not reported. */
static ssize_t aio_wait_for(struct aiocb *cb, const char *what, bool eagain_ok)
{
	const struct aiocb *list[1] = { cb };
	struct timespec ts = { .tv_sec = HARNESS_PEER_WAIT_MS / 1000 };
	int err;

	while ((err = aio_error(cb)) == EINPROGRESS)
		if (aio_suspend(list, 1, &ts) < 0 && errno != EINTR)
			return harness_fail("%s: aio_suspend: %s", what, strerror(errno));
	if (err == EAGAIN && eagain_ok) {
		(void)aio_return(cb);
		return -EAGAIN;
	}
	if (err)
		return harness_fail("%s: %s", what, strerror(err));
	return aio_return(cb);
}

static ssize_t aio_wait(struct aiocb *cb, const char *what)
{
	return aio_wait_for(cb, what, false);
}

static int aio_client(int fd)
{
	static unsigned char buf[AIO_REST];
	struct aiocb cb;
	size_t done = 0;
	ssize_t n;

	if (harness_send_pattern(fd, KEY + 5, 0, AIO_FIRST) < 0 || harness_expect_byte(fd, 's') < 0)
		return -1;
	harness_pattern_fill(KEY + 5, AIO_FIRST, buf, AIO_REST);
	while (done < AIO_REST) {
		memset(&cb, 0, sizeof(cb));
		cb.aio_fildes = fd;
		cb.aio_buf = buf + done;
		cb.aio_nbytes = AIO_REST - done;
		if (aio_write(&cb) < 0)
			return harness_fail("aio_write: %s", strerror(errno));
		if ((n = aio_wait(&cb, "aio_write")) <= 0)
			return n < 0 ? -1 : harness_fail("aio_write wrote 0 bytes");
		done += (size_t)n;
	}
	for (done = 0; done < AIO_ANSWER;) {
		memset(&cb, 0, sizeof(cb));
		cb.aio_fildes = fd;
		cb.aio_buf = buf;
		cb.aio_nbytes = AIO_ANSWER - done;
		if (aio_read(&cb) < 0)
			return harness_fail("aio_read: %s", strerror(errno));
		if ((n = aio_wait(&cb, "aio_read")) <= 0)
			return n < 0 ? -1 : harness_fail("aio_read: EOF after %zu of %u bytes", done, AIO_ANSWER);
		if (harness_pattern_check(KEY + 6, done, buf, (size_t)n, "aio: the answer read by aio_read") < 0)
			return -1;
		done += (size_t)n;
	}
	return harness_finish_client(fd);
}

/*
 * aio_connecting, lio_connecting (issue 26): the client connects without
 * blocking and at once, before any poll, submits CONN_BYTES with aio_write
 * (lio_connecting: with lio_listio(LIO_NOWAIT)) while its socket is still
 * connecting as fabsock sees it (the kernel's handshake may be done or
 * not). glibc's helper thread writes past every wrapper; a request the
 * kernel answers EAGAIN (not connected yet, or full) waits for POLLOUT and
 * goes again with aio_write. The server checks every byte and echoes them;
 * the client reads the echo with recv and checks every byte. Under fabsock
 * the connection must settle as kernel TCP (no byte went in-band yet;
 * e2e_semantics judges it so): no byte lost, no HELLO in the stream.
 * aio_probing: the same with aio_write 20 ms after connect(), which
 * e2e_semantics runs with the client's probe 200 ms late and a server that
 * answers probes only in its application's calls (FABSOCK_TEST_PROBE_DELAY_MS,
 * FABSOCK_TEST_SERVICE_PROBES=0): the client then waits for its probe's
 * answer, and stays on TCP from there.
 */
#define CONN_BYTES (256u << 10)
#define CONN_ROUNDS 2000

static int aio_connecting_server(int fd)
{
	static unsigned char buf[CONN_BYTES];

	if (harness_recv_exact(fd, buf, sizeof(buf)) < 0 ||
	    harness_pattern_check(KEY + 7, 0, buf, sizeof(buf), "aio_connecting: the bytes of aio_write") < 0 ||
	    harness_send_all(fd, buf, sizeof(buf)) < 0)
		return -1;
	return harness_expect_byte(fd, 'a');
}

static int aio_connecting_with(bool lio, unsigned wait_ms)
{
	static unsigned char buf[CONN_BYTES], echo[CONN_BYTES];
	const char *what = lio ? "lio_listio" : "aio_write";
	struct aiocb cb;
	size_t done = 0;
	unsigned rounds = 0, eagain = 0;
	int fd, result = -1;

	harness_pattern_fill(KEY + 7, 0, buf, sizeof(buf)); /* (first: nothing between connect and aio_write) */
	fd = socket(harness_server_address->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return harness_fail("socket: %s", strerror(errno));
	if (connect(fd, harness_server_address->ai_addr, harness_server_address->ai_addrlen) == 0) {
		harness_info("connect returned 0 at once");
	} else if (errno != EINPROGRESS) {
		harness_fail("nonblocking connect: %s", strerror(errno));
		goto out;
	}
	harness_connections++;
	if (wait_ms)
		usleep(wait_ms * 1000u); /* (no poll: fabsock's poll would settle the socket) */
	while (done < CONN_BYTES) {
		struct aiocb *list[1] = { &cb };
		ssize_t n;

		if (++rounds > CONN_ROUNDS) {
			harness_fail("%s: %u requests, %zu of %u bytes written", what, CONN_ROUNDS, done, CONN_BYTES);
			goto out;
		}
		memset(&cb, 0, sizeof(cb));
		cb.aio_fildes = fd;
		cb.aio_buf = buf + done;
		cb.aio_nbytes = CONN_BYTES - done;
		cb.aio_lio_opcode = LIO_WRITE;
		if (lio && rounds == 1 ? lio_listio(LIO_NOWAIT, list, 1, NULL) < 0 : aio_write(&cb) < 0) {
			harness_fail("%s: %s", rounds == 1 ? what : "aio_write", strerror(errno));
			goto out;
		}
		n = aio_wait_for(&cb, what, true);
		if (n == -EAGAIN) {
			int events = harness_wait_fd(fd, POLLOUT, HARNESS_PEER_WAIT_MS);

			eagain++;
			if (events <= 0) {
				if (events == 0)
					harness_fail("%s: EAGAIN, and not writable within %d ms", what, HARNESS_PEER_WAIT_MS);
				goto out;
			}
			continue;
		}
		if (n <= 0) {
			if (n == 0)
				harness_fail("%s wrote 0 bytes", what);
			goto out;
		}
		done += (size_t)n;
	}
	harness_info("%s: %u requests, %u answered EAGAIN", what, rounds, eagain);
	if (harness_recv_exact(fd, echo, sizeof(echo)) < 0 ||
	    harness_pattern_check(KEY + 7, 0, echo, sizeof(echo), "the echo of the bytes of aio_write") < 0)
		goto out;
	result = harness_finish_client(fd);
out:
	close(fd);
	return result;
}

static int aio_connecting_client(int fd)
{
	(void)fd;
	return aio_connecting_with(false, 0);
}

static int lio_connecting_client(int fd)
{
	(void)fd;
	return aio_connecting_with(true, 0);
}

static int aio_probing_client(int fd)
{
	(void)fd;
	return aio_connecting_with(false, 20);
}

static const struct harness_scenario scenarios[] = {
	{ "aio", aio_server, aio_client, 0 },
	{ "aio_connecting", aio_connecting_server, aio_connecting_client, HARNESS_CLIENT_CONNECTS_ITSELF },
	{ "lio_connecting", aio_connecting_server, lio_connecting_client, HARNESS_CLIENT_CONNECTS_ITSELF },
	{ "aio_probing", aio_connecting_server, aio_probing_client, HARNESS_CLIENT_CONNECTS_ITSELF },
	{ "fcntl64_dup", fcntl64_dup_server, fcntl64_dup_client, HARNESS_CLIENT_CLOSES_FD },
	{ "fcntl64_nonblock", fcntl64_nonblock_server, fcntl64_nonblock_client, 0 },
	{ "mmsg", mmsg_server, mmsg_client, 0 },
	{ "control_reset", control_reset_server, control_reset_client, HARNESS_CLIENT_CLOSES_FD },
};

int main(int argc, char **argv)
{
	return harness_scenario_run("fs_glibc_entries", scenarios, HARNESS_COUNT(scenarios), argc, argv);
}
