/* SPDX-License-Identifier: MIT */
/*
 * fs_semantics_lifecycle: the descriptor and process lifecycle scenarios
 * (issue 4): dup/dup2 sharing, close with data in flight then exit,
 * SO_LINGER reset, close from another thread while one is blocked (recv,
 * epoll_wait), two threads on one socket, EINTR and SA_RESTART, children
 * that exit, are killed or exec, sendfile, splice, closefrom, exits that run
 * no atexit handler and handlers that run after fabsock's. Run like
 * fs_semantics (`server PORT SCENARIO`, `client HOST PORT SCENARIO`, `list`;
 * harness.h), on blocking sockets; the same expectations hold for kernel TCP
 * and for fabsock.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

extern char **environ;

#define SEM_BIG (4u << 20)

/*
 * dup_share: the client sends the first half of a 1 MiB stream on its fd,
 * dup()s it, closes the original and sends the second half on the
 * duplicate; the server reads it all on an F_DUPFD copy (the original
 * closed), dup2()s that onto fd 40, closes the copy and answers 'k' on fd
 * 40; the client reads 'k' on its duplicate, then a dup3(O_CLOEXEC) copy
 * reads the server's EOF.
 */
static int dup_share_server(int fd)
{
	int copy = fcntl(fd, F_DUPFD, 30), moved;

	if (copy < 30)
		return harness_fail("F_DUPFD: %s", strerror(errno));
	close(fd);
	if (harness_recv_pattern(copy, 21, 0, 1u << 20, "dup_share data") < 0)
		return -1;
	moved = dup2(copy, 40);
	if (moved != 40)
		return harness_fail("dup2: %s", strerror(errno));
	close(copy);
	if (harness_send_byte(40, 'k') < 0)
		return -1;
	return close(40) == 0 ? 0 : harness_fail("close(40): %s", strerror(errno));
}

static int dup_share_client(int fd)
{
	int copy, third;

	if (harness_send_pattern(fd, 21, 0, 1u << 19) < 0)
		return -1;
	copy = dup(fd);
	if (copy < 0)
		return harness_fail("dup: %s", strerror(errno));
	if (close(fd) != 0)
		return harness_fail("close of the original: %s", strerror(errno));
	if (harness_send_pattern(copy, 21, 1u << 19, 1u << 19) < 0 || harness_expect_byte(copy, 'k') < 0)
		return -1;
	third = dup3(copy, 45, O_CLOEXEC);
	if (third != 45)
		return harness_fail("dup3: %s", strerror(errno));
	if (!(fcntl(45, F_GETFD) & FD_CLOEXEC))
		return harness_fail("dup3(O_CLOEXEC) did not set FD_CLOEXEC");
	close(copy);
	return harness_expect_eof(45);
}

/*
 * dup2_replace: the client opens a second connection B (first byte 'B'; the
 * first connection A says 'A'), then dup2(A, B): B's connection closes (the
 * server reads its EOF) and fd B now writes on A: the 64 KiB sent on fd B
 * arrive on A, and the server's 'k' on A is read on fd B.
 */
static int dup2_replace_server(int fd)
{
	int other = harness_scenario_accept(), a = fd, b = other;
	char first = 0;

	if (harness_recv_exact(fd, &first, 1) < 0)
		return -1;
	if (first == 'B') {
		a = other;
		b = fd;
		if (harness_expect_byte(a, 'A') < 0)
			return -1;
	} else if (first != 'A' || harness_expect_byte(b, 'B') < 0) {
		return harness_fail("first bytes: '%c'", first);
	}
	if (harness_expect_eof(b) < 0 || harness_recv_pattern(a, 22, 0, 65536, "data sent on the dup2'ed fd") < 0 ||
	    harness_send_byte(a, 'k') < 0)
		return -1;
	close(other);
	return 0;
}

static int dup2_replace_client(int fd)
{
	int b = harness_scenario_connect();

	if (harness_send_byte(fd, 'A') < 0 || harness_send_byte(b, 'B') < 0)
		return -1;
	harness_sleep_ms(100);
	if (dup2(fd, b) != b)
		return harness_fail("dup2: %s", strerror(errno));
	if (harness_send_pattern(b, 22, 0, 65536) < 0 || harness_expect_byte(b, 'k') < 0)
		return -1;
	close(b);
	return 0;
}

/*
 * close_exit: the client writes 4 MiB, closes and exits at once; the server
 * starts reading only 300 ms later and must get every byte, then EOF (TCP
 * delivers what was written before close even when the process is gone).
 */
static int close_exit_server(int fd)
{
	harness_sleep_ms(300);
	if (harness_recv_pattern(fd, 23, 0, SEM_BIG, "data written before close+exit") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int close_exit_client(int fd)
{
	if (harness_send_pattern(fd, 23, 0, SEM_BIG) < 0)
		return -1;
	if (close(fd) != 0)
		return harness_fail("close: %s", strerror(errno));
	harness_print_pass();
	exit(0);
}

/*
 * closed_number_reused (nginx under load: a file opened per request gets a
 * number fabsock used before): the client writes 64 KiB and closes; under
 * fabsock the stream outlives the fd on a descriptor of its own, moved high
 * (512 and up) and closed once the FIN is out. Then the client opens
 * /dev/null up to 700 times, past those numbers, and closes each: every
 * close() must succeed - a number fabsock gave back is the application's.
 */
static int closed_number_reused_server(int fd)
{
	if (harness_recv_pattern(fd, 90, 0, 65536, "data written before close") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int closed_number_reused_client(int fd)
{
	enum { MOST = 700 };
	int files[MOST], n = 0, status = 0;
	struct rlimit lim;
	int most = MOST;

	if (harness_send_pattern(fd, 90, 0, 65536) < 0)
		return -1;
	if (close(fd) != 0)
		return harness_fail("close: %s", strerror(errno));
	harness_sleep_ms(500); /* the FIN is out; the stream's descriptor closes */
	if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < MOST + 32)
		most = (int)lim.rlim_cur - 32;
	while (n < most && (files[n] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
		n++;
	if (n < most)
		status = harness_fail("open /dev/null: %d of %d: %s", n, most, strerror(errno));
	for (int i = 0; i < n; i++)
		if (close(files[i]) != 0 && status == 0)
			status = harness_fail("close() of /dev/null at fd %d: %s", files[i], strerror(errno));
	harness_info("opened and closed %d files, up to fd %d", n, n ? files[n - 1] : -1);
	return status;
}

/*
 * close_exit_late: after a one-byte exchange (the connection is offloaded
 * on both sides), the client writes 256 KiB, less than the receive window,
 * closes and exits at once; the server starts reading only 2.5 s later,
 * while the script gives the client FABSOCK_LINGER_SEC=1. The kernel
 * delivers from its socket buffers. Under fabsock the bytes must leave the
 * writer before its exit linger runs out although nobody reads them:
 * payloads that wait at the sender for the reader's pull are pulled into
 * the reader's own buffers when it does not read (fs_engine_pull_stale);
 * without that they are dropped at the writer's exit.
 */
#define SEM_LATE (256u << 10)

static int close_exit_late_server(int fd)
{
	if (harness_expect_byte(fd, 's') < 0 || harness_send_byte(fd, 'g') < 0)
		return -1;
	harness_sleep_ms(2500);
	if (harness_recv_pattern(fd, 29, 0, SEM_LATE, "data written before close+exit, read late") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int close_exit_late_client(int fd)
{
	if (harness_send_byte(fd, 's') < 0 || harness_expect_byte(fd, 'g') < 0)
		return -1;
	if (harness_send_pattern(fd, 29, 0, SEM_LATE) < 0)
		return -1;
	if (close(fd) != 0)
		return harness_fail("close: %s", strerror(errno));
	harness_print_pass();
	exit(0);
}

/*
 * linger_reaped: the writer's linger runs out while its sends are still
 * posted. After a one-byte exchange the server sends its pid; the client
 * stops it (SIGSTOP), writes up to 256 KiB without blocking, for at most
 * 500 ms (under fabsock the window takes it all: payloads that wait at the
 * sender for the reader to pull them), closes, and stays alive for 3 s while the
 * script gives it FABSOCK_LINGER_SEC=1: fabsock drops the closed stream
 * with its sends still posted (its service thread's timer does, which a
 * loaded host delays: 1.6 s was not always enough beside CI's other
 * tests, and the server, continued, then pulled every payload first). Then it continues the server, which pulls
 * them: their completions reach the writer after its stream is gone (a
 * use-after-free before, which the ASan run of this scenario reports), and
 * the client stays 1 s more to take them. The server reads what arrives:
 * a prefix of the pattern (all of it on the kernel), then EOF or a reset.
 */
#define SEM_REAPED (256u << 10)

static int linger_reaped_server(int fd)
{
	uint32_t pid = (uint32_t)getpid();
	unsigned char *got = malloc(SEM_REAPED + 1);
	size_t have = 0;
	ssize_t n;
	int ret = 0;

	if (!got)
		return harness_fail("out of memory");
	if (harness_expect_byte(fd, 's') < 0 || harness_send_all(fd, &pid, sizeof(pid)) < 0) {
		free(got);
		return -1;
	}
	while (have <= SEM_REAPED && (n = recv(fd, got + have, SEM_REAPED + 1 - have, 0)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == ECONNRESET)
			break;
		if (n < 0) {
			free(got);
			return harness_fail("recv after %zu bytes: %s", have, strerror(errno));
		}
		have += (size_t)n;
	}
	if (have > SEM_REAPED)
		ret = harness_fail("more than the %u bytes written", SEM_REAPED);
	else if (have && harness_pattern_check(43, 0, got, have, "data written before the linger ran out") < 0)
		ret = -1;
	harness_info("bytes that arrived: %zu of %u", have, SEM_REAPED);
	free(got);
	return ret;
}

static int linger_reaped_client(int fd)
{
	uint32_t pid = 0;
	double deadline;

	if (harness_send_byte(fd, 's') < 0 || harness_recv_exact(fd, &pid, sizeof(pid)) < 0)
		return -1;
	/* stopped only once its threads are idle: a server stopped inside a
	 * provider call keeps its shm region's lock, and every send to it
	 * then waits in the provider, MSG_DONTWAIT or not (a known gap,
	 * docs/design.md "Known gaps"; seen here 1 run in 55 on a loaded
	 * host, the client blocked in fs_prov_spin_lock) */
	harness_sleep_ms(200);
	if (pid <= 1 || kill((pid_t)pid, SIGSTOP) != 0)
		return harness_fail("stopping the server (pid %u): %s", pid, strerror(errno));
	deadline = harness_now_ms() + 500;
	/* never blocked by the stopped reader: what the buffers (kernel) or
	 * the window (fabsock) take, for at most 500 ms */
	for (size_t sent = 0; sent < SEM_REAPED && harness_remaining_ms(deadline) > 0;) {
		static unsigned char chunk[128u << 10]; /* fabsock: a pulled payload each */
		size_t len = SEM_REAPED - sent < sizeof(chunk) ? SEM_REAPED - sent : sizeof(chunk);
		ssize_t n;

		harness_pattern_fill(43, sent, chunk, len);
		n = send(fd, chunk, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0) {
			sent += (size_t)n;
		} else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			harness_wait_fd(fd, POLLOUT, 50);
		} else if (!(n < 0 && errno == EINTR)) {
			kill((pid_t)pid, SIGCONT);
			return harness_fail("send after %zu bytes: %s", sent, n < 0 ? strerror(errno) : "returned 0");
		}
	}
	if (close(fd) != 0) {
		kill((pid_t)pid, SIGCONT);
		return harness_fail("close: %s", strerror(errno));
	}
	harness_sleep_ms(3000);
	if (kill((pid_t)pid, SIGCONT) != 0)
		return harness_fail("continuing the server: %s", strerror(errno));
	harness_sleep_ms(1000);
	harness_print_pass();
	exit(0);
}

/*
 * close_settles: after a one-byte exchange and 600 ms of quiet (an idle
 * engine has backed off to its long sleeps by then), the client closes and
 * makes no socket call at all. Its kernel connection must leave ESTABLISHED
 * (our FIN went out, as TCP's close sends one) within 100 ms, watched in
 * /proc/net/tcp*; the server holds its end open meanwhile, so no FIN of its
 * own wakes the client. Under fabsock the engine closes its duplicate of
 * the kernel socket once the stream's FIN completes: inside close() on shm,
 * else when the service thread next progresses (close() asks it to look
 * within a millisecond, fs_service_kick_soon). Measured without that
 * request, the thread's own back-off still made it within 15 ms, so this
 * guards the outcome, not the request itself. The client then stays quiet
 * another 600 ms, past the server's close: with no open stream left, the
 * service thread must keep progressing (an orphan counts in live_streams)
 * until the closed one has the peer's FIN and is freed, which the script
 * reads in the client's orphans_reaped counter (printed at exit, before
 * exit's own clean-up). With orphans left out of the service thread's
 * count the client reports orphans_reaped=0.
 */
static bool close_settles_established(unsigned port)
{
	static const char *const tables[] = { "/proc/net/tcp", "/proc/net/tcp6" };
	bool found = false;

	for (unsigned t = 0; t < 2 && !found; t++) {
		FILE *table = fopen(tables[t], "re");
		char line[512];

		if (!table)
			continue;
		while (!found && fgets(line, sizeof(line), table)) {
			char local[128];
			unsigned local_port, state;

			/* "  sl  local_address rem_address   st ..." */
			if (sscanf(line, " %*d: %127[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x", local, &local_port, &state) == 3 &&
			    local_port == port && state == 0x01)
				found = true;
		}
		fclose(table);
	}
	return found;
}

static int close_settles_server(int fd)
{
	if (harness_expect_byte(fd, 's') < 0 || harness_send_byte(fd, 'g') < 0 || harness_expect_eof(fd) < 0)
		return -1;
	harness_sleep_ms(300); /* no FIN back while the client watches */
	return 0;
}

static int close_settles_client(int fd)
{
	struct sockaddr_storage local;
	socklen_t length = sizeof(local);
	unsigned port;
	double start;

	if (harness_send_byte(fd, 's') < 0 || harness_expect_byte(fd, 'g') < 0)
		return -1;
	if (getsockname(fd, (struct sockaddr *)&local, &length) < 0)
		return harness_fail("getsockname: %s", strerror(errno));
	port = ntohs(local.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&local)->sin6_port
						: ((struct sockaddr_in *)&local)->sin_port);
	harness_sleep_ms(600);
	if (!close_settles_established(port))
		return harness_fail("port %u is not in /proc/net/tcp* as ESTABLISHED before the close", port);
	start = harness_now_ms();
	if (close(fd) != 0)
		return harness_fail("close: %s", strerror(errno));
	while (close_settles_established(port)) {
		if (harness_now_ms() - start > 100)
			return harness_fail("the kernel connection from port %u is still ESTABLISHED 100 ms after close()",
					port);
		harness_sleep_ms(2);
	}
	harness_info("the kernel connection left ESTABLISHED %.1f ms after close()", harness_now_ms() - start);
	/* Quiet again while the server's FIN comes (after its 300 ms): the
	 * closed stream must be finished without any call of ours (the
	 * script checks the orphans_reaped counter, printed before exit's
	 * own clean-up). */
	harness_sleep_ms(600);
	return 0;
}

/*
 * linger0: the client sets SO_LINGER {1, 0} and closes; the server, blocked
 * in recv, gets -1 ECONNRESET (a reset, not an orderly EOF).
 */
static int linger0_server(int fd)
{
	char byte;
	ssize_t result;

	if (harness_send_byte(fd, 'g') < 0)
		return -1;
	do
		result = recv(fd, &byte, 1, 0);
	while (result < 0 && errno == EINTR);
	if (result < 0 && errno == ECONNRESET)
		return 0;
	return harness_fail("recv after the peer's SO_LINGER 0 close returned %zd (%s), expected ECONNRESET", result,
			result < 0 ? strerror(errno) : "EOF or data");
}

static int linger0_client(int fd)
{
	struct linger linger = { .l_onoff = 1, .l_linger = 0 };

	if (harness_expect_byte(fd, 'g') < 0)
		return -1;
	if (setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, sizeof(linger)) < 0)
		return harness_fail("SO_LINGER: %s", strerror(errno));
	harness_sleep_ms(200); /* the server is in recv by now */
	return close(fd) == 0 ? 0 : harness_fail("close: %s", strerror(errno));
}

/*
 * close_blocked / close_blocked_epoll: a thread blocks in recv (or
 * epoll_wait with a 3 s timeout) on connection A; the main thread closes A.
 * The blocked call must come back, with -1 EBADF (fabsock), or with the
 * byte 'z' the server sends on A once told so over a second connection K
 * (kernel TCP: close does not wake a blocked recv; the server's byte does),
 * or for epoll_wait with no event or only the registered cookie. Nothing
 * may crash and nothing may stay blocked (joins are bounded).
 */
struct sem_blocked {
	int fd, epfd;
	ssize_t result;
	int error;
	char byte;
	bool done;
	uint64_t cookie_seen;
};

#define SEM_COOKIE 0x5eed5eedull

static void *sem_blocked_recv(void *arg)
{
	struct sem_blocked *b = arg;

	do
		b->result = recv(b->fd, &b->byte, 1, 0);
	while (b->result < 0 && errno == EINTR);
	b->error = b->result < 0 ? errno : 0;
	__atomic_store_n(&b->done, true, __ATOMIC_RELEASE);
	return NULL;
}

static void *sem_blocked_epoll(void *arg)
{
	struct sem_blocked *b = arg;
	struct epoll_event event = { 0 };

	b->result = epoll_wait(b->epfd, &event, 1, 3000);
	b->error = b->result < 0 ? errno : 0;
	if (b->result > 0)
		b->cookie_seen = event.data.u64;
	__atomic_store_n(&b->done, true, __ATOMIC_RELEASE);
	return NULL;
}

static bool sem_join_within(pthread_t thread, struct sem_blocked *b, unsigned milliseconds)
{
	for (unsigned waited = 0; waited < milliseconds; waited += 10) {
		if (__atomic_load_n(&b->done, __ATOMIC_ACQUIRE)) {
			pthread_join(thread, NULL);
			return true;
		}
		harness_sleep_ms(10);
	}
	return false;
}

static int close_blocked_server(int fd)
{
	int kick = harness_scenario_accept(), a = fd, k = kick;
	char first = 0, byte;
	ssize_t result;

	if (harness_recv_exact(fd, &first, 1) < 0)
		return -1;
	if (first == 'K') {
		a = kick;
		k = fd;
		if (harness_expect_byte(a, 'A') < 0)
			return -1;
	} else if (first != 'A' || harness_expect_byte(k, 'K') < 0) {
		return harness_fail("first bytes: '%c'", first);
	}
	if (harness_send_byte(a, 'r') < 0 || harness_expect_byte(k, 'k') < 0)
		return -1;
	/* The client closed A: this byte is read by a kernel-TCP recv still
	 * blocked, or lost (the peer may answer with a reset). */
	(void)send(a, "z", 1, MSG_NOSIGNAL);
	do
		result = recv(a, &byte, 1, 0);
	while (result < 0 && errno == EINTR);
	if (result > 0)
		return harness_fail("data on A after the client closed it");
	if (harness_send_byte(k, 'e') < 0)
		return -1;
	close(kick);
	return 0;
}

static int close_blocked_common(int fd, bool use_epoll)
{
	int k = harness_scenario_connect();
	struct sem_blocked b = { .fd = fd, .epfd = -1 };
	pthread_t thread;
	bool returned_early;

	if (harness_send_byte(fd, 'A') < 0 || harness_send_byte(k, 'K') < 0 || harness_expect_byte(fd, 'r') < 0)
		return -1;
	if (use_epoll) {
		struct epoll_event event = { .events = EPOLLIN, .data.u64 = SEM_COOKIE };

		b.epfd = epoll_create1(EPOLL_CLOEXEC);
		if (b.epfd < 0 || epoll_ctl(b.epfd, EPOLL_CTL_ADD, fd, &event) < 0)
			return harness_fail("epoll: %s", strerror(errno));
	}
	if (pthread_create(&thread, NULL, use_epoll ? sem_blocked_epoll : sem_blocked_recv, &b))
		return harness_fail("pthread_create failed");
	harness_sleep_ms(300);
	if (close(fd) != 0)
		return harness_fail("close while another thread is blocked: %s", strerror(errno));
	returned_early = sem_join_within(thread, &b, 1000);
	if (harness_send_byte(k, 'k') < 0)
		return -1;
	if (!returned_early && !sem_join_within(thread, &b, 5000))
		return harness_fail("the blocked %s did not return within 6 s of close", use_epoll ? "epoll_wait" : "recv");
	harness_info("blocked %s returned %zd (%s) %s", use_epoll ? "epoll_wait" : "recv", b.result,
		 b.error ? strerror(b.error) : "ok", returned_early ? "at close" : "after the server's byte");
	if (use_epoll) {
		if (b.result < 0)
			return harness_fail("epoll_wait: %s", strerror(b.error));
		if (b.result > 0 && b.cookie_seen != SEM_COOKIE)
			return harness_fail("epoll_wait reported data 0x%llx, not the registered cookie",
					(unsigned long long)b.cookie_seen);
		close(b.epfd);
	} else if (!(b.result < 0 && b.error == EBADF) && !(b.result == 1 && b.byte == 'z')) {
		return harness_fail("blocked recv returned %zd (%s), expected -1 EBADF or the byte 'z'", b.result,
				b.error ? strerror(b.error) : "");
	}
	if (harness_expect_byte(k, 'e') < 0)
		return -1;
	close(k);
	return 0;
}

static int close_blocked_client(int fd)
{
	return close_blocked_common(fd, false);
}

static int close_blocked_epoll_client(int fd)
{
	return close_blocked_common(fd, true);
}

/*
 * threads_duplex: on each side one thread sends 4 MiB while another
 * receives the peer's 4 MiB on the same socket, both checked.
 * duplex_reader_first: the same, but the server's sender starts 200 ms
 * after its reader blocked in its first receive, and (e2e_semantics.sh)
 * the client's probe comes 500 ms late: the sender waits for that noted
 * probe while the reader waits in the kernel for the first byte, and the
 * "yes" and the HELLO come to the sender (issue 26: it refused the HELLO,
 * and the connection stayed on TCP; now the reader settles it).
 */
struct sem_sender {
	int fd;
	unsigned salt;
	int result;
	unsigned delay_ms;
};

static void *sem_sender_thread(void *arg)
{
	struct sem_sender *sender = arg;

	if (sender->delay_ms)
		usleep(sender->delay_ms * 1000u);
	sender->result = harness_send_pattern(sender->fd, sender->salt, 0, SEM_BIG);
	return NULL;
}

static int threads_duplex_side_ex(int fd, unsigned send_salt, unsigned recv_salt, unsigned send_delay_ms)
{
	struct sem_sender sender = { fd, send_salt, -1, send_delay_ms };
	pthread_t thread;
	int result;

	if (pthread_create(&thread, NULL, sem_sender_thread, &sender))
		return harness_fail("pthread_create failed");
	result = harness_recv_pattern(fd, recv_salt, 0, SEM_BIG, "duplex data");
	pthread_join(thread, NULL);
	if (result < 0 || sender.result < 0)
		return -1;
	/* both directions done: agree before closing */
	if (harness_send_byte(fd, 'd') < 0 || harness_expect_byte(fd, 'd') < 0)
		return -1;
	return 0;
}

static int threads_duplex_side(int fd, unsigned send_salt, unsigned recv_salt)
{
	return threads_duplex_side_ex(fd, send_salt, recv_salt, 0);
}

static int threads_duplex_server(int fd)
{
	return threads_duplex_side(fd, 24, 25);
}

static int duplex_reader_first_server(int fd)
{
	return threads_duplex_side_ex(fd, 24, 25, 200);
}

static int threads_duplex_client(int fd)
{
	return threads_duplex_side(fd, 25, 24);
}

/*
 * eintr: a SIGUSR1 handler installed without SA_RESTART interrupts a
 * blocked recv: -1 EINTR. With every handler installed with SA_RESTART, the
 * same signal does not: recv goes on and returns the server's byte 'b',
 * sent 600 ms later.
 */
static volatile sig_atomic_t sem_usr1_count;

static void sem_count_usr1(int signal_number)
{
	(void)signal_number;
	sem_usr1_count++;
}

struct sem_killer {
	pthread_t target;
	unsigned delay_ms;
};

static void *sem_killer_thread(void *arg)
{
	struct sem_killer *killer = arg;

	harness_sleep_ms(killer->delay_ms);
	pthread_kill(killer->target, SIGUSR1);
	return NULL;
}

static int eintr_server(int fd)
{
	if (harness_expect_byte(fd, 'o') < 0 || harness_send_byte(fd, 'o') < 0 || harness_expect_byte(fd, 'p') < 0)
		return -1;
	harness_sleep_ms(600);
	if (harness_send_byte(fd, 'b') < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int eintr_client(int fd)
{
	struct sem_killer killer = { pthread_self(), 200 };
	pthread_t thread;
	ssize_t result;
	char byte = 0;
	int error;

	/* The connection is set up first: during a process's first offload
	 * fabsock is inside libfabric's initialisation, which swallows EINTR
	 * (docs/design.md, "Signals"). */
	if (harness_send_byte(fd, 'o') < 0 || harness_expect_byte(fd, 'o') < 0)
		return -1;
	harness_set_handler(SIGUSR1, sem_count_usr1, 0);
	pthread_create(&thread, NULL, sem_killer_thread, &killer);
	result = recv(fd, &byte, 1, 0);
	error = errno;
	pthread_join(thread, NULL);
	if (result != -1 || error != EINTR)
		return harness_fail("recv with a non-SA_RESTART handler returned %zd (%s), expected EINTR", result,
				result < 0 ? strerror(error) : "data");
	/* Every handler restarts now (fabsock cannot tell which signal
	 * interrupted it, so it restarts only when all of them would). */
	harness_set_handler(SIGUSR1, sem_count_usr1, SA_RESTART);
	harness_set_handler(SIGPIPE, harness_count_sigpipe, SA_RESTART);
	if (harness_send_byte(fd, 'p') < 0)
		return -1;
	pthread_create(&thread, NULL, sem_killer_thread, &killer);
	result = recv(fd, &byte, 1, 0);
	error = errno;
	pthread_join(thread, NULL);
	if (result != 1 || byte != 'b')
		return harness_fail("recv with SA_RESTART returned %zd (%s), expected the byte 'b'", result,
				result < 0 ? strerror(error) : "other data");
	if (sem_usr1_count != 2)
		return harness_fail("SIGUSR1 ran %d times, expected 2", (int)sem_usr1_count);
	return 0;
}

/*
 * fork_children: after some traffic the client forks a child that closes
 * its copy of the socket and exits, one that is SIGTERM'ed (after 50 ms,
 * then 50 more each at once after their fork), runs system(),
 * posix_spawn() and vfork()+exec of /bin/true, and one that daemon()s;
 * the connection then still
 * carries 1 MiB each way, checked.
 */
static int fork_children_server(int fd)
{
	if (harness_recv_pattern(fd, 26, 0, 65536, "before fork") < 0 || harness_send_byte(fd, 'f') < 0)
		return -1;
	if (harness_recv_pattern(fd, 27, 0, 1u << 20, "after the children") < 0 || harness_send_pattern(fd, 28, 0, 1u << 20) < 0)
		return -1;
	return harness_expect_eof(fd);
}

/* How many /dev/shm files name this process (fabsock's shm region is
 * fabsock-<pid namespace>-<pid>-<random>; none under kernel TCP). */
static int sem_own_shm_regions(void)
{
	char pattern[64];
	DIR *dir = opendir("/dev/shm");
	struct dirent *entry;
	int count = 0;

	snprintf(pattern, sizeof(pattern), "-%d-", (int)getpid());
	while (dir && (entry = readdir(dir)))
		if (strncmp(entry->d_name, "fabsock-", 8) == 0 && strstr(entry->d_name, pattern))
			count++;
	if (dir)
		closedir(dir);
	return count;
}

/* Children SIGTERM'ed at once after their fork. Not under TSan: its
 * runtime takes a signal that comes while fork()'s child handlers run
 * (ours block every signal there) into a queue of its own and, in the
 * child of a fork, never delivers it (the child sleeps out its 10 s with
 * nothing pending in the kernel: seen every run with gcc 12's TSan), so
 * the loop would only test TSan; release and ASan builds run it. */
#if defined(__SANITIZE_THREAD__)
#define SEM_AT_ONCE_CHILDREN 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SEM_AT_ONCE_CHILDREN 0
#endif
#endif
#ifndef SEM_AT_ONCE_CHILDREN
#define SEM_AT_ONCE_CHILDREN 50
#endif

static int fork_children_client(int fd)
{
	char *true_argv[] = { "true", NULL };
	pid_t pid;
	int status;

	if (harness_send_pattern(fd, 26, 0, 65536) < 0 || harness_expect_byte(fd, 'f') < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		close(fd);
		exit(0);
	}
	if (harness_wait_child(pid, "child that closes and exits", 0) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		harness_sleep_ms(10000);
		_exit(1);
	}
	harness_sleep_ms(50);
	{
		int regions = sem_own_shm_regions();

		kill(pid, SIGTERM);
		if (harness_wait_child(pid, "child killed with SIGTERM", SIGTERM) < 0)
			return -1;
		/* the child must not have removed this process's shm region (a
		 * handler inherited from the parent's libfabric would) */
		if (sem_own_shm_regions() < regions)
			return harness_fail("a child's SIGTERM removed the parent's shm region");
		harness_info("shm regions of this process before/after the child's SIGTERM: %d/%d", regions,
			 sem_own_shm_regions());
		/* the same at once after fork(): the signal then finds the child
		 * before or inside fork()'s child handlers (the old library
		 * lost the region within 1-10 such children) */
		for (int i = 0; i < SEM_AT_ONCE_CHILDREN; i++) {
			pid = fork();
			if (pid == 0) {
				harness_sleep_ms(10000);
				_exit(1);
			}
			if (pid > 0)
				kill(pid, SIGTERM);
			if (harness_wait_child(pid, "child killed with SIGTERM at once", SIGTERM) < 0)
				return -1;
			if (sem_own_shm_regions() < regions)
				return harness_fail("the SIGTERM of child %d, sent at once after its fork, removed the parent's shm region", i + 1);
		}
	}
	harness_info("children SIGTERM'ed at once after their fork: %d (none under TSan)", SEM_AT_ONCE_CHILDREN);
	status = system("true");
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return harness_fail("system(\"true\") status 0x%x", status);
	if (posix_spawnp(&pid, "true", NULL, NULL, true_argv, environ) != 0 ||
	    harness_wait_child(pid, "posix_spawn", 0) < 0)
		return harness_fail("posix_spawn of true failed");
	pid = vfork();
	if (pid == 0) {
		execvp("true", true_argv);
		_exit(127);
	}
	if (harness_wait_child(pid, "vfork+exec", 0) < 0)
		return -1;
	/* daemon(): the child returns from fork inside daemon() and exits
	 * there; the grandchild (the daemon) closes its copy and leaves. */
	pid = fork();
	if (pid == 0) {
		if (daemon(1, 1) != 0)
			_exit(1);
		close(fd);
		_exit(0);
	}
	if (harness_wait_child(pid, "daemon()", 0) < 0)
		return -1;
	if (harness_send_pattern(fd, 27, 0, 1u << 20) < 0 || harness_recv_pattern(fd, 28, 0, 1u << 20, "after the children") < 0)
		return -1;
	return 0;
}

/*
 * sendfile: the client sendfile()s a 3 MiB file to the socket, the first
 * half with an offset pointer (the file position must not move), the
 * second from the file position; the server checks every byte and EOF.
 */
static int sendfile_server(int fd)
{
	if (harness_recv_pattern(fd, 29, 0, 3u << 20, "sendfile data") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int sendfile_client(int fd)
{
	char path[] = "/tmp/fs_semantics_sendfileXXXXXX";
	size_t total = 3u << 20, half = total / 2;
	int file = mkstemp(path);
	off_t offset = 0;
	int result = 0;

	if (file < 0)
		return harness_fail("mkstemp: %s", strerror(errno));
	unlink(path);
	{
		unsigned char *data = malloc(total);
		bool written;

		if (!data)
			return harness_fail("out of memory");
		harness_pattern_fill(29, 0, data, total);
		written = write(file, data, total) == (ssize_t)total;
		free(data);
		if (!written)
			return harness_fail("cannot write the file: %s", strerror(errno));
	}
	if (lseek(file, 0, SEEK_SET) != 0)
		return harness_fail("lseek: %s", strerror(errno));
	while ((size_t)offset < half) {
		ssize_t sent = sendfile(fd, file, &offset, half - (size_t)offset);
		if (sent < 0 && errno == EINTR)
			continue;
		if (sent <= 0) {
			result = harness_fail("sendfile with offset: %s", sent < 0 ? strerror(errno) : "returned 0");
			break;
		}
	}
	if (result == 0 && lseek(file, 0, SEEK_CUR) != 0)
		result = harness_fail("sendfile with an offset pointer moved the file position");
	if (result == 0 && lseek(file, (off_t)half, SEEK_SET) != (off_t)half)
		result = harness_fail("lseek: %s", strerror(errno));
	for (size_t done = half; result == 0 && done < total;) {
		ssize_t sent = sendfile(fd, file, NULL, total - done);
		if (sent < 0 && errno == EINTR)
			continue;
		if (sent <= 0)
			result = harness_fail("sendfile from the file position: %s", sent < 0 ? strerror(errno) : "0");
		else
			done += (size_t)sent;
	}
	if (result == 0 && lseek(file, 0, SEEK_CUR) != (off_t)total)
		result = harness_fail("the file position is %lld after sendfile, expected %zu",
				  (long long)lseek(file, 0, SEEK_CUR), total);
	close(file);
	return result;
}

/*
 * exit_blocked: the client exits (exit(), atexit handlers and all) while
 * another of its threads is blocked in recv on an offloaded socket; the
 * process must exit with status 0, not crash in a
 * thread that wakes after fabsock shut its fabric down. The server reads
 * the client's 1 MiB (sent before) and then EOF or ECONNRESET.
 */
static void *sem_exit_blocked_recv(void *arg)
{
	char byte;

	(void)recv(*(int *)arg, &byte, 1, 0);
	return NULL;
}

static int exit_blocked_server(int fd)
{
	char byte;
	ssize_t result;

	if (harness_recv_pattern(fd, 30, 0, 1u << 20, "data before the exit") < 0)
		return -1;
	do
		result = recv(fd, &byte, 1, 0);
	while (result < 0 && errno == EINTR);
	if (result == 0 || (result < 0 && errno == ECONNRESET))
		return 0;
	return harness_fail("after the client's exit recv returned %zd (%s)", result, result < 0 ? strerror(errno) : "data");
}

static int exit_blocked_client(int fd)
{
	static int fd_copy;
	pthread_t thread;

	fd_copy = fd;
	if (harness_send_pattern(fd, 30, 0, 1u << 20) < 0)
		return -1;
	if (pthread_create(&thread, NULL, sem_exit_blocked_recv, &fd_copy))
		return harness_fail("pthread_create failed");
	/* abandoned on purpose: nobody joins it (and TSan, which reports a
	 * joinable thread that ended unjoined, has nothing to report) */
	pthread_detach(thread);
	harness_sleep_ms(200);
	harness_print_pass();
	exit(0);
}

/*
 * splice: the client splices 256 KiB from a pipe into the socket, 32 KiB
 * at a time. Kernel TCP moves them, and so must fabsock over the fabric
 * (core/sock_io.c; tests/progs/fs_splice.c has the rest of splice): every
 * byte arrives once, in order.
 */
static int splice_server(int fd)
{
	if (harness_recv_pattern(fd, 31, 0, 256u << 10, "spliced data") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int splice_client(int fd)
{
	size_t total = 256u << 10, moved = 0;
	unsigned char *data = malloc(total);
	int pipes[2];

	if (!data || pipe(pipes))
		return harness_fail("setup: %s", strerror(errno));
	harness_pattern_fill(31, 0, data, total);
	while (moved < total) {
		size_t piece = total - moved < 32768 ? total - moved : 32768, in_pipe = 0;
		ssize_t n;

		if (write(pipes[1], data + moved, piece) != (ssize_t)piece)
			return harness_fail("pipe write: %s", strerror(errno));
		while (in_pipe < piece) {
			n = splice(pipes[0], NULL, fd, NULL, piece - in_pipe, 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return harness_fail("splice: %s", n < 0 ? strerror(errno) : "0");
			in_pipe += (size_t)n;
		}
		moved += piece;
	}
	close(pipes[0]);
	close(pipes[1]);
	free(data);
	return 0;
}

/*
 * closefrom: the client closes every descriptor from 3 up with closefrom()
 * (what daemons do before exec); its connection ends in order (the server
 * reads the data, then EOF), and a second connection made afterwards still
 * carries 256 KiB each way, checked: fabsock's own descriptors survived.
 */
static int closefrom_server(int fd)
{
	int second;

	if (harness_recv_pattern(fd, 32, 0, 65536, "data before closefrom") < 0 || harness_expect_eof(fd) < 0)
		return -1;
	second = harness_scenario_accept();
	if (harness_recv_pattern(second, 33, 0, 256u << 10, "second connection") < 0 ||
	    harness_send_pattern(second, 34, 0, 256u << 10) < 0 || harness_expect_eof(second) < 0)
		return -1;
	close(second);
	return 0;
}

static int closefrom_client(int fd)
{
	int second;

	if (harness_send_pattern(fd, 32, 0, 65536) < 0)
		return -1;
	closefrom(3);
	if (fcntl(fd, F_GETFD) != -1 || errno != EBADF)
		return harness_fail("closefrom(3) left fd %d open", fd);
	second = harness_scenario_connect();
	if (harness_send_pattern(second, 33, 0, 256u << 10) < 0 ||
	    harness_recv_pattern(second, 34, 0, 256u << 10, "second connection") < 0)
		return -1;
	close(second);
	return 0;
}

/*
 * banner: a server-first protocol: the server sends a 100-byte banner as
 * soon as it accepts, then reads 64 KiB from the client and answers 'k'.
 * tests/scripts/e2e_latehello.sh runs it with the client's HELLO delayed
 * past the server's wait, so the server commits to TCP and must strip the
 * HELLO that arrives afterwards.
 */
static int banner_server(int fd)
{
	if (harness_send_pattern(fd, 35, 0, 100) < 0 || harness_recv_pattern(fd, 36, 0, 65536, "client data after the banner") < 0 ||
	    harness_send_byte(fd, 'k') < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int banner_client(int fd)
{
	if (harness_recv_pattern(fd, 35, 0, 100, "banner") < 0 || harness_send_pattern(fd, 36, 0, 65536) < 0 ||
	    harness_expect_byte(fd, 'k') < 0)
		return -1;
	return 0;
}

/*
 * vfork_closeall: after some traffic the client vfork()s a child that does
 * what Python's subprocess and other spawners do before exec: dup2() onto a
 * low fd, close() one descriptor, close_range() every descriptor from 3 up,
 * then exec()s /bin/true. The child shares the parent's memory but has its
 * own descriptor table: none of it may touch the parent's connection, which
 * then still carries 1 MiB each way, checked, and ends with EOF.
 */
static int vfork_closeall_server(int fd)
{
	if (harness_recv_pattern(fd, 37, 0, 65536, "before vfork") < 0 || harness_send_byte(fd, 'v') < 0)
		return -1;
	if (harness_recv_pattern(fd, 38, 0, 1u << 20, "after the vfork child") < 0 || harness_send_pattern(fd, 39, 0, 1u << 20) < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int vfork_closeall_client(int fd)
{
	char *true_argv[] = { "true", NULL };
	pid_t pid;

	if (harness_send_pattern(fd, 37, 0, 65536) < 0 || harness_expect_byte(fd, 'v') < 0)
		return -1;
	pid = vfork();
	if (pid == 0) {
		/* only async-signal-safe calls in a vfork child */
		if (dup2(fd, 100) < 0 || close(100) < 0 || close(fd) < 0)
			_exit(126);
		if (close_range(3, ~0u, 0) < 0)
			_exit(125);
		execvp("true", true_argv);
		_exit(127);
	}
	if (harness_wait_child(pid, "vfork child that closes everything", 0) < 0)
		return -1;
	if (harness_send_pattern(fd, 38, 0, 1u << 20) < 0 || harness_recv_pattern(fd, 39, 0, 1u << 20, "after the vfork child") < 0)
		return -1;
	return 0;
}

/*
 * Exits that run no atexit handler, and handlers that run after fabsock's
 * own exit handling (the kernel delivers what a process wrote however it
 * ends; fabsock's bytes live in the process, so it must send them first).
 *
 * underscore_exit: the client writes 8 MiB and leaves with _exit() without
 * closing (Python's os._exit in a forked child: socketserver). The server
 * starts reading 300 ms later: every byte, then EOF.
 * close_underscore_exit: the same with close() before _exit().
 */
#define SEM_EXIT_BYTES (8u << 20)

static int underscore_exit_server(int fd)
{
	harness_sleep_ms(300);
	if (harness_recv_pattern(fd, 40, 0, SEM_EXIT_BYTES, "data written before _exit") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int underscore_exit_common(int fd, bool do_close)
{
	if (harness_send_pattern(fd, 40, 0, SEM_EXIT_BYTES) < 0)
		return -1;
	if (do_close && close(fd) != 0)
		return harness_fail("close: %s", strerror(errno));
	harness_print_pass();
	_exit(0);
}

static int underscore_exit_client(int fd)
{
	return underscore_exit_common(fd, false);
}

static int close_underscore_exit_client(int fd)
{
	return underscore_exit_common(fd, true);
}

/*
 * exit_late_close: the client writes 1 MiB and keeps a duplicate of the
 * socket open past main: an executable's destructor (which runs after every
 * atexit handler, fabsock's included, as do handlers registered before
 * fabsock's constructor ran) then sends 64 KiB more and closes it. The
 * kernel sends them. Under fabsock the process's end has already delivered
 * the stream and its FIN, so the late send may fail (EBADF, EPIPE) but must
 * not crash or hang, and the server sees 1 MiB, or 1 MiB and the 64 KiB,
 * then EOF: never a byte the client was told was sent and that is missing.
 */
static int sem_late_fd = -1;

__attribute__((destructor)) static void sem_late_destructor(void)
{
	static unsigned char late[65536];
	ssize_t sent;

	if (sem_late_fd < 0)
		return;
	harness_pattern_fill(42, 0, late, sizeof(late));
	sent = send(sem_late_fd, late, sizeof(late), MSG_NOSIGNAL);
	if (sent != (ssize_t)sizeof(late) &&
	    !(sent < 0 && (errno == EBADF || errno == EPIPE || errno == ECONNRESET))) {
		printf("FAIL exit_late_close: the destructor's send returned %zd (%s)\n", sent,
		       sent < 0 ? strerror(errno) : "short");
		fflush(stdout);
		_exit(1);
	}
	printf("info exit_late_close: the destructor's send returned %zd\n", sent);
	fflush(stdout);
	close(sem_late_fd);
}

static int exit_late_close_server(int fd)
{
	unsigned char *rest = malloc(65536 + 1);
	size_t got = 0;
	ssize_t n;

	if (!rest)
		return harness_fail("out of memory");
	if (harness_recv_pattern(fd, 41, 0, 1u << 20, "data written before exit") < 0) {
		free(rest);
		return -1;
	}
	while (got <= 65536 && (n = recv(fd, rest + got, 65536 + 1 - got, 0)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			free(rest);
			return harness_fail("after 1 MiB: recv: %s", strerror(errno));
		}
		got += (size_t)n;
	}
	if (got != 0 && got != 65536) {
		free(rest);
		return harness_fail("after 1 MiB: %zu bytes before EOF, expected 0 or 65536", got);
	}
	if (got && harness_pattern_check(42, 0, rest, got, "the destructor's bytes") < 0) {
		free(rest);
		return -1;
	}
	harness_info("the destructor's bytes that arrived: %zu", got);
	free(rest);
	return 0;
}

static int exit_late_close_client(int fd)
{
	if (harness_send_pattern(fd, 41, 0, 1u << 20) < 0)
		return -1;
	sem_late_fd = dup(fd);
	if (sem_late_fd < 0)
		return harness_fail("dup: %s", strerror(errno));
	return 0;
}

/*
 * killed_by_term: the client writes 8 MiB and sends itself SIGTERM, whose
 * action is the default (the process dies by it: the script checks the
 * status). The server reads 300 ms later: every byte, then EOF, as the
 * kernel delivers a killed process's socket buffers.
 * killed_by_pipe: the same, dying by SIGPIPE: the client writes 8 MiB to
 * the server, then to a pipe whose reader it closed, with SIGPIPE's default
 * action restored.
 */
static int killed_by_client(int fd, int how)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };

	if (harness_send_pattern(fd, 40, 0, SEM_EXIT_BYTES) < 0)
		return -1;
	harness_print_pass();
	if (how == SIGPIPE) {
		int pipes[2];
		char byte = 'x';

		sigaction(SIGPIPE, &dfl, NULL);
		if (pipe(pipes) != 0)
			return harness_fail("pipe: %s", strerror(errno));
		close(pipes[0]);
		if (write(pipes[1], &byte, 1) < 0)
			return harness_fail("write to a pipe without reader: %s, and still alive", strerror(errno));
	} else {
		kill(getpid(), how);
	}
	harness_sleep_ms(20000);
	return harness_fail("still alive 20 s after signal %d", how);
}

static int killed_by_term_client(int fd)
{
	return killed_by_client(fd, SIGTERM);
}

static int killed_by_pipe_client(int fd)
{
	return killed_by_client(fd, SIGPIPE);
}

/*
 * handler_replaces: the client's SIGTERM action must look like the default
 * (fabsock's exit handler stands in for it once a stream is offloaded), and
 * the handler it installs must be the one that runs: it counts one SIGTERM
 * and the connection then carries 1 MiB each way as usual.
 */
static volatile sig_atomic_t sem_term_count;

static void sem_count_term(int signal_number)
{
	(void)signal_number;
	sem_term_count++;
}

static int handler_replaces_server(int fd)
{
	if (harness_recv_pattern(fd, 43, 0, 65536, "before the handler") < 0 || harness_send_byte(fd, 'h') < 0)
		return -1;
	if (harness_recv_pattern(fd, 44, 0, 1u << 20, "after SIGTERM") < 0 || harness_send_pattern(fd, 45, 0, 1u << 20) < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int handler_replaces_client(int fd)
{
	struct sigaction now, mine = { .sa_handler = sem_count_term };

	if (harness_send_pattern(fd, 43, 0, 65536) < 0 || harness_expect_byte(fd, 'h') < 0)
		return -1;
	if (sigaction(SIGTERM, NULL, &now) != 0 || (now.sa_flags & SA_SIGINFO) || now.sa_handler != SIG_DFL)
		return harness_fail("SIGTERM's action does not look like the default (flags 0x%x)", now.sa_flags);
	/* (not SIGINT: a shell starts background jobs with it ignored) */
	if (signal(SIGUSR2, SIG_DFL) != SIG_DFL)
		return harness_fail("signal(SIGUSR2) did not report the default as the previous action");
	sigemptyset(&mine.sa_mask);
	mine.sa_flags = SA_RESTART;
	if (sigaction(SIGTERM, &mine, NULL) != 0)
		return harness_fail("sigaction: %s", strerror(errno));
	kill(getpid(), SIGTERM);
	if (sem_term_count != 1)
		return harness_fail("the application's SIGTERM handler ran %d times", (int)sem_term_count);
	if (sigaction(SIGTERM, NULL, &now) != 0 || now.sa_handler != sem_count_term)
		return harness_fail("sigaction does not report the application's own handler");
	if (harness_send_pattern(fd, 44, 0, 1u << 20) < 0 || harness_recv_pattern(fd, 45, 0, 1u << 20, "after SIGTERM") < 0)
		return -1;
	return 0;
}

static const struct harness_scenario scenarios[] = {
	{ "dup_share", dup_share_server, dup_share_client, 0 },
	{ "dup2_replace", dup2_replace_server, dup2_replace_client, 0 },
	{ "close_exit", close_exit_server, close_exit_client, 0 },
	{ "close_exit_late", close_exit_late_server, close_exit_late_client, 0 },
	{ "linger_reaped", linger_reaped_server, linger_reaped_client, 0 },
	{ "closed_number_reused", closed_number_reused_server, closed_number_reused_client, HARNESS_CLIENT_CLOSES_FD },
	{ "close_settles", close_settles_server, close_settles_client, 0 },
	{ "linger0", linger0_server, linger0_client, 0 },
	{ "close_blocked", close_blocked_server, close_blocked_client, 0 },
	{ "close_blocked_epoll", close_blocked_server, close_blocked_epoll_client, 0 },
	{ "threads_duplex", threads_duplex_server, threads_duplex_client, 0 },
	{ "duplex_reader_first", duplex_reader_first_server, threads_duplex_client, 0 },
	{ "eintr", eintr_server, eintr_client, 0 },
	{ "fork_children", fork_children_server, fork_children_client, 0 },
	{ "sendfile", sendfile_server, sendfile_client, 0 },
	{ "exit_blocked", exit_blocked_server, exit_blocked_client, 0 },
	{ "splice", splice_server, splice_client, 0 },
	{ "closefrom", closefrom_server, closefrom_client, 0 },
	{ "banner", banner_server, banner_client, 0 },
	{ "vfork_closeall", vfork_closeall_server, vfork_closeall_client, 0 },
	{ "underscore_exit", underscore_exit_server, underscore_exit_client, 0 },
	{ "close_underscore_exit", underscore_exit_server, close_underscore_exit_client, 0 },
	{ "exit_late_close", exit_late_close_server, exit_late_close_client, 0 },
	{ "killed_by_term", underscore_exit_server, killed_by_term_client, 0 },
	{ "killed_by_pipe", underscore_exit_server, killed_by_pipe_client, 0 },
	{ "handler_replaces", handler_replaces_server, handler_replaces_client, 0 },
};

int main(int argc, char **argv)
{
	return harness_scenario_run("fs_semantics_lifecycle", scenarios, HARNESS_COUNT(scenarios), argc, argv);
}
