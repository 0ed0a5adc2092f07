/* SPDX-License-Identifier: MIT */
/*
 * fs_semantics: checks one blocking-socket semantic per run, as Linux kernel
 * TCP implements it, so the same expectations can be held against a process
 * running under LD_PRELOAD=libfabsock.so. The script starts
 * `fs_semantics server PORT SCENARIO` (PORT 0 picks one; the server prints
 * `listening port=N` once it listens) and `fs_semantics client HOST PORT
 * SCENARIO`. Client and server synchronize through the connection itself
 * (one-byte "go"/"ack" messages) and every wait is bounded, by loop counts and
 * by a SIGALRM watchdog. Each process prints `PASS name` or `FAIL name:
 * detail` lines, `info name: ...` measurements and finally `connections=N`
 * (how many TCP connections it opened or accepted), and exits nonzero on any
 * failure (harness.h: the scenario table, the reporter and the watchdog).
 * Its siblings, run the same way by the same script: fs_semantics_lifecycle
 * (descriptors and processes: dup, close, exit, signals, children) and
 * fs_semantics_share (another process takes the connection over).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
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
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define SEM_ADDRESS_TEXT_SIZE 64

/* ---- helpers of these scenarios ---------------------------------------- */

/* The socket must still be in blocking mode (a call with MSG_DONTWAIT or a
 * timeout may not have changed it). */
static int sem_is_blocking(int fd)
{
	return harness_expect_nonblocking(fd, false, "the socket");
}

/* A server that sends LENGTH bytes of stream KEY in one write (after the
 * client's 'g' if WAIT_FOR_GO) and waits for the client's 'a'. */
static int sem_send_stream(int fd, uint64_t key, size_t length, bool wait_for_go)
{
	if ((wait_for_go && harness_expect_byte(fd, 'g') < 0) || harness_send_pattern(fd, key, 0, length) < 0)
		return -1;
	return harness_expect_byte(fd, 'a');
}

/* Reads until EOF: exactly LENGTH (< 8 KiB) bytes of stream KEY, then EOF. */
static int sem_recv_stream_to_eof(int fd, uint64_t key, size_t length, const char *what)
{
	unsigned char buffer[8192];
	size_t received = 0;

	for (;;) {
		ssize_t result = recv(fd, buffer + received, sizeof(buffer) - received, 0);
		if (result < 0 && errno == EINTR)
			continue;
		if (result < 0)
			return harness_fail("recv: %s after %zu bytes", strerror(errno), received);
		if (result == 0)
			break;
		received += (size_t)result;
		if (received > length)
			return harness_fail("more than %zu bytes", length);
	}
	if (received != length)
		return harness_fail("EOF after %zu bytes, expected %zu", received, length);
	return harness_pattern_check(key, 0, buffer, length, what);
}

/*
 * Moves exactly the iovecs' total, advancing on partial transfers: SENDING
 * with writev, or sendmsg (USE_MSG), else with readv, or recvmsg (USE_MSG;
 * its msg_flags must stay 0).
 */
static int sem_iov_exact(int fd, struct iovec *parts, int count, bool sending, bool use_msg)
{
	const char *call = sending ? (use_msg ? "sendmsg" : "writev") : (use_msg ? "recvmsg" : "readv");

	while (count > 0) {
		struct msghdr message = { .msg_iov = parts, .msg_iovlen = (size_t)count };
		ssize_t result;

		if (sending)
			result = use_msg ? sendmsg(fd, &message, MSG_NOSIGNAL) : writev(fd, parts, count);
		else
			result = use_msg ? recvmsg(fd, &message, 0) : readv(fd, parts, count);
		if (result > 0 && !sending && use_msg && message.msg_flags != 0)
			return harness_fail("recvmsg msg_flags 0x%x, expected 0", message.msg_flags);
		if (result < 0 && errno == EINTR)
			continue;
		if (result <= 0)
			return harness_fail("%s: %s", call,
					    result < 0 ? strerror(errno) : sending ? "returned 0" : "early EOF");
		while (count > 0 && (size_t)result >= parts->iov_len) {
			result -= (ssize_t)parts->iov_len;
			parts++;
			count--;
		}
		if (count > 0) {
			parts->iov_base = (char *)parts->iov_base + result;
			parts->iov_len -= (size_t)result;
		}
	}
	return 0;
}

/* Splits `buffer` into iovecs of the given sizes (which sum to its length). */
static void sem_split(struct iovec *parts, unsigned char *buffer, const size_t *sizes, int count)
{
	for (int i = 0; i < count; i++) {
		parts[i] = (struct iovec){ buffer, sizes[i] };
		buffer += sizes[i];
	}
}

static void sem_address_text(const struct sockaddr *address, socklen_t length, char *text)
{
	char host[INET6_ADDRSTRLEN], service[8];
	if (getnameinfo(address, length, host, sizeof(host), service, sizeof(service),
			NI_NUMERICHOST | NI_NUMERICSERV) != 0)
		snprintf(text, SEM_ADDRESS_TEXT_SIZE, "(unprintable family %d)", address->sa_family);
	else
		snprintf(text, SEM_ADDRESS_TEXT_SIZE, "%s %s", host, service);
}

/* ---- scenarios --------------------------------------------------------- */

/*
 * partial_read: the server sends 100 bytes in one write; the client's recv
 * with a 64 KiB buffer returns what has arrived (1..100 bytes) at once instead
 * of waiting for 64 KiB. The rest is read up to exactly 100 bytes.
 */
static int partial_read_server(int fd)
{
	return sem_send_stream(fd, 1, 100, false);
}

static int partial_read_client(int fd)
{
	static unsigned char buffer[65536];
	double start = harness_now_ms();
	ssize_t first = recv(fd, buffer, sizeof(buffer), 0);
	double elapsed = harness_now_ms() - start;

	if (first <= 0 || first > 100)
		return harness_fail("first recv returned %zd (%s), expected 1..100", first, first < 0 ? strerror(errno) : "");
	harness_info("first recv returned %zd bytes after %.1f ms", first, elapsed);
	if (elapsed > 2000)
		return harness_fail("first recv took %.0f ms", elapsed);
	if (harness_recv_exact(fd, buffer + first, 100 - (size_t)first) < 0 ||
	    harness_pattern_check(1, 0, buffer, 100, "data") < 0)
		return -1;
	return harness_finish_client(fd);
}

/*
 * peek: recv(MSG_PEEK) returns n > 0 bytes without consuming them: a second
 * peek returns at least the same bytes, and a plain recv of n bytes returns
 * exactly the n peeked bytes.
 */
static int peek_server(int fd)
{
	return sem_send_stream(fd, 2, 20, false);
}

static int peek_client(int fd)
{
	unsigned char first[64], second[64], consumed[64];
	ssize_t first_length = recv(fd, first, sizeof(first), MSG_PEEK);
	if (first_length <= 0 || first_length > 20)
		return harness_fail("first peek returned %zd, expected 1..20", first_length);
	ssize_t second_length = recv(fd, second, sizeof(second), MSG_PEEK);
	if (second_length < first_length || memcmp(first, second, (size_t)first_length) != 0)
		return harness_fail("second peek returned %zd bytes, not the %zd peeked before", second_length, first_length);
	ssize_t consumed_length = recv(fd, consumed, (size_t)first_length, 0);
	if (consumed_length != first_length || memcmp(first, consumed, (size_t)first_length) != 0)
		return harness_fail("recv after peek returned %zd bytes, not the %zd peeked", consumed_length, first_length);
	if (harness_recv_exact(fd, consumed + first_length, 20 - (size_t)first_length) < 0 ||
	    harness_pattern_check(2, 0, consumed, 20, "data") < 0)
		return -1;
	harness_info("peeked %zd then %zd bytes", first_length, second_length);
	return harness_finish_client(fd);
}

/*
 * waitall: the server sends 4 writes of 25 bytes 50 ms apart; one
 * recv(100, MSG_WAITALL) returns all 100 bytes.
 */
static int waitall_server(int fd)
{
	unsigned char data[100];
	harness_pattern_fill(3, 0, data, sizeof(data));
	for (int i = 0; i < 4; i++) {
		if (i)
			harness_sleep_ms(50);
		if (harness_send_all(fd, data + 25 * i, 25) < 0)
			return -1;
	}
	return harness_expect_byte(fd, 'a');
}

static int waitall_client(int fd)
{
	unsigned char buffer[100];
	double start = harness_now_ms();
	ssize_t result = recv(fd, buffer, sizeof(buffer), MSG_WAITALL);
	if (result != 100)
		return harness_fail("recv(MSG_WAITALL) returned %zd (%s), expected 100", result,
				result < 0 ? strerror(errno) : "short");
	harness_info("recv(MSG_WAITALL) took %.1f ms", harness_now_ms() - start);
	if (harness_pattern_check(3, 0, buffer, 100, "data") < 0)
		return -1;
	return harness_finish_client(fd);
}

/*
 * dontwait: recv(MSG_DONTWAIT) on a socket with nothing to read returns -1
 * with EAGAIN/EWOULDBLOCK, and leaves the socket blocking. After the client's
 * 'g' the server sends 10 bytes; recv(MSG_DONTWAIT) then returns them (polled
 * every 10 ms, for at most 5 s).
 */
static int dontwait_server(int fd)
{
	return sem_send_stream(fd, 4, 10, true);
}

static int dontwait_client(int fd)
{
	unsigned char buffer[64];
	size_t received = 0;
	ssize_t result = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
	if (result != -1 || (errno != EAGAIN && errno != EWOULDBLOCK))
		return harness_fail("recv(MSG_DONTWAIT) on an empty socket returned %zd (%s), expected -1 EAGAIN", result,
				result < 0 ? strerror(errno) : "data");
	if (sem_is_blocking(fd) < 0 || harness_send_byte(fd, 'g') < 0)
		return -1;
	for (int attempt = 0; attempt < 500 && received < 10; attempt++) {
		result = recv(fd, buffer + received, sizeof(buffer) - received, MSG_DONTWAIT);
		if (result > 0) {
			received += (size_t)result;
		} else if (result == 0) {
			return harness_fail("EOF after %zu bytes", received);
		} else if (errno == EAGAIN || errno == EWOULDBLOCK) {
			harness_sleep_ms(10);
		} else if (errno != EINTR) {
			return harness_fail("recv(MSG_DONTWAIT): %s", strerror(errno));
		}
	}
	if (received != 10)
		return harness_fail("recv(MSG_DONTWAIT) got %zu bytes in 5 s, expected 10", received);
	if (harness_pattern_check(4, 0, buffer, 10, "data") < 0 || sem_is_blocking(fd) < 0)
		return -1;
	return harness_finish_client(fd);
}

/*
 * eof_after_data: the server writes 5000 bytes and close()s at once; the
 * client reads all 5000, then recv returns 0, and 0 again (EOF is sticky,
 * also for read()).
 */
static int eof_after_data_server(int fd)
{
	unsigned char data[5000];
	harness_pattern_fill(5, 0, data, sizeof(data));
	return harness_send_all(fd, data, sizeof(data));
}

static int eof_after_data_client(int fd)
{
	unsigned char buffer[64];

	if (sem_recv_stream_to_eof(fd, 5, 5000, "data") < 0)
		return -1;
	ssize_t again = recv(fd, buffer, sizeof(buffer), 0);
	ssize_t third = read(fd, buffer, sizeof(buffer));
	if (again != 0 || third != 0)
		return harness_fail("after EOF recv returned %zd and read %zd, expected 0 and 0", again, third);
	return 0;
}

/*
 * shutdown_wr: the client sends 3000 bytes and shutdown(SHUT_WR); a further
 * send fails with EPIPE. The server reads exactly 3000 bytes then EOF, then
 * still sends a 2000-byte reply and closes; the client reads all 2000 bytes
 * then EOF. Half-close works in both directions.
 */
static int shutdown_wr_server(int fd)
{
	if (sem_recv_stream_to_eof(fd, 6, 3000, "request") < 0)
		return -1;
	return harness_send_pattern(fd, 7, 0, 2000);
}

static int shutdown_wr_client(int fd)
{
	unsigned char request[3000], reply[2000];
	harness_pattern_fill(6, 0, request, sizeof(request));
	if (harness_send_all(fd, request, sizeof(request)) < 0)
		return -1;
	if (shutdown(fd, SHUT_WR) < 0)
		return harness_fail("shutdown(SHUT_WR): %s", strerror(errno));
	ssize_t result = send(fd, "x", 1, MSG_NOSIGNAL);
	if (result != -1 || errno != EPIPE)
		return harness_fail("send after SHUT_WR returned %zd (%s), expected -1 EPIPE", result,
				result < 0 ? strerror(errno) : "sent");
	if (harness_recv_exact(fd, reply, sizeof(reply)) < 0 || harness_pattern_check(7, 0, reply, sizeof(reply), "reply") < 0)
		return -1;
	return harness_expect_eof(fd);
}

/*
 * epipe_nosignal / sigpipe: the server reads the client's 'h' and closes the
 * connection fully. The client sees EOF, then keeps writing 1000 bytes (at
 * most 200 times, 10 ms apart): the first write succeeds, as on the kernel
 * (the peer answers it with a reset), the second returns -1 EPIPE: a client
 * whose idle keep-alive connection was closed learns it from its next read,
 * not from SIGPIPE. With MSG_NOSIGNAL no
 * SIGPIPE is delivered; with plain write() and a SIGPIPE handler installed,
 * the handler runs for the failing write.
 */
static int closing_server(int fd)
{
	if (harness_expect_byte(fd, 'h') < 0)
		return -1;
	close(fd);
	harness_sleep_ms(300);
	return 0;
}

static int epipe_client(int fd, bool use_nosignal)
{
	unsigned char data[1000];
	int successes = 0;

	harness_pattern_fill(8, 0, data, sizeof(data));
	if (harness_send_byte(fd, 'h') < 0 || harness_expect_eof(fd) < 0)
		return -1;
	harness_sigpipe_count = 0;
	for (int attempt = 0; attempt < 200; attempt++) {
		int signals_before = harness_sigpipe_count;
		ssize_t result = use_nosignal ? send(fd, data, sizeof(data), MSG_NOSIGNAL) : write(fd, data, sizeof(data));
		if (result >= 0) {
			successes++;
			harness_sleep_ms(10);
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno != EPIPE)
			return harness_fail("write failed with %s, expected EPIPE", strerror(errno));
		harness_info("EPIPE after %d successful writes; SIGPIPE count %d", successes, (int)harness_sigpipe_count);
		if (successes != 1)
			return harness_fail("EPIPE after %d successful writes, expected 1 (the kernel accepts one)", successes);
		if (use_nosignal && harness_sigpipe_count != 0)
			return harness_fail("SIGPIPE delivered %d times despite MSG_NOSIGNAL", (int)harness_sigpipe_count);
		if (!use_nosignal && harness_sigpipe_count <= signals_before)
			return harness_fail("write returned EPIPE but no SIGPIPE was delivered");
		return 0;
	}
	return harness_fail("no EPIPE after %d successful writes to a closed peer", successes);
}

static int epipe_nosignal_client(int fd)
{
	return epipe_client(fd, true);
}

static int sigpipe_client(int fd)
{
	return epipe_client(fd, false);
}

/*
 * rcvtimeo: with SO_RCVTIMEO 200 ms (read back as 200 ms, +-10), recv on an
 * idle socket returns -1 EAGAIN after 150..1500 ms. Resetting the timeout to
 * 0 makes recv block again (until the server's EOF).
 */
static int rcvtimeo_server(int fd)
{
	if (harness_expect_byte(fd, 'd') < 0)
		return -1;
	return 0;
}

static int rcvtimeo_client(int fd)
{
	struct timeval timeout = { 0, 200000 }, read_back = { 0, 0 };
	socklen_t length = sizeof(read_back);
	char byte;

	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)) < 0)
		return harness_fail("setsockopt(SO_RCVTIMEO): %s", strerror(errno));
	if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &read_back, &length) < 0)
		return harness_fail("getsockopt(SO_RCVTIMEO): %s", strerror(errno));
	long read_back_ms = read_back.tv_sec * 1000 + read_back.tv_usec / 1000;
	if (read_back_ms < 190 || read_back_ms > 210)
		return harness_fail("SO_RCVTIMEO reads back as %ld ms, expected 200", read_back_ms);
	double start = harness_now_ms();
	ssize_t result = recv(fd, &byte, 1, 0);
	double elapsed = harness_now_ms() - start;
	if (result != -1 || (errno != EAGAIN && errno != EWOULDBLOCK))
		return harness_fail("recv returned %zd (%s), expected -1 EAGAIN", result, result < 0 ? strerror(errno) : "");
	harness_info("recv timed out after %.1f ms", elapsed);
	if (elapsed < 150 || elapsed > 1500)
		return harness_fail("recv timed out after %.0f ms, expected 150..1500", elapsed);
	if (sem_is_blocking(fd) < 0)
		return -1;
	timeout.tv_usec = 0;
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)) < 0)
		return harness_fail("clearing SO_RCVTIMEO: %s", strerror(errno));
	if (harness_send_byte(fd, 'd') < 0)
		return -1;
	return harness_expect_eof(fd);
}

/*
 * sndtimeo: two connections, a data one (first byte 'D') and a control one
 * (first byte 'C'). The server never reads the data connection beyond 'D'.
 * The client sets SO_SNDTIMEO 200 ms on it and writes 64 KiB chunks: after at
 * most 64 MiB / 20 s a send returns -1 EAGAIN, that call having taken
 * 150..1500 ms. The client then sends 'x' on the control connection and the
 * server closes both.
 */
static int sndtimeo_server(int first_fd)
{
	int second_fd = harness_scenario_accept();
	int data_fd = -1, control_fd = -1;
	char first_byte = 0, second_byte = 0;

	if (harness_recv_exact(first_fd, &first_byte, 1) < 0 || harness_recv_exact(second_fd, &second_byte, 1) < 0)
		goto out;
	if (first_byte == 'D' && second_byte == 'C') {
		data_fd = first_fd;
		control_fd = second_fd;
	} else if (first_byte == 'C' && second_byte == 'D') {
		data_fd = second_fd;
		control_fd = first_fd;
	} else {
		harness_fail("connections introduced themselves as '%c' and '%c'", first_byte, second_byte);
		goto out;
	}
	(void)data_fd;
	harness_expect_byte(control_fd, 'x');
out:
	close(second_fd);
	return harness_failures() ? -1 : 0;
}

static int sndtimeo_client(int data_fd)
{
	static unsigned char chunk[65536];
	struct timeval timeout = { 0, 200000 };
	uint64_t sent = 0;
	double start = harness_now_ms();
	int control_fd, result = -1;

	if (harness_send_byte(data_fd, 'D') < 0)
		return -1;
	control_fd = harness_scenario_connect();
	if (harness_send_byte(control_fd, 'C') < 0)
		goto out;
	if (setsockopt(data_fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout)) < 0) {
		harness_fail("setsockopt(SO_SNDTIMEO): %s", strerror(errno));
		goto out;
	}
	harness_pattern_fill(9, 0, chunk, sizeof(chunk));
	while (sent < (64u << 20) && harness_now_ms() - start < 20000) {
		double call_start = harness_now_ms();
		ssize_t written = send(data_fd, chunk, sizeof(chunk), MSG_NOSIGNAL);
		double call_ms = harness_now_ms() - call_start;
		if (written > 0) {
			sent += (uint64_t)written;
			continue;
		}
		if (written < 0 && errno == EINTR)
			continue;
		if (written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			harness_info("send timed out after %.1f ms, %llu bytes accepted before", call_ms,
				 (unsigned long long)sent);
			if (call_ms < 150 || call_ms > 1500)
				harness_fail("the timed-out send took %.0f ms, expected 150..1500", call_ms);
			else
				result = 0;
			goto out;
		}
		harness_fail("send returned %zd (%s), expected data or -1 EAGAIN", written,
			 written < 0 ? strerror(errno) : "0");
		goto out;
	}
	harness_fail("no EAGAIN after %llu bytes / %.0f ms", (unsigned long long)sent, harness_now_ms() - start);
out:
	if (harness_send_byte(control_fd, 'x') < 0)
		result = -1;
	harness_expect_eof(control_fd);
	close(control_fd);
	return result;
}

/*
 * so_error: getsockopt(SO_ERROR) is 0 (with optlen sizeof(int)) on both ends
 * of a healthy connection, before and after exchanging data.
 */
static int sem_check_so_error(int fd, const char *when)
{
	int error = -1;
	socklen_t length = sizeof(error);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) < 0)
		return harness_fail("getsockopt(SO_ERROR) %s: %s", when, strerror(errno));
	if (error != 0 || length != sizeof(int))
		return harness_fail("SO_ERROR %s is %d (length %u), expected 0", when, error, (unsigned)length);
	return 0;
}

static int so_error_server(int fd)
{
	if (sem_check_so_error(fd, "after accept") < 0 || harness_expect_byte(fd, 'p') < 0 || harness_send_byte(fd, 'q') < 0)
		return -1;
	if (harness_expect_eof(fd) < 0)
		return -1;
	return sem_check_so_error(fd, "after EOF");
}

static int so_error_client(int fd)
{
	if (sem_check_so_error(fd, "after connect") < 0 || harness_send_byte(fd, 'p') < 0 || harness_expect_byte(fd, 'q') < 0)
		return -1;
	return sem_check_so_error(fd, "after the exchange");
}

/*
 * iov: the client sends 1040 bytes with writev (3 iovecs: 7, 1000, 33) and
 * 4205 with sendmsg (3 iovecs: 5, 200, 4000). The server reads them with
 * readv (10, 500, 530) and recvmsg (3 iovecs, msg_flags 0), checks every byte
 * and sends all 5245 back with sendmsg then writev; the client reads them with
 * recvmsg and readv into differently cut iovecs and checks every byte.
 */
#define SEM_IOV_TOTAL 5245

static int iov_server(int fd)
{
	static unsigned char buffer[SEM_IOV_TOTAL];
	static const size_t read_first[] = { 10, 500, 530 }, read_second[] = { 1, 4000, 204 };
	static const size_t send_first[] = { 3000, 45, 200 }, send_second[] = { 1000, 999, 1 };
	struct iovec parts[3];

	sem_split(parts, buffer, read_first, 3);
	if (sem_iov_exact(fd, parts, 3, false, false) < 0)
		return -1;
	sem_split(parts, buffer + 1040, read_second, 3);
	if (sem_iov_exact(fd, parts, 3, false, true) < 0 || harness_pattern_check(10, 0, buffer, SEM_IOV_TOTAL, "request") < 0)
		return -1;
	sem_split(parts, buffer, send_first, 3);
	if (sem_iov_exact(fd, parts, 3, true, true) < 0)
		return -1;
	sem_split(parts, buffer + 3245, send_second, 3);
	if (sem_iov_exact(fd, parts, 3, true, false) < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int iov_client(int fd)
{
	static unsigned char data[SEM_IOV_TOTAL], buffer[SEM_IOV_TOTAL];
	static const size_t write_first[] = { 7, 1000, 33 }, write_second[] = { 5, 200, 4000 };
	static const size_t read_first[] = { 1, 2600, 2644 };
	struct iovec parts[3];

	harness_pattern_fill(10, 0, data, sizeof(data));
	sem_split(parts, data, write_first, 3);
	if (sem_iov_exact(fd, parts, 3, true, false) < 0)
		return -1;
	sem_split(parts, data + 1040, write_second, 3);
	if (sem_iov_exact(fd, parts, 3, true, true) < 0)
		return -1;
	sem_split(parts, buffer, read_first, 3);
	if (sem_iov_exact(fd, parts, 2, false, true) < 0) /* the first 2601 bytes via recvmsg */
		return -1;
	if (sem_iov_exact(fd, parts + 2, 1, false, false) < 0) /* the other 2644 via readv */
		return -1;
	return harness_pattern_check(10, 0, buffer, SEM_IOV_TOTAL, "echo");
}

/*
 * fionread: after the client's 'g' the server sends 1234 bytes in one write;
 * ioctl(FIONREAD), polled every 10 ms for at most 2 s, reaches exactly 1234
 * and never more; after reading them it reports 0.
 */
static int fionread_server(int fd)
{
	return sem_send_stream(fd, 11, 1234, true);
}

static int fionread_client(int fd)
{
	unsigned char buffer[1234];
	int available = -1;

	if (harness_send_byte(fd, 'g') < 0)
		return -1;
	for (int attempt = 0; attempt < 200; attempt++) {
		if (ioctl(fd, FIONREAD, &available) < 0)
			return harness_fail("ioctl(FIONREAD): %s", strerror(errno));
		if (available > 1234)
			return harness_fail("FIONREAD reports %d, more than the 1234 sent", available);
		if (available == 1234)
			break;
		harness_sleep_ms(10);
	}
	if (available != 1234)
		return harness_fail("FIONREAD reports %d after 2 s, expected 1234", available);
	if (harness_recv_exact(fd, buffer, sizeof(buffer)) < 0 || harness_pattern_check(11, 0, buffer, sizeof(buffer), "data") < 0)
		return -1;
	if (ioctl(fd, FIONREAD, &available) < 0 || available != 0)
		return harness_fail("FIONREAD reports %d after reading everything, expected 0", available);
	if (harness_send_byte(fd, 'a') < 0)
		return -1;
	return harness_expect_eof(fd);
}

/*
 * poll_queued (libpq's read loop: psql's COPY ... TO STDOUT): the server
 * sends 16 MiB in one blocking write after the client's 'g'; the client,
 * nonblocking, reads at most 16 KiB at a time and calls poll(POLLIN)
 * before every read, as libpq does while a message is incomplete, so that
 * most polls start with bytes queued and unread. A poll with bytes queued
 * (FIONREAD > 0 just before it) must return at once: more than
 * POLL_QUEUED_SLOW_MAX of them taking POLL_QUEUED_SLOW_MS or more fails (a
 * scheduling delay on a loaded host makes one slow now and then; the
 * defect this catches made nearly all of them take 250 ms). The script runs
 * it with FABSOCK_SPIN_US=0, where every wait sleeps from its first round.
 */
#define POLL_QUEUED_BYTES (16u << 20)
#define POLL_QUEUED_PIECE (16u << 10)
#define POLL_QUEUED_SLOW_MS 100.0
#define POLL_QUEUED_SLOW_MAX 3

static int poll_queued_server(int fd)
{
	return sem_send_stream(fd, 12, POLL_QUEUED_BYTES, true);
}

static int poll_queued_client(int fd)
{
	static unsigned char buffer[POLL_QUEUED_PIECE];
	double start = harness_now_ms(), slowest = 0;
	unsigned polls = 0, queued_polls = 0, slow = 0;
	size_t got = 0;
	int flags = fcntl(fd, F_GETFL);

	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return harness_fail("fcntl(O_NONBLOCK): %s", strerror(errno));
	if (harness_send_byte(fd, 'g') < 0)
		return -1;
	while (got < POLL_QUEUED_BYTES) {
		int queued = 0, revents;
		double before, took;
		ssize_t n;

		if (ioctl(fd, FIONREAD, &queued) < 0)
			return harness_fail("ioctl(FIONREAD): %s", strerror(errno));
		before = harness_now_ms();
		revents = harness_wait_fd(fd, POLLIN, 10000);
		took = harness_now_ms() - before;
		polls++;
		if (revents < 0)
			return -1;
		if (!(revents & POLLIN))
			return harness_fail("poll returned revents 0x%x after %.0f ms with %zu of %u bytes read",
					    (unsigned)revents, took, got, POLL_QUEUED_BYTES);
		if (queued > 0) {
			queued_polls++;
			slowest = took > slowest ? took : slowest;
			if (took >= POLL_QUEUED_SLOW_MS && ++slow > POLL_QUEUED_SLOW_MAX)
				return harness_fail("%u polls with bytes queued took >= %.0f ms (the last %.0f ms, "
						    "%d bytes queued before it); %zu of %u bytes read",
						    slow, POLL_QUEUED_SLOW_MS, took, queued, got, POLL_QUEUED_BYTES);
		}
		n = recv(fd, buffer, sizeof(buffer), 0);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			continue; /* poll may say readable for an end that is not there yet */
		if (n <= 0)
			return harness_fail("recv returned %zd (%s) after %zu bytes", n, n < 0 ? strerror(errno) : "EOF",
					    got);
		if (harness_pattern_check(12, got, buffer, (size_t)n, "data") < 0)
			return -1;
		got += (size_t)n;
	}
	harness_info("%u polls, %u with bytes queued (slowest %.1f ms, %u >= %.0f ms), %u bytes in %.0f ms", polls,
		     queued_polls, slowest, slow, POLL_QUEUED_SLOW_MS, POLL_QUEUED_BYTES, harness_now_ms() - start);
	if (queued_polls < 16)
		return harness_fail("only %u polls started with bytes queued: the scenario tested nothing", queued_polls);
	if (fcntl(fd, F_SETFL, flags) < 0)
		return harness_fail("fcntl(blocking): %s", strerror(errno));
	return harness_finish_client(fd);
}

/*
 * peer_kill: after a 'x'/'y' exchange the server prints `ready` and sleeps;
 * the client prints `waiting` and blocks in recv. The script kill -9's the
 * server; the client's recv must return 0 or -1 ECONNRESET (the script bounds
 * the time from the kill to the client's exit to 5 s).
 */
static int peer_kill_server(int fd)
{
	if (harness_expect_byte(fd, 'x') < 0 || harness_send_byte(fd, 'y') < 0)
		return -1;
	printf("ready\n");
	fflush(stdout);
	harness_sleep_ms(30000);
	return harness_fail("the script did not kill the server within 30 s");
}

static int peer_kill_client(int fd)
{
	char byte;
	if (harness_send_byte(fd, 'x') < 0 || harness_expect_byte(fd, 'y') < 0)
		return -1;
	printf("waiting\n");
	fflush(stdout);
	double start = harness_now_ms();
	ssize_t result;
	do
		result = recv(fd, &byte, 1, 0);
	while (result < 0 && errno == EINTR);
	harness_info("recv returned %zd (%s) after %.0f ms", result, result < 0 ? strerror(errno) : "", harness_now_ms() - start);
	if (result == 0 || (result < 0 && errno == ECONNRESET))
		return 0;
	return harness_fail("recv returned %zd (%s), expected 0 or -1 ECONNRESET", result,
			result < 0 ? strerror(errno) : "data");
}

/*
 * read_write: plain read()/write() on the socket: the client write()s 3000
 * bytes, the server read()s exactly those and write()s them back XOR 0x5a,
 * then closes; the client read()s the 3000 transformed bytes and then 0.
 */
/* read() or (WRITING) write() until LENGTH bytes moved. */
static int sem_read_write_all(int fd, unsigned char *buffer, size_t length, bool writing)
{
	size_t done = 0;
	while (done < length) {
		ssize_t result = writing ? write(fd, buffer + done, length - done) : read(fd, buffer + done, length - done);
		if (result < 0 && errno == EINTR)
			continue;
		if (result <= 0)
			return harness_fail("%s: %s after %zu bytes", writing ? "write" : "read",
					    result < 0 ? strerror(errno) : writing ? "returned 0" : "early EOF", done);
		done += (size_t)result;
	}
	return 0;
}

static int read_write_server(int fd)
{
	unsigned char buffer[3000];
	if (sem_read_write_all(fd, buffer, sizeof(buffer), false) < 0 || harness_pattern_check(12, 0, buffer, sizeof(buffer), "request") < 0)
		return -1;
	for (size_t i = 0; i < sizeof(buffer); i++)
		buffer[i] ^= 0x5a;
	return sem_read_write_all(fd, buffer, sizeof(buffer), true);
}

static int read_write_client(int fd)
{
	unsigned char data[3000], buffer[3000];
	harness_pattern_fill(12, 0, data, sizeof(data));
	if (sem_read_write_all(fd, data, sizeof(data), true) < 0 || sem_read_write_all(fd, buffer, sizeof(buffer), false) < 0)
		return -1;
	for (size_t i = 0; i < sizeof(buffer); i++)
		if (buffer[i] != (data[i] ^ 0x5a))
			return harness_fail("reply byte %zu is 0x%02x, expected 0x%02x", i, buffer[i], data[i] ^ 0x5a);
	ssize_t result = read(fd, buffer, sizeof(buffer));
	if (result != 0)
		return harness_fail("read after the reply returned %zd, expected 0 (EOF)", result);
	return 0;
}

/*
 * cork: TCP_CORK as nginx's tcp_nopush uses it, and left on. After the
 * client's 'g', the server corks (getsockopt must say 1), writes 100 and
 * 100 bytes, uncorks (getsockopt 0): the client gets the 200 bytes. Then
 * it corks, writes 50 bytes and does not uncork: the kernel sends a corked
 * partial frame after 200 ms at most, so the client gets them (within the
 * watchdog's bound) and answers 'a', which the server waits for. The
 * server requires that 'a' took at least SEM_HELD_MIN_MS from that write
 * (the kernel holds such a frame about 200 ms: 212 ms measured; a hold that
 * did not hold answers at once). (fabsock keeps the cork of an offloaded
 * stream itself: e2e_semantics checks its cork_kept counter.)
 */
static int sem_cork_set(int fd, int on)
{
	int value = -1;
	socklen_t length = sizeof(value);

	if (setsockopt(fd, IPPROTO_TCP, TCP_CORK, &on, sizeof(on)) < 0)
		return harness_fail("setsockopt(TCP_CORK, %d): %s", on, strerror(errno));
	if (getsockopt(fd, IPPROTO_TCP, TCP_CORK, &value, &length) < 0)
		return harness_fail("getsockopt(TCP_CORK): %s", strerror(errno));
	if (length != sizeof(value) || (value != 0) != (on != 0))
		return harness_fail("getsockopt(TCP_CORK) after setting %d says %d (length %u)", on, value,
				    (unsigned)length);
	return 0;
}

/* The bytes a server left held (corked, or sent with MSG_MORE last) took at
 * least this long to be answered: the kernel sends them after ~200 ms. */
#define SEM_HELD_MIN_MS 100

/* The server's end of cork and msg_more: the client's 'a' for the held bytes
 * written at START came no sooner than the kernel would send them. */
static int sem_expect_held(int fd, double start, const char *how)
{
	double took;

	if (harness_expect_byte(fd, 'a') < 0)
		return -1;
	took = harness_now_ms() - start;
	harness_info("the client answered the bytes %s %.0f ms after they were written", how, took);
	if (took < SEM_HELD_MIN_MS)
		return harness_fail("the bytes %s were answered after %.0f ms: not held (the kernel holds them ~200 ms)",
				    how, took);
	return 0;
}

/* The client's end of cork and msg_more: 200 bytes of stream KEY, then the
 * 50 held ones, answered with 'a'. */
static int sem_held_client(int fd, uint64_t key)
{
	if (harness_send_byte(fd, 'g') < 0 || harness_recv_pattern(fd, key, 0, 200, "data before the held bytes") < 0 ||
	    harness_recv_pattern(fd, key, 200, 50, "held bytes") < 0)
		return -1;
	return harness_finish_client(fd);
}

static int cork_server(int fd)
{
	double start;

	if (harness_expect_byte(fd, 'g') < 0 || sem_cork_set(fd, 1) < 0 || harness_send_pattern(fd, 40, 0, 100) < 0 ||
	    harness_send_pattern(fd, 40, 100, 100) < 0 || sem_cork_set(fd, 0) < 0)
		return -1;
	/* left corked: the bytes go within the kernel's 200 ms all the same */
	if (sem_cork_set(fd, 1) < 0)
		return -1;
	start = harness_now_ms();
	if (harness_send_pattern(fd, 40, 200, 50) < 0)
		return -1;
	return sem_expect_held(fd, start, "left corked");
}

static int cork_client(int fd)
{
	return sem_held_client(fd, 40);
}

/*
 * msg_more: MSG_MORE as TCP_CORK for one call. After the client's 'g', the
 * server sends 100 bytes with MSG_MORE and 100 without: the client gets the
 * 200. Then 50 bytes with MSG_MORE and nothing after: they arrive all the
 * same (the kernel sends them after about 200 ms: 203 ms measured) and the
 * client answers 'a', no sooner than SEM_HELD_MIN_MS. (fabsock holds the tail of an offloaded stream's MSG_MORE send:
 * e2e_semantics checks its more_held counter.)
 */
static int sem_send_more(int fd, uint64_t from, size_t length, int flags)
{
	unsigned char data[128];
	ssize_t result;

	harness_pattern_fill(41, from, data, length);
	result = send(fd, data, length, flags | MSG_NOSIGNAL);
	if (result != (ssize_t)length)
		return harness_fail("send(%zu bytes, flags 0x%x) returned %zd: %s", length, flags, result,
				    result < 0 ? strerror(errno) : "short");
	return 0;
}

static int msg_more_server(int fd)
{
	double start;

	if (harness_expect_byte(fd, 'g') < 0 || sem_send_more(fd, 0, 100, MSG_MORE) < 0 || sem_send_more(fd, 100, 100, 0) < 0)
		return -1;
	start = harness_now_ms();
	if (sem_send_more(fd, 200, 50, MSG_MORE) < 0)
		return -1;
	return sem_expect_held(fd, start, "sent with MSG_MORE last");
}

static int msg_more_client(int fd)
{
	return sem_held_client(fd, 41);
}

/*
 * getpeername: the client's getpeername equals the address it connected to;
 * the server's getpeername equals accept's address and the client's
 * getsockname (sent over as text), and the server's getsockname equals the
 * client's getpeername.
 */
static int getpeername_server(int fd)
{
	struct sockaddr_storage peer, local;
	socklen_t peer_length = sizeof(peer), local_length = sizeof(local);
	char peer_text[SEM_ADDRESS_TEXT_SIZE], local_text[SEM_ADDRESS_TEXT_SIZE] = { 0 };
	char client_said[SEM_ADDRESS_TEXT_SIZE], accepted_text[SEM_ADDRESS_TEXT_SIZE];

	if (getpeername(fd, (struct sockaddr *)&peer, &peer_length) < 0 ||
	    getsockname(fd, (struct sockaddr *)&local, &local_length) < 0)
		return harness_fail("getpeername/getsockname: %s", strerror(errno));
	sem_address_text((struct sockaddr *)&peer, peer_length, peer_text);
	sem_address_text((struct sockaddr *)&local, local_length, local_text);
	/* accept's out-parameter must be the address getpeername reports */
	sem_address_text((struct sockaddr *)&harness_accepted_peer, harness_accepted_peer_length, accepted_text);
	if (harness_accepted_peer_length != peer_length || strcmp(accepted_text, peer_text) != 0)
		harness_fail("accept returned '%s', getpeername '%s'", accepted_text, peer_text);
	if (harness_recv_exact(fd, client_said, sizeof(client_said)) < 0)
		return -1;
	client_said[SEM_ADDRESS_TEXT_SIZE - 1] = '\0';
	if (strcmp(client_said, peer_text) != 0)
		return harness_fail("getpeername says '%s', the client's getsockname says '%s'", peer_text, client_said);
	harness_info("server sees peer %s, local %s", peer_text, local_text);
	if (harness_send_all(fd, local_text, sizeof(local_text)) < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int getpeername_client(int fd)
{
	struct sockaddr_storage peer, local;
	socklen_t peer_length = sizeof(peer), local_length = sizeof(local);
	char peer_text[SEM_ADDRESS_TEXT_SIZE], connected_text[SEM_ADDRESS_TEXT_SIZE];
	char local_text[SEM_ADDRESS_TEXT_SIZE] = { 0 }, server_said[SEM_ADDRESS_TEXT_SIZE];

	if (getpeername(fd, (struct sockaddr *)&peer, &peer_length) < 0 ||
	    getsockname(fd, (struct sockaddr *)&local, &local_length) < 0)
		return harness_fail("getpeername/getsockname: %s", strerror(errno));
	sem_address_text((struct sockaddr *)&peer, peer_length, peer_text);
	sem_address_text(harness_server_address->ai_addr, harness_server_address->ai_addrlen, connected_text);
	sem_address_text((struct sockaddr *)&local, local_length, local_text);
	if (peer_length != harness_server_address->ai_addrlen || strcmp(peer_text, connected_text) != 0)
		return harness_fail("getpeername says '%s' (length %u), connect used '%s' (length %u)", peer_text,
				(unsigned)peer_length, connected_text, (unsigned)harness_server_address->ai_addrlen);
	if (harness_send_all(fd, local_text, sizeof(local_text)) < 0 || harness_recv_exact(fd, server_said, sizeof(server_said)) < 0)
		return -1;
	server_said[SEM_ADDRESS_TEXT_SIZE - 1] = '\0';
	if (strcmp(server_said, peer_text) != 0)
		return harness_fail("getpeername says '%s', the server's getsockname says '%s'", peer_text, server_said);
	harness_info("client sees peer %s, local %s", peer_text, local_text);
	return 0;
}

/*
 * peer_kill_rev: like peer_kill with the roles swapped: the server blocks
 * in recv (prints `waiting`), the script kill -9's the client (which
 * printed `ready`); the server's recv returns 0 or -1 ECONNRESET.
 */
static int peer_kill_rev_server(int fd)
{
	return peer_kill_client(fd);
}

static int peer_kill_rev_client(int fd)
{
	return peer_kill_server(fd);
}

static const struct harness_scenario scenarios[] = {
	{ "partial_read", partial_read_server, partial_read_client, 0 },
	{ "peek", peek_server, peek_client, 0 },
	{ "waitall", waitall_server, waitall_client, 0 },
	{ "dontwait", dontwait_server, dontwait_client, 0 },
	{ "eof_after_data", eof_after_data_server, eof_after_data_client, 0 },
	{ "shutdown_wr", shutdown_wr_server, shutdown_wr_client, 0 },
	{ "epipe_nosignal", closing_server, epipe_nosignal_client, 0 },
	{ "sigpipe", closing_server, sigpipe_client, 0 },
	{ "rcvtimeo", rcvtimeo_server, rcvtimeo_client, 0 },
	{ "sndtimeo", sndtimeo_server, sndtimeo_client, 0 },
	{ "so_error", so_error_server, so_error_client, 0 },
	{ "iov", iov_server, iov_client, 0 },
	{ "fionread", fionread_server, fionread_client, 0 },
	{ "peer_kill", peer_kill_server, peer_kill_client, 0 },
	{ "peer_kill_rev", peer_kill_rev_server, peer_kill_rev_client, 0 },
	{ "read_write", read_write_server, read_write_client, 0 },
	{ "getpeername", getpeername_server, getpeername_client, 0 },
	{ "poll_queued", poll_queued_server, poll_queued_client, 0 },
	{ "cork", cork_server, cork_client, 0 },
	{ "msg_more", msg_more_server, msg_more_client, 0 },
};

int main(int argc, char **argv)
{
	return harness_scenario_run("fs_semantics", scenarios, HARNESS_COUNT(scenarios), argc, argv);
}
