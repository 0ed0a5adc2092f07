/* SPDX-License-Identifier: MIT */
/*
 * fs_passthrough: checks that every file descriptor fabsock must not touch
 * behaves exactly as the kernel makes it behave, so the same binary gives
 * the same output with and without LD_PRELOAD=libfabsock.so. It drives UDP
 * (IPv4 and IPv6: sendto/recvfrom, connect+send/recv, sendmsg/recvmsg,
 * read/write, MSG_PEEK, truncation, FIONREAD), AF_UNIX stream, datagram and
 * seqpacket socketpairs and a named AF_UNIX listener (including SCM_RIGHTS
 * fd passing), pipes, eventfd, regular files (read/write/readv/writev/
 * pread/pwrite), poll/select/epoll on them, fcntl and ioctl, close, and TCP
 * sockets that never carry a stream. Finally it checks that libfabric was
 * never loaded into the process and that no signal handler was installed.
 *
 * Built on purpose with -O2 -D_FORTIFY_SOURCE=2: in the pt_chk_* functions
 * the buffer size is known and the length is not, so glibc routes read,
 * recv and recvfrom through __read_chk, __recv_chk and __recvfrom_chk (the
 * e2e script checks the binary imports them). Elsewhere reads go through
 * noinline helpers where the buffer size is unknown: plain read/recv.
 *
 *   fs_passthrough [--listen] [--tcp-pair] [--signals-only]
 *
 * --listen     also create a TCP listening socket on 127.0.0.1 (kept open
 *              until the end, never connected to)
 * --tcp-pair   also run a loopback TCP connection inside the process; only
 *              meaningful where offload is off (no preload, or a rule
 *              "kernel any *"), since the maps check then still applies
 * --signals-only  print the disposition of each checked signal and exit
 *
 * Signals that were already ignored when the program started (inherited
 * SIG_IGN) can be named in FS_PASSTHROUGH_IGN (comma separated, e.g.
 * "SIGINT,SIGPIPE"); every other checked signal must be SIG_DFL.
 *
 * Output: one "ok SECTION (N checks)" or "FAIL ..." line per problem, then
 * "N passed, M failed"; nothing that differs between runs (no ports, pids or
 * paths). Exit status 1 on any failure.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

static int pt_passed, pt_failed;
static int pt_section_checks, pt_section_fails;
static const char *pt_section_name;

static void pt_section(const char *name)
{
	pt_section_name = name;
	pt_section_checks = 0;
	pt_section_fails = 0;
}

static void pt_section_end(void)
{
	if (pt_section_fails == 0)
		printf("ok %s (%d checks)\n", pt_section_name, pt_section_checks);
	fflush(stdout);
}

static bool pt_check(bool cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool pt_check(bool cond, const char *fmt, ...)
{
	va_list ap;

	pt_section_checks++;
	if (cond) {
		pt_passed++;
		return true;
	}
	pt_failed++;
	pt_section_fails++;
	printf("FAIL %s: ", pt_section_name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	return false;
}

/* "returned N, errno E" for messages, with E only when N is negative. */
#define PT_RC(rc) (long)(rc), ((rc) < 0 ? strerror(errno) : "-")

/* LEN bytes of the test stream SEED (harness.h). */
static void pt_pattern(uint8_t *buf, size_t len, unsigned seed)
{
	harness_pattern_fill(seed, 0, buf, len);
}

static bool pt_fd_closed(int fd)
{
	return fcntl(fd, F_GETFD) < 0 && errno == EBADF;
}

static void pt_close(int fd, const char *what)
{
	int rc = close(fd);

	pt_check(rc == 0, "close(%s) returned %ld (%s)", what, PT_RC(rc));
	pt_check(pt_fd_closed(fd), "%s still open after close", what);
}

/* Waits (bounded) until FD is readable; true if it is. */
static bool pt_readable(int fd, int timeout_ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	return poll(&pfd, 1, timeout_ms) == 1 && (pfd.revents & POLLIN);
}

/* ---- plain (unfortified) I/O: the buffer size is unknown here ----------- */

__attribute__((noinline, noclone)) static ssize_t pt_plain_read(int fd, void *buf, size_t len)
{
	return read(fd, buf, len);
}

__attribute__((noinline, noclone)) static ssize_t pt_plain_recv(int fd, void *buf, size_t len, int flags)
{
	return recv(fd, buf, len, flags);
}

__attribute__((noinline, noclone)) static ssize_t pt_plain_recvfrom(int fd, void *buf, size_t len, int flags,
								    struct sockaddr *from, socklen_t *fromlen)
{
	return recvfrom(fd, buf, len, flags, from, fromlen);
}

/* Reads exactly LEN bytes (bounded by poll timeouts); returns bytes read. */
static size_t pt_read_full(int fd, uint8_t *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t r;

		if (!pt_readable(fd, 5000))
			break;
		r = pt_plain_read(fd, buf + got, len - got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	return got;
}

static size_t pt_write_full(int fd, const uint8_t *buf, size_t len)
{
	size_t put = 0;

	while (put < len) {
		ssize_t w = write(fd, buf + put, len - put);

		if (w <= 0)
			break;
		put += (size_t)w;
	}
	return put;
}

/* ---- fortified I/O: known buffer size, run-time length ------------------ */

#define PT_CHK_BUF 4096

/* Reads LEN (<= PT_CHK_BUF) bytes with read() -> __read_chk and compares. */
static bool pt_chk_read_expect(int fd, const uint8_t *expect, size_t len)
{
	uint8_t buf[PT_CHK_BUF];
	volatile size_t want = len; /* not a compile-time constant */
	ssize_t r;

	if (len > sizeof(buf) || !pt_readable(fd, 5000))
		return false;
	r = read(fd, buf, want);
	return r == (ssize_t)len && !memcmp(buf, expect, len);
}

static bool pt_chk_recv_expect(int fd, const uint8_t *expect, size_t len, int flags)
{
	uint8_t buf[PT_CHK_BUF];
	volatile size_t want = len;
	ssize_t r;

	if (len > sizeof(buf) || !pt_readable(fd, 5000))
		return false;
	r = recv(fd, buf, want, flags);
	return r == (ssize_t)len && !memcmp(buf, expect, len);
}

static bool pt_chk_recvfrom_expect(int fd, const uint8_t *expect, size_t len, struct sockaddr_storage *from)
{
	uint8_t buf[PT_CHK_BUF];
	volatile size_t want = len;
	socklen_t fromlen = sizeof(*from);
	ssize_t r;

	if (len > sizeof(buf) || !pt_readable(fd, 5000))
		return false;
	r = recvfrom(fd, buf, want, 0, (struct sockaddr *)from, &fromlen);
	return r == (ssize_t)len && !memcmp(buf, expect, len);
}

/* ---- fcntl / ioctl common checks ---------------------------------------- */

static void pt_fcntl_checks(int fd, const char *what)
{
	int fl = fcntl(fd, F_GETFL), fdfl, dup_fd, on;

	pt_check(fl >= 0, "%s: F_GETFL failed: %s", what, strerror(errno));
	pt_check(fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0, "%s: F_SETFL O_NONBLOCK failed", what);
	pt_check((fcntl(fd, F_GETFL) & O_NONBLOCK) != 0, "%s: O_NONBLOCK not visible in F_GETFL", what);
	pt_check(fcntl(fd, F_SETFL, fl) == 0 && (fcntl(fd, F_GETFL) & O_NONBLOCK) == (fl & O_NONBLOCK),
		 "%s: O_NONBLOCK not restored", what);
	fdfl = fcntl(fd, F_GETFD);
	pt_check(fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) == 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC),
		 "%s: FD_CLOEXEC not set", what);
	pt_check(fcntl(fd, F_SETFD, fdfl) == 0, "%s: F_SETFD restore failed", what);
	dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 100);
	pt_check(dup_fd >= 100, "%s: F_DUPFD_CLOEXEC 100 returned %d", what, dup_fd);
	if (dup_fd >= 0)
		pt_close(dup_fd, "F_DUPFD copy");
	/* FIONBIO is the ioctl twin of O_NONBLOCK. */
	on = 1;
	pt_check(ioctl(fd, FIONBIO, &on) == 0 && (fcntl(fd, F_GETFL) & O_NONBLOCK), "%s: FIONBIO 1 failed", what);
	on = 0;
	pt_check(ioctl(fd, FIONBIO, &on) == 0 && !(fcntl(fd, F_GETFL) & O_NONBLOCK), "%s: FIONBIO 0 failed", what);
}

static int pt_fionread(int fd)
{
	int n = -1;

	if (ioctl(fd, FIONREAD, &n) < 0)
		return -1;
	return n;
}

/* ---- UDP ---------------------------------------------------------------- */

static int pt_udp_bound(int family)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd = socket(family, SOCK_DGRAM, 0);

	if (fd < 0)
		return -1;
	memset(&ss, 0, sizeof(ss));
	if (family == AF_INET) {
		struct sockaddr_in *sin = (struct sockaddr_in *)&ss;

		sin->sin_family = AF_INET;
		sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		len = sizeof(*sin);
	} else {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;

		sin6->sin6_family = AF_INET6;
		sin6->sin6_addr = in6addr_loopback;
		len = sizeof(*sin6);
	}
	if (bind(fd, (struct sockaddr *)&ss, len) < 0) {
		int saved = errno;

		close(fd);
		errno = saved;
		return -1;
	}
	return fd;
}

static bool pt_same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET)
		return !memcmp(&((const struct sockaddr_in *)a)->sin_addr, &((const struct sockaddr_in *)b)->sin_addr, 4) &&
		       ((const struct sockaddr_in *)a)->sin_port == ((const struct sockaddr_in *)b)->sin_port;
	return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr, 16) &&
	       ((const struct sockaddr_in6 *)a)->sin6_port == ((const struct sockaddr_in6 *)b)->sin6_port;
}

static void pt_udp(int family, const char *name)
{
	struct sockaddr_storage a_addr, b_addr, from, peer;
	socklen_t alen = sizeof(a_addr), blen = sizeof(b_addr), flen, plen;
	uint8_t out[65000], in[65000];
	struct iovec iov[2];
	struct msghdr msg;
	ssize_t r;
	int a, b, val, rcvbuf;
	socklen_t vlen;

	pt_section(name);
	a = pt_udp_bound(family);
	if (a < 0 && (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL)) {
		/* Same on both runs: the machine has no IPv6 loopback. */
		printf("skip %s (no loopback for this family)\n", name);
		return;
	}
	b = pt_udp_bound(family);
	if (!pt_check(a >= 0 && b >= 0, "cannot bind UDP sockets: %s", strerror(errno)))
		return;
	pt_check(getsockname(a, (struct sockaddr *)&a_addr, &alen) == 0, "getsockname a");
	pt_check(getsockname(b, (struct sockaddr *)&b_addr, &blen) == 0, "getsockname b");

	/* Unconnected sendto / recvfrom, source address reported. */
	pt_pattern(out, 1000, 1);
	r = sendto(a, out, 1000, 0, (struct sockaddr *)&b_addr, blen);
	pt_check(r == 1000, "sendto returned %ld (%s)", PT_RC(r));
	pt_check(pt_readable(b, 5000), "datagram not readable");
	pt_check(pt_fionread(b) == 1000, "FIONREAD on UDP = %d, expected 1000", pt_fionread(b));
	flen = sizeof(from);
	r = pt_plain_recvfrom(b, in, sizeof(in), 0, (struct sockaddr *)&from, &flen);
	pt_check(r == 1000 && !memcmp(in, out, 1000), "recvfrom returned %ld (%s) or wrong bytes", PT_RC(r));
	pt_check(pt_same_addr(&from, &a_addr), "recvfrom source is not the sender");

	/* Largest common case: a 60000-byte datagram stays one datagram. */
	pt_pattern(out, 60000, 2);
	r = sendto(a, out, 60000, 0, (struct sockaddr *)&b_addr, blen);
	pt_check(r == 60000, "sendto 60000 returned %ld (%s)", PT_RC(r));
	pt_check(pt_readable(b, 5000), "big datagram not readable");
	r = pt_plain_recvfrom(b, in, sizeof(in), 0, NULL, NULL);
	pt_check(r == 60000 && !memcmp(in, out, 60000), "big recvfrom returned %ld (%s) or wrong bytes", PT_RC(r));

	/* Zero-length datagram. */
	r = sendto(a, out, 0, 0, (struct sockaddr *)&b_addr, blen);
	pt_check(r == 0, "zero-length sendto returned %ld (%s)", PT_RC(r));
	pt_check(pt_readable(b, 5000), "zero-length datagram not readable");
	r = pt_plain_recv(b, in, sizeof(in), 0);
	pt_check(r == 0, "zero-length recv returned %ld (%s)", PT_RC(r));

	/* connect + send / recv, and read / write on connected sockets. */
	pt_check(connect(a, (struct sockaddr *)&b_addr, blen) == 0, "connect a->b: %s", strerror(errno));
	pt_check(connect(b, (struct sockaddr *)&a_addr, alen) == 0, "connect b->a: %s", strerror(errno));
	plen = sizeof(peer);
	pt_check(getpeername(a, (struct sockaddr *)&peer, &plen) == 0 && pt_same_addr(&peer, &b_addr),
		 "getpeername after UDP connect");
	pt_pattern(out, 1500, 3);
	r = send(a, out, 1500, 0);
	pt_check(r == 1500, "send returned %ld (%s)", PT_RC(r));
	pt_check(pt_readable(b, 5000), "send not readable");
	r = pt_plain_recv(b, in, sizeof(in), 0);
	pt_check(r == 1500 && !memcmp(in, out, 1500), "recv returned %ld (%s) or wrong bytes", PT_RC(r));
	pt_pattern(out, 700, 4);
	r = write(b, out, 700);
	pt_check(r == 700, "write on UDP returned %ld (%s)", PT_RC(r));
	pt_check(pt_readable(a, 5000), "write not readable");
	r = pt_plain_read(a, in, sizeof(in));
	pt_check(r == 700 && !memcmp(in, out, 700), "read on UDP returned %ld (%s) or wrong bytes", PT_RC(r));

	/* MSG_PEEK leaves the datagram; a short buffer truncates it (MSG_TRUNC). */
	pt_pattern(out, 300, 5);
	pt_check(send(a, out, 300, 0) == 300, "send for peek");
	pt_check(pt_readable(b, 5000), "peek datagram not readable");
	r = pt_plain_recv(b, in, sizeof(in), MSG_PEEK);
	pt_check(r == 300 && !memcmp(in, out, 300), "MSG_PEEK returned %ld (%s)", PT_RC(r));
	memset(&msg, 0, sizeof(msg));
	iov[0].iov_base = in;
	iov[0].iov_len = 100;
	msg.msg_iov = iov;
	msg.msg_iovlen = 1;
	r = recvmsg(b, &msg, 0);
	pt_check(r == 100 && (msg.msg_flags & MSG_TRUNC) && !memcmp(in, out, 100),
		 "truncating recvmsg returned %ld (%s), flags 0x%x", PT_RC(r), msg.msg_flags);
	r = pt_plain_recv(b, in, sizeof(in), MSG_DONTWAIT);
	pt_check(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "rest of a truncated datagram is gone: %ld (%s)",
		 PT_RC(r));

	/* sendmsg / recvmsg with two iovecs each. */
	pt_pattern(out, 2000, 6);
	memset(&msg, 0, sizeof(msg));
	iov[0].iov_base = out;
	iov[0].iov_len = 500;
	iov[1].iov_base = out + 500;
	iov[1].iov_len = 1500;
	msg.msg_iov = iov;
	msg.msg_iovlen = 2;
	r = sendmsg(a, &msg, 0);
	pt_check(r == 2000, "sendmsg returned %ld (%s)", PT_RC(r));
	pt_check(pt_readable(b, 5000), "sendmsg not readable");
	memset(in, 0, 2000);
	memset(&msg, 0, sizeof(msg));
	iov[0].iov_base = in;
	iov[0].iov_len = 1234;
	iov[1].iov_base = in + 1234;
	iov[1].iov_len = 2000;
	msg.msg_iov = iov;
	msg.msg_iovlen = 2;
	r = recvmsg(b, &msg, 0);
	pt_check(r == 2000 && !memcmp(in, out, 2000) && !(msg.msg_flags & MSG_TRUNC), "recvmsg returned %ld (%s)",
		 PT_RC(r));

	/* Fortified paths: __recv_chk and __recvfrom_chk. */
	pt_pattern(out, 800, 7);
	pt_check(send(a, out, 800, 0) == 800, "send for __recv_chk");
	pt_check(pt_chk_recv_expect(b, out, 800, 0), "recv through __recv_chk: wrong result");
	pt_pattern(out, 900, 8);
	pt_check(send(b, out, 900, 0) == 900, "send for __recvfrom_chk");
	pt_check(pt_chk_recvfrom_expect(a, out, 900, &from) && pt_same_addr(&from, &b_addr),
		 "recvfrom through __recvfrom_chk: wrong result or source");
	pt_pattern(out, 1000, 9);
	pt_check(send(a, out, 1000, 0) == 1000, "send for __read_chk");
	pt_check(pt_chk_read_expect(b, out, 1000), "read of UDP through __read_chk: wrong result");

	/* Empty socket: nonblocking recv says EAGAIN, poll/select say not ready. */
	r = pt_plain_recv(b, in, sizeof(in), MSG_DONTWAIT);
	pt_check(r < 0 && errno == EAGAIN, "MSG_DONTWAIT on empty UDP returned %ld (%s)", PT_RC(r));
	{
		struct pollfd pfd = { .fd = b, .events = POLLIN | POLLOUT };
		struct timeval tv = { 0, 0 };
		fd_set rs, ws;

		pt_check(poll(&pfd, 1, 0) == 1 && pfd.revents == POLLOUT, "poll on empty UDP: revents 0x%x",
			 pfd.revents);
		FD_ZERO(&rs);
		FD_ZERO(&ws);
		FD_SET(b, &rs);
		FD_SET(b, &ws);
		pt_check(select(b + 1, &rs, &ws, NULL, &tv) == 1 && !FD_ISSET(b, &rs) && FD_ISSET(b, &ws),
			 "select on empty UDP");
	}

	/* Options go to the kernel untouched. */
	rcvbuf = 123456;
	pt_check(setsockopt(b, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)) == 0, "SO_RCVBUF set");
	vlen = sizeof(val);
	pt_check(getsockopt(b, SOL_SOCKET, SO_RCVBUF, &val, &vlen) == 0 && val == 2 * rcvbuf,
		 "SO_RCVBUF reads %d, kernel doubles to %d", val, 2 * rcvbuf);
	vlen = sizeof(val);
	pt_check(getsockopt(b, SOL_SOCKET, SO_TYPE, &val, &vlen) == 0 && val == SOCK_DGRAM, "SO_TYPE");
	pt_fcntl_checks(a, "UDP socket");
	pt_check(shutdown(a, SHUT_RDWR) == 0, "shutdown of a connected UDP socket: %s", strerror(errno));

	pt_close(a, "UDP socket a");
	pt_close(b, "UDP socket b");
	r = sendto(a, out, 1, 0, (struct sockaddr *)&b_addr, blen);
	pt_check(r < 0 && errno == EBADF, "sendto on a closed fd returned %ld (%s)", PT_RC(r));
	pt_section_end();
}

/* ---- AF_UNIX ------------------------------------------------------------ */

/* Sends one byte plus FD_TO_PASS over unix socket FD with SCM_RIGHTS. */
static ssize_t pt_send_fd(int fd, int fd_to_pass, const void *data, size_t len)
{
	union {
		struct cmsghdr hdr;
		char buf[CMSG_SPACE(sizeof(int))];
	} control;
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;

	memset(&control, 0, sizeof(control));
	msg.msg_control = control.buf;
	msg.msg_controllen = sizeof(control.buf);
	cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd_to_pass, sizeof(int));
	return sendmsg(fd, &msg, 0);
}

/* Receives data and one passed fd; *PASSED is -1 if none came. */
static ssize_t pt_recv_fd(int fd, void *data, size_t len, int *passed)
{
	union {
		struct cmsghdr hdr;
		char buf[CMSG_SPACE(sizeof(int))];
	} control;
	struct iovec iov = { .iov_base = data, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;
	ssize_t r;

	*passed = -1;
	msg.msg_control = control.buf;
	msg.msg_controllen = sizeof(control.buf);
	if (!pt_readable(fd, 5000))
		return -2;
	r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
	if (r < 0)
		return r;
	for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(passed, CMSG_DATA(cm), sizeof(int));
	return r;
}

/* Passes a pipe's write end from X to Y; Y writes into it; the pipe's read
 * end (kept here) must see the bytes. */
static void pt_fd_passing(int x, int y, const char *how)
{
	int pfd[2], passed = -1;
	uint8_t tag = 0x5a, got = 0, msg[32], back[32];
	ssize_t r;

	if (!pt_check(pipe(pfd) == 0, "pipe for fd passing"))
		return;
	r = pt_send_fd(x, pfd[1], &tag, 1);
	pt_check(r == 1, "%s: sendmsg SCM_RIGHTS returned %ld (%s)", how, PT_RC(r));
	r = pt_recv_fd(y, &got, 1, &passed);
	pt_check(r == 1 && got == tag, "%s: recvmsg returned %ld, byte 0x%02x", how, (long)r, got);
	if (pt_check(passed >= 0 && passed != pfd[1], "%s: no descriptor received", how)) {
		pt_check((fcntl(passed, F_GETFD) & FD_CLOEXEC) != 0, "%s: MSG_CMSG_CLOEXEC not applied", how);
		pt_pattern(msg, sizeof(msg), 20);
		pt_check(write(passed, msg, sizeof(msg)) == (ssize_t)sizeof(msg), "%s: write into passed fd", how);
		pt_check(pt_read_full(pfd[0], back, sizeof(back)) == sizeof(back) && !memcmp(back, msg, sizeof(msg)),
			 "%s: bytes written into the passed fd did not arrive", how);
		pt_close(passed, "passed fd");
	}
	pt_close(pfd[0], "pipe read end");
	pt_close(pfd[1], "pipe write end");
}

/* Stream traffic both ways: write/read, writev/readv, send/recv, peek,
 * fortified recv and read, then half-close. */
static void pt_unix_stream_traffic(int x, int y)
{
	static uint8_t out[128 * 1024], in[128 * 1024];
	struct iovec iov[3];
	ssize_t r;

	pt_pattern(out, 100000, 30);
	pt_check(pt_write_full(x, out, 100000) == 100000, "write 100000 bytes");
	pt_check(pt_read_full(y, in, 100000) == 100000 && !memcmp(in, out, 100000), "read 100000 bytes");

	pt_pattern(out, 3000, 31);
	iov[0] = (struct iovec){ out, 1 };
	iov[1] = (struct iovec){ out + 1, 999 };
	iov[2] = (struct iovec){ out + 1000, 2000 };
	r = writev(y, iov, 3);
	pt_check(r == 3000, "writev returned %ld (%s)", PT_RC(r));
	memset(in, 0, 3000);
	iov[0] = (struct iovec){ in, 1500 };
	iov[1] = (struct iovec){ in + 1500, 1500 };
	pt_check(pt_readable(x, 5000), "writev data not readable");
	r = readv(x, iov, 2);
	pt_check(r == 3000 && !memcmp(in, out, 3000), "readv returned %ld (%s)", PT_RC(r));

	pt_pattern(out, 500, 32);
	pt_check(send(x, out, 500, 0) == 500, "send on unix stream");
	pt_check(pt_readable(y, 5000), "send not readable");
	pt_check(pt_fionread(y) == 500, "FIONREAD on unix stream = %d", pt_fionread(y));
	r = pt_plain_recv(y, in, 500, MSG_PEEK);
	pt_check(r == 500 && !memcmp(in, out, 500), "MSG_PEEK on unix stream returned %ld (%s)", PT_RC(r));
	pt_check(pt_chk_recv_expect(y, out, 500, 0), "recv through __recv_chk on unix stream");

	pt_pattern(out, 2048, 33);
	pt_check(write(y, out, 2048) == 2048, "write for __read_chk");
	pt_check(pt_chk_read_expect(x, out, 2048), "read through __read_chk on unix stream");

	r = pt_plain_recv(x, in, 10, MSG_DONTWAIT);
	pt_check(r < 0 && errno == EAGAIN, "MSG_DONTWAIT on empty unix stream returned %ld (%s)", PT_RC(r));

	pt_fd_passing(x, y, "socketpair x->y");
	pt_fd_passing(y, x, "socketpair y->x");

	pt_check(shutdown(x, SHUT_WR) == 0, "shutdown SHUT_WR");
	pt_check(pt_readable(y, 5000), "EOF not readable");
	r = pt_plain_read(y, in, 10);
	pt_check(r == 0, "read after peer SHUT_WR returned %ld (%s), expected EOF", PT_RC(r));
	pt_check(write(y, "z", 1) == 1, "write towards the half-closed side still works");
	pt_check(pt_read_full(x, in, 1) == 1 && in[0] == 'z', "half-closed side still reads");
}

static void pt_unix_socketpair(void)
{
	int sv[2], val;
	socklen_t vlen = sizeof(val);
	uint8_t a[100], b[300], in[400];
	ssize_t r;

	pt_section("unix_stream_socketpair");
	if (pt_check(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair: %s", strerror(errno))) {
		pt_check(getsockopt(sv[0], SOL_SOCKET, SO_TYPE, &val, &vlen) == 0 && val == SOCK_STREAM, "SO_TYPE");
		pt_unix_stream_traffic(sv[0], sv[1]);
		pt_fcntl_checks(sv[0], "unix stream");
		pt_close(sv[0], "unix stream x");
		pt_close(sv[1], "unix stream y");
	}
	pt_section_end();

	/* Datagram and seqpacket pairs keep message boundaries. */
	static const int types[] = { SOCK_DGRAM, SOCK_SEQPACKET };
	static const char *const names[] = { "unix_dgram_socketpair", "unix_seqpacket_socketpair" };

	for (int t = 0; t < 2; t++) {
		pt_section(names[t]);
		if (!pt_check(socketpair(AF_UNIX, types[t], 0, sv) == 0, "socketpair: %s", strerror(errno))) {
			pt_section_end();
			continue;
		}
		pt_pattern(a, sizeof(a), 40);
		pt_pattern(b, sizeof(b), 41);
		pt_check(send(sv[0], a, sizeof(a), 0) == (ssize_t)sizeof(a), "send 100");
		pt_check(write(sv[0], b, sizeof(b)) == (ssize_t)sizeof(b), "write 300");
		pt_check(pt_readable(sv[1], 5000), "not readable");
		r = pt_plain_recv(sv[1], in, sizeof(in), 0);
		pt_check(r == (ssize_t)sizeof(a) && !memcmp(in, a, sizeof(a)), "first message: %ld", (long)r);
		r = pt_plain_read(sv[1], in, sizeof(in));
		pt_check(r == (ssize_t)sizeof(b) && !memcmp(in, b, sizeof(b)), "second message: %ld", (long)r);
		pt_fd_passing(sv[1], sv[0], names[t]);
		pt_close(sv[0], "pair x");
		pt_close(sv[1], "pair y");
		pt_section_end();
	}
}

static void pt_unix_named(void)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX }, peer;
	socklen_t plen = sizeof(peer);
	char file_path[] = "/tmp/fs_passthrough.XXXXXX";
	uint8_t content[5000], in[5000];
	int lfd, cfd, sfd, file_fd, passed = -1;
	uint8_t one = 1, got = 0;
	ssize_t r;

	pt_section("unix_named");
	snprintf(addr.sun_path, sizeof(addr.sun_path), "/tmp/fs_passthrough.%ld.sock", (long)getpid());
	unlink(addr.sun_path);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (!pt_check(lfd >= 0 && bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) == 0 && listen(lfd, 4) == 0,
		      "named unix listener: %s", strerror(errno))) {
		pt_section_end();
		return;
	}
	cfd = socket(AF_UNIX, SOCK_STREAM, 0);
	pt_check(cfd >= 0 && connect(cfd, (struct sockaddr *)&addr, sizeof(addr)) == 0, "connect to named socket: %s",
		 strerror(errno));
	pt_check(pt_readable(lfd, 5000), "listener not readable");
	sfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	pt_check(sfd >= 0 && (fcntl(sfd, F_GETFD) & FD_CLOEXEC), "accept4 SOCK_CLOEXEC: %s", strerror(errno));
	pt_check(getpeername(cfd, (struct sockaddr *)&peer, &plen) == 0 && !strcmp(peer.sun_path, addr.sun_path),
		 "getpeername of the named socket");
	if (sfd >= 0) {
		pt_unix_stream_traffic(cfd, sfd);

		/* Pass a regular file; the receiver reads it through the new fd. */
		file_fd = mkstemp(file_path);
		if (pt_check(file_fd >= 0, "mkstemp: %s", strerror(errno))) {
			unlink(file_path);
			pt_pattern(content, sizeof(content), 50);
			pt_check(pt_write_full(file_fd, content, sizeof(content)) == sizeof(content), "file write");
			pt_check(lseek(file_fd, 0, SEEK_SET) == 0, "lseek");
			r = pt_send_fd(sfd, file_fd, &one, 1);
			pt_check(r == 1, "sendmsg of a file fd returned %ld (%s)", PT_RC(r));
			r = pt_recv_fd(cfd, &got, 1, &passed);
			pt_check(r == 1 && got == one && passed >= 0, "recvmsg of a file fd returned %ld", (long)r);
			if (passed >= 0) {
				pt_check(pt_read_full(passed, in, sizeof(in)) == sizeof(in) && !memcmp(in, content, sizeof(in)),
					 "reading the passed file fd");
				pt_close(passed, "passed file fd");
			}
			pt_close(file_fd, "file fd");
		}
		pt_close(sfd, "accepted unix socket");
	}
	pt_close(cfd, "connected unix socket");
	pt_close(lfd, "unix listener");
	unlink(addr.sun_path);
	pt_section_end();
}

/* ---- pipes, eventfd, epoll ---------------------------------------------- */

static void pt_pipes(void)
{
	static uint8_t out[200000], in[200000];
	struct iovec iov[2];
	sigset_t pipe_set, old_set;
	struct timespec zero = { 0, 0 };
	int p[2], ep, ev;
	struct epoll_event event = { .events = EPOLLIN, .data.u64 = 0x1234 }, got_event;
	uint64_t count;
	ssize_t r;

	pt_section("pipe");
	if (!pt_check(pipe2(p, O_CLOEXEC) == 0, "pipe2: %s", strerror(errno))) {
		pt_section_end();
		return;
	}
	pt_pattern(out, 4096, 60);
	pt_check(write(p[1], out, 4096) == 4096, "pipe write");
	pt_check(pt_fionread(p[0]) == 4096, "FIONREAD on pipe = %d", pt_fionread(p[0]));
	pt_check(pt_chk_read_expect(p[0], out, 4096), "pipe read through __read_chk");

	pt_pattern(out, 3000, 61);
	iov[0] = (struct iovec){ out, 1000 };
	iov[1] = (struct iovec){ out + 1000, 2000 };
	pt_check(writev(p[1], iov, 2) == 3000, "pipe writev");
	iov[0] = (struct iovec){ in, 2999 };
	iov[1] = (struct iovec){ in + 2999, 1 };
	pt_check(readv(p[0], iov, 2) == 3000 && !memcmp(in, out, 3000), "pipe readv");

	/* More than the pipe holds: a writer child-free way is nonblocking. */
	pt_check(fcntl(p[1], F_SETFL, O_NONBLOCK) == 0, "pipe O_NONBLOCK");
	pt_pattern(out, sizeof(out), 62);
	r = write(p[1], out, sizeof(out));
	pt_check(r > 0 && r < (ssize_t)sizeof(out), "nonblocking pipe write returned %ld (%s), expected partial",
		 PT_RC(r));
	if (r > 0) {
		ssize_t again = write(p[1], out, 1);

		pt_check(again < 0 && errno == EAGAIN, "write to a full nonblocking pipe returned %ld (%s)", PT_RC(again));
		pt_check(pt_read_full(p[0], in, (size_t)r) == (size_t)r && !memcmp(in, out, (size_t)r),
			 "draining the full pipe");
	}
	pt_check(fcntl(p[0], F_SETFL, O_NONBLOCK) == 0, "read end O_NONBLOCK");
	r = pt_plain_read(p[0], in, 1);
	pt_check(r < 0 && errno == EAGAIN, "read of an empty nonblocking pipe returned %ld (%s)", PT_RC(r));
	pt_fcntl_checks(p[0], "pipe read end");

	/* epoll sees pipe readiness with the caller's data. */
	ep = epoll_create1(EPOLL_CLOEXEC);
	pt_check(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &event) == 0, "epoll_ctl on a pipe: %s", strerror(errno));
	pt_check(epoll_wait(ep, &got_event, 1, 0) == 0, "epoll reports an empty pipe ready");
	pt_check(write(p[1], "x", 1) == 1, "pipe write for epoll");
	pt_check(epoll_wait(ep, &got_event, 1, 5000) == 1 && got_event.data.u64 == 0x1234 && (got_event.events & EPOLLIN),
		 "epoll_wait on a readable pipe");
	pt_check(pt_plain_read(p[0], in, 1) == 1 && in[0] == 'x', "read after epoll");

	/* eventfd */
	ev = eventfd(0, EFD_CLOEXEC);
	if (pt_check(ev >= 0, "eventfd: %s", strerror(errno))) {
		count = 5;
		pt_check(write(ev, &count, sizeof(count)) == sizeof(count), "eventfd write");
		count = 0;
		pt_check(pt_plain_read(ev, &count, sizeof(count)) == sizeof(count) && count == 5, "eventfd read %llu",
			 (unsigned long long)count);
		pt_close(ev, "eventfd");
	}
	pt_close(ep, "epoll fd");

	/* Writing into a pipe whose read end is closed: EPIPE (SIGPIPE blocked
	 * and consumed, so the disposition is never changed). */
	pt_close(p[0], "pipe read end");
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	sigprocmask(SIG_BLOCK, &pipe_set, &old_set);
	r = write(p[1], "x", 1);
	pt_check(r < 0 && errno == EPIPE, "write to a widowed pipe returned %ld (%s)", PT_RC(r));
	pt_check(sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE, "SIGPIPE was not raised by the widowed pipe");
	sigprocmask(SIG_SETMASK, &old_set, NULL);
	pt_close(p[1], "pipe write end");

	/* EOF on a pipe whose writer closed. */
	if (pt_check(pipe(p) == 0, "second pipe")) {
		pt_check(write(p[1], "ab", 2) == 2, "write before close");
		pt_close(p[1], "writer");
		pt_check(pt_plain_read(p[0], in, 10) == 2, "read the last bytes");
		pt_check(pt_plain_read(p[0], in, 10) == 0, "EOF after the writer closed");
		pt_close(p[0], "reader");
	}
	pt_section_end();
}

/* ---- regular files ------------------------------------------------------ */

static void pt_files(void)
{
	static uint8_t out[100000], in[100000];
	char path[] = "/tmp/fs_passthrough.XXXXXX";
	struct iovec iov[3];
	struct stat st;
	int fd, fd2;
	ssize_t r;

	pt_section("regular_file");
	fd = mkstemp(path);
	if (!pt_check(fd >= 0, "mkstemp: %s", strerror(errno))) {
		pt_section_end();
		return;
	}
	pt_pattern(out, sizeof(out), 70);
	pt_check(pt_write_full(fd, out, 60000) == 60000, "file write");
	iov[0] = (struct iovec){ out + 60000, 1 };
	iov[1] = (struct iovec){ out + 60001, 19999 };
	iov[2] = (struct iovec){ out + 80000, 20000 };
	r = writev(fd, iov, 3);
	pt_check(r == 40000, "file writev returned %ld (%s)", PT_RC(r));
	pt_check(fstat(fd, &st) == 0 && st.st_size == (off_t)sizeof(out), "file size %lld", (long long)st.st_size);
	pt_check(lseek(fd, 0, SEEK_SET) == 0, "lseek 0");
	r = pt_plain_read(fd, in, 50000);
	pt_check(r == 50000 && !memcmp(in, out, 50000), "file read returned %ld (%s)", PT_RC(r));
	iov[0] = (struct iovec){ in + 50000, 25000 };
	iov[1] = (struct iovec){ in + 75000, 30000 };
	r = readv(fd, iov, 2);
	pt_check(r == 50000 && !memcmp(in, out, sizeof(out)), "file readv returned %ld (%s)", PT_RC(r));
	r = pt_plain_read(fd, in, 10);
	pt_check(r == 0, "read at EOF returned %ld (%s)", PT_RC(r));
	pt_check(lseek(fd, 4096, SEEK_SET) == 4096, "lseek 4096");
	pt_check(pt_chk_read_expect(fd, out + 4096, 4000), "file read through __read_chk");
	r = pread(fd, in, 100, 99900);
	pt_check(r == 100 && !memcmp(in, out + 99900, 100), "pread returned %ld (%s)", PT_RC(r));
	pt_check(pwrite(fd, "HELLO", 5, 10) == 5, "pwrite");
	r = pread(fd, in, 5, 10);
	pt_check(r == 5 && !memcmp(in, "HELLO", 5), "pread after pwrite");
	pt_check((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR, "F_GETFL access mode");
	pt_fcntl_checks(fd, "regular file");
	fd2 = dup(fd);
	pt_check(fd2 >= 0 && lseek(fd2, 0, SEEK_CUR) == lseek(fd, 0, SEEK_CUR), "dup shares the offset");
	if (fd2 >= 0)
		pt_close(fd2, "dup of the file");
	pt_check(ftruncate(fd, 10) == 0 && fstat(fd, &st) == 0 && st.st_size == 10, "ftruncate");
	pt_close(fd, "file");
	r = pt_plain_read(fd, in, 1);
	pt_check(r < 0 && errno == EBADF, "read on a closed fd returned %ld (%s)", PT_RC(r));
	unlink(path);

	/* /dev/zero and /dev/null through read/write. */
	fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
	if (pt_check(fd >= 0, "open /dev/zero")) {
		memset(in, 1, 4096);
		pt_check(pt_plain_read(fd, in, 4096) == 4096 && in[0] == 0 && in[4095] == 0, "/dev/zero read");
		pt_close(fd, "/dev/zero");
	}
	fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
	if (pt_check(fd >= 0, "open /dev/null")) {
		pt_check(write(fd, out, 1000) == 1000, "/dev/null write");
		pt_close(fd, "/dev/null");
	}
	pt_section_end();
}

/* ---- TCP sockets that never carry a stream ------------------------------ */

static int pt_tcp_listener(struct sockaddr_in *addr)
{
	socklen_t len = sizeof(*addr);
	int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	memset(addr, 0, sizeof(*addr));
	addr->sin_family = AF_INET;
	addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0)
		return -1;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)addr, sizeof(*addr)) < 0 || listen(fd, 8) < 0 ||
	    getsockname(fd, (struct sockaddr *)addr, &len) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static void pt_tcp_unconnected(void)
{
	int fd, val, one = 1;
	socklen_t vlen = sizeof(val);

	pt_section("tcp_never_connected");
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (pt_check(fd >= 0, "socket: %s", strerror(errno))) {
		pt_check(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0, "TCP_NODELAY");
		pt_check(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &val, &vlen) == 0 && val == 1, "TCP_NODELAY reads back");
		pt_check(send(fd, "x", 1, MSG_NOSIGNAL) < 0 && (errno == EPIPE || errno == ENOTCONN),
			 "send on an unconnected TCP socket: %s", strerror(errno));
		pt_fcntl_checks(fd, "unconnected TCP socket");
		pt_close(fd, "unconnected TCP socket");
	}
	fd = socket(AF_INET6, SOCK_STREAM, 0);
	if (fd >= 0)
		pt_close(fd, "unconnected TCP6 socket");
	pt_section_end();
}

/* A loopback TCP stream inside this process (offload must be off). */
static void pt_tcp_pair(void)
{
	static uint8_t out[65536], in[65536];
	struct sockaddr_in addr;
	int lfd, cfd, sfd;

	pt_section("tcp_pair_kernel");
	lfd = pt_tcp_listener(&addr);
	if (!pt_check(lfd >= 0, "listener: %s", strerror(errno))) {
		pt_section_end();
		return;
	}
	cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	pt_check(cfd >= 0 && connect(cfd, (struct sockaddr *)&addr, sizeof(addr)) == 0, "connect: %s", strerror(errno));
	pt_check(pt_readable(lfd, 5000), "listener not readable");
	sfd = accept(lfd, NULL, NULL);
	if (pt_check(sfd >= 0, "accept: %s", strerror(errno))) {
		pt_pattern(out, sizeof(out), 80);
		pt_check(pt_write_full(cfd, out, sizeof(out)) == sizeof(out), "client write");
		pt_check(pt_read_full(sfd, in, sizeof(in)) == sizeof(in) && !memcmp(in, out, sizeof(in)), "server read");
		pt_pattern(out, sizeof(out), 81);
		pt_check(pt_write_full(sfd, out, sizeof(out)) == sizeof(out), "server write");
		pt_check(pt_read_full(cfd, in, sizeof(in)) == sizeof(in) && !memcmp(in, out, sizeof(in)), "client read");
		pt_close(sfd, "accepted TCP socket");
	}
	pt_close(cfd, "client TCP socket");
	pt_close(lfd, "TCP listener");
	pt_section_end();
}

/* ---- what the process must not have ------------------------------------- */

static void pt_no_libfabric(void)
{
	char line[4096], first[512] = "";
	int found = 0;
	FILE *maps = fopen("/proc/self/maps", "r");

	pt_section("no_libfabric_loaded");
	if (!pt_check(maps != NULL, "cannot open /proc/self/maps")) {
		pt_section_end();
		return;
	}
	/* libfabric itself, or what loading Debian's libfabric drags in. */
	while (fgets(line, sizeof(line), maps)) {
		const char *path = strchr(line, '/');
		bool fabric = strstr(line, "libfabric") != NULL;

		if (!path || (!fabric && !strstr(line, "libinfinipath") && !strstr(line, "libpsm")))
			continue;
		line[strcspn(line, "\n")] = 0;
		if (found++ == 0 || (fabric && !strstr(first, "libfabric")))
			snprintf(first, sizeof(first), "%s", path);
	}
	fclose(maps);
	pt_check(found == 0, "mapped although nothing was offloaded: %s", first);
	pt_section_end();
}

static const struct {
	int sig;
	const char *name;
} pt_signals[] = {
	{ SIGSEGV, "SIGSEGV" }, { SIGBUS, "SIGBUS" },   { SIGILL, "SIGILL" },   { SIGFPE, "SIGFPE" },
	{ SIGINT, "SIGINT" },   { SIGTERM, "SIGTERM" }, { SIGABRT, "SIGABRT" }, { SIGPIPE, "SIGPIPE" },
};
#define PT_SIGNAL_COUNT (sizeof(pt_signals) / sizeof(pt_signals[0]))

/* "SIG_DFL", "SIG_IGN", "SANITIZER" (a handler of the sanitizer runtime this
 * binary was built with: not fabsock's, present in both runs) or
 * "HANDLER in OBJECT" (OBJECT: the file the handler lives in). */
static const char *pt_disposition(int sig)
{
	static char text[600];
	struct sigaction old;
	Dl_info info;
	void *handler;

	if (sigaction(sig, NULL, &old) < 0)
		return "ERROR";
	if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL)
		return "SIG_DFL";
	if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN)
		return "SIG_IGN";
	handler = (old.sa_flags & SA_SIGINFO) ? (void *)old.sa_sigaction : (void *)old.sa_handler;
	if (dladdr(handler, &info) && info.dli_fname) {
		if (strstr(info.dli_fname, "libasan") || strstr(info.dli_fname, "libubsan") ||
		    strstr(info.dli_fname, "libtsan"))
			return "SANITIZER";
		snprintf(text, sizeof(text), "HANDLER in %s", info.dli_fname);
		return text;
	}
	return "HANDLER";
}

static bool pt_ign_allowed(const char *name)
{
	const char *list = getenv("FS_PASSTHROUGH_IGN");
	size_t n = strlen(name);

	for (const char *p = list; p && *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (len == n && !strncmp(p, name, n))
			return true;
		p = end ? end + 1 : p + len;
	}
	return false;
}

static void pt_signal_dispositions(const char *when)
{
	char section[64];

	snprintf(section, sizeof(section), "signals_%s", when);
	pt_section(section);
	for (size_t i = 0; i < PT_SIGNAL_COUNT; i++) {
		const char *d = pt_disposition(pt_signals[i].sig);

		if (!strcmp(d, "SIG_IGN") && pt_ign_allowed(pt_signals[i].name)) {
			pt_check(true, "inherited SIG_IGN");
			continue;
		}
		pt_check(!strcmp(d, "SIG_DFL") || !strcmp(d, "SANITIZER"), "%s is %s, expected SIG_DFL",
			 pt_signals[i].name, d);
	}
	pt_section_end();
}

int main(int argc, char **argv)
{
	bool listen_too = false, tcp_pair = false;
	struct sockaddr_in listen_addr;
	int listen_fd = -1;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--listen")) {
			listen_too = true;
		} else if (!strcmp(argv[i], "--tcp-pair")) {
			tcp_pair = true;
		} else if (!strcmp(argv[i], "--signals-only")) {
			for (size_t s = 0; s < PT_SIGNAL_COUNT; s++)
				printf("%s %s\n", pt_signals[s].name, pt_disposition(pt_signals[s].sig));
			return 0;
		} else {
			fprintf(stderr, "usage: fs_passthrough [--listen] [--tcp-pair] [--signals-only]\n");
			return 2;
		}
	}
#if !defined(_FORTIFY_SOURCE) || _FORTIFY_SOURCE < 2 || !defined(__OPTIMIZE__)
	printf("note: built without -O2 -D_FORTIFY_SOURCE=2; the __*_chk paths are plain calls\n");
#endif
	pt_signal_dispositions("at_start");

	if (listen_too) {
		pt_section("tcp_listener");
		listen_fd = pt_tcp_listener(&listen_addr);
		pt_check(listen_fd >= 0, "TCP listener: %s", strerror(errno));
		pt_section_end();
	}
	pt_udp(AF_INET, "udp4");
	pt_udp(AF_INET6, "udp6");
	pt_unix_socketpair();
	pt_unix_named();
	pt_pipes();
	pt_files();
	pt_tcp_unconnected();
	if (tcp_pair)
		pt_tcp_pair();
	if (listen_fd >= 0) {
		struct pollfd pfd = { .fd = listen_fd, .events = POLLIN };

		pt_section("tcp_listener_idle");
		pt_check(poll(&pfd, 1, 0) == 0, "idle listener reported ready");
		pt_section_end();
	}

	pt_no_libfabric();
	pt_signal_dispositions("at_end");
	if (listen_fd >= 0) {
		pt_section("tcp_listener_close");
		pt_close(listen_fd, "TCP listener");
		pt_section_end();
	}
	printf("%d passed, %d failed\n", pt_passed, pt_failed);
	return pt_failed ? 1 : 0;
}
