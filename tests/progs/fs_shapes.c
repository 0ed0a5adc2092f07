/* SPDX-License-Identifier: MIT */
/*
 * fs_shapes: one echo server in each of the shapes real servers take, for
 * the lifecycle tests (issue 4), and a client that drives it.
 *
 *   fs_shapes server SHAPE NCONN   SHAPE: fork | prefork | reuseport | threads | epoll
 *   fs_shapes client HOST PORT NCONN PARALLEL
 *   fs_shapes exec-server threads|epoll NCONN   listens, then execs itself
 *             as `serve-fd FD SHAPE NCONN` with the listening socket
 *   fs_shapes inetd PROGRAM ARGS...   accepts one connection, forks, and
 *             the child execs PROGRAM with the connection as fds 0 and 1
 *   fs_shapes exec-client HOST PORT   one round trip and 64 KiB not read
 *             back, then execs itself as `after-exec FD`, which reads that
 *             echo and echoes 1 MiB more on the inherited connection
 *   fs_shapes sink / fs_shapes source HOST PORT   one connection streaming
 *             until the other end dies (the peer-death test)
 *
 * fork: the parent accepts and forks a child per connection (the parent
 * closes its copy at once); prefork: the parent listens and forks 4
 * workers that all accept on the shared socket until NCONN connections
 * were served (a shared counter); reuseport: 4 workers each listen on
 * their own SO_REUSEPORT socket on one port; threads: a thread per connection;
 * epoll: one thread, nonblocking sockets, edge-triggered epoll.
 *
 * Per connection the client sends 1 MiB of its own pattern in 32 KiB
 * pieces, reading each piece's echo back before the next, checks every
 * byte, then closes; the server echoes until EOF. Every process that
 * served connections exits through exit() (so fabsock prints its stats
 * line). The server prints `listening port=N`, then `served=N`; each side
 * prints PASS or FAIL lines and exits nonzero on failure. Every wait is
 * bounded (poll timeouts, a SIGALRM watchdog).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define SH_BYTES (1u << 20)
#define SH_PIECE (32u << 10)
#define SH_WORKERS 4
#define SH_WATCHDOG 120

/* A forked worker's lines must reach the file before it exits. */
#define sh_fail(...) (harness_fail(__VA_ARGS__), fflush(stdout))

/* ---- server ------------------------------------------------------------ */

/* Echoes until EOF on a blocking socket. Returns 0 or -1. */
static int sh_echo_blocking(int fd)
{
	static __thread char buffer[SH_PIECE];

	for (;;) {
		ssize_t n = recv(fd, buffer, sizeof(buffer), 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			return 0;
		if (n < 0) {
			sh_fail("server recv: %s", strerror(errno));
			return -1;
		}
		int result = harness_write_full(fd, buffer, (size_t)n, NULL);

		if (result < 0) {
			sh_fail("server send: %s", strerror(-result));
			return -1;
		}
	}
}

static int sh_accept(int listen_fd, int timeout_ms)
{
	struct pollfd p = { .fd = listen_fd, .events = POLLIN };
	int fd;

	if (poll(&p, 1, timeout_ms) <= 0)
		return -1;
	do
		fd = accept(listen_fd, NULL, NULL);
	while (fd < 0 && errno == EINTR);
	return fd;
}

static int sh_serve_fork(int listen_fd, int nconn)
{
	int children = 0, status;

	for (int i = 0; i < nconn; i++) {
		int fd = sh_accept(listen_fd, 60000);
		pid_t pid;

		if (fd < 0) {
			sh_fail("accept: %s", strerror(errno));
			break;
		}
		pid = fork();
		if (pid == 0) {
			close(listen_fd);
			exit(sh_echo_blocking(fd) == 0 && close(fd) == 0 ? 0 : 1);
		}
		if (pid < 0)
			sh_fail("fork: %s", strerror(errno));
		else
			children++;
		close(fd); /* the child has it */
	}
	for (int i = 0; i < children; i++)
		if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
			sh_fail("a connection's child failed (status 0x%x)", status);
	return children;
}

/* A worker of prefork/reuseport: serves connections from LISTEN_FD until
 * the workers together served NCONN (SERVED, shared), then exits. */
static void __attribute__((noreturn)) sh_worker(int w, int listen_fd, int *served, int nconn)
{
	int mine = 0, bad = 0;

	while (__atomic_load_n(served, __ATOMIC_ACQUIRE) < nconn) {
		int fd = sh_accept(listen_fd, 100);

		if (fd < 0)
			continue;
		if (sh_echo_blocking(fd) < 0)
			bad++;
		close(fd);
		mine++;
		__atomic_add_fetch(served, 1, __ATOMIC_ACQ_REL);
	}
	printf("worker %d served %d\n", w, mine);
	exit(bad ? 1 : 0);
}

static void sh_wait_workers(void)
{
	int status = 0;

	for (int w = 0; w < SH_WORKERS; w++)
		if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
			sh_fail("a worker failed (status 0x%x)", status);
}

static int sh_serve_prefork(int listen_fd, int nconn)
{
	int *served = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (served == MAP_FAILED) {
		sh_fail("mmap: %s", strerror(errno));
		return 0;
	}
	*served = 0;
	/* Nonblocking: all workers poll the shared socket, and the ones that
	 * lose the race for a connection must not sit in accept() after the
	 * last one (accepted sockets stay blocking: accept() does not inherit
	 * O_NONBLOCK). */
	fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
	for (int w = 0; w < SH_WORKERS; w++) {
		pid_t pid = fork();

		if (pid == 0)
			sh_worker(w, listen_fd, served, nconn);
		if (pid < 0)
			sh_fail("fork: %s", strerror(errno));
	}
	sh_wait_workers();
	return *served;
}

/* reuseport: four workers, each with its own listening socket on the same
 * port (SO_REUSEPORT; the kernel spreads connections among them). The
 * parent's own socket only reserves the port until they all listen. */
static int sh_serve_reuseport(int listen_fd, int nconn)
{
	struct sockaddr_in address;
	socklen_t length = sizeof(address);
	int *shared = mmap(NULL, 2 * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int *served = shared, *ready = shared + 1;

	if (shared == MAP_FAILED || getsockname(listen_fd, (struct sockaddr *)&address, &length)) {
		sh_fail("setup: %s", strerror(errno));
		return 0;
	}
	*served = *ready = 0;
	for (int w = 0; w < SH_WORKERS; w++) {
		pid_t pid = fork();

		if (pid == 0) {
			int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

			close(listen_fd);
			setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
			if (bind(fd, (struct sockaddr *)&address, sizeof(address)) || listen(fd, 128)) {
				sh_fail("worker %d: listen: %s", w, strerror(errno));
				exit(1);
			}
			__atomic_add_fetch(ready, 1, __ATOMIC_ACQ_REL);
			sh_worker(w, fd, served, nconn);
		}
		if (pid < 0)
			sh_fail("fork: %s", strerror(errno));
	}
	for (int i = 0; i < 1000 && __atomic_load_n(ready, __ATOMIC_ACQUIRE) < SH_WORKERS; i++)
		usleep(5000);
	close(listen_fd); /* from now on only the workers' sockets take connections */
	printf("listening port=%d\n", ntohs(address.sin_port));
	fflush(stdout);
	sh_wait_workers();
	return *served;
}

static void *sh_conn_thread(void *arg)
{
	int fd = (int)(intptr_t)arg;

	sh_echo_blocking(fd);
	close(fd);
	return NULL;
}

static int sh_serve_threads(int listen_fd, int nconn)
{
	pthread_t *threads = calloc((size_t)nconn, sizeof(*threads));
	int started = 0;

	for (int i = 0; i < nconn; i++) {
		int fd = sh_accept(listen_fd, 60000);

		if (fd < 0) {
			sh_fail("accept: %s", strerror(errno));
			break;
		}
		if (pthread_create(&threads[started], NULL, sh_conn_thread, (void *)(intptr_t)fd)) {
			sh_fail("pthread_create");
			close(fd);
			continue;
		}
		started++;
	}
	for (int i = 0; i < started; i++)
		pthread_join(threads[i], NULL);
	free(threads);
	return started;
}

struct sh_conn {
	int fd;
	char pending[SH_PIECE];
	size_t pending_from, pending_len;
};

/* Edge-triggered: reads and echoes until EAGAIN. Returns 1 at EOF/error. */
static int sh_epoll_serve(int epfd, struct sh_conn *c)
{
	for (;;) {
		ssize_t n;

		while (c->pending_len) {
			n = send(c->fd, c->pending + c->pending_from, c->pending_len, MSG_NOSIGNAL);
			if (n < 0 && errno == EAGAIN) {
				struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = c };

				epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
				return 0;
			}
			if (n <= 0) {
				sh_fail("epoll server send: %s", n < 0 ? strerror(errno) : "0");
				return 1;
			}
			c->pending_from += (size_t)n;
			c->pending_len -= (size_t)n;
		}
		n = recv(c->fd, c->pending, sizeof(c->pending), 0);
		if (n < 0 && errno == EAGAIN)
			return 0;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			sh_fail("epoll server recv: %s", strerror(errno));
		if (n <= 0)
			return 1;
		c->pending_from = 0;
		c->pending_len = (size_t)n;
	}
}

static int sh_serve_epoll(int listen_fd, int nconn)
{
	int epfd = epoll_create1(EPOLL_CLOEXEC), accepted = 0, finished = 0;
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };

	fcntl(listen_fd, F_SETFL, O_NONBLOCK);
	epoll_ctl(epfd, EPOLL_CTL_ADD, listen_fd, &ev);
	while (finished < nconn) {
		struct epoll_event events[16];
		int n = epoll_wait(epfd, events, 16, 60000);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			sh_fail("epoll_wait: %s", n < 0 ? strerror(errno) : "60 s without an event");
			break;
		}
		for (int i = 0; i < n; i++)
			for (int j = 0; j < i; j++)
				if (events[i].data.ptr == events[j].data.ptr) {
					sh_fail("epoll_wait reported one fd twice in a batch (events 0x%x, 0x%x)",
						events[j].events, events[i].events);
					exit(1);
				}
		for (int i = 0; i < n; i++) {
			struct sh_conn *c = events[i].data.ptr;

			if (!c) {
				int fd;

				while ((fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
					struct epoll_event cev = { .events = EPOLLIN | EPOLLET };

					c = calloc(1, sizeof(*c));
					c->fd = fd;
					cev.data.ptr = c;
					epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &cev);
					accepted++;
					if (sh_epoll_serve(epfd, c)) {
						close(fd);
						free(c);
						finished++;
					}
				}
				continue;
			}
			if (sh_epoll_serve(epfd, c)) {
				close(c->fd); /* also leaves the epoll set */
				free(c);
				finished++;
			}
		}
	}
	close(epfd);
	return accepted;
}

/* The server's last lines and exit status: every connection served, no failure. */
static int sh_server_result(const char *shape, int served, int nconn)
{
	printf("served=%d\n", served);
	if (served != nconn)
		sh_fail("served %d connections, expected %d", served, nconn);
	if (!harness_failures())
		printf("PASS server %s\n", shape);
	return harness_failures() ? 1 : 0;
}

static int sh_server(const char *shape, int nconn)
{
	bool reuseport = strcmp(shape, "reuseport") == 0;
	int listen_fd, served;

	if (reuseport) {
		/* only reserves the port until the workers listen on it */
		struct sockaddr_in address = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int one = 1;

		listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		setsockopt(listen_fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
		if (bind(listen_fd, (struct sockaddr *)&address, sizeof(address))) {
			sh_fail("bind: %s", strerror(errno));
			return 1;
		}
	} else {
		listen_fd = harness_listen(AF_INET, "127.0.0.1", "0", SOCK_CLOEXEC, 128);
		if (listen_fd < 0)
			return 1;
		printf("listening port=%u\n", harness_local_port(listen_fd));
	}
	fflush(stdout);
	if (reuseport)
		served = sh_serve_reuseport(listen_fd, nconn);
	else if (strcmp(shape, "fork") == 0)
		served = sh_serve_fork(listen_fd, nconn);
	else if (strcmp(shape, "prefork") == 0)
		served = sh_serve_prefork(listen_fd, nconn);
	else if (strcmp(shape, "threads") == 0)
		served = sh_serve_threads(listen_fd, nconn);
	else if (strcmp(shape, "epoll") == 0)
		served = sh_serve_epoll(listen_fd, nconn);
	else {
		sh_fail("unknown shape %s", shape);
		return 2;
	}
	close(listen_fd);
	return sh_server_result(shape, served, nconn);
}

/* ---- client ------------------------------------------------------------ */

static struct addrinfo *sh_target;
static int sh_next_salt;

static int sh_one_connection(unsigned salt)
{
	unsigned char out[SH_PIECE], in[SH_PIECE];
	int fd = harness_connect(sh_target, 0);

	if (fd < 0)
		return -1;
	for (size_t at = 0; at < SH_BYTES; at += SH_PIECE) {
		int result;

		harness_pattern_fill(salt, at, out, SH_PIECE);
		result = harness_write_full(fd, out, SH_PIECE, NULL);
		if (result == 0)
			result = harness_read_full(fd, in, SH_PIECE, NULL);
		if (result < 0) {
			sh_fail("connection %u: %s", salt, result == -ENODATA ? "early EOF" : strerror(-result));
			close(fd);
			return -1;
		}
		if (memcmp(in, out, SH_PIECE)) {
			sh_fail("connection %u: echo differs in bytes %zu..%zu", salt, at, at + SH_PIECE);
			close(fd);
			return -1;
		}
	}
	return close(fd) == 0 ? 0 : -1;
}

struct sh_client_thread {
	int count;
	int ok;
};

static void *sh_client_thread(void *arg)
{
	struct sh_client_thread *t = arg;

	for (int i = 0; i < t->count; i++)
		if (sh_one_connection((unsigned)__atomic_add_fetch(&sh_next_salt, 1, __ATOMIC_RELAXED)) == 0)
			t->ok++;
	return NULL;
}

static int sh_client(const char *host, const char *port, int nconn, int parallel)
{
	struct sh_client_thread *threads = calloc((size_t)parallel, sizeof(*threads));
	pthread_t *ids = calloc((size_t)parallel, sizeof(*ids));
	int ok = 0;

	sh_target = harness_resolve(host, port, AF_UNSPEC);
	if (!sh_target)
		return 1;
	for (int i = 0; i < parallel; i++) {
		threads[i].count = nconn / parallel + (i < nconn % parallel);
		pthread_create(&ids[i], NULL, sh_client_thread, &threads[i]);
	}
	for (int i = 0; i < parallel; i++) {
		pthread_join(ids[i], NULL);
		ok += threads[i].ok;
	}
	printf("connections=%d ok=%d\n", nconn, ok);
	if (ok != nconn)
		sh_fail("%d of %d connections checked out", ok, nconn);
	if (!harness_failures())
		printf("PASS client\n");
	return harness_failures() ? 1 : 0;
}

/* One connection to HOST PORT (sh_target keeps the address), or -1 (reported). */
static int sh_connect(const char *host, const char *port)
{
	sh_target = harness_resolve(host, port, AF_UNSPEC);
	return sh_target ? harness_connect(sh_target, 0) : -1;
}

/* ---- exec ---------------------------------------------------------------- */

/* exec-server SHAPE NCONN: listens, then execs `serve-fd FD SHAPE NCONN`
 * with the listening socket (no FD_CLOEXEC) as the new program's. */
static int sh_exec_server(const char *self, const char *shape, const char *nconn)
{
	int listen_fd = harness_listen(AF_INET, "127.0.0.1", "0", 0, 128);
	char fd_text[16];

	if (listen_fd < 0)
		return 1;
	snprintf(fd_text, sizeof(fd_text), "%d", listen_fd);
	execl(self, self, "serve-fd", fd_text, shape, nconn, (char *)NULL);
	sh_fail("exec: %s", strerror(errno));
	return 1;
}

static int sh_serve_fd(int listen_fd, const char *shape, int nconn)
{
	unsigned port = harness_local_port(listen_fd);
	int served;

	if (!port) {
		sh_fail("the inherited fd %d is not a bound socket: %s", listen_fd, strerror(errno));
		return 1;
	}
	printf("listening port=%u\n", port);
	fflush(stdout);
	served = strcmp(shape, "threads") == 0 ? sh_serve_threads(listen_fd, nconn) : sh_serve_epoll(listen_fd, nconn);
	return sh_server_result(shape, served, nconn);
}

/* inetd PROGRAM ARGS...: accepts one connection, forks; the child puts it
 * on fds 0 and 1 (no FD_CLOEXEC) and execs PROGRAM, which talks to the
 * client through its standard input and output. */
static int sh_inetd(char **program)
{
	int listen_fd = harness_listen(AF_INET, "127.0.0.1", "0", SOCK_CLOEXEC, 16), fd, status = 0;
	pid_t pid;

	if (listen_fd < 0)
		return 1;
	printf("listening port=%u\n", harness_local_port(listen_fd));
	fflush(stdout);
	fd = sh_accept(listen_fd, 60000);
	if (fd < 0) {
		sh_fail("accept: %s", strerror(errno));
		return 1;
	}
	pid = fork();
	if (pid == 0) {
		dup2(fd, 0);
		dup2(fd, 1);
		close(fd);
		execvp(program[0], program);
		_exit(127);
	}
	close(fd);
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		sh_fail("the exec'd program failed (status 0x%x)", status);
	if (!harness_failures())
		printf("PASS server inetd\n");
	return harness_failures() ? 1 : 0;
}

/* exec-client HOST PORT: one offloaded echo round trip, then 64 KiB whose
 * echo it does not wait for, then the process execs `after-exec FD` with
 * the connection still open (no FD_CLOEXEC). */
#define SH_EXEC_UNREAD 65536u

static int sh_exec_client(const char *self, const char *host, const char *port)
{
	static unsigned char out[SH_EXEC_UNREAD];
	char fd_text[16], byte = 'e';
	int fd, result;

	fd = sh_connect(host, port);
	if (fd < 0)
		return 1;
	if (send(fd, &byte, 1, 0) != 1 || recv(fd, &byte, 1, MSG_WAITALL) != 1) {
		sh_fail("round trip before exec: %s", strerror(errno));
		return 1;
	}
	harness_pattern_fill(77, 0, out, sizeof(out));
	result = harness_write_full(fd, out, sizeof(out), NULL);
	if (result < 0) {
		sh_fail("write before exec: %s", strerror(-result));
		return 1;
	}
	snprintf(fd_text, sizeof(fd_text), "%d", fd);
	printf("exec with fd %d\n", fd);
	fflush(stdout);
	execl(self, self, "after-exec", fd_text, (char *)NULL);
	sh_fail("exec: %s", strerror(errno));
	return 1;
}

/* after-exec FD: the inherited connection goes on as with the kernel: the
 * echo of the 64 KiB written before exec, then a 1 MiB echo, every byte
 * checked, then EOF after our shutdown. First it prints, as `env NAME=VALUE`,
 * each variable fabsock may set for libfabric that the new program was given
 * (the script checks that only the user's own are there: core/fabric.c
 * fs_fabric_env_names). */
static int sh_after_exec(int fd)
{
	static const char *const fabric_env[] = { "IPATH_NO_BACKTRACE", "FI_EFA_FORK_SAFE", "FI_SHM_DISABLE_CMA",
						  "FI_OFI_RXM_BUFFER_SIZE", "FI_OFI_RXM_EAGER_LIMIT",
						  "FI_PROVIDER_PATH" };
	static unsigned char out[SH_PIECE], in[SH_EXEC_UNREAD];
	char byte;
	ssize_t n;
	int result;

	for (size_t i = 0; i < sizeof(fabric_env) / sizeof(fabric_env[0]); i++)
		if (getenv(fabric_env[i]))
			printf("env %s=%s\n", fabric_env[i], getenv(fabric_env[i]));
	size_t differs;

	harness_watchdog_start(30, NULL);
	result = harness_read_full(fd, in, SH_EXEC_UNREAD, NULL);
	if (result < 0) {
		sh_fail("after exec: reading the echo of the bytes written before exec: %s",
			result == -ENODATA ? "early EOF" : strerror(-result));
		return 1;
	}
	differs = harness_pattern_mismatch(77, 0, in, SH_EXEC_UNREAD);
	if (differs != SH_EXEC_UNREAD) {
		sh_fail("after exec: echo byte %zu written before exec differs", differs);
		return 1;
	}
	for (size_t at = 0; at < SH_BYTES; at += SH_PIECE) {
		harness_pattern_fill(78, at, out, SH_PIECE);
		result = harness_write_full(fd, out, SH_PIECE, NULL);
		if (result == 0)
			result = harness_read_full(fd, in, SH_PIECE, NULL);
		if (result < 0) {
			sh_fail("after exec: echo at %zu: %s", at, result == -ENODATA ? "early EOF" : strerror(-result));
			return 1;
		}
		if (memcmp(in, out, SH_PIECE)) {
			sh_fail("after exec: echo differs in bytes %zu..%zu", at, at + SH_PIECE);
			return 1;
		}
	}
	if (shutdown(fd, SHUT_WR)) {
		sh_fail("after exec: shutdown: %s", strerror(errno));
		return 1;
	}
	n = recv(fd, &byte, 1, 0);
	if (n != 0) {
		sh_fail("after exec: expected EOF, recv returned %zd (%s)", n, n < 0 ? strerror(errno) : "data");
		return 1;
	}
	printf("after exec: %u + %u bytes echoed exactly\n", SH_EXEC_UNREAD, (unsigned)SH_BYTES);
	printf("PASS after-exec\n");
	return 0;
}

/* ---- peer death ---------------------------------------------------------- */

/* sink: accepts one connection and reads until EOF or an error, then says
 * which; source HOST PORT: writes until an error. The test kill -9's one of
 * them mid-stream; the other must end by itself, promptly. */

/* Receives (SENDING false) or sends on FD until it returns 0 or fails for
 * another reason than EINTR; prints "streaming" once bytes flow and
 * "WHO ended: <why> after N bytes". Returns the last result (errno kept). */
static ssize_t sh_pump(int fd, bool sending, const char *who)
{
	static char buffer[1 << 16];
	unsigned long long total = 0;
	ssize_t n;
	int saved;

	for (;;) {
		n = sending ? send(fd, buffer, sizeof(buffer), MSG_NOSIGNAL) : recv(fd, buffer, sizeof(buffer), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (!total)
			printf("streaming\n");
		total += (unsigned long long)n;
	}
	saved = errno;
	printf("%s ended: %s after %llu bytes\n", who, n == 0 ? (sending ? "0" : "EOF") : strerror(saved), total);
	errno = saved;
	return n;
}

static int sh_sink(void)
{
	int listen_fd = harness_listen(AF_INET, "127.0.0.1", "0", 0, 4), fd;
	ssize_t n;

	if (listen_fd < 0)
		return 1;
	printf("listening port=%u\n", harness_local_port(listen_fd));
	fd = sh_accept(listen_fd, 60000);
	if (fd < 0)
		return 1;
	n = sh_pump(fd, false, "sink");
	return n == 0 || errno == ECONNRESET ? 0 : 1;
}

static int sh_source(const char *host, const char *port)
{
	ssize_t n;
	int fd;

	fd = sh_connect(host, port);
	if (fd < 0)
		return 1;
	n = sh_pump(fd, true, "source");
	return n < 0 && (errno == EPIPE || errno == ECONNRESET) ? 0 : 1;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	harness_set_name(argc > 1 ? argv[1] : "fs_shapes");
	harness_watchdog_start(SH_WATCHDOG, NULL);
	if (argc == 4 && strcmp(argv[1], "exec-server") == 0)
		return sh_exec_server(argv[0], argv[2], argv[3]);
	if (argc == 5 && strcmp(argv[1], "serve-fd") == 0)
		return sh_serve_fd(atoi(argv[2]), argv[3], atoi(argv[4]));
	if (argc >= 3 && strcmp(argv[1], "inetd") == 0)
		return sh_inetd(argv + 2);
	if (argc == 4 && strcmp(argv[1], "exec-client") == 0)
		return sh_exec_client(argv[0], argv[2], argv[3]);
	if (argc == 3 && strcmp(argv[1], "after-exec") == 0)
		return sh_after_exec(atoi(argv[2]));
	if (argc == 2 && strcmp(argv[1], "sink") == 0)
		return sh_sink();
	if (argc == 4 && strcmp(argv[1], "source") == 0)
		return sh_source(argv[2], argv[3]);
	if (argc == 4 && strcmp(argv[1], "server") == 0)
		return sh_server(argv[2], atoi(argv[3]));
	if (argc == 6 && strcmp(argv[1], "client") == 0)
		return sh_client(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
	fprintf(stderr, "usage: fs_shapes server fork|prefork|reuseport|threads|epoll NCONN\n"
			"       fs_shapes client HOST PORT NCONN PARALLEL\n"
			"       fs_shapes exec-server threads|epoll NCONN\n"
			"       fs_shapes inetd PROGRAM [ARGS...]\n"
			"       fs_shapes exec-client HOST PORT\n");
	return 2;
}
