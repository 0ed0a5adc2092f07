/* SPDX-License-Identifier: MIT */
/*
 * The interposed libc functions (preload/symbols.def lists them). Each
 * wrapper only translates: look the fd up, hand fabsock's sockets to the
 * core (one receive entry, one send entry for every variant), and call the
 * real function for everything else or when the core answers FS_PASS.
 * Negative errnos from the core become -1/errno in fs_ret(), the only place
 * that does so.
 */
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/epoll.h"
#include "core/fabric.h"
#include "core/fdtable.h"
#include "core/plain.h"
#include "core/guard.h"
#include "core/handback.h"
#include "core/listener.h"
#include "core/sigs.h"
#include "core/sock.h"
#include "core/udp.h"
#include "core/util.h"
#include "preload/real.h"
#include "preload/wrappers.h"


#ifdef FS_SANITIZE_THREAD
/* A TSan-built library preloaded into a program that was not built with
 * TSan: the runtime initialises from this library's constructors and, while
 * it does, installs its signal handlers through sigaction(), which resolves
 * to the wrapper below. Until this library's constructor has run, the signal
 * wrappers go straight to libc, past the instrumented core. (This file is
 * built without TSan instrumentation: CMakeLists.txt.) */
static int fs_preload_ready;
extern int __sigaction(int sig, const struct sigaction *act, struct sigaction *oldact);
/* Before it (another library's constructor, the runtime's own start), a
 * wrapper that would call into the instrumented core goes to libc: no
 * socket of fabsock's can exist yet. */
#define FS_BEFORE_INIT() (!__atomic_load_n(&fs_preload_ready, __ATOMIC_ACQUIRE))
#else
#define FS_BEFORE_INIT() 0
#endif

__attribute__((constructor(101))) static void fs_preload_init(void)
{
	fs_core_init();
#ifdef FS_SANITIZE_THREAD
	__atomic_store_n(&fs_preload_ready, 1, __ATOMIC_RELEASE);
#endif
}


/* The socket of ours behind FD, a reference (fs_sock_put); NULL for one
 * fabsock leaves alone. For socket, connect, accept, listen and shutdown:
 * like send and recv, no vfork check (a getpid() system call on every
 * connection's path, issue 27 target 5). A vfork child may only exec or
 * _exit; the calls it makes before (dup2, close, close_range: Python's
 * subprocess) keep the check (fs_core_hands_off). One that opened sockets
 * anyway would leave entries for numbers free in its parent, which the
 * parent's own socket() or accept() at that number replaces, and which
 * pass any other file's calls to the kernel. */
static struct fs_sock *fs_wrap_sock(int fd)
{
	return fs_fdt_peek_any(fd) ? fs_sock_get(fd) : NULL;
}

/* listen() and shutdown(): the core's CALL for a socket of ours, the
 * kernel's REAL for any other and when the core passes (FS_PASS). */
static int fs_int_call(int fd, int arg, int (*call)(struct fs_sock *, int), int (*real)(int, int))
{
	struct fs_sock *s = fs_wrap_sock(fd);
	int ret;

	if (!s)
		return real(fd, arg);
	ret = call(s, arg);
	fs_sock_put(s);
	return ret == FS_PASS ? real(fd, arg) : (int)fs_ret(ret);
}

FS_EXPORT int socket(int domain, int type, int protocol)
{
	int fd = FS_REAL(socket)(domain, type, protocol);

	if (fd >= 0) /* (fs_core_socket: inside fabsock or disabled, nothing) */
		fs_core_socket(fd, domain, type);
	return fd;
}

FS_EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	/* TCP sockets are in the fd table; a UDP port is the application's
	 * even where a probe twin holds it */
	if (FS_BEFORE_INIT() || fs_fdt_peek_any(fd) || fs_core_hands_off())
		return FS_REAL(bind)(fd, addr, len);
	return (int)fs_ret(fs_core_udp_bind(fd, addr, len));
}

FS_EXPORT int listen(int fd, int backlog)
{
	return fs_int_call(fd, backlog, fs_core_listen, FS_REAL(listen));
}

/* accept() and accept4() on a socket of ours. An application that asks
 * for no address (a thread per connection) still gets none, but the real
 * call is given room for it: the server's first read then needs no
 * getpeername() to find the connection's probe record. */
static int fs_accept_common(int fd, struct sockaddr *addr, socklen_t *len, int flags, bool four)
{
	struct fs_sock *s = fs_wrap_sock(fd);
	struct sockaddr_storage own;
	socklen_t own_len = sizeof(own), room;
	unsigned spread;
	int newfd;

	if (!s)
		return four ? FS_REAL(accept4)(fd, addr, len, flags) : FS_REAL(accept)(fd, addr, len);
	if (!addr) {
		addr = (struct sockaddr *)&own;
		len = &own_len;
	}
	room = len ? *len : 0;
	/* before the descriptor exists: a fork after it gives it to the child */
	spread = __atomic_load_n(&fs_fds_spread, __ATOMIC_SEQ_CST);
	newfd = four ? FS_REAL(accept4)(fd, addr, len, flags) : FS_REAL(accept)(fd, addr, len);
	if (newfd >= 0)
		fs_core_accepted(s, newfd, flags, addr, len, room, spread);
	fs_sock_put(s);
	return newfd;
}

FS_EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	return fs_accept_common(fd, addr, len, 0, false);
}

FS_EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	return fs_accept_common(fd, addr, len, flags, true);
}

FS_EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct fs_sock *s = fs_wrap_sock(fd);
	long ret;

	if (!s)
		return FS_REAL(connect)(fd, addr, len);
	ret = addr ? fs_core_connect(s, addr, len) : FS_PASS;
	fs_sock_put(s);
	if (ret == FS_PASS)
		return FS_REAL(connect)(fd, addr, len);
	return (int)fs_ret(ret);
}

/* ---- receive variants -------------------------------------------------- */

ssize_t fs_msg_entry(int fd, struct msghdr *msg, int flags, bool send)
{
	struct fs_sock *s = fs_sock_get(fd);
	ssize_t ret;

	if (!s)
		return FS_PASS;
	ret = send ? fs_core_sendmsg(s, msg, flags) : fs_core_recvmsg(s, msg, flags);
	fs_sock_put(s);
	return ret;
}

static inline ssize_t fs_recv_entry(int fd, struct msghdr *msg, int flags)
{
	return fs_msg_entry(fd, msg, flags, false);
}

static inline ssize_t fs_send_entry(int fd, const struct msghdr *msg, int flags)
{
	return fs_msg_entry(fd, (struct msghdr *)msg, flags, true);
}

/* One buffer's call (read, recv, write, send...): the core's entry, or
 * REAL_CALL for an fd that is not fabsock's. */
#define FS_IO_ONE(send, fd, buf, len, flags, real_call)                                      \
	do {                                                                                 \
		struct iovec iov_ = { .iov_base = (void *)(buf), .iov_len = (len) };         \
		struct msghdr msg_ = { .msg_iov = &iov_, .msg_iovlen = 1 };                 \
		ssize_t ret_ = fs_fdt_peek_any(fd) ? fs_msg_entry((fd), &msg_, (flags), (send)) : FS_PASS; \
		if (ret_ == FS_PASS)                                                         \
			return real_call;                                                    \
		return fs_ret(ret_);                                                         \
	} while (0)
#define FS_RECV_ONE(fd, buf, len, flags, real_call) FS_IO_ONE(false, fd, buf, len, flags, real_call)
#define FS_SEND_ONE(fd, buf, len, flags, real_call) FS_IO_ONE(true, fd, buf, len, flags, real_call)

FS_EXPORT ssize_t read(int fd, void *buf, size_t len)
{
	FS_RECV_ONE(fd, buf, len, 0, FS_REAL(read)(fd, buf, len));
}

FS_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	FS_RECV_ONE(fd, buf, len, flags, FS_REAL(recv)(fd, buf, len, flags));
}

FS_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr, socklen_t *alen)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t ret = fs_fdt_peek_any(fd) ? fs_recv_entry(fd, &msg, flags) : FS_PASS;

	if (ret == FS_PASS)
		return FS_REAL(recvfrom)(fd, buf, len, flags, addr, alen);
	if (ret >= 0 && addr && alen)
		*alen = 0; /* a connected TCP socket reports no source address */
	return fs_ret(ret);
}

/* readv and writev on a socket of ours: the entry point with the vector as
 * a message (the kernel's count check first), or FS_PASS. */
static ssize_t fs_vec_entry(int fd, const struct iovec *iov, int iovcnt, bool send)
{
	struct msghdr msg = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };

	if (!fs_fdt_peek_any(fd))
		return FS_PASS;
	if (iovcnt < 0 || iovcnt > IOV_MAX)
		return -EINVAL;
	return send ? fs_send_entry(fd, &msg, 0) : fs_recv_entry(fd, &msg, 0);
}

FS_EXPORT ssize_t readv(int fd, const struct iovec *iov, int iovcnt)
{
	ssize_t ret = fs_vec_entry(fd, iov, iovcnt, false);

	return ret == FS_PASS ? FS_REAL(readv)(fd, iov, iovcnt) : fs_ret(ret);
}

/* Descriptors that came with MSG (SCM_RIGHTS): a mark a close fabsock did
 * not see left at their numbers goes (core/plain.h). */
static void fs_rights_received(const struct msghdr *msg)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR((struct msghdr *)msg); c; c = CMSG_NXTHDR((struct msghdr *)msg, c)) {
		size_t n;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
			continue;
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int got;

			memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(got));
			fs_plain_forget(got);
		}
	}
}

FS_EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	ssize_t ret = fs_fdt_peek_any(fd) ? fs_recv_entry(fd, msg, flags) : FS_PASS;

	if (ret == FS_PASS) {
		ret = FS_REAL(recvmsg)(fd, msg, flags);
		if (ret >= 0 && msg && msg->msg_controllen && !FS_BEFORE_INIT() &&
		    __atomic_load_n(&fs_plain_marks, __ATOMIC_RELAXED))
			fs_rights_received(msg);
		return ret;
	}
	return fs_ret(ret);
}

FS_EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
	if (len > buflen)
		return FS_REAL(__read_chk)(fd, buf, len, buflen); /* reports the overflow */
	FS_RECV_ONE(fd, buf, len, 0, FS_REAL(__read_chk)(fd, buf, len, buflen));
}

FS_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
	if (len > buflen)
		return FS_REAL(__recv_chk)(fd, buf, len, buflen, flags);
	FS_RECV_ONE(fd, buf, len, flags, FS_REAL(__recv_chk)(fd, buf, len, buflen, flags));
}

FS_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
				 struct sockaddr *addr, socklen_t *alen)
{
	if (len > buflen)
		return FS_REAL(__recvfrom_chk)(fd, buf, len, buflen, flags, addr, alen);
	return recvfrom(fd, buf, len, flags, addr, alen);
}

/* ---- send variants ----------------------------------------------------- */

FS_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
	FS_SEND_ONE(fd, buf, len, 0, FS_REAL(write)(fd, buf, len));
}

FS_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	FS_SEND_ONE(fd, buf, len, flags, FS_REAL(send)(fd, buf, len, flags));
}

FS_EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *addr,
			 socklen_t alen)
{
	/* On a connected TCP socket the kernel ignores the destination; many
	 * programs written for UDP and TCP alike (sockperf) pass one anyway. */
	FS_SEND_ONE(fd, buf, len, flags, FS_REAL(sendto)(fd, buf, len, flags, addr, alen));
}

FS_EXPORT ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
	ssize_t ret = fs_vec_entry(fd, iov, iovcnt, true);

	return ret == FS_PASS ? FS_REAL(writev)(fd, iov, iovcnt) : fs_ret(ret);
}

FS_EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	ssize_t ret;

	/* msg_name is ignored on a connected TCP socket, as by the kernel.
	 * Descriptors passed with SCM_RIGHTS (on any socket) must arrive as
	 * plain kernel sockets: offloaded ones go back to TCP first. */
	if (msg && msg->msg_controllen)
		fs_core_before_pass(msg);
	if (!fs_fdt_peek_any(fd))
		return FS_REAL(sendmsg)(fd, msg, flags);
	ret = fs_send_entry(fd, msg, flags);
	if (ret == FS_PASS)
		return FS_REAL(sendmsg)(fd, msg, flags);
	return fs_ret(ret);
}

/* sendfile onto an offloaded socket reads the file and sends it over the
 * fabric; anything else is the kernel's. */
FS_EXPORT ssize_t sendfile(int out_fd, int in_fd, off_t *offset, size_t count)
{
	struct fs_sock *s;
	ssize_t ret;

	if (!fs_fdt_peek_any(out_fd) || !(s = fs_sock_get(out_fd)))
		return FS_REAL(sendfile)(out_fd, in_fd, offset, count);
	ret = fs_core_sendfile(s, in_fd, offset, count);
	fs_sock_put(s);
	if (ret == FS_PASS)
		return FS_REAL(sendfile)(out_fd, in_fd, offset, count);
	return fs_ret(ret);
}

FS_EXPORT ssize_t sendfile64(int out_fd, int in_fd, off64_t *offset, size_t count)
{
	_Static_assert(sizeof(off64_t) == sizeof(off_t), "64-bit off_t");
	return sendfile(out_fd, in_fd, (off_t *)offset, count);
}

/* splice with an offloaded socket at one end and a pipe at the other:
 * the core moves the bytes between the stream and the pipe. Anything else
 * (both ends ours, no pipe, offsets, bad flags) is the kernel's, which
 * refuses a misuse before it moves a byte, with its own errno. */
FS_EXPORT ssize_t splice(int fd_in, loff_t *off_in, int fd_out, loff_t *off_out, size_t len, unsigned int flags)
{
	bool in = fs_fdt_peek_any(fd_in), out = fs_fdt_peek_any(fd_out);
	struct fs_sock *s;
	ssize_t ret;

	if (in == out || off_in || off_out || !(s = fs_sock_get(out ? fd_out : fd_in)))
		return FS_REAL(splice)(fd_in, off_in, fd_out, off_out, len, flags);
	ret = fs_core_splice(s, out ? fd_in : fd_out, out, len, flags);
	fs_sock_put(s);
	if (ret == FS_PASS)
		return FS_REAL(splice)(fd_in, off_in, fd_out, off_out, len, flags);
	return fs_ret(ret);
}

/* POSIX AIO (aio_read, aio_write, lio_listio): glibc's helper threads
 * read and write with its internal calls, which no wrapper sees, so on an
 * offloaded socket they would read a kernel socket that has none of the
 * stream's bytes and write bytes the peer takes as a reset. The stream goes
 * back to TCP first (as for urgent data, fs_core_to_kernel; a client whose
 * HELLO is not out yet stays on TCP): the kernel socket then carries every
 * byte, at kernel speed. */
static void fs_aio_fd(int fd)
{
	struct fs_sock *s;

	if (fd < 0 || !fs_fdt_peek_any(fd) || !(s = fs_sock_get(fd)))
		return;
	(void)fs_core_to_kernel(s); /* (an error: the kernel's call says what it is now) */
	fs_sock_put(s);
}

/* aio_read, aio_write and their 64-bit twins: the request's descriptor
 * goes back first. (A NULL CB: as glibc's own, which reads it.) */
#define FS_AIO_WRAPPER(name, cb_type)                   \
	FS_EXPORT int name(cb_type *cb)                 \
	{                                               \
		fs_aio_fd(cb->aio_fildes);              \
		return FS_REAL(name)(cb);               \
	}
FS_AIO_WRAPPER(aio_read, struct aiocb)
FS_AIO_WRAPPER(aio_write, struct aiocb)
FS_AIO_WRAPPER(aio_read64, struct aiocb64)
FS_AIO_WRAPPER(aio_write64, struct aiocb64)

/* lio_listio and lio_listio64: every request's descriptor but a LIO_NOP's
 * (which glibc skips) goes back first. */
#define FS_LIO_WRAPPER(name, cb_type)                                                         \
	FS_EXPORT int name(int mode, cb_type *const list[], int nent, struct sigevent *sig)   \
	{                                                                                     \
		for (int i = 0; i < nent; i++)                                                \
			if (list[i] && list[i]->aio_lio_opcode != LIO_NOP)                    \
				fs_aio_fd(list[i]->aio_fildes);                               \
		return FS_REAL(name)(mode, list, nent, sig);                                  \
	}
FS_LIO_WRAPPER(lio_listio, struct aiocb)
FS_LIO_WRAPPER(lio_listio64, struct aiocb64)

/* ---- descriptor-level calls -------------------------------------------- */

FS_EXPORT int close(int fd)
{
	struct fs_sock *s;
	long ret;

	if (FS_BEFORE_INIT() || (!fs_fdt_peek_any(fd) && !fs_epoll_known(fd) && !fs_epoll_left(fd))) {
		int closed, err;
		uint64_t mark = FS_BEFORE_INIT() ? 0 : fs_plain_take(fd);

		/* a TCP connection its history chose: the kernel's counts first
		 * (no vfork check: in such a child the report would only come
		 * early, with the counts so far) */
		if (__atomic_load_n(&fs_history_tracked, __ATOMIC_RELAXED) && !FS_BEFORE_INIT() && !FS_GUARDED())
			fs_history_fd_closing(fd);
		closed = FS_REAL(close)(fd);
		err = errno;
		/* a plain listener's untracked connection: its port's count */
		if (mark) {
			fs_plain_release(mark);
			errno = err;
		}

		/* an application's UDP socket that took a probe twin's port */
		if (__atomic_load_n(&fs_twin_displacers_n, __ATOMIC_RELAXED) && !FS_BEFORE_INIT() &&
		    !fs_core_hands_off()) {
			fs_listeners_fd_closed(fd);
			errno = err;
		}
		return closed;
	}
	if (fs_core_hands_off())
		return FS_GUARDED() && fs_fdt_peek(fd) == FS_SOCK_INTERNAL ? fs_internal_fd_close(fd), 0
									    : FS_REAL(close)(fd);
	if (fs_epoll_known(fd))
		fs_epoll_closed(fd);
	fs_epoll_left_closing(fd);
	if (!fs_fdt_peek_any(fd)) {
		if (__atomic_load_n(&fs_history_tracked, __ATOMIC_RELAXED))
			fs_history_fd_closing(fd); /* (in an epoll set: as above) */
		return FS_REAL(close)(fd);
	}
	if (fs_fdt_peek(fd) == FS_SOCK_INTERNAL && !FS_GUARDED())
		return (int)fs_ret(-EBADF); /* fabsock's own: not the application's to close */
	s = fs_sock_get(fd);
	if (!s)
		return FS_REAL(close)(fd);
	ret = fs_core_close(s, fd);
	fs_sock_put(s);
	return (int)fs_ret(ret);
}

/* close_range/closefrom: the fabsock sockets in the range close as with
 * close(); fabsock's own internal fds are left out (an application closing
 * "everything above 2" must not pull the engine's descriptors away); the
 * rest goes to the kernel in as few calls as the gaps allow. Setting
 * CLOSE_RANGE_CLOEXEC closes nothing now: the kernel does it all. */
FS_EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
	unsigned int hi, start = first;

	if (!fs_fdt_size || (flags & CLOSE_RANGE_CLOEXEC) || first > last || fs_core_hands_off())
		return FS_REAL(close_range)(first, last, flags);
	hi = last < fs_fdt_size - 1 ? last : (unsigned int)fs_fdt_size - 1;
	for (unsigned int fd = first; fd <= hi && fd >= first; fd++) {
		struct fs_sock *peek = fs_fdt_peek((int)fd);

		if (fs_epoll_known((int)fd))
			fs_epoll_closed((int)fd);
		fs_epoll_left_closing((int)fd);
		if (!peek) {
			uint64_t mark = fs_plain_take((int)fd);

			if (__atomic_load_n(&fs_history_tracked, __ATOMIC_RELAXED))
				fs_history_fd_closing((int)fd);
			if (mark)
				fs_plain_drop(mark); /* (its port stays counted) */
			continue;
		}
		if (peek == FS_SOCK_INTERNAL) {
			if (start < fd && FS_REAL(close_range)(start, fd - 1, flags))
				return -1;
			start = fd + 1;
			continue;
		}
		close((int)fd); /* the stream's orderly close */
	}
	if (start > last || start < first)
		return 0;
	return FS_REAL(close_range)(start, last, flags);
}

FS_EXPORT void closefrom(int lowfd)
{
	if (lowfd < 0)
		lowfd = 0;
	close_range((unsigned int)lowfd, ~0u, 0);
}

/* After a real dup of FD to NEWFD (>= 0): the duplicate shares FD's
 * fabsock socket. Returns NEWFD, or -1 with errno set (NEWFD closed). */
static int fs_dup_done(int fd, int newfd)
{
	struct fs_sock *s;
	long ret;

	if (newfd < 0 || !(s = fs_sock_get(fd)))
		return newfd;
	ret = fs_core_dup(s, newfd);
	fs_sock_put(s);
	if (ret) {
		FS_REAL(close)(newfd);
		return (int)fs_ret(ret);
	}
	return newfd;
}

FS_EXPORT int dup(int fd)
{
	int newfd;

	fs_plain_dup(fd);
	if (fs_epoll_left(fd))
		fs_fds_spread_note(); /* a second descriptor fabsock does not count */
	if (!fs_fdt_peek_any(fd) || fs_core_hands_off()) {
		newfd = FS_REAL(dup)(fd);
		if (newfd >= 0 && !FS_BEFORE_INIT())
			fs_plain_forget(newfd); /* (a mark left there: core/plain.h) */
		return newfd;
	}
	return fs_dup_done(fd, FS_REAL(dup)(fd));
}

static int fs_dup_replace(int fd, int newfd, int flags, bool three);

/* dup2/dup3 over a plain listener's untracked connection (core/plain.h):
 * its port's count is lowered once the kernel replaced it. */
static int fs_dup_over_plain(int fd, int newfd, int flags, bool three)
{
	uint64_t mark = fs_plain_take(newfd);
	int ret, err;

	fs_plain_dup(fd);
	ret = fs_dup_replace(fd, newfd, flags, three);
	err = errno;
	if (ret >= 0)
		fs_plain_release(mark);
	else
		fs_plain_restore(newfd, mark);
	errno = err;
	return ret;
}

/* dup2/dup3 replace NEWFD: what fabsock had there goes first, as at
 * close() (the kernel does the replacement atomically; fabsock lets go of
 * its state just before). Nothing happens when the call would fail. */
static int fs_dup_replace(int fd, int newfd, int flags, bool three)
{
	struct fs_sock *target = fs_fdt_peek(newfd);

	if (fd != newfd && fs_plain_marked(newfd) && !FS_BEFORE_INIT())
		return fs_dup_over_plain(fd, newfd, flags, three);
	if (fd != newfd)
		fs_plain_dup(fd);
	if (fd != newfd && fs_epoll_left(fd))
		fs_fds_spread_note(); /* a second descriptor fabsock does not count */
	/* a TCP connection its history chose, replaced: reported as closed */
	if (__atomic_load_n(&fs_history_tracked, __ATOMIC_RELAXED) && fd != newfd && !FS_BEFORE_INIT() &&
	    !fs_core_hands_off() && FS_REAL(fcntl)(fd, F_GETFD) >= 0)
		fs_history_fd_closing(newfd);
	if (fd == newfd || (!fs_fdt_peek_any(fd) && !target && !fs_epoll_known(newfd) && !fs_epoll_left(newfd)) ||
	    fs_core_hands_off())
		return three ? FS_REAL(dup3)(fd, newfd, flags) : FS_REAL(dup2)(fd, newfd);
	if (FS_REAL(fcntl)(fd, F_GETFD) < 0)
		return -1; /* EBADF, and NEWFD stays as it was */
	if (target == FS_SOCK_INTERNAL)
		return (int)fs_ret(-EBADF); /* fabsock's own fd: not the application's to replace */
	if (three && (flags & ~O_CLOEXEC))
		return (int)fs_ret(-EINVAL);
	if (fs_epoll_known(newfd))
		fs_epoll_closed(newfd);
	fs_epoll_left_closing(newfd);
	if (target)
		fs_core_dup_target(newfd);
	return fs_dup_done(fd, three ? FS_REAL(dup3)(fd, newfd, flags) : FS_REAL(dup2)(fd, newfd));
}

FS_EXPORT int dup2(int fd, int newfd)
{
	return fs_dup_replace(fd, newfd, 0, false);
}

FS_EXPORT int dup3(int fd, int newfd, int flags)
{
	return fs_dup_replace(fd, newfd, flags, true);
}

FS_EXPORT int shutdown(int fd, int how)
{
	return fs_int_call(fd, how, fs_core_shutdown, FS_REAL(shutdown));
}

/* The syscall() numbers that go to fabsock's wrappers (below). */
static inline bool fs_syscall_changes_fd(long number)
{
	switch (number) {
	case SYS_close:
#ifdef SYS_close_range
	case SYS_close_range:
#endif
	case SYS_dup:
#ifdef SYS_dup2
	case SYS_dup2:
#endif
	case SYS_dup3:
	case SYS_shutdown:
		return true;
	default:
		return false;
	}
}

/* syscall(): libuv (Node.js and everything else built on it) closes every
 * descriptor with syscall(SYS_close, fd), not close(), so that a signal
 * cannot cancel it. That close went straight to the kernel: the socket's
 * stream never learned of it, its FIN never went, the kernel socket (the
 * stream's control connection) closed at once, and the peer, seeing the
 * connection end without a FIN while bytes still waited for credit, reset
 * it (issue 26: 3.1-3.7 MB of a 4 MB response). The calls that decide what
 * a descriptor is (close, close_range, dup, dup2, dup3) and shutdown go to
 * their wrappers, which return -1/errno as syscall() does; every other
 * number, and fabsock's own raw calls (guarded, or before the table is
 * resolved), go to libc's syscall() unchanged. Six arguments are always
 * passed on, as glibc's syscall() itself loads six registers. */
FS_EXPORT long syscall(long number, ...)
{
	long a[6];
	va_list ap;

	va_start(ap, number);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	/* a user change the kernel makes for this thread only: fabsock's
	 * cached euid (fs_self_euid) is asked of the kernel from now on */
	if (number == SYS_setuid || number == SYS_setreuid || number == SYS_setresuid)
		__atomic_store_n(&fs_euid_uncached, true, __ATOMIC_RELAXED);
	/* the number first: futex and the other hot numbers (Rust's locks)
	 * pass straight on without a look at the thread's guard */
	if (fs_syscall_changes_fd(number) && !FS_BEFORE_INIT() && !FS_GUARDED() &&
	    __atomic_load_n(&fs_real_done, __ATOMIC_ACQUIRE)) {
		switch (number) {
		case SYS_close:
			return close((int)a[0]);
#ifdef SYS_close_range
		case SYS_close_range:
			return close_range((unsigned int)a[0], (unsigned int)a[1], (int)a[2]);
#endif
		case SYS_dup:
			return dup((int)a[0]);
#ifdef SYS_dup2
		case SYS_dup2:
			return dup2((int)a[0], (int)a[1]);
#endif
		case SYS_dup3:
			return dup3((int)a[0], (int)a[1], (int)a[2]);
		case SYS_shutdown:
			return shutdown((int)a[0], (int)a[1]);
		default:
			break;
		}
	}
	return fs_real_syscall_get()(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

FS_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	struct fs_sock *s = fs_sock_get(fd);
	long ret;

	if (!s)
		return FS_REAL(getsockopt)(fd, level, name, val, len);
	ret = fs_core_getsockopt(s, level, name, val, len);
	fs_sock_put(s);
	if (ret == FS_PASS)
		return FS_REAL(getsockopt)(fd, level, name, val, len);
	return (int)fs_ret(ret);
}

FS_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	struct fs_sock *s = fs_sock_get(fd);
	int ret;

	if (s && fs_core_setsockopt_kept(s, level, name, val, len)) {
		fs_sock_put(s);
		return 0;
	}
	ret = FS_REAL(setsockopt)(fd, level, name, val, len);
	if (s) {
		if (ret == 0)
			fs_core_setsockopt(s, level, name, val, len);
		fs_sock_put(s);
	}
	return ret;
}

/* fcntl and fcntl64 (the same function on 64-bit glibc; on 32-bit, fcntl64
 * is the one with 64-bit locks): REAL does it, and a duplicate or a new
 * O_NONBLOCK of a socket of ours is noted. */
static int fs_fcntl_common(int fd, int cmd, long arg, int (*real)(int, int, ...))
{
	int ret;
	struct fs_sock *s;

	if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
		fs_plain_dup(fd);
	ret = real(fd, cmd, arg);
	if (ret >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && !FS_BEFORE_INIT())
		fs_plain_forget(ret); /* (a mark left there: core/plain.h) */

	if (ret >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && fs_epoll_left(fd))
		fs_fds_spread_note(); /* a second descriptor fabsock does not count */
	if (ret >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && fs_fdt_peek_any(fd) && !fs_core_hands_off())
		return fs_dup_done(fd, ret);
	if (ret >= 0 && cmd == F_SETFL && fs_fdt_peek_any(fd) && (s = fs_sock_get(fd))) {
		fs_core_set_nonblock(s, (arg & O_NONBLOCK) != 0);
		fs_sock_put(s);
	}
	return ret;
}

FS_EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	long arg;

	va_start(ap, cmd);
	arg = va_arg(ap, long); /* every command's argument fits in a long */
	va_end(ap);
	return fs_fcntl_common(fd, cmd, arg, FS_REAL(fcntl));
}

FS_EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	long arg;

	va_start(ap, cmd);
	arg = va_arg(ap, long);
	va_end(ap);
	return fs_fcntl_common(fd, cmd, arg, FS_REAL(fcntl64));
}

FS_EXPORT int ioctl(int fd, unsigned long request, ...)
{
	va_list ap;
	void *arg;
	struct fs_sock *s;
	int ret;

	va_start(ap, request);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!fs_fdt_peek_any(fd) || (request != FIONREAD && request != FIONBIO))
		return FS_REAL(ioctl)(fd, request, arg);
	s = fs_sock_get(fd);
	if (!s)
		return FS_REAL(ioctl)(fd, request, arg);
	if (request == FIONREAD) {
		long r = fs_core_fionread(s, arg);

		fs_sock_put(s);
		if (r == FS_PASS)
			return FS_REAL(ioctl)(fd, request, arg);
		return (int)fs_ret(r);
	}
	ret = FS_REAL(ioctl)(fd, request, arg);
	if (ret == 0 && arg)
		fs_core_set_nonblock(s, *(int *)arg != 0);
	fs_sock_put(s);
	return ret;
}

FS_EXPORT int getpeername(int fd, struct sockaddr *addr, socklen_t *len)
{
	return FS_REAL(getpeername)(fd, addr, len);
}

FS_EXPORT int getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
	return FS_REAL(getsockname)(fd, addr, len);
}

static int64_t fs_ms_to_ns(int ms)
{
	return ms < 0 ? -1 : (int64_t)ms * 1000000;
}

static int64_t fs_ts_to_ns(const struct timespec *ts)
{
	return ts ? (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec : -1;
}

FS_EXPORT int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	if (FS_GUARDED() || !fs_core_enabled)
		return FS_REAL(poll)(fds, nfds, timeout);
	return (int)fs_ret(fs_core_poll(fds, nfds, fs_ms_to_ns(timeout), NULL));
}

FS_EXPORT int __poll_chk(struct pollfd *fds, nfds_t nfds, int timeout, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < nfds || FS_GUARDED() || !fs_core_enabled)
		return FS_REAL(__poll_chk)(fds, nfds, timeout, fdslen); /* reports the overflow */
	return (int)fs_ret(fs_core_poll(fds, nfds, fs_ms_to_ns(timeout), NULL));
}

FS_EXPORT int ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask)
{
	if (FS_GUARDED() || !fs_core_enabled)
		return FS_REAL(ppoll)(fds, nfds, timeout, sigmask);
	if (timeout && (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L))
		return (int)fs_ret(-EINVAL);
	return (int)fs_ret(fs_core_poll(fds, nfds, fs_ts_to_ns(timeout), sigmask));
}

FS_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask,
			  size_t fdslen)
{
	if (fdslen / sizeof(*fds) < nfds || FS_GUARDED() || !fs_core_enabled)
		return FS_REAL(__ppoll_chk)(fds, nfds, timeout, sigmask, fdslen);
	return ppoll(fds, nfds, timeout, sigmask);
}

FS_EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timeval *timeout)
{
	int64_t ns;
	int ret;

	if (FS_GUARDED() || !fs_core_enabled)
		return FS_REAL(select)(nfds, r, w, x, timeout);
	if (timeout && (timeout->tv_sec < 0 || timeout->tv_usec < 0))
		return (int)fs_ret(-EINVAL);
	ns = timeout ? (int64_t)timeout->tv_sec * 1000000000 + (int64_t)timeout->tv_usec * 1000 : -1;
	ret = fs_core_select(nfds, r, w, x, ns, NULL);
	/* Linux's select() leaves the time not slept in *timeout */
	if (timeout && ret == 0) {
		timeout->tv_sec = 0;
		timeout->tv_usec = 0;
	}
	return (int)fs_ret(ret);
}

FS_EXPORT int pselect(int nfds, fd_set *r, fd_set *w, fd_set *x, const struct timespec *timeout,
		      const sigset_t *sigmask)
{
	if (FS_GUARDED() || !fs_core_enabled)
		return FS_REAL(pselect)(nfds, r, w, x, timeout, sigmask);
	if (timeout && (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L))
		return (int)fs_ret(-EINVAL);
	return (int)fs_ret(fs_core_select(nfds, r, w, x, fs_ts_to_ns(timeout), sigmask));
}

/* epoll_create and epoll_create1: a new instance has no members (fabsock
 * learns an instance at its first epoll_ctl with one of its sockets); only
 * a mark a close fabsock did not see left at its number goes (it would
 * take the instance for a socket: core/plain.h). */
FS_EXPORT int epoll_create(int size)
{
	int fd = FS_REAL(epoll_create)(size);

	if (fd >= 0 && !FS_BEFORE_INIT())
		fs_plain_forget(fd);
	return fd;
}

FS_EXPORT int epoll_create1(int flags)
{
	int fd = FS_REAL(epoll_create1)(flags);

	if (fd >= 0 && !FS_BEFORE_INIT())
		fs_plain_forget(fd);
	return fd;
}

FS_EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *event)
{
	/* Like send and recv, no vfork check (a getpid() system call: a quarter
	 * of redis-benchmark's CPU, four epoll_ctl per request): epoll_ctl
	 * creates, closes and duplicates no descriptor (fs_core_hands_off). */
	struct fs_sock *s = fs_fdt_peek_any(fd) ? fs_sock_get(fd) : NULL;
	long ret = FS_PASS;

	if (s) {
		ret = fs_epoll_ctl(epfd, op, fd, event, s);
		fs_sock_put(s);
	} else if (!FS_GUARDED() && fs_core_enabled && fs_fdt_peek(fd) == NULL) {
		/* a socket fabsock let go of while epoll records named it:
		 * they go first, or a later look would undo this call */
		if (fs_epoll_left(fd))
			fs_epoll_left_ctl(epfd, fd);
		/* an epoll instance inside another: its fabsock members must be
		 * seen through it */
		if (op != EPOLL_CTL_ADD || fs_epoll_is_instance(fd))
			ret = fs_epoll_ctl_nested(epfd, op, fd, event);
	}
	if (ret == FS_PASS)
		return FS_REAL(epoll_ctl)(epfd, op, fd, event);
	return (int)fs_ret(ret);
}

FS_EXPORT int epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout)
{
	if (FS_GUARDED() || !fs_core_enabled)
		return FS_REAL(epoll_wait)(epfd, events, maxevents, timeout);
	if (!fs_epoll_known(epfd))
		return (int)fs_ret(fs_epoll_wait_plain(epfd, events, maxevents, timeout, NULL));
	return (int)fs_ret(fs_epoll_wait(epfd, events, maxevents, timeout, NULL));
}

FS_EXPORT int epoll_pwait(int epfd, struct epoll_event *events, int maxevents, int timeout, const sigset_t *sigmask)
{
	if (FS_GUARDED() || !fs_core_enabled)
		return FS_REAL(epoll_pwait)(epfd, events, maxevents, timeout, sigmask);
	if (!fs_epoll_known(epfd))
		return (int)fs_ret(fs_epoll_wait_plain(epfd, events, maxevents, timeout, sigmask));
	return (int)fs_ret(fs_epoll_wait(epfd, events, maxevents, timeout, sigmask));
}

FS_EXPORT int epoll_pwait2(int epfd, struct epoll_event *events, int maxevents, const struct timespec *timeout,
			   const sigset_t *sigmask)
{
	int ms, k;

	if (FS_GUARDED() || !fs_core_enabled)
		return FS_REAL(epoll_pwait2)(epfd, events, maxevents, timeout, sigmask);
	if (!fs_epoll_known(epfd)) {
		k = FS_REAL(epoll_pwait2)(epfd, events, maxevents, timeout, sigmask);
		/* another thread gave it a fabsock member meanwhile (epoll.h) */
		if (k <= 0 || !fs_epoll_known(epfd) || (k = fs_epoll_drop_ours(events, k)))
			return k;
		/* then fabsock's way (the whole timeout again: rather a wait
		 * longer than asked than a 0 before the time is up) */
	}
	if (timeout && (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L))
		return (int)fs_ret(-EINVAL);
	/* rounded up: never return before the caller's time is up */
	ms = !timeout ? -1
		      : timeout->tv_sec > 2000000 ? 2000000000
						  : (int)(timeout->tv_sec * 1000 + (timeout->tv_nsec + 999999) / 1000000);
	return (int)fs_ret(fs_epoll_wait(epfd, events, maxevents, ms, sigmask));
}

FS_EXPORT pid_t forkpty(int *amaster, char *name, const struct termios *termp, const struct winsize *winp)
{
	pid_t pid = FS_REAL(forkpty)(amaster, name, termp, winp);

	if (pid > 0 && !fs_core_hands_off())
		fs_handback_forked(pid);
	return pid;
}

/* The user changes: listener records follow (fs_core_uid_changed). */
#define FS_SETUID(call)                                         \
	do {                                                    \
		int ret_ = (call);                              \
		if (ret_ == 0 && !FS_BEFORE_INIT() && !fs_core_hands_off()) \
			fs_core_uid_changed();                  \
		return ret_;                                    \
	} while (0)

FS_EXPORT int setuid(uid_t uid)
{
	FS_SETUID(FS_REAL(setuid)(uid));
}

FS_EXPORT int seteuid(uid_t uid)
{
	FS_SETUID(FS_REAL(seteuid)(uid));
}

FS_EXPORT int setreuid(uid_t ruid, uid_t euid)
{
	FS_SETUID(FS_REAL(setreuid)(ruid, euid));
}

FS_EXPORT int setresuid(uid_t ruid, uid_t euid, uid_t suid)
{
	FS_SETUID(FS_REAL(setresuid)(ruid, euid, suid));
}

FS_EXPORT pid_t fork(void)
{
	pid_t pid = FS_REAL(fork)();

	/* the parent remembers its children: a close or an exit hands back
	 * the streams one may still share (core/handback.h) */
	if (pid > 0 && !fs_core_hands_off())
		fs_handback_forked(pid);
	return pid;
}

/* exec: this program's offloaded streams die with it, and a socket that
 * survives into the new program must be a plain kernel socket there: they
 * go back to TCP first (fs_core_before_exec). A spawned child takes only
 * what survives its exec. (glibc's own execl family calls its internal
 * execve, so each has its wrapper.) FS_EXEC runs CALL between the two. */
#define FS_EXEC(call)                                                      \
	do {                                                               \
		int ret_;                                                  \
		fs_core_before_exec(false);                                \
		ret_ = (call);                                             \
		fs_core_exec_failed();                                     \
		return ret_;                                               \
	} while (0)

FS_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	FS_EXEC(FS_REAL(execve)(path, argv, envp));
}

FS_EXPORT int execv(const char *path, char *const argv[])
{
	FS_EXEC(FS_REAL(execv)(path, argv));
}

FS_EXPORT int execvp(const char *file, char *const argv[])
{
	FS_EXEC(FS_REAL(execvp)(file, argv));
}

FS_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	FS_EXEC(FS_REAL(execvpe)(file, argv, envp));
}

/* execl, execle, execlp: the list as a vector, as glibc builds it (ARG, the
 * rest up to the NULL; execle's environment after it). */
#define FS_EXECL_ARGV(arg, argv_name, envp_name, want_envp, call)          \
	do {                                                               \
		va_list ap_;                                               \
		size_t n_ = 1;                                             \
		char **envp_name = NULL;                                   \
		va_start(ap_, arg);                                        \
		while (va_arg(ap_, char *))                                \
			n_++;                                              \
		if (want_envp)                                             \
			envp_name = va_arg(ap_, char **);                  \
		va_end(ap_);                                               \
		{                                                          \
			char *argv_name[n_ + 1];                           \
			va_start(ap_, arg);                                \
			argv_name[0] = (char *)(arg);                      \
			for (size_t i_ = 1; i_ <= n_; i_++)                \
				argv_name[i_] = va_arg(ap_, char *);       \
			va_end(ap_);                                       \
			(void)envp_name;                                   \
			FS_EXEC(call);                                     \
		}                                                          \
	} while (0)

FS_EXPORT int execl(const char *path, const char *arg, ...)
{
	FS_EXECL_ARGV(arg, argv, envp, false, FS_REAL(execve)(path, argv, environ));
}

FS_EXPORT int execle(const char *path, const char *arg, ...)
{
	FS_EXECL_ARGV(arg, argv, envp, true, FS_REAL(execve)(path, argv, envp));
}

FS_EXPORT int execlp(const char *file, const char *arg, ...)
{
	FS_EXECL_ARGV(arg, argv, envp, false, FS_REAL(execvp)(file, argv));
}

FS_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	FS_EXEC(FS_REAL(fexecve)(fd, argv, envp));
}

FS_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *actions,
			  const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	fs_core_before_exec(true);
	return FS_REAL(posix_spawn)(pid, path, actions, attr, argv, envp);
}

FS_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *actions,
			   const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	fs_core_before_exec(true);
	return FS_REAL(posix_spawnp)(pid, file, actions, attr, argv, envp);
}

/* system() and popen(): their shell inherits every descriptor without
 * FD_CLOEXEC, and holds it while it runs (epoll.c, fs_member_close_alone) */
FS_EXPORT int system(const char *command)
{
	fs_fds_spread_note();
	return FS_REAL(system)(command);
}

FS_EXPORT FILE *popen(const char *command, const char *type)
{
	fs_fds_spread_note();
	return FS_REAL(popen)(command, type);
}

/* _exit() and _Exit() end the process without atexit handlers (a forked
 * child's usual way out: Python's os._exit, fork-per-connection servers).
 * The kernel still delivers what a process wrote to its sockets before it
 * exits, however it exits; fabsock's bytes live in the process, so they go
 * out first (fs_core_exit). exit() reaches the kernel through glibc's own
 * _exit, not this one, after the atexit handler did the same. */
FS_EXPORT __attribute__((noreturn)) void _exit(int status)
{
	if (!fs_core_hands_off())
		fs_core_exit();
	FS_REAL(_exit)(status);
	__builtin_unreachable();
}

FS_EXPORT __attribute__((noreturn)) void _Exit(int status)
{
	if (!fs_core_hands_off())
		fs_core_exit();
	FS_REAL(_Exit)(status);
	__builtin_unreachable();
}

/* Inside fabsock's own calls only: libfabric's verbs provider reads all of
 * /proc/kallsyms twice when libfabric initialises (about 80 ms, in every
 * process that offloads) to learn whether the kernel supports peer memory
 * and dma-buf registrations, which fabsock never makes. It finds no file
 * and goes on without. Every other fopen() is the real one. */
static bool fs_fopen_refused(const char *path)
{
	return FS_GUARDED() && path && strcmp(path, "/proc/kallsyms") == 0;
}

FS_EXPORT FILE *fopen(const char *path, const char *mode)
{
	if (fs_fopen_refused(path)) {
		errno = ENOENT;
		return NULL;
	}
	return FS_REAL(fopen)(path, mode);
}

FS_EXPORT FILE *fopen64(const char *path, const char *mode)
{
	if (fs_fopen_refused(path)) {
		errno = ENOENT;
		return NULL;
	}
	return FS_REAL(fopen64)(path, mode);
}

/* libfabric 1.17's shm provider writes its region's name with
 * strncpy(name, src, total_size - name_offset): the region's size is rounded
 * up to a power of two, so that zero-fills the 3-4 MiB between the name and
 * the end of a region that ftruncate() has just created, faulting in every
 * page of it: the largest part of a process's first rail open (~40 % of a
 * curl's CPU under fabsock). While fabric.c enables an shm endpoint whose
 * region file did not exist (fs_fresh_region), a long strncpy therefore
 * writes the string and one NUL only: the rest of a new file reads as
 * zeros already, which is all the zero-fill would have written. Every other
 * strncpy is the real one (or, before the table is resolved, the same
 * semantics spelt out). */
FS_EXPORT char *strncpy(char *dst, const char *src, size_t len)
{
	size_t n;

	if (fs_fresh_region && FS_GUARDED() && len > 4096) {
		n = strnlen(src, len);
		memcpy(dst, src, n);
		if (n < len)
			dst[n] = '\0';
		return dst;
	}
	if (fs_real.strncpy)
		return fs_real.strncpy(dst, src, len);
	n = strnlen(src, len);
	memcpy(dst, src, n);
	memset(dst + n, 0, len - n);
	return dst;
}

/* sigaction() and signal(): a signal whose default action fabsock's exit
 * handler stands in for (core/sigs.h) still looks like the default to the
 * application, and its own handler replaces fabsock's. Any other signal is
 * the kernel's business. */
FS_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *oldact)
{
#ifdef FS_SANITIZE_THREAD
	if (FS_BEFORE_INIT())
		return __sigaction(sig, act, oldact);
#endif
	if (FS_GUARDED() || !fs_sigs_exit_watched(sig))
		return FS_REAL(sigaction)(sig, act, oldact);
	return (int)fs_ret(fs_sigs_app_sigaction(sig, act, oldact));
}

/* signal() and sysv_signal(): sigaction() with FLAGS (what glibc passes). */
static sighandler_t fs_signal_common(int sig, sighandler_t handler, int flags, bool reset_mask)
{
	struct sigaction act = { .sa_handler = handler, .sa_flags = flags }, old;

	sigemptyset(&act.sa_mask);
	if (!reset_mask)
		sigaddset(&act.sa_mask, sig);
	return sigaction(sig, &act, &old) ? SIG_ERR : old.sa_handler;
}

FS_EXPORT sighandler_t signal(int sig, sighandler_t handler)
{
	/* (before the constructor under TSan: through the sigaction wrapper,
	 * which goes to libc's __sigaction then; bsd_signal is this function) */
	if (FS_BEFORE_INIT())
		return fs_signal_common(sig, handler, SA_RESTART, false);
	if (FS_GUARDED() || !fs_sigs_exit_watched(sig))
		return FS_REAL(signal)(sig, handler);
	return fs_signal_common(sig, handler, SA_RESTART, false); /* glibc's signal(): BSD semantics */
}

/* System V semantics: reset to the default on delivery, not blocked while
 * its handler runs, no restart (glibc's sysv_signal). */
FS_EXPORT sighandler_t sysv_signal(int sig, sighandler_t handler)
{
	if (FS_BEFORE_INIT() || FS_GUARDED() || !fs_sigs_exit_watched(sig))
		return FS_REAL(sysv_signal)(sig, handler);
	if (handler == SIG_ERR || sig <= 0 || sig >= NSIG) {
		errno = EINVAL;
		return SIG_ERR;
	}
	return fs_signal_common(sig, handler, SA_RESETHAND | SA_NODEFER, true);
}

/* A provider's spin lock, taken inside a provider call: spin briefly, then
 * sleep, so that a holder waiting for this core gets it (fs_prov_spin_lock).
 * Everyone else's spin locks are glibc's, untouched. */
FS_EXPORT int pthread_spin_lock(pthread_spinlock_t *lock)
{
	if (!FS_GUARDED())
		return FS_REAL(pthread_spin_lock)(lock);
	return fs_prov_spin_lock(lock);
}

/* Threads a provider starts while fabsock is calling into it belong to the
 * provider for their whole life: they run with the guard held. */
struct fs_thread_start {
	void *(*start)(void *);
	void *arg;
};

static void *fs_internal_thread(void *p)
{
	struct fs_thread_start ts = *(struct fs_thread_start *)p;

	free(p);
	FS_GUARD_ENTER();
	return ts.start(ts.arg);
}

FS_EXPORT int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *), void *arg)
{
	struct fs_thread_start *ts;
	int ret;

	if (!FS_GUARDED())
		return FS_REAL(pthread_create)(thread, attr, start, arg);
	ts = malloc(sizeof(*ts));
	if (!ts)
		return EAGAIN;
	ts->start = start;
	ts->arg = arg;
	ret = FS_REAL(pthread_create)(thread, attr, fs_internal_thread, ts);
	if (ret)
		free(ts);
	return ret;
}

/* glibc's other public names of these functions (symbols.def) */
#define FS_SYM(ret, name, params)
#define FS_ALIAS(name, target) \
	extern __typeof__(target) name __attribute__((alias(#target), copy(target), visibility("default")));
#include "preload/symbols.def"
#undef FS_ALIAS
#undef FS_SYM
