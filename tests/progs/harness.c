/* SPDX-License-Identifier: MIT */
/*
 * The test programs' shared harness (harness.h says what it owns and which
 * output lines the scripts read). Plain POSIX and glibc only: no fabsock
 * code, so the programs behave the same with and without the preload.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- reporting ----------------------------------------------------------- */

static const char *report_name = "?";
static pid_t report_pid;              /* the process that named itself; children say their pid */
static const char *stderr_program;    /* set: FAIL lines go to stderr in the program's style */
static int failure_count;             /* atomic: any thread may fail */
static pthread_mutex_t first_failure_lock = PTHREAD_MUTEX_INITIALIZER;
static char first_failure[512];

void harness_set_name(const char *name)
{
	report_name = name;
	report_pid = getpid();
}

const char *harness_name(void)
{
	return report_name;
}

void harness_report_to_stderr(const char *program)
{
	stderr_program = program;
}

/* "<name>" or "<name> [pid N]" in a process forked after the name was set. */
static void harness_line_name(char *text, size_t size)
{
	if (report_pid && getpid() != report_pid)
		snprintf(text, size, "%s [pid %d]", report_name, (int)getpid());
	else
		snprintf(text, size, "%s", report_name);
}

/* Prints "KIND NAME: DETAIL" in one call: lines of threads never interleave. */
static void harness_print_line(const char *kind, const char *detail)
{
	char name[128];

	harness_line_name(name, sizeof(name));
	printf("%s %s: %s\n", kind, name, detail);
}

/* An info line, or (FAILURE) a FAIL line that is counted and whose detail is
 * kept if it is the first. */
static void harness_report(bool failure, const char *format, va_list args)
{
	char detail[512];

	vsnprintf(detail, sizeof(detail), format, args);
	if (!failure) {
		harness_print_line("info", detail);
		return;
	}
	if (stderr_program)
		fprintf(stderr, "%s: error: %s\n", stderr_program, detail);
	else
		harness_print_line("FAIL", detail);
	pthread_mutex_lock(&first_failure_lock);
	if (!first_failure[0])
		snprintf(first_failure, sizeof(first_failure), "%s", detail[0] ? detail : "(no detail)");
	pthread_mutex_unlock(&first_failure_lock);
	__atomic_add_fetch(&failure_count, 1, __ATOMIC_RELAXED);
}

int harness_fail(const char *format, ...)
{
	va_list args;

	va_start(args, format);
	harness_report(true, format, args);
	va_end(args);
	return -1;
}

void harness_info(const char *format, ...)
{
	va_list args;

	va_start(args, format);
	harness_report(false, format, args);
	va_end(args);
}

int harness_failures(void)
{
	return __atomic_load_n(&failure_count, __ATOMIC_RELAXED);
}

const char *harness_first_failure(void)
{
	return first_failure;
}

int harness_connections; /* atomic: threads of one scenario connect */

void harness_print_pass(void)
{
	printf("PASS %s\nconnections=%d\n", report_name, __atomic_load_n(&harness_connections, __ATOMIC_RELAXED));
	fflush(stdout);
}

/* ---- watchdog, signals and time ----------------------------------------- */

volatile sig_atomic_t harness_sigpipe_count;
static char watchdog_line[256];
static size_t watchdog_line_length;
static unsigned watchdog_seconds;
static double watchdog_start_ms;

static void harness_watchdog_fire(int signal_number)
{
	(void)signal_number;
	/* async-signal-safe: the line was formatted when the watchdog was set */
	if (write(STDOUT_FILENO, watchdog_line, watchdog_line_length) < 0)
		_exit(3);
	_exit(3);
}

int harness_set_handler(int signal_number, void (*handler)(int), int flags)
{
	struct sigaction action;

	memset(&action, 0, sizeof(action));
	action.sa_handler = handler;
	action.sa_flags = flags;
	sigemptyset(&action.sa_mask);
	return sigaction(signal_number, &action, NULL);
}

void harness_count_sigpipe(int signal_number)
{
	(void)signal_number;
	harness_sigpipe_count++;
}

void harness_watchdog_start(unsigned seconds, const char *line)
{
	if (line)
		snprintf(watchdog_line, sizeof(watchdog_line), "%s\n", line);
	else
		snprintf(watchdog_line, sizeof(watchdog_line), "FAIL %s: watchdog: still running after %u s\n",
			 report_name, seconds);
	watchdog_line_length = strlen(watchdog_line);
	watchdog_seconds = seconds;
	watchdog_start_ms = harness_now_ms();
	/* SA_RESTART spelled out: sanitizer runtimes implement signal()
	 * without it, and a scenario may need every handler restartable */
	harness_set_handler(SIGALRM, harness_watchdog_fire, SA_RESTART);
	alarm(seconds);
}

void harness_watchdog_rearm(void)
{
	double left = watchdog_seconds - (harness_now_ms() - watchdog_start_ms) / 1000;

	harness_set_handler(SIGALRM, harness_watchdog_fire, SA_RESTART);
	alarm(left < 1 ? 1 : (unsigned)left);
}

double harness_now_ms(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}

int harness_remaining_ms(double deadline)
{
	double left = deadline - harness_now_ms();

	return left <= 0 ? 0 : (int)left + 1;
}

void harness_sleep_ms(double milliseconds)
{
	struct timespec delay;

	if (milliseconds <= 0)
		return;
	delay.tv_sec = (time_t)(milliseconds / 1000);
	delay.tv_nsec = (long)((milliseconds - (double)delay.tv_sec * 1000) * 1e6);
	while (nanosleep(&delay, &delay) < 0 && errno == EINTR)
		;
}

long harness_status_kib(const char *field)
{
	char line[256];
	long value = -1;
	size_t field_length = strlen(field);
	FILE *status = fopen("/proc/self/status", "r");

	if (!status)
		return -1;
	while (fgets(line, sizeof(line), status))
		if (strncmp(line, field, field_length) == 0 && line[field_length] == ':')
			value = strtol(line + field_length + 1, NULL, 10);
	fclose(status);
	return value;
}

/* ---- files and numbers ------------------------------------------------------ */

int harness_write_file_atomically(const char *path, const char *text)
{
	char temporary[4096];
	FILE *file;

	snprintf(temporary, sizeof(temporary), "%s.tmp.%d", path, (int)getpid());
	file = fopen(temporary, "w");
	if (!file)
		return -1;
	fputs(text, file);
	if (fclose(file) != 0)
		return -1;
	return rename(temporary, path);
}

int harness_parse_size(const char *text, uint64_t max, uint64_t *value)
{
	unsigned long long number;
	uint64_t scale = 1;
	char *end;

	errno = 0;
	number = strtoull(text, &end, 10);
	if (errno || end == text || text[0] == '-' || text[0] == '+' || text[0] == ' ')
		return -1;
	switch (*end) {
	case 'k': case 'K': scale = 1ull << 10; end++; break;
	case 'm': case 'M': scale = 1ull << 20; end++; break;
	case 'g': case 'G': scale = 1ull << 30; end++; break;
	default: break;
	}
	if (scale > 1 && *end == 'i' && end[1] == 'B')
		end += 2;
	if (*end != '\0' || number > UINT64_MAX / scale || number * scale > max)
		return -1;
	*value = number * scale;
	return 0;
}

/* ---- test pattern and checksum ------------------------------------------ */

uint64_t harness_splitmix64(uint64_t value)
{
	value += 0x9E3779B97F4A7C15ull;
	value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ull;
	value = (value ^ (value >> 27)) * 0x94D049BB133111EBull;
	return value ^ (value >> 31);
}

/* The 8 bytes at offsets [8 * index, 8 * index + 8) of the stream MIXED_KEY. */
static uint64_t harness_pattern_word(uint64_t mixed_key, uint64_t index)
{
	return harness_splitmix64(mixed_key + index);
}

unsigned char harness_pattern_byte(uint64_t key, uint64_t offset)
{
	return (unsigned char)(harness_pattern_word(harness_splitmix64(key), offset >> 3) >> (8 * (offset & 7)));
}

void harness_pattern_fill(uint64_t key, uint64_t offset, void *buffer, size_t length)
{
	uint64_t mixed_key = harness_splitmix64(key);
	unsigned char *bytes = buffer;

	while (length > 0 && (offset & 7)) {
		*bytes++ = (unsigned char)(harness_pattern_word(mixed_key, offset >> 3) >> (8 * (offset & 7)));
		offset++;
		length--;
	}
	while (length >= 8) {
		uint64_t word = harness_pattern_word(mixed_key, offset >> 3);
		for (int i = 0; i < 8; i++)
			bytes[i] = (unsigned char)(word >> (8 * i));
		bytes += 8;
		offset += 8;
		length -= 8;
	}
	while (length > 0) {
		*bytes++ = (unsigned char)(harness_pattern_word(mixed_key, offset >> 3) >> (8 * (offset & 7)));
		offset++;
		length--;
	}
}

size_t harness_pattern_mismatch(uint64_t key, uint64_t offset, const void *buffer, size_t length)
{
	uint64_t mixed_key = harness_splitmix64(key), word = 0;
	const unsigned char *bytes = buffer;

	for (size_t i = 0; i < length; i++) {
		uint64_t at = offset + i;
		if (i == 0 || (at & 7) == 0)
			word = harness_pattern_word(mixed_key, at >> 3);
		if (bytes[i] != (unsigned char)(word >> (8 * (at & 7))))
			return i;
	}
	return length;
}

int harness_pattern_check(uint64_t key, uint64_t offset, const void *buffer, size_t length, const char *what)
{
	size_t at = harness_pattern_mismatch(key, offset, buffer, length);

	if (at == length)
		return 0;
	return harness_fail("%s: byte %llu is 0x%02x, expected 0x%02x", what, (unsigned long long)(offset + at),
			    ((const unsigned char *)buffer)[at], harness_pattern_byte(key, offset + at));
}

uint64_t harness_fnv1a(uint64_t hash, const void *data, size_t length)
{
	const unsigned char *bytes = data;

	for (size_t i = 0; i < length; i++) {
		hash ^= bytes[i];
		hash *= 0x100000001b3ull;
	}
	return hash;
}

/* ---- full reads and writes ---------------------------------------------- */

int harness_wait_fd(int fd, short events, int timeout_ms)
{
	double deadline = harness_now_ms() + timeout_ms;

	for (;;) {
		struct pollfd entry = { .fd = fd, .events = events };
		int result = poll(&entry, 1, harness_remaining_ms(deadline));
		if (result > 0)
			return entry.revents;
		if (result == 0)
			return 0;
		if (errno != EINTR)
			return harness_fail("poll: %s", strerror(errno));
	}
}

/* Whether FD is a blocking socket without SO_SNDTIMEO (SENDING) or
 * SO_RCVTIMEO: one on which the call never returns EAGAIN. */
static bool harness_blocking_untimed(int fd, bool sending)
{
	struct timeval timeout = { 0, 0 };
	socklen_t length = sizeof(timeout);
	int flags = fcntl(fd, F_GETFL);

	if (flags < 0 || (flags & O_NONBLOCK))
		return false;
	if (getsockopt(fd, SOL_SOCKET, sending ? SO_SNDTIMEO : SO_RCVTIMEO, &timeout, &length) != 0)
		return false;
	return timeout.tv_sec == 0 && timeout.tv_usec == 0;
}

/* One transfer loop for both directions (SENDING: send, else recv). A
 * nonblocking or timed socket's EAGAIN waits for readiness; a blocking
 * untimed one's is returned as the error it is. */
static int harness_transfer_full(int fd, void *buffer, size_t length, size_t *done_out, bool sending)
{
	double deadline = harness_now_ms() + HARNESS_PEER_WAIT_MS;
	size_t done = 0;
	int status = 0;

	while (done < length) {
		ssize_t result = sending ? send(fd, (const char *)buffer + done, length - done, MSG_NOSIGNAL)
					 : recv(fd, (char *)buffer + done, length - done, 0);
		if (result > 0) {
			done += (size_t)result;
		} else if (result == 0) {
			status = sending ? -EIO : -ENODATA;
			break;
		} else if (errno == EAGAIN || errno == EWOULDBLOCK) {
			struct pollfd entry = { .fd = fd, .events = sending ? POLLOUT : POLLIN };
			int ready;

			if (harness_blocking_untimed(fd, sending)) {
				/* the kernel's blocking call never says EAGAIN without
				 * a timeout: that is the fault under test, not a wait */
				status = -EAGAIN;
				break;
			}
			ready = poll(&entry, 1, harness_remaining_ms(deadline));
			if (ready == 0 || (ready < 0 && errno != EINTR)) {
				status = ready == 0 ? -ETIMEDOUT : -errno;
				break;
			}
		} else if (errno != EINTR) {
			status = -errno;
			break;
		}
	}
	if (done_out)
		*done_out = done;
	return status;
}

int harness_read_full(int fd, void *buffer, size_t length, size_t *done)
{
	return harness_transfer_full(fd, buffer, length, done, false);
}

int harness_write_full(int fd, const void *data, size_t length, size_t *done)
{
	return harness_transfer_full(fd, (void *)data, length, done, true);
}

int harness_recv_exact(int fd, void *buffer, size_t length)
{
	size_t done = 0;
	int result = harness_read_full(fd, buffer, length, &done);

	if (result == -ENODATA)
		return harness_fail("early EOF after %zu of %zu bytes", done, length);
	if (result == -ETIMEDOUT)
		return harness_fail("recv: nothing readable within %d ms (%zu of %zu bytes)", HARNESS_PEER_WAIT_MS,
				    done, length);
	if (result < 0)
		return harness_fail("recv: %s after %zu of %zu bytes", strerror(-result), done, length);
	return 0;
}

int harness_send_all(int fd, const void *data, size_t length)
{
	size_t done = 0;
	int result = harness_write_full(fd, data, length, &done);

	if (result == -ETIMEDOUT)
		return harness_fail("send: not writable again within %d ms (%zu of %zu bytes sent)",
				    HARNESS_PEER_WAIT_MS, done, length);
	if (result < 0)
		return harness_fail("send: %s after %zu of %zu bytes", result == -EIO ? "returned 0" : strerror(-result),
				    done, length);
	return 0;
}

int harness_send_byte(int fd, char byte)
{
	return harness_send_all(fd, &byte, 1);
}

int harness_expect_byte(int fd, char expected)
{
	char byte = 0;

	if (harness_recv_exact(fd, &byte, 1) < 0)
		return -1;
	if (byte != expected)
		return harness_fail("sync byte '%c', expected '%c'", byte, expected);
	return 0;
}

int harness_expect_eof(int fd)
{
	char byte;
	size_t done = 0;
	int result = harness_read_full(fd, &byte, 1, &done);

	if (result == -ENODATA)
		return 0;
	if (result == -ETIMEDOUT)
		return harness_fail("no EOF within %d ms", HARNESS_PEER_WAIT_MS);
	return harness_fail("expected EOF, recv returned %s", result < 0 ? strerror(-result) : "data");
}

int harness_finish_client(int fd)
{
	if (harness_send_byte(fd, 'a') < 0)
		return -1;
	return harness_expect_eof(fd);
}

/* The pattern moves in pieces of this size (a buffer per call, not per byte). */
#define HARNESS_PATTERN_PIECE (64u << 10)

/* Bytes [FROM, FROM + LENGTH) of KEY's stream, a piece at a time: sent, or
 * (WHAT, naming them in a failure, not NULL) received and checked. */
static int harness_move_pattern(int fd, uint64_t key, uint64_t from, size_t length, const char *what)
{
	unsigned char *buffer = malloc(length < HARNESS_PATTERN_PIECE ? length + 1 : HARNESS_PATTERN_PIECE);
	int result = 0;

	if (!buffer)
		return harness_fail("out of memory");
	for (size_t done = 0; done < length && result == 0;) {
		size_t piece = length - done < HARNESS_PATTERN_PIECE ? length - done : HARNESS_PATTERN_PIECE;
		if (what) {
			result = harness_recv_exact(fd, buffer, piece);
			if (result == 0)
				result = harness_pattern_check(key, from + done, buffer, piece, what);
		} else {
			harness_pattern_fill(key, from + done, buffer, piece);
			result = harness_send_all(fd, buffer, piece);
		}
		done += piece;
	}
	free(buffer);
	return result;
}

int harness_send_pattern(int fd, uint64_t key, uint64_t from, size_t length)
{
	return harness_move_pattern(fd, key, from, length, NULL);
}

int harness_recv_pattern(int fd, uint64_t key, uint64_t from, size_t length, const char *what)
{
	return harness_move_pattern(fd, key, from, length, what ? what : "data");
}

int harness_expect_nonblocking(int fd, bool nonblocking, const char *what)
{
	int flags = fcntl(fd, F_GETFL);

	if (flags < 0 || !(flags & O_NONBLOCK) != !nonblocking)
		return harness_fail("%s is not in %s mode (flags 0x%x)", what, nonblocking ? "nonblocking" : "blocking",
				    flags);
	return 0;
}

/* ---- connections ---------------------------------------------------------- */

int harness_listen(int family, const char *host, const char *port, int type_flags, int backlog)
{
	struct addrinfo hints = { .ai_family = family, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICHOST };
	struct addrinfo *address = NULL;
	int fd, one = 1, result;

	result = getaddrinfo(host, port, &hints, &address);
	if (result != 0)
		return harness_fail("listen address %s port %s: %s", host ? host : "(any)", port, gai_strerror(result));
	fd = socket(address->ai_family, SOCK_STREAM | type_flags, 0);
	if (fd < 0) {
		freeaddrinfo(address);
		return harness_fail("socket: %s", strerror(errno));
	}
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, address->ai_addr, address->ai_addrlen) < 0 || listen(fd, backlog) < 0) {
		harness_fail("listen on port %s: %s", port, strerror(errno));
		freeaddrinfo(address);
		close(fd);
		return -1;
	}
	freeaddrinfo(address);
	return fd;
}

unsigned harness_local_port(int fd)
{
	struct sockaddr_storage address;
	socklen_t length = sizeof(address);

	if (getsockname(fd, (struct sockaddr *)&address, &length) < 0)
		return 0;
	if (address.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&address)->sin6_port);
	return ntohs(((struct sockaddr_in *)&address)->sin_port);
}

struct addrinfo *harness_resolve(const char *host, const char *port, int family)
{
	struct addrinfo hints = { .ai_family = family, .ai_socktype = SOCK_STREAM };
	struct addrinfo *address = NULL;
	int result = getaddrinfo(host, port, &hints, &address);

	if (result != 0) {
		harness_fail("cannot resolve %s port %s: %s", host, port, gai_strerror(result));
		return NULL;
	}
	return address;
}

int harness_accept(int listen_fd, int timeout_ms, int flags, struct sockaddr_storage *peer, socklen_t *peer_length)
{
	int fd;

	if (timeout_ms >= 0) {
		int revents = harness_wait_fd(listen_fd, POLLIN, timeout_ms);
		if (revents < 0)
			return -1;
		if (revents == 0)
			return harness_fail("no connection to accept within %d ms", timeout_ms);
	}
	do
		fd = timeout_ms < 0 && !flags ? accept(listen_fd, (struct sockaddr *)peer, peer_length)
					       : accept4(listen_fd, (struct sockaddr *)peer, peer_length, flags);
	while (fd < 0 && errno == EINTR);
	if (fd < 0)
		return harness_fail("accept: %s", strerror(errno));
	__atomic_add_fetch(&harness_connections, 1, __ATOMIC_RELAXED);
	return fd;
}

int harness_connect(const struct addrinfo *address, int type_flags)
{
	int fd = socket(address->ai_family, SOCK_STREAM | type_flags, 0), error = -1;
	socklen_t length = sizeof(error);

	if (fd < 0)
		return harness_fail("socket: %s", strerror(errno));
	if (connect(fd, address->ai_addr, address->ai_addrlen) < 0) {
		if (!(type_flags & SOCK_NONBLOCK) || errno != EINPROGRESS) {
			harness_fail("connect: %s", strerror(errno));
			close(fd);
			return -1;
		}
		if (harness_wait_fd(fd, POLLOUT, HARNESS_PEER_WAIT_MS) <= 0) {
			harness_fail("connect did not complete within %d ms", HARNESS_PEER_WAIT_MS);
			close(fd);
			return -1;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) < 0 || error != 0) {
			harness_fail("connect: SO_ERROR %d (%s)", error, error > 0 ? strerror(error) : strerror(errno));
			close(fd);
			return -1;
		}
	}
	__atomic_add_fetch(&harness_connections, 1, __ATOMIC_RELAXED);
	return fd;
}

/* ---- children --------------------------------------------------------------- */

int harness_wait_child(pid_t pid, const char *what, int expected_signal)
{
	int status = 0;

	if (pid < 0)
		return harness_fail("%s: fork failed: %s", what, strerror(errno));
	while (waitpid(pid, &status, 0) != pid)
		if (errno != EINTR)
			return harness_fail("%s: waitpid: %s", what, strerror(errno));
	if (expected_signal ? !(WIFSIGNALED(status) && WTERMSIG(status) == expected_signal)
			    : !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
		return harness_fail("%s: child status 0x%x", what, status);
	return 0;
}

/* ---- scenario programs -------------------------------------------------- */

int harness_listen_fd = -1;
struct addrinfo *harness_server_address;
struct sockaddr_storage harness_accepted_peer;
socklen_t harness_accepted_peer_length;
static const struct harness_program *scenario_program;

static void harness_usage(const struct harness_program *program)
{
	fprintf(stderr,
		"usage: %s server PORT SCENARIO\n"
		"       %s client HOST PORT SCENARIO\n"
		"       %s list\nscenarios:",
		program->name, program->name, program->name);
	for (size_t i = 0; i < program->count; i++)
		fprintf(stderr, " %s", program->scenarios[i].name);
	fprintf(stderr, "\n");
	exit(2);
}

int harness_scenario_accept(void)
{
	if (scenario_program->nonblocking)
		return harness_accept(harness_listen_fd, HARNESS_PEER_WAIT_MS, SOCK_NONBLOCK | SOCK_CLOEXEC, NULL, NULL);
	return harness_accept(harness_listen_fd, -1, 0, NULL, NULL);
}

int harness_scenario_connect(void)
{
	return harness_connect(harness_server_address,
			       scenario_program->nonblocking ? SOCK_NONBLOCK | SOCK_CLOEXEC : 0);
}

/* The server's side: listen, print the port, accept the first connection. */
/* `tcp_info bytes_acked=A bytes_received=R bytes_retrans=X` for the
 * server's connection FD at the end of its scenario, from the kernel's
 * TCP_INFO: A + R are the payload bytes of both directions counted once
 * each (sequence space: a peer's FIN counts 1, a retransmission nothing),
 * the exact figure a test compares where the segments counted on the wire
 * (an nftables counter, which sees every retransmission again) are not
 * (e2e_semantics.sh, the hand-back scenarios). Nothing on a kernel without
 * the fields, or when FD is no TCP socket now. */
static void harness_print_tcp_info(int fd)
{
	struct tcp_info info;
	socklen_t length = sizeof(info);

	memset(&info, 0, sizeof(info));
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
	    length < offsetof(struct tcp_info, tcpi_bytes_retrans) + sizeof(info.tcpi_bytes_retrans))
		return;
	printf("tcp_info bytes_acked=%llu bytes_received=%llu bytes_retrans=%llu\n", (unsigned long long)info.tcpi_bytes_acked,
	       (unsigned long long)info.tcpi_bytes_received, (unsigned long long)info.tcpi_bytes_retrans);
	fflush(stdout);
}

static int harness_scenario_serve(const struct harness_scenario *scenario, const char *port)
{
	bool nonblocking = scenario_program->nonblocking;
	int fd = -1;

	harness_listen_fd = harness_listen(AF_INET, NULL, port, nonblocking ? SOCK_NONBLOCK | SOCK_CLOEXEC : 0, 16);
	if (harness_listen_fd < 0)
		return -2;
	printf("listening port=%u\n", harness_local_port(harness_listen_fd));
	fflush(stdout);
	if (scenario->flags & HARNESS_SERVER_ACCEPTS_ITSELF)
		return scenario->server(-1);
	harness_accepted_peer_length = sizeof(harness_accepted_peer);
	fd = nonblocking ? harness_accept(harness_listen_fd, HARNESS_PEER_WAIT_MS, SOCK_NONBLOCK | SOCK_CLOEXEC,
					  &harness_accepted_peer, &harness_accepted_peer_length)
			 : harness_accept(harness_listen_fd, -1, 0, &harness_accepted_peer, &harness_accepted_peer_length);
	if (fd < 0)
		return -2;
	if (nonblocking && harness_expect_nonblocking(fd, true, "the accepted socket") < 0) {
		close(fd);
		return -1;
	}
	int result = scenario->server(fd);
	if (!(scenario->flags & HARNESS_SERVER_CLOSES_FD)) {
		if (result == 0)
			harness_print_tcp_info(fd);
		close(fd);
	}
	return result;
}

/* The client's side: resolve, connect (unless the scenario does). */
static int harness_scenario_client(const struct harness_scenario *scenario, const char *host, const char *port)
{
	int fd = -1, result;

	harness_server_address = harness_resolve(host, port, AF_UNSPEC);
	if (!harness_server_address)
		return -2;
	if (!(scenario->flags & HARNESS_CLIENT_CONNECTS_ITSELF)) {
		fd = harness_scenario_connect();
		if (fd < 0)
			return -1;
	}
	result = scenario->client(fd);
	if (fd >= 0 && !(scenario->flags & HARNESS_CLIENT_CLOSES_FD))
		close(fd);
	return result;
}

int harness_scenario_run(const char *name, const struct harness_scenario *scenarios, size_t count, int argc,
			 char **argv)
{
	const struct harness_program program = {
		.name = name, .scenarios = scenarios, .count = count, .watchdog_seconds = HARNESS_WATCHDOG_SECONDS,
	};

	return harness_scenario_main(&program, argc, argv);
}

int harness_scenario_main(const struct harness_program *program, int argc, char **argv)
{
	const struct harness_scenario *scenario = NULL;
	bool is_server;
	int result;

	if (argc == 2 && strcmp(argv[1], "list") == 0) {
		for (size_t i = 0; i < program->count; i++)
			printf("%s\n", program->scenarios[i].name);
		return 0;
	}
	if (argc == 4 && strcmp(argv[1], "server") == 0)
		is_server = true;
	else if (argc == 5 && strcmp(argv[1], "client") == 0)
		is_server = false;
	else
		harness_usage(program);
	for (size_t i = 0; i < program->count; i++)
		if (strcmp(program->scenarios[i].name, argv[argc - 1]) == 0)
			scenario = &program->scenarios[i];
	if (!scenario)
		harness_usage(program);
	scenario_program = program;
	harness_set_name(scenario->name);
	setvbuf(stdout, NULL, _IOLBF, 0);

	/* A counting SIGPIPE handler everywhere: a stray SIGPIPE is reported, not fatal. */
	harness_set_handler(SIGPIPE, harness_count_sigpipe, 0);
	harness_watchdog_start(program->watchdog_seconds, NULL);
	if (program->setup)
		program->setup();

	result = is_server ? harness_scenario_serve(scenario, argv[2]) : harness_scenario_client(scenario, argv[2], argv[3]);
	if (program->sigpipe_fails && harness_sigpipe_count)
		harness_fail("%d SIGPIPE(s) although every send used MSG_NOSIGNAL", (int)harness_sigpipe_count);
	if (result == 0 && harness_failures() == 0)
		printf("PASS %s\n", scenario->name);
	else if (harness_failures() == 0)
		harness_fail("failed without detail");
	printf("connections=%d\n", __atomic_load_n(&harness_connections, __ATOMIC_RELAXED));
	return harness_failures() ? 1 : 0;
}
