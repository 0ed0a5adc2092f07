/* SPDX-License-Identifier: MIT */
/*
 * fs_semantics_share: scenarios where another process uses the connection:
 * a child forked after it carried data, a process it is passed to with
 * SCM_RIGHTS, a peer that forks, and urgent data. With the kernel they all
 * share one connection; under fabsock the stream goes back to TCP first
 * (core/handback.h), and every byte must still arrive once, in order. In
 * each, bytes are in flight toward the client (written by the server, not
 * yet read) when the other process takes over, so the ones the first
 * process's stream had received but not read must reach the reader that
 * reads next. Run like fs_semantics (harness.h), on blocking sockets.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* The start every scenario here shares: 64 KiB from the client, 'f' back,
 * so both ends use the connection (offloaded, under fabsock) before the
 * sharing begins. */
static int sem_share_start_server(int fd, unsigned salt)
{
	if (harness_recv_pattern(fd, salt, 0, 65536, "before sharing") < 0 || harness_send_byte(fd, 'f') < 0)
		return -1;
	return 0;
}

static int sem_share_start_client(int fd, unsigned salt)
{
	if (harness_send_pattern(fd, salt, 0, 65536) < 0 || harness_expect_byte(fd, 'f') < 0)
		return -1;
	return 0;
}

/*
 * fork_child_reads (rsync's and sshd's children): the server sends 512 KiB;
 * the client reads the first 1000 bytes, forks, and the child reads the
 * rest and answers 1 MiB, then exits; the parent then writes 64 KiB more
 * and closes. The server checks all of it, in that order, then EOF.
 */
static int fork_child_reads_server(int fd)
{
	if (sem_share_start_server(fd, 50) < 0 || harness_send_pattern(fd, 51, 0, 512u << 10) < 0)
		return -1;
	if (harness_recv_pattern(fd, 52, 0, 1u << 20, "the child's answer") < 0 ||
	    harness_recv_pattern(fd, 53, 0, 65536, "the parent's bytes after the child") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int fork_child_reads_client(int fd)
{
	pid_t pid;

	if (sem_share_start_client(fd, 50) < 0 || harness_recv_pattern(fd, 51, 0, 1000, "before the fork") < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		int bad = harness_recv_pattern(fd, 51, 1000, (512u << 10) - 1000, "read by the child") < 0 ||
			  harness_send_pattern(fd, 52, 0, 1u << 20) < 0;

		exit(bad ? 1 : 0);
	}
	if (harness_wait_child(pid, "the child reading and writing", 0) < 0)
		return -1;
	return harness_send_pattern(fd, 53, 0, 65536);
}

/*
 * fork_split (rsync's client: one process reads the connection, the other
 * writes it, at once): after the start the client forks; the child reads
 * 1 MiB, the parent writes 1 MiB meanwhile; the server writes its 1 MiB
 * then reads the client's, answers 'd' and waits for EOF.
 */
static int fork_split_server(int fd)
{
	if (sem_share_start_server(fd, 54) < 0 || harness_send_pattern(fd, 55, 0, 1u << 20) < 0 ||
	    harness_recv_pattern(fd, 56, 0, 1u << 20, "the parent's writes") < 0 || harness_send_byte(fd, 'd') < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int fork_split_client(int fd)
{
	pid_t pid;

	if (sem_share_start_client(fd, 54) < 0)
		return -1;
	pid = fork();
	if (pid == 0)
		exit(harness_recv_pattern(fd, 55, 0, 1u << 20, "read by the child") < 0 ? 1 : 0);
	if (harness_send_pattern(fd, 56, 0, 1u << 20) < 0) {
		harness_wait_child(pid, "the reading child", 0);
		return -1;
	}
	if (harness_wait_child(pid, "the reading child", 0) < 0)
		return -1;
	return harness_expect_byte(fd, 'd');
}

/*
 * parent_closes (a server that forks a handler per connection after it
 * read from it, then closes its copy): the server sends 256 KiB; the client
 * forks, closes its copy at once and waits; the child reads all 256 KiB,
 * answers 1 MiB and exits. The server checks it and sees EOF.
 */
static int parent_closes_server(int fd)
{
	if (sem_share_start_server(fd, 57) < 0 || harness_send_pattern(fd, 58, 0, 256u << 10) < 0 ||
	    harness_recv_pattern(fd, 59, 0, 1u << 20, "the child's answer") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int parent_closes_client(int fd)
{
	pid_t pid;
	int keep;

	if (sem_share_start_client(fd, 57) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		harness_sleep_ms(100); /* the parent closes first */
		exit(harness_recv_pattern(fd, 58, 0, 256u << 10, "read by the child") < 0 || harness_send_pattern(fd, 59, 0, 1u << 20) < 0
			     ? 1
			     : 0);
	}
	/* main() closes FD after the scenario: a placeholder goes there (not
	 * a duplicate of the socket, which would keep it open) */
	keep = open("/dev/null", O_RDONLY);
	if (close(fd) != 0)
		return harness_fail("close: %s", strerror(errno));
	if (harness_wait_child(pid, "the child after the parent's close", 0) < 0)
		return -1;
	if (keep >= 0 && dup2(keep, fd) != fd)
		return harness_fail("dup2: %s", strerror(errno));
	return 0;
}

/*
 * parent_exits (a daemon's parent leaving its child the connection): the
 * server sends 256 KiB; the client forks and exits at once without closing
 * its copy; the child, after its parent is gone, reads the 256 KiB and
 * answers 1 MiB. The server checks it and sees EOF.
 */
static int parent_exits_server(int fd)
{
	if (sem_share_start_server(fd, 60) < 0 || harness_send_pattern(fd, 61, 0, 256u << 10) < 0 ||
	    harness_recv_pattern(fd, 62, 0, 1u << 20, "the child's answer") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int parent_exits_client(int fd)
{
	pid_t parent = getpid(), pid;

	if (sem_share_start_client(fd, 60) < 0)
		return -1;
	pid = fork();
	if (pid < 0)
		return harness_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		for (int i = 0; i < 2000 && getppid() == parent; i++)
			harness_sleep_ms(10);
		if (getppid() == parent)
			exit(1);
		exit(harness_recv_pattern(fd, 61, 0, 256u << 10, "read by the child") < 0 || harness_send_pattern(fd, 62, 0, 1u << 20) < 0
			     ? 1
			     : 0);
	}
	/* the parent's end: what main() prints, without closing the socket */
	harness_print_pass();
	exit(0);
}

/*
 * pass_rights (a process that hands a connection to another with
 * SCM_RIGHTS): the client forks a helper that closes its copy and waits on
 * a UNIX socket; the server sends 256 KiB; the client passes the
 * connection to the helper, closes its own and waits; the helper reads the
 * 256 KiB and answers 1 MiB. The server checks it and sees EOF.
 */
static int pass_rights_server(int fd)
{
	if (sem_share_start_server(fd, 63) < 0 || harness_send_pattern(fd, 64, 0, 256u << 10) < 0 ||
	    harness_recv_pattern(fd, 65, 0, 1u << 20, "the helper's answer") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int sem_recv_fd(int unix_fd)
{
	char data, control[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &data, 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = sizeof(control) };
	struct cmsghdr *c;
	int fd = -1;

	if (recvmsg(unix_fd, &msg, 0) != 1)
		return -1;
	c = CMSG_FIRSTHDR(&msg);
	if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
		memcpy(&fd, CMSG_DATA(c), sizeof(fd));
	return fd;
}

static int pass_rights_client(int fd)
{
	char data = 'p', control[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &data, 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = sizeof(control) };
	struct cmsghdr *c;
	int pair[2], keep;
	pid_t pid;

	if (sem_share_start_client(fd, 63) < 0)
		return -1;
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0)
		return harness_fail("socketpair: %s", strerror(errno));
	pid = fork();
	if (pid == 0) {
		int got;

		close(fd);
		close(pair[0]);
		got = sem_recv_fd(pair[1]);
		if (got < 0) {
			harness_fail("the helper received no descriptor");
			exit(1);
		}
		exit(harness_recv_pattern(got, 64, 0, 256u << 10, "read by the helper") < 0 ||
				     harness_send_pattern(got, 65, 0, 1u << 20) < 0
			     ? 1
			     : 0);
	}
	close(pair[1]);
	memset(control, 0, sizeof(control));
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(fd));
	if (sendmsg(pair[0], &msg, 0) != 1) {
		harness_fail("sendmsg SCM_RIGHTS: %s", strerror(errno));
		kill(pid, SIGKILL);
		harness_wait_child(pid, "the helper", 0);
		return -1;
	}
	close(pair[0]);
	keep = open("/dev/null", O_RDONLY);
	close(fd);
	if (harness_wait_child(pid, "the helper", 0) < 0)
		return -1;
	if (keep >= 0 && dup2(keep, fd) != fd)
		return harness_fail("dup2: %s", strerror(errno));
	return 0;
}

/*
 * fork_child_sandboxed (sshd's preauth child): like fork_child_reads, but
 * the child first confines itself as sshd does before it touches the
 * connection: no new privileges, and a seccomp filter that lets through
 * little more than read, write, poll and memory calls, makes open and
 * fstat fail with EACCES and kills the process for anything else (kill(),
 * prlimit64, socket calls...). It then reads the server's bytes with read()
 * and answers with write(), as sshd does.
 */
#define SEM_SC_ALLOW(nr)                                                                                   \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
#define SEM_SC_DENY(nr, err)                                                                               \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1),                                                   \
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((err) & SECCOMP_RET_DATA))

static int sem_sandbox(void)
{
	static struct sock_filter insns[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		SEM_SC_DENY(__NR_open, EACCES),
		SEM_SC_DENY(__NR_openat, EACCES),
		SEM_SC_DENY(__NR_fstat, EACCES),
		SEM_SC_DENY(__NR_newfstatat, EACCES),
		SEM_SC_DENY(__NR_stat, EACCES),
		SEM_SC_DENY(__NR_lstat, EACCES),
		SEM_SC_ALLOW(__NR_brk),
		SEM_SC_ALLOW(__NR_clock_gettime),
		SEM_SC_ALLOW(__NR_close),
		SEM_SC_ALLOW(__NR_exit),
		SEM_SC_ALLOW(__NR_exit_group),
		SEM_SC_ALLOW(__NR_futex),
		SEM_SC_ALLOW(__NR_geteuid),
		SEM_SC_ALLOW(__NR_getpid),
		SEM_SC_ALLOW(__NR_getrandom),
		SEM_SC_ALLOW(__NR_gettimeofday),
		SEM_SC_ALLOW(__NR_getuid),
		SEM_SC_ALLOW(__NR_madvise),
		SEM_SC_ALLOW(__NR_mmap),
		SEM_SC_ALLOW(__NR_mprotect),
		SEM_SC_ALLOW(__NR_mremap),
		SEM_SC_ALLOW(__NR_munmap),
		SEM_SC_ALLOW(__NR_nanosleep),
		SEM_SC_ALLOW(__NR_clock_nanosleep),
		SEM_SC_ALLOW(__NR_poll),
		SEM_SC_ALLOW(__NR_ppoll),
		SEM_SC_ALLOW(__NR_pselect6),
		SEM_SC_ALLOW(__NR_select),
		SEM_SC_ALLOW(__NR_read),
		SEM_SC_ALLOW(__NR_rt_sigprocmask),
		SEM_SC_ALLOW(__NR_shutdown),
		/* the ASan runtime, when the program is built with it, looks
		 * at the alternate signal stack as the child exits */
		SEM_SC_ALLOW(__NR_sigaltstack),
		SEM_SC_ALLOW(__NR_write),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
	};
	static const struct sock_fprog program = { .len = sizeof(insns) / sizeof(insns[0]), .filter = insns };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		return harness_fail("PR_SET_NO_NEW_PRIVS: %s", strerror(errno));
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0)
		return harness_fail("PR_SET_SECCOMP: %s", strerror(errno));
	return 0;
}

/* read() until LENGTH bytes of stream SALT from FROM arrived, checked; it
 * reports nothing (stdio would fstat, which the sandbox refuses). */
static int sem_read_pattern(int fd, size_t from, size_t length, unsigned salt)
{
	static unsigned char buffer[16384];
	size_t done = 0;

	while (done < length) {
		size_t want = length - done < sizeof(buffer) ? length - done : sizeof(buffer);
		ssize_t n = read(fd, buffer, want);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		if (harness_pattern_mismatch(salt, from + done, buffer, (size_t)n) != (size_t)n)
			return -1;
		done += (size_t)n;
	}
	return 0;
}

static int sem_write_pattern(int fd, size_t length, unsigned salt)
{
	static unsigned char buffer[16384];
	size_t done = 0;

	while (done < length) {
		size_t n = length - done < sizeof(buffer) ? length - done : sizeof(buffer);
		ssize_t w;

		harness_pattern_fill(salt, done, buffer, n);
		w = write(fd, buffer, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		done += (size_t)w;
	}
	return 0;
}

static int fork_child_sandboxed_server(int fd)
{
	if (sem_share_start_server(fd, 66) < 0 || harness_send_pattern(fd, 67, 0, 512u << 10) < 0)
		return -1;
	if (harness_recv_pattern(fd, 68, 0, 1u << 20, "the sandboxed child's answer") < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int fork_child_sandboxed_client(int fd)
{
	pid_t pid;
	int status = 0;

	if (sem_share_start_client(fd, 66) < 0 || harness_recv_pattern(fd, 67, 0, 1000, "before the fork") < 0)
		return -1;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		if (sem_sandbox() < 0)
			_exit(2);
		/* only write(2) from here: stdio would fstat */
		if (sem_read_pattern(fd, 1000, (512u << 10) - 1000, 67) < 0)
			_exit(3);
		if (sem_write_pattern(fd, 1u << 20, 68) < 0)
			_exit(4);
		_exit(0);
	}
	if (pid < 0)
		return harness_fail("fork: %s", strerror(errno));
	if (waitpid(pid, &status, 0) != pid)
		return harness_fail("waitpid: %s", strerror(errno));
	if (WIFSIGNALED(status))
		return harness_fail("the sandboxed child was killed by signal %d%s", WTERMSIG(status),
				WTERMSIG(status) == SIGSYS ? " (a system call its filter forbids)" : "");
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return harness_fail("the sandboxed child exited with %d (2: no sandbox, 3: read, 4: write)",
				WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	return 0;
}

/*
 * peer_forks_poll (ssh's client against sshd's preauth child): the server
 * sends 4 KiB, which the client reads; then the server forks and its child
 * writes 64 KiB and reads a 64 KiB answer. The client waits with poll()
 * and reads nonblocking: a read right after poll() said POLLIN must not
 * fail with EAGAIN (the kernel never does that to a lone reader), however
 * the connection moves underneath.
 */
static int peer_forks_poll_server(int fd)
{
	pid_t pid;

	if (sem_share_start_server(fd, 69) < 0 || harness_send_pattern(fd, 70, 0, 4096) < 0 || harness_expect_byte(fd, 'r') < 0)
		return -1;
	pid = fork();
	if (pid == 0)
		_exit(harness_send_pattern(fd, 71, 0, 65536) < 0 || harness_recv_pattern(fd, 72, 0, 65536, "the answer") < 0 ? 1 : 0);
	if (harness_wait_child(pid, "the writing child", 0) < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int peer_forks_poll_client(int fd)
{
	static unsigned char buffer[65536];
	size_t done = 0;
	int spurious = 0;

	if (sem_share_start_client(fd, 69) < 0 || harness_recv_pattern(fd, 70, 0, 4096, "before the fork") < 0 ||
	    harness_send_byte(fd, 'r') < 0)
		return -1;
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0)
		return harness_fail("O_NONBLOCK: %s", strerror(errno));
	for (int rounds = 0; done < sizeof(buffer) && rounds < 100000; rounds++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (poll(&p, 1, 10000) <= 0)
			return harness_fail("poll: no data within 10 s after %zu bytes", done);
		n = read(fd, buffer + done, sizeof(buffer) - done);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			spurious++;
			continue;
		}
		if (n <= 0)
			return harness_fail("read after POLLIN: %s", n < 0 ? strerror(errno) : "EOF");
		done += (size_t)n;
	}
	if (spurious)
		return harness_fail("%d reads failed with EAGAIN right after poll() reported POLLIN", spurious);
	if (harness_pattern_check(71, 0, buffer, sizeof(buffer), "the child's bytes") < 0)
		return -1;
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
		return harness_fail("clearing O_NONBLOCK: %s", strerror(errno));
	return harness_send_pattern(fd, 72, 0, 65536);
}

/*
 * urgent (telnet's Data Mark, ftp's ABOR): after the start the client sends
 * "abc", one byte with MSG_OOB, then "def", and closes. The server reads
 * "abc", waits in select() for the exceptional condition, reads the urgent
 * byte with recv(MSG_OOB), then "def" and EOF: the urgent byte is never
 * inline. Under fabsock the sender's stream goes back to TCP for it (the
 * kernel carries urgent data); it went inline as data before.
 */
static int urgent_server(int fd)
{
	struct timeval tv = { 10, 0 };
	char buf[3], oob = 0;
	fd_set ex;

	if (sem_share_start_server(fd, 57) < 0 || harness_recv_exact(fd, buf, 3) < 0)
		return -1;
	if (memcmp(buf, "abc", 3) != 0)
		return harness_fail("the first bytes are %02x %02x %02x, expected abc", buf[0], buf[1], buf[2]);
	FD_ZERO(&ex);
	FD_SET(fd, &ex);
	if (select(fd + 1, NULL, NULL, &ex, &tv) != 1)
		return harness_fail("no urgent data reported within 10 s (select: %s)", strerror(errno));
	if (recv(fd, &oob, 1, MSG_OOB) != 1 || oob != '!')
		return harness_fail("recv(MSG_OOB) gave %02x (%s), expected '!'", oob, strerror(errno));
	if (harness_recv_exact(fd, buf, 3) < 0)
		return -1;
	if (memcmp(buf, "def", 3) != 0)
		return harness_fail("after the urgent byte %02x %02x %02x, expected def", buf[0], buf[1], buf[2]);
	return harness_expect_eof(fd);
}

static int urgent_client(int fd)
{
	if (sem_share_start_client(fd, 57) < 0 || harness_send_all(fd, "abc", 3) < 0)
		return -1;
	if (send(fd, "!", 1, MSG_OOB) != 1)
		return harness_fail("send(MSG_OOB): %s", strerror(errno));
	return harness_send_all(fd, "def", 3);
}

/*
 * fork_mid_connect (a threaded program that spawns a child while another
 * thread connects: Python's subprocess closing every fd in the child, a
 * worker pool shelling out): one thread is inside a blocking connect() -
 * under fabsock its handshake holds the socket's lock, for a second here
 * (the script delays the HELLO) - when the main thread forks; the child
 * closes that fd and exits. A lock the parent's thread held at the fork is
 * held by no thread of the child: the child must neither hang nor crash.
 * Then the parent's connection carries 64 KiB each way as usual.
 */
struct fork_mid_connect_arg {
	int fd;
	int result;
	int error;
	int done; /* atomic: the thread is detached (a joinable one is a
		   * leak to TSan at the child's exit) */
};

static void *fork_mid_connect_thread(void *p)
{
	struct fork_mid_connect_arg *arg = p;

	arg->result = connect(arg->fd, harness_server_address->ai_addr, harness_server_address->ai_addrlen);
	arg->error = errno;
	__atomic_store_n(&arg->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Waits (bounded) for the connecting thread to finish. 0, or -1 (reported). */
static int fork_mid_connect_join(struct fork_mid_connect_arg *arg)
{
	double deadline = harness_now_ms() + HARNESS_PEER_WAIT_MS;

	while (!__atomic_load_n(&arg->done, __ATOMIC_ACQUIRE)) {
		if (harness_now_ms() > deadline)
			return harness_fail("connect() in the thread did not return");
		harness_sleep_ms(5);
	}
	return 0;
}

static int fork_mid_connect_server(int fd)
{
	if (sem_share_start_server(fd, 70) < 0 || harness_send_pattern(fd, 71, 0, 65536) < 0)
		return -1;
	return harness_expect_eof(fd);
}

static int fork_mid_connect_client(int unused)
{
	struct fork_mid_connect_arg arg = { .fd = -1 };
	pthread_t thread;
	int status = -1;
	pid_t pid;

	(void)unused;
	arg.fd = socket(harness_server_address->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (arg.fd < 0)
		return harness_fail("socket: %s", strerror(errno));
	if (pthread_create(&thread, NULL, fork_mid_connect_thread, &arg)) {
		close(arg.fd);
		return harness_fail("pthread_create failed");
	}
	pthread_detach(thread);
	harness_sleep_ms(300); /* the thread is inside connect() now */
	pid = fork();
	if (pid == 0) {
		alarm(10); /* a hang ends by SIGALRM: the parent reports it */
		close(arg.fd);
		exit(0);
	}
	if (harness_wait_child(pid, "the child closing the connecting socket", 0) < 0) {
		if (fork_mid_connect_join(&arg) == 0)
			close(arg.fd); /* else the thread may still use it */
		return -1;
	}
	if (fork_mid_connect_join(&arg) < 0)
		return -1;
	if (arg.result < 0) {
		harness_fail("connect in the thread failed: %s", strerror(arg.error));
	} else {
		harness_connections++;
		if (sem_share_start_client(arg.fd, 70) == 0 &&
		    harness_recv_pattern(arg.fd, 71, 0, 65536, "after the fork") == 0)
			status = 0;
	}
	close(arg.fd);
	return status;
}

static const struct harness_scenario scenarios[] = {
	{ "fork_child_reads", fork_child_reads_server, fork_child_reads_client, 0 },
	{ "fork_split", fork_split_server, fork_split_client, 0 },
	{ "parent_closes", parent_closes_server, parent_closes_client, 0 },
	{ "parent_exits", parent_exits_server, parent_exits_client, 0 },
	{ "pass_rights", pass_rights_server, pass_rights_client, 0 },
	{ "fork_child_sandboxed", fork_child_sandboxed_server, fork_child_sandboxed_client, 0 },
	{ "peer_forks_poll", peer_forks_poll_server, peer_forks_poll_client, 0 },
	{ "urgent", urgent_server, urgent_client, 0 },
	{ "fork_mid_connect", fork_mid_connect_server, fork_mid_connect_client, HARNESS_CLIENT_CONNECTS_ITSELF },
};

int main(int argc, char **argv)
{
	return harness_scenario_run("fs_semantics_share", scenarios, HARNESS_COUNT(scenarios), argc, argv);
}
