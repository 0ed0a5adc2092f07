/* SPDX-License-Identifier: MIT */
/*
 * The socket's data entry points: receive, send (and the bytes a client
 * holds before its HELLO-ACK), sendfile, splice, shutdown, and the socket
 * options and ioctls fabsock answers. Part of the socket module: the state
 * changes these need are sock.c's (sock_internal.h).
 */
#include "core/sock.h"
#include "core/sock_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "config/rules.h"
#include "core/bell.h"
#include "core/diag.h"
#include "core/engine.h"
#include "core/epoll.h"
#include "core/fabric.h"
#include "core/fdtable.h"
#include "core/handback.h"
#include "core/tcpfirst.h"
#include "core/guard.h"
#include "core/inherit.h"
#include "core/listener.h"
#include "core/negcache.h"
#include "core/negotiate.h"
#include "core/service.h"
#include "core/sigs.h"
#include "core/stats.h"
#include "core/udp.h"
#include "preload/real.h"

/* What sendfile() on an offloaded socket reads and sends at a time. */
#define FS_SENDFILE_CHUNK (256u << 10)

static uint64_t fs_timeout_ns(const struct timeval *tv)
{
	return (uint64_t)tv->tv_sec * 1000000000ull + (uint64_t)tv->tv_usec * 1000ull;
}

/* A socket this process cannot use as offloaded (fs_sock_unshare): the
 * kernel's, or the hand-back's error. */
static int fs_sock_foreign(struct fs_sock *s)
{
	int err;

	fs_sock_unshare(s, &err);
	return err ? err : FS_PASS;
}

/* FS_TCP from the stream: the kernel socket answers this call. */
static ssize_t fs_tcp_pass(ssize_t ret)
{
	return ret == FS_TCP ? FS_PASS : ret;
}

static uint64_t fs_deadline(uint64_t timeout_ns)
{
	return timeout_ns ? fs_now_ns() + timeout_ns : 0;
}

/* Whether this process may use S's stream: 0, or what fs_sock_foreign
 * says (FS_PASS once the stream went back to TCP for a socket shared with
 * another process, or the hand-back's error). S is offloaded. */
static int fs_sock_ours(struct fs_sock *s)
{
	if (s->pid != fs_self_pid() || fs_stream_hb(s->stream) == FS_HB_DONE)
		return fs_sock_foreign(s);
	return 0;
}

/* The first step of the data entry points: a socket still negotiating
 * settles (FOR_SEND, until DEADLINE_NS: fs_sock_settle), then says who
 * answers the call: 0, this process's stream; FS_PASS, the kernel socket;
 * -EAGAIN while the handshake is undecided at DEADLINE_NS; -errno. (A send
 * before the HELLO-ACK holds its bytes instead: fs_sock_send_early.) */
static int fs_sock_prepare(struct fs_sock *s, bool for_send, uint64_t deadline_ns)
{
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED && fs_sock_pending(s)) {
		int ret = fs_sock_settle(s, for_send, deadline_ns);

		if (ret && ret != FS_PASS)
			return ret;
	}
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED)
		return FS_PASS;
	return fs_sock_ours(s);
}

void fs_core_recv_defer_error(struct fs_sock *s, int err)
{
	__atomic_store_n(&s->rx_deferred_error, err, __ATOMIC_RELEASE);
}

ssize_t fs_core_recvmsg(struct fs_sock *s, struct msghdr *msg, int flags)
{
	bool nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	uint64_t deadline = fs_deadline(s->rcvtimeo_ns);
	ssize_t ret;

	if (__builtin_expect(__atomic_load_n(&s->rx_deferred_error, __ATOMIC_RELAXED) != 0, 0) &&
	    (ret = __atomic_exchange_n(&s->rx_deferred_error, 0, __ATOMIC_ACQ_REL)) != 0)
		return ret;
	if (fs_sock_state(s) == FS_SOCK_SERVER_PENDING) {
		ret = fs_sock_first_read(s, msg, flags, nonblock);
		if (ret != FS_FIRST_READ_NO)
			return ret;
	}
	ret = fs_sock_prepare(s, false, nonblock ? fs_now_ns() : deadline);
	if (ret == -EAGAIN && !nonblock && !deadline)
		return -EIO; /* an unbounded wait for the handshake ended undecided */
	if (ret == FS_PASS && fs_sock_state(s) != FS_SOCK_OFFLOADED && s->strip_hello &&
	    fs_negotiate_strip_hello(s, nonblock ? fs_now_ns() : deadline) == -EAGAIN)
		return -EAGAIN; /* TCP; a HELLO its client may still send goes first */
	if (ret)
		return ret;
	if (flags & MSG_OOB)
		return FS_PASS; /* a peer's urgent byte came over TCP (it took the stream back there): the kernel has it, or says EINVAL */
	if (flags & ~(MSG_PEEK | MSG_WAITALL | MSG_DONTWAIT | MSG_NOSIGNAL | MSG_CMSG_CLOEXEC))
		return -EOPNOTSUPP; /* MSG_TRUNC, MSG_ERRQUEUE... have no fabric meaning */
	if (s->shut_rd)
		return 0;
	ret = fs_tcp_pass(fs_stream_recv(s->stream, msg->msg_iov, (int)msg->msg_iovlen, flags, nonblock, deadline, s->fd));
	/* (counted once for the step-back and the history; after the read:
	 * the stream goes back at a turn's end, with nothing of the answer
	 * left unread as a rule) */
	if (ret > 0 && !(flags & MSG_PEEK) && !fs_tcpfirst_any(s->stream) && fs_stepback_received(&s->sb, (uint64_t)ret))
		fs_stepback_fire(s);
	if (ret != FS_PASS) {
		msg->msg_flags = 0;
		msg->msg_namelen = 0;
		msg->msg_controllen = 0;
	}
	return ret;
}

/* A socket in CONNECTING whose connect() finished before the service
 * thread noticed moves on now (fs_sock_connect_done). Returns false while
 * the connection is not up yet. */
static bool fs_sock_connect_advance(struct fs_sock *s)
{
	bool up;

	if (fs_sock_state(s) != FS_SOCK_CONNECTING)
		return true;
	fs_lock(&s->lock);
	up = fs_sock_connect_done(s);
	pthread_mutex_unlock(&s->lock);
	return up;
}

bool fs_sock_writable_early(const struct fs_sock *s)
{
	enum fs_sock_state st = fs_sock_state(s);

	return st != FS_SOCK_CLIENT_PENDING && !(st == FS_SOCK_CLIENT_HELLO_SENT && s->hold_full) &&
	       !(st == FS_SOCK_SERVER_PENDING && __atomic_load_n(&s->send_owed, __ATOMIC_ACQUIRE));
}

/* A send on a socket that has not settled. A client whose connection is up
 * holds the bytes in its stream until the HELLO-ACK lets them go, like
 * TCP's send buffer: the server application need not have read yet. A
 * nonblocking send never waits for the server (it answers the HELLO on its
 * first read, which may come seconds later): -EAGAIN while the probe is
 * unanswered or the hold is full, and the socket is not reported writable
 * until it settles (fs_sock_writable_early). A blocking one waits for the
 * ACK as long as SO_SNDTIMEO allows. The server side settles as before
 * (its wait is bounded by FABSOCK_FIRST_SEND_WAIT_MS and the probe's
 * timeout), without waiting for a nonblocking sender: -EAGAIN while the
 * client's probe or HELLO may still come, and the writability reported
 * again once that is over (fs_sock.send_owed). A blocking one waits as
 * before, not by SO_SNDTIMEO: the kernel's send into an empty buffer
 * never times out. Returns bytes held (> 0), 0 when the socket is
 * offloaded now (send on its stream), FS_PASS, -EAGAIN or -errno. */
static ssize_t fs_sock_send_early(struct fs_sock *s, const struct msghdr *msg, bool nonblock)
{
	uint64_t deadline = nonblock ? fs_now_ns() : fs_deadline(s->sndtimeo_ns);
	ssize_t ret;

	if (s->shut_wr && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT)
		return -EPIPE; /* shut down before the ACK (fs_sock_shutdown_early) */
	if (!fs_sock_connect_advance(s))
		return FS_PASS; /* the kernel answers for a connection not yet up */
	if ((fs_sock_state(s) == FS_SOCK_CLIENT_PENDING || fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT) &&
	    !s->shut_wr) {
		fs_lock(&s->lock);
		ret = 0;
		if (fs_sock_state(s) == FS_SOCK_CLIENT_PENDING)
			ret = fs_sock_send_hello(s, deadline);
		if (ret == FS_PASS) {
			fs_sock_release(s);
			pthread_mutex_unlock(&s->lock);
			return FS_PASS;
		}
		if (ret == 0 && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT && !s->stream) {
			/* An empty HELLO: the connection stays TCP, and the server
			 * takes exactly the HELLO off its head (it answers with a
			 * NAK, or strips it if it spoke first), so the bytes may
			 * follow it at once, as shutdown's FIN does. Waiting for the
			 * NAK made every send before the server's first read wait
			 * for it (for ever in a thread that accepts that connection
			 * itself later); the NAK is still read before the first
			 * receive. */
			pthread_mutex_unlock(&s->lock);
			return FS_PASS;
		}
		if (ret == 0 && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT)
			ret = fs_stream_send(s->stream, msg->msg_iov, (int)msg->msg_iovlen, true, 0, s->fd, false);
		if (ret == FS_TCP_FIRST) /* the ACK came and said TCP first (tcpfirst.h) */
			ret = fs_tcpfirst_kernel_send(s->stream, s->fd, msg, 0, true);
		if (ret > 0 || ret == -EAGAIN)
			s->hold_full = ret == -EAGAIN;
		pthread_mutex_unlock(&s->lock);
		if (ret > 0)
			return ret;
		if (nonblock && (ret == -EAGAIN || ret == 0))
			return -EAGAIN;
	}
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED)
		return 0;
	if (!fs_sock_pending(s))
		return FS_PASS;
	if (fs_sock_state(s) == FS_SOCK_SERVER_PENDING)
		deadline = nonblock ? fs_now_ns() : 0;
	return fs_sock_settle(s, true, deadline);
}

/* How many iovec entries a blocking send's rest may span (fs_sock_send_rest);
 * beyond them the send returns a partial count. */
#define FS_SEND_REST_IOV 64

/* A blocking send whose first DONE bytes of MSG the pre-ACK hold took: the
 * kernel's would not return before it sent everything, and programs count
 * on that (write() != len is an error to them), so send the rest where the
 * connection goes (fs_core_sendmsg waits for the ACK, bounded by
 * SO_SNDTIMEO; over TCP if it stays TCP). Returns the count sent, at least
 * DONE: an error after DONE bytes is the next call's, as the kernel's is. */
static ssize_t fs_sock_send_rest(struct fs_sock *s, const struct msghdr *msg, int flags, size_t done)
{
	struct iovec rest[FS_SEND_REST_IOV];
	struct msghdr m = *msg;
	size_t skip = done;
	ssize_t ret;
	int n = 0;

	for (size_t i = 0; i < msg->msg_iovlen && n < FS_SEND_REST_IOV; i++) {
		if (skip >= msg->msg_iov[i].iov_len) {
			skip -= msg->msg_iov[i].iov_len;
			continue;
		}
		rest[n].iov_base = (char *)msg->msg_iov[i].iov_base + skip;
		rest[n++].iov_len = msg->msg_iov[i].iov_len - skip;
		skip = 0;
	}
	if (!n)
		return (ssize_t)done;
	m.msg_iov = rest;
	m.msg_iovlen = (size_t)n;
	ret = fs_core_sendmsg(s, &m, flags | MSG_NOSIGNAL);
	if (ret == FS_PASS) {
		/* it went to TCP: the held bytes went first (fs_negotiate_abort_ex) */
		ret = fs_real.sendmsg(s->fd, &m, flags | MSG_NOSIGNAL);
	}
	return (ssize_t)done + (ret > 0 ? ret : 0);
}

ssize_t fs_core_sendmsg(struct fs_sock *s, const struct msghdr *msg, int flags)
{
	bool nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	ssize_t ret;

	if (s->strip_hello)
		s->strip_sent = true; /* a HELLO still to come is then dropped without a NAK */
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED) {
		size_t total = 0;

		ret = fs_sock_send_early(s, msg, nonblock);
		if (ret == -EPIPE && !(flags & MSG_NOSIGNAL))
			pthread_kill(pthread_self(), SIGPIPE);
		if (ret > 0 && !nonblock) {
			for (size_t i = 0; i < msg->msg_iovlen; i++)
				total += msg->msg_iov[i].iov_len;
			if ((size_t)ret < total)
				return fs_sock_send_rest(s, msg, flags, (size_t)ret);
		}
		if (ret > 0)
			fs_stepback_sent_held(&s->sb, (uint64_t)ret);
		if (ret)
			return ret;
	}
	if ((ret = fs_sock_ours(s)) != 0)
		return ret;
	if (msg->msg_controllen || (flags & MSG_OOB)) {
		/* ancillary data and urgent data have no fabric meaning: the
		 * stream goes back to TCP (descriptors passed with it go back
		 * first), then the kernel sends it, as it would have (an urgent
		 * byte sent as data would reach the peer's reader inline: telnet's
		 * Data Mark, ftp's abort) */
		fs_core_before_pass(msg);
		fs_handback_sync(s->stream, s->fd);
		return fs_sock_foreign(s);
	}
	if (s->shut_wr)
		ret = -EPIPE;
	else
		ret = fs_stream_send(s->stream, msg->msg_iov, (int)msg->msg_iovlen, nonblock, fs_deadline(s->sndtimeo_ns),
				     s->fd, (flags & MSG_MORE) != 0);
	if (ret == FS_TCP_FIRST) /* the writer is on TCP still (tcpfirst.h) */
		ret = fs_tcpfirst_kernel_send(s->stream, s->fd, msg, flags, nonblock);
	ret = fs_tcp_pass(ret);
	if (ret == FS_PASS)
		return ret;
	/* (the step back judges the fabric: not while a direction is on TCP) */
	if (ret > 0 && !fs_tcpfirst_any(s->stream))
		fs_stepback_sent(&s->sb, (uint64_t)ret);
	if (ret == -EPIPE && !(flags & MSG_NOSIGNAL))
		pthread_kill(pthread_self(), SIGPIPE);
	return ret;
}

ssize_t fs_core_sendfile(struct fs_sock *s, int in_fd, off_t *offset, size_t count)
{
	static __thread char *chunk;
	off_t pos = offset ? *offset : lseek(in_fd, 0, SEEK_CUR);
	size_t total = 0;
	ssize_t ret = 0;

	if (fs_sock_state(s) == FS_SOCK_SERVER_PENDING) {
		/* (a nonblocking one never waits: fs_sock_send_early) */
		ret = fs_sock_settle(s, true, s->nonblock ? fs_now_ns() : 0);
		if (ret)
			return ret;
	} else {
		fs_sock_connect_advance(s);
	}
	/* a client still negotiating: the chunks go through fs_core_sendmsg,
	 * which holds them until the ACK without waiting for the server */
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED && fs_sock_state(s) != FS_SOCK_CLIENT_PENDING &&
	    fs_sock_state(s) != FS_SOCK_CLIENT_HELLO_SENT)
		return FS_PASS; /* the kernel's socket: its own sendfile */
	if (pos < 0) {
		/* A pipe cannot be read back into on a partial send. */
		FS_WARN_ONCE("sendfile from a non-seekable fd onto an offloaded socket is not supported: EINVAL");
		return -EINVAL;
	}
	if (!chunk && !(chunk = malloc(FS_SENDFILE_CHUNK)))
		return -ENOMEM;
	while (total < count) {
		size_t want = count - total < FS_SENDFILE_CHUNK ? count - total : FS_SENDFILE_CHUNK;
		ssize_t got = pread(in_fd, chunk, want, pos);
		struct iovec iov = { chunk, 0 };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

		if (got < 0 && errno == EINTR && total)
			break;
		if (got < 0) {
			ret = -errno;
			break;
		}
		if (got == 0)
			break; /* end of file */
		iov.iov_len = (size_t)got;
		ret = fs_core_sendmsg(s, &msg, 0);
		if (ret <= 0)
			break;
		total += (size_t)ret;
		pos += ret;
		if (ret < got)
			break; /* nonblocking, partial */
	}
	if (offset)
		*offset = pos;
	else if (total)
		lseek(in_fd, pos, SEEK_SET);
	return total ? (ssize_t)total : ret;
}

/* ---- splice ------------------------------------------------------------ */

/* What one splice moves at most: the bounce buffer's size. */
#define FS_SPLICE_CHUNK (256u << 10)

/* splice's pipe side. The kernel's rules, mirrored (probed on 6.18):
 * SPLICE_F_NONBLOCK, or O_NONBLOCK on the pipe, makes only the pipe side
 * nonblocking; the socket side follows the socket's O_NONBLOCK (and its
 * SO_RCVTIMEO/SO_SNDTIMEO). Socket to pipe waits for room in the pipe
 * first (EPIPE and SIGPIPE when it has no reader), then for the socket's
 * bytes, and moves no more than the pipe takes then; pipe to socket waits
 * for bytes in the pipe (0 once it is empty and has no writer), then
 * takes out of the pipe only what the stream's send queue takes. SIGPIPE
 * with EPIPE on the socket side, as the kernel's splice (no MSG_NOSIGNAL
 * there). SPLICE_F_MORE, SPLICE_F_MOVE and SPLICE_F_GIFT are hints. */
struct fs_splice_pipe {
	int fd;
	bool nonblock;  /* SPLICE_F_NONBLOCK or O_NONBLOCK on the pipe */
	bool file_nb;   /* O_NONBLOCK on the pipe: its own write never waits */
	bool lend;      /* this write: vmsplice from a mapping of its own */
};

/* Whether FD is a pipe (or FIFO) open for reading (READ) or writing:
 * anything else is a misuse the kernel answers (EINVAL, EBADF). */
static bool fs_splice_is_pipe(int fd, bool read, int *fl)
{
	struct stat st;
	int acc;

	if (fstat(fd, &st) || !S_ISFIFO(st.st_mode))
		return false;
	*fl = fs_real.fcntl(fd, F_GETFL);
	if (*fl < 0)
		return false;
	acc = *fl & O_ACCMODE;
	return acc == O_RDWR || acc == (read ? O_RDONLY : O_WRONLY);
}

/* Waits for EVENTS on the pipe (not at all when NONBLOCK). Returns the
 * revents (0: not ready), or -EINTR for a signal whose handler does not
 * restart calls. */
static int fs_splice_pipe_wait(int fd, short events, bool nonblock)
{
	struct pollfd p = { .fd = fd, .events = events };

	for (;;) {
		int n = fs_real.poll(&p, 1, nonblock ? 0 : -1);

		if (n >= 0)
			return n ? p.revents : 0;
		if (errno != EINTR)
			return -errno;
		if (!fs_sigs_restart())
			return -EINTR;
	}
}

/* The sink of socket-to-pipe: writes what the stream's head holds into the
 * pipe; exactly what this takes is consumed (fs_stream_recv_to), the rest
 * stays first in the stream. Called without the engine lock. It must not
 * wait for room the pipe does not have: the kernel's splice never does
 * once it looked (it moves what fits), and a program whose one thread
 * splices into the pipe and then out of it would wait for itself.
 *  - O_NONBLOCK on the pipe: one write(), whatever part fits.
 *  - An empty pipe without O_NONBLOCK (SPLICE_F_NONBLOCK or not): write()
 *    until all is in. The caller asked for no more than the pipe's size,
 *    and an empty pipe takes that whole without waiting. (Only another
 *    writer that fills it between the look and the write can make this
 *    wait, until the pipe's reader takes some: the one case where a
 *    SPLICE_F_NONBLOCK splice may wait, never losing a byte. haproxy's
 *    pattern, SPLICE_F_NONBLOCK into its own blocking pipe, which it
 *    empties before it splices into it again, always comes here.)
 *  - A pipe that holds bytes already, whose buffers may take less than
 *    its size less FIONREAD (a partly read page, pages other splices
 *    filled in part): vmsplice(SPLICE_F_NONBLOCK), which moves what fits
 *    and waits for nothing, the one nonblocking write into a pipe that
 *    leaves its shared file flags alone (pwritev2's RWF_NOWAIT is
 *    EOPNOTSUPP on pipes, 6.18). vmsplice lends the pages to the pipe
 *    rather than copying them (seen on 6.18): BUF is then a private mapping
 *    of its own (P->lend), unmapped after, which the pipe keeps alive until
 *    its reader is done with the bytes. It is slow (a fresh mapping per
 *    call: 34-43 MB/s against 220-512 MB/s through write(), 64 KiB calls),
 *    hence only here. */
static ssize_t fs_splice_sink(void *arg, void *buf, size_t len)
{
	const struct fs_splice_pipe *p = arg;
	size_t done = 0;
	ssize_t n = 0;

	if (p->lend) {
		struct iovec iov = { .iov_base = buf, .iov_len = len };

		n = vmsplice(p->fd, &iov, 1, SPLICE_F_NONBLOCK);
		return n >= 0 ? n : errno == EAGAIN ? 0 : -errno;
	}
	/* bounded: each round writes at least a byte or ends */
	while (done < len) {
		n = fs_real.write(p->fd, (char *)buf + done, len - done);
		if (n <= 0)
			break;
		done += (size_t)n;
		if (p->file_nb)
			break;
	}
	if (done)
		return (ssize_t)done;
	return n < 0 && errno != EAGAIN ? -errno : 0;
}

/* The source of pipe-to-socket, called with the engine lock held: a read
 * that never waits, whatever the pipe's flags (vmsplice on a read end
 * copies out, and SPLICE_F_NONBLOCK makes it return at once). Returns the
 * bytes read, 0 at the end of file, -EAGAIN when the pipe is empty. */
static ssize_t fs_splice_source(void *arg, void *buf, size_t len)
{
	const struct fs_splice_pipe *p = arg;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	ssize_t n = vmsplice(p->fd, &iov, 1, SPLICE_F_NONBLOCK);

	return n >= 0 ? n : -errno;
}

/* Room in the pipe now: its size less what it holds (*HELD), a page at
 * least (a pipe that polled writable has a free page). Pipe buffers that
 * were read or filled only in part make it an estimate: the sink copes. */
static size_t fs_splice_pipe_room(int fd, int *held)
{
	int size = fs_real.fcntl(fd, F_GETPIPE_SZ);
	long page = sysconf(_SC_PAGESIZE);

	*held = 0;
	if (fs_real.ioctl(fd, FIONREAD, held) || *held < 0)
		*held = 0;
	if (size <= *held)
		return (size_t)page;
	return (size_t)(size - *held) > (size_t)page ? (size_t)(size - *held) : (size_t)page;
}

/* Socket (offloaded, this process's) to pipe. */
static ssize_t fs_splice_to_pipe(struct fs_sock *s, struct fs_splice_pipe *p, size_t len)
{
	static __thread char *bounce;
	uint64_t deadline = fs_deadline(s->rcvtimeo_ns);
	ssize_t ret = -EAGAIN;

	if (s->shut_rd)
		return 0;
	if (!bounce && !(bounce = malloc(FS_SPLICE_CHUNK)))
		return -ENOMEM;
	/* Rounds end when bytes moved, or on an error; another only when the
	 * pipe's room went to another writer between the look and the write,
	 * and a pipe that may wait waits for room again first. */
	for (int round = 0; round < 64; round++) {
		size_t want = len < FS_SPLICE_CHUNK ? len : FS_SPLICE_CHUNK, room;
		int ev = fs_splice_pipe_wait(p->fd, POLLOUT, p->nonblock), held;
		char *buf = bounce;

		if (ev < 0)
			return ev;
		if (ev & POLLERR) {
			/* no reader: the kernel's answer, EPIPE and SIGPIPE */
			pthread_kill(pthread_self(), SIGPIPE);
			return -EPIPE;
		}
		if (!(ev & POLLOUT))
			return -EAGAIN;
		room = fs_splice_pipe_room(p->fd, &held);
		if (want > room)
			want = room;
		p->lend = !p->file_nb && held > 0;
		if (p->lend) {
			buf = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (buf == MAP_FAILED)
				return -ENOMEM;
		}
		ret = fs_tcp_pass(fs_stream_recv_to(s->stream, buf, want, fs_splice_sink, p, s->nonblock, deadline,
						    s->fd));
		if (buf != bounce)
			munmap(buf, want);
		if (ret != -ENOSPC)
			break;
		ret = -EAGAIN;
		if (p->nonblock)
			break;
	}
	if (ret == -EAGAIN && !s->nonblock && !deadline && !p->nonblock)
		ret = -EINTR; /* (64 rounds of lost races: as a signal would end it) */
	if (ret > 0)
		FS_STAT_ADD(splice_bytes, (uint64_t)ret);
	if (ret > 0 && fs_stepback_received(&s->sb, (uint64_t)ret))
		fs_stepback_fire(s);
	return ret;
}

/* Pipe to socket (offloaded, this process's). */
static ssize_t fs_splice_from_pipe(struct fs_sock *s, struct fs_splice_pipe *p, size_t len)
{
	uint64_t deadline = fs_deadline(s->sndtimeo_ns);
	ssize_t ret = -EAGAIN;

	if (s->shut_wr) {
		pthread_kill(pthread_self(), SIGPIPE);
		return -EPIPE;
	}
	/* Another round only when another reader emptied the pipe between
	 * the look and the read. */
	for (int round = 0; round < 64; round++) {
		int ev = fs_splice_pipe_wait(p->fd, POLLIN, p->nonblock);

		if (ev < 0)
			return ev;
		if (!(ev & POLLIN))
			return ev & (POLLHUP | POLLERR) ? 0 : -EAGAIN; /* empty: no writer (0), or none yet */
		ret = fs_tcp_pass(fs_stream_send_from(s->stream, fs_splice_source, p, len, s->nonblock, deadline,
						      s->fd));
		if (ret != -ENODATA)
			break;
		ret = -EAGAIN;
		if (p->nonblock)
			break;
	}
	if (ret > 0) {
		FS_STAT_ADD(splice_bytes, (uint64_t)ret);
		fs_stepback_sent(&s->sb, (uint64_t)ret);
	}
	if (ret == -EPIPE)
		pthread_kill(pthread_self(), SIGPIPE);
	return ret;
}

ssize_t fs_core_splice(struct fs_sock *s, int pipe_fd, bool out, size_t len, unsigned flags)
{
	struct fs_splice_pipe p = { .fd = pipe_fd };
	bool nonblock = s->nonblock;
	int fl, ret;

	if (!len || (flags & ~(unsigned)(SPLICE_F_MOVE | SPLICE_F_NONBLOCK | SPLICE_F_MORE | SPLICE_F_GIFT)) ||
	    !fs_splice_is_pipe(pipe_fd, out, &fl))
		return FS_PASS; /* the kernel's answer, before it touches the socket */
	p.file_nb = fl & O_NONBLOCK;
	p.nonblock = p.file_nb || (flags & SPLICE_F_NONBLOCK);
	/* A connection the kernel made before the service thread noticed moves
	 * on now: passed as CONNECTING, the kernel's splice would put bytes on
	 * TCP ahead of the HELLO (as fs_sock_send_early does). */
	if (fs_sock_state(s) == FS_SOCK_CONNECTING && !fs_sock_connect_advance(s))
		return FS_PASS; /* the kernel answers for a connection not yet up: EAGAIN, nothing moved */
	if (out) {
		if (s->strip_hello)
			s->strip_sent = true; /* as a send: a HELLO still to come is dropped without a NAK */
		/* settle first (a client's held bytes go before these) */
		ret = fs_sock_prepare(s, true, nonblock ? fs_now_ns() : 0);
	} else {
		uint64_t deadline = fs_deadline(s->rcvtimeo_ns);

		if (__atomic_load_n(&s->rx_deferred_error, __ATOMIC_RELAXED) != 0 &&
		    (ret = __atomic_exchange_n(&s->rx_deferred_error, 0, __ATOMIC_ACQ_REL)) != 0)
			return ret;
		ret = fs_sock_prepare(s, false, nonblock ? fs_now_ns() : deadline);
		if (ret == -EAGAIN && !nonblock && !deadline)
			return -EIO; /* an unbounded wait for the handshake ended undecided (as recv) */
		/* on TCP: a HELLO its client may still send must not reach the pipe */
		if (ret == FS_PASS && fs_sock_state(s) != FS_SOCK_OFFLOADED && s->strip_hello &&
		    fs_negotiate_strip_hello(s, nonblock ? fs_now_ns() : deadline) == -EAGAIN)
			return -EAGAIN;
	}
	if (ret)
		return ret;
	return out ? fs_splice_from_pipe(s, &p, len) : fs_splice_to_pipe(s, &p, len);
}

int fs_core_to_kernel(struct fs_sock *s)
{
	int ret;

	/* a client whose HELLO is not out stays on TCP (fs_sock_client_to_kernel) */
	if ((fs_sock_state(s) == FS_SOCK_CONNECTING || fs_sock_state(s) == FS_SOCK_CLIENT_PENDING) &&
	    fs_sock_client_to_kernel(s))
		return FS_PASS;
	ret = fs_sock_prepare(s, true, 0);
	if (ret)
		return ret; /* FS_PASS: the kernel's already */
	fs_handback_sync(s->stream, s->fd);
	return fs_sock_foreign(s);
}

/* shutdown(SHUT_WR or SHUT_RDWR) of a client before the HELLO-ACK, which
 * must not wait for the server any more than a send does (the kernel's
 * shutdown never waits): the FIN is queued behind the held bytes and goes
 * with them when the ACK comes, or as the kernel's shutdown after them if
 * the connection stays TCP (fs_negotiate_abort_ex). After an empty HELLO
 * the kernel's own shutdown follows it at once. The wait for the probe's
 * answer (if not in yet) is bounded by FABSOCK_PROBE_TIMEOUT_MS. Returns 0
 * (done), FS_PASS, -errno, or 1: not a case for here, settle first. */
static int fs_sock_shutdown_early(struct fs_sock *s, int how)
{
	int ret = 0;

	fs_sock_connect_advance(s);
	if (fs_sock_state(s) != FS_SOCK_CLIENT_PENDING && fs_sock_state(s) != FS_SOCK_CLIENT_HELLO_SENT)
		return 1;
	fs_lock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_CLIENT_PENDING)
		ret = fs_sock_send_hello(s, 0);
	if (ret == FS_PASS) {
		fs_sock_release(s);
	} else if (ret == 0 && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT) {
		if (!s->stream) {
			ret = FS_PASS; /* nothing held: the NAK is read later, as usual */
		} else if (s->shut_wr || fs_stream_shutdown_wr(s->stream) == 0) {
			s->shut_wr = true;
			s->shut_rd = s->shut_rd || how == SHUT_RDWR;
		} else {
			ret = 1; /* no buffer for the FIN: settle first */
		}
	} else if (ret == 0) {
		ret = 1;
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

int fs_core_shutdown(struct fs_sock *s, int how)
{
	int ret;

	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return -EINVAL;
	if (fs_sock_pending(s) && how != SHUT_RD) {
		ret = fs_sock_shutdown_early(s, how);
		if (ret <= 0)
			return ret;
	}
	/* settle first, so the peer's view stays consistent */
	ret = fs_sock_prepare(s, true, 0);
	if (ret)
		return ret;
	/* The kernel checks that the socket is connected and the argument. */
	if (how == SHUT_RD || how == SHUT_RDWR)
		s->shut_rd = true;
	if ((how == SHUT_WR || how == SHUT_RDWR) && !s->shut_wr) {
		s->shut_wr = true;
		if (fs_stream_shutdown_wr(s->stream) == FS_TCP)
			return FS_PASS; /* back on TCP: the kernel's own shutdown */
		fs_service_kick();
	}
	return 0;
}

int fs_core_getsockopt(struct fs_sock *s, int level, int name, void *val, socklen_t *len)
{
	if (level == IPPROTO_TCP && name == TCP_CORK && val && len && *len >= sizeof(int) &&
	    fs_sock_state(s) == FS_SOCK_OFFLOADED && s->pid == fs_self_pid() && s->stream &&
	    __atomic_load_n(&s->stream->cork_kept, __ATOMIC_RELAXED)) {
		/* kept by the stream, not told to the kernel (fs_stream_set_cork) */
		*(int *)val = __atomic_load_n(&s->stream->corked, __ATOMIC_RELAXED);
		*len = sizeof(int);
		return 0;
	}
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED && level == SOL_SOCKET && name == SO_ERROR && val && len &&
	    *len >= sizeof(int) && s->pid == fs_self_pid()) {
		int err = 0;
		struct fs_stream *st = s->stream;

		if (st && st->error && !st->error_reported) {
			err = -st->error;
			st->error_reported = true;
		}
		*(int *)val = err;
		*len = sizeof(int);
		return 0;
	}
	return FS_PASS;
}

bool fs_core_setsockopt_kept(struct fs_sock *s, int level, int name, const void *val, socklen_t len)
{
	struct fs_stream *st;

	if (level != IPPROTO_TCP || name != TCP_CORK || !val || len < sizeof(int))
		return false;
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED || s->pid != fs_self_pid() || !(st = s->stream))
		return false;
	return fs_stream_set_cork(st, *(const int *)val != 0, s->cork_kernel);
}

void fs_core_setsockopt(struct fs_sock *s, int level, int name, const void *val, socklen_t len)
{
	if (level == IPPROTO_TCP && name == TCP_CORK && val && len >= sizeof(int))
		s->cork_kernel = *(const int *)val != 0;
	if (level != SOL_SOCKET || !val)
		return;
	if ((name == SO_RCVTIMEO || name == SO_SNDTIMEO) && len >= sizeof(struct timeval)) {
		uint64_t ns = fs_timeout_ns(val);

		if (name == SO_RCVTIMEO)
			s->rcvtimeo_ns = ns;
		else
			s->sndtimeo_ns = ns;
	} else if (name == SO_LINGER && len >= sizeof(struct linger)) {
		const struct linger *lin = val;

		s->linger0 = lin->l_onoff && lin->l_linger == 0;
	}
}

void fs_core_set_nonblock(struct fs_sock *s, bool nonblock)
{
	s->nonblock = nonblock;
}

/* Remembered so that close() knows to look for epoll members (epoll.c
 * handles the membership itself). */
void fs_core_epoll_add(struct fs_sock *s)
{
	__atomic_store_n(&s->event_loop, true, __ATOMIC_RELEASE);
}

int fs_core_fionread(struct fs_sock *s, int *avail)
{
	size_t n;

	/* A negotiating socket may hold handshake bytes (a HELLO, an ACK) the
	 * kernel would count: settle first, without waiting. Anything but
	 * this process's stream: the kernel counts (from now on, for a socket
	 * another process shares). */
	if (fs_sock_state(s) == FS_SOCK_CONNECTING || fs_sock_prepare(s, false, fs_now_ns()))
		return FS_PASS;
	if (fs_stream_hb(s->stream) != FS_HB_NONE)
		return FS_PASS; /* what is on its way over TCP */
	n = fs_stream_readable(s->stream);
	*avail = n > INT32_MAX ? INT32_MAX : (int)n;
	return 0;
}
