/* SPDX-License-Identifier: MIT */
/*
 * The interposed libc functions (preload/symbols.def lists them). Each
 * wrapper only translates: look the fd up, hand fabsock's sockets to the
 * core (one receive entry, one send entry for every variant), and call the
 * real function for everything else or when the core answers FS_PASS.
 * Negative errnos from the core become -1/errno in fs_ret(), the only place
 * that does so.
 */
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
#include <unistd.h>

#include "core/epoll.h"
#include "core/guard.h"
#include "core/sock.h"
#include "preload/real.h"

#define FS_EXPORT __attribute__((visibility("default")))

__attribute__((constructor(101))) static void fs_preload_init(void)
{
	fs_core_init();
}

static inline long fs_ret(long ret)
{
	if (ret < 0) {
		errno = (int)-ret;
		return -1;
	}
	return ret;
}

FS_EXPORT int socket(int domain, int type, int protocol)
{
	int fd = fs_real.socket(domain, type, protocol);

	if (fd >= 0)
		fs_core_socket(fd, domain, type);
	return fd;
}

FS_EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	return fs_real.bind(fd, addr, len);
}

FS_EXPORT int listen(int fd, int backlog)
{
	struct fs_sock *s = fs_sock_get(fd);
	long ret;

	if (!s)
		return fs_real.listen(fd, backlog);
	ret = fs_core_listen(s, backlog);
	fs_sock_put(s);
	return (int)fs_ret(ret);
}

static int fs_accept_common(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	struct fs_sock *s = fs_sock_get(fd);
	int newfd = fs_real.accept4(fd, addr, len, flags);

	if (s) {
		if (newfd >= 0)
			fs_core_accepted(s, newfd, flags);
		fs_sock_put(s);
	}
	return newfd;
}

FS_EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	struct fs_sock *s = fs_sock_get(fd);
	int newfd;

	if (!s)
		return fs_real.accept(fd, addr, len);
	newfd = fs_real.accept(fd, addr, len);
	if (newfd >= 0)
		fs_core_accepted(s, newfd, 0);
	fs_sock_put(s);
	return newfd;
}

FS_EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	return fs_accept_common(fd, addr, len, flags);
}

FS_EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct fs_sock *s = fs_sock_get(fd);
	long ret;

	if (!s)
		return fs_real.connect(fd, addr, len);
	ret = addr ? fs_core_connect(s, addr, len) : FS_PASS;
	fs_sock_put(s);
	if (ret == FS_PASS)
		return fs_real.connect(fd, addr, len);
	return (int)fs_ret(ret);
}

/* ---- receive variants -------------------------------------------------- */

/* Returns FS_PASS when the fd is not fabsock's. */
static ssize_t fs_recv_entry(int fd, struct msghdr *msg, int flags)
{
	struct fs_sock *s = fs_sock_get(fd);
	ssize_t ret;

	if (!s)
		return FS_PASS;
	ret = fs_core_recvmsg(s, msg, flags);
	fs_sock_put(s);
	return ret;
}

#define FS_RECV_ONE(fd, buf, len, flags, real_call)                                   \
	do {                                                                          \
		struct iovec iov_ = { .iov_base = (buf), .iov_len = (len) };          \
		struct msghdr msg_ = { .msg_iov = &iov_, .msg_iovlen = 1 };          \
		ssize_t ret_ = fs_fdt_peek_any(fd) ? fs_recv_entry((fd), &msg_, (flags)) : FS_PASS; \
		if (ret_ == FS_PASS)                                                  \
			return real_call;                                             \
		return fs_ret(ret_);                                                  \
	} while (0)

#include "core/fdtable.h"
static inline int fs_fdt_peek_any(int fd)
{
	return fs_fdt_peek(fd) != NULL;
}

FS_EXPORT ssize_t read(int fd, void *buf, size_t len)
{
	FS_RECV_ONE(fd, buf, len, 0, fs_real.read(fd, buf, len));
}

FS_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	FS_RECV_ONE(fd, buf, len, flags, fs_real.recv(fd, buf, len, flags));
}

FS_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr, socklen_t *alen)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t ret = fs_fdt_peek_any(fd) ? fs_recv_entry(fd, &msg, flags) : FS_PASS;

	if (ret == FS_PASS)
		return fs_real.recvfrom(fd, buf, len, flags, addr, alen);
	if (ret >= 0 && addr && alen)
		*alen = 0; /* a connected TCP socket reports no source address */
	return fs_ret(ret);
}

FS_EXPORT ssize_t readv(int fd, const struct iovec *iov, int iovcnt)
{
	struct msghdr msg = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
	ssize_t ret;

	if (!fs_fdt_peek_any(fd))
		return fs_real.readv(fd, iov, iovcnt);
	if (iovcnt < 0 || iovcnt > IOV_MAX)
		return fs_ret(-EINVAL);
	ret = fs_recv_entry(fd, &msg, 0);
	if (ret == FS_PASS)
		return fs_real.readv(fd, iov, iovcnt);
	return fs_ret(ret);
}

FS_EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	ssize_t ret = fs_fdt_peek_any(fd) ? fs_recv_entry(fd, msg, flags) : FS_PASS;

	if (ret == FS_PASS)
		return fs_real.recvmsg(fd, msg, flags);
	return fs_ret(ret);
}

FS_EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
	if (len > buflen)
		return fs_real.__read_chk(fd, buf, len, buflen); /* reports the overflow */
	FS_RECV_ONE(fd, buf, len, 0, fs_real.__read_chk(fd, buf, len, buflen));
}

FS_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
	if (len > buflen)
		return fs_real.__recv_chk(fd, buf, len, buflen, flags);
	FS_RECV_ONE(fd, buf, len, flags, fs_real.__recv_chk(fd, buf, len, buflen, flags));
}

FS_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
				 struct sockaddr *addr, socklen_t *alen)
{
	if (len > buflen)
		return fs_real.__recvfrom_chk(fd, buf, len, buflen, flags, addr, alen);
	return recvfrom(fd, buf, len, flags, addr, alen);
}

/* ---- send variants ----------------------------------------------------- */

static ssize_t fs_send_entry(int fd, const struct msghdr *msg, int flags)
{
	struct fs_sock *s = fs_sock_get(fd);
	ssize_t ret;

	if (!s)
		return FS_PASS;
	ret = fs_core_sendmsg(s, msg, flags);
	fs_sock_put(s);
	return ret;
}

#define FS_SEND_ONE(fd, buf, len, flags, real_call)                                          \
	do {                                                                                 \
		struct iovec iov_ = { .iov_base = (void *)(buf), .iov_len = (len) };         \
		struct msghdr msg_ = { .msg_iov = &iov_, .msg_iovlen = 1 };                 \
		ssize_t ret_ = fs_fdt_peek_any(fd) ? fs_send_entry((fd), &msg_, (flags)) : FS_PASS; \
		if (ret_ == FS_PASS)                                                         \
			return real_call;                                                    \
		return fs_ret(ret_);                                                         \
	} while (0)

FS_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
	FS_SEND_ONE(fd, buf, len, 0, fs_real.write(fd, buf, len));
}

FS_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	FS_SEND_ONE(fd, buf, len, flags, fs_real.send(fd, buf, len, flags));
}

FS_EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *addr,
			 socklen_t alen)
{
	/* On a connected TCP socket the kernel ignores the destination; many
	 * programs written for UDP and TCP alike (sockperf) pass one anyway. */
	FS_SEND_ONE(fd, buf, len, flags, fs_real.sendto(fd, buf, len, flags, addr, alen));
}

FS_EXPORT ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
	struct msghdr msg = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
	ssize_t ret;

	if (!fs_fdt_peek_any(fd))
		return fs_real.writev(fd, iov, iovcnt);
	if (iovcnt < 0 || iovcnt > IOV_MAX)
		return fs_ret(-EINVAL);
	ret = fs_send_entry(fd, &msg, 0);
	if (ret == FS_PASS)
		return fs_real.writev(fd, iov, iovcnt);
	return fs_ret(ret);
}

FS_EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	ssize_t ret;

	/* msg_name is ignored on a connected TCP socket, as by the kernel;
	 * ancillary data has no meaning on the fabric and goes to the kernel. */
	if (!fs_fdt_peek_any(fd) || msg->msg_controllen)
		return fs_real.sendmsg(fd, msg, flags);
	ret = fs_send_entry(fd, msg, flags);
	if (ret == FS_PASS)
		return fs_real.sendmsg(fd, msg, flags);
	return fs_ret(ret);
}

/* sendfile onto an offloaded socket reads the file and sends it over the
 * fabric; anything else is the kernel's. */
FS_EXPORT ssize_t sendfile(int out_fd, int in_fd, off_t *offset, size_t count)
{
	struct fs_sock *s;
	ssize_t ret;

	if (!fs_fdt_peek_any(out_fd) || !(s = fs_sock_get(out_fd)))
		return fs_real.sendfile(out_fd, in_fd, offset, count);
	ret = fs_core_sendfile(s, in_fd, offset, count);
	fs_sock_put(s);
	if (ret == FS_PASS)
		return fs_real.sendfile(out_fd, in_fd, offset, count);
	return fs_ret(ret);
}

FS_EXPORT ssize_t sendfile64(int out_fd, int in_fd, off64_t *offset, size_t count)
{
	_Static_assert(sizeof(off64_t) == sizeof(off_t), "64-bit off_t");
	return sendfile(out_fd, in_fd, (off_t *)offset, count);
}

/* splice moves data inside the kernel, which never has an offloaded
 * socket's data: refused with EINVAL on one (and a warning once). */
FS_EXPORT ssize_t splice(int fd_in, loff_t *off_in, int fd_out, loff_t *off_out, size_t len, unsigned int flags)
{
	for (int side = 0; side < 2; side++) {
		int fd = side ? fd_out : fd_in;
		struct fs_sock *s;
		long ret;

		if (!fs_fdt_peek_any(fd) || !(s = fs_sock_get(fd)))
			continue;
		ret = fs_core_splice(s, side == 1);
		fs_sock_put(s);
		if (ret != FS_PASS)
			return fs_ret(ret);
	}
	return fs_real.splice(fd_in, off_in, fd_out, off_out, len, flags);
}

/* ---- descriptor-level calls -------------------------------------------- */

FS_EXPORT int close(int fd)
{
	struct fs_sock *s;
	long ret;

	if (!FS_GUARDED() && fs_epoll_has_members(fd))
		fs_epoll_closed(fd);
	if (!fs_fdt_peek_any(fd))
		return fs_real.close(fd);
	if (fs_fdt_peek(fd) == FS_SOCK_INTERNAL && !FS_GUARDED())
		return (int)fs_ret(-EBADF); /* fabsock's own: not the application's to close */
	s = fs_sock_get(fd);
	if (!s)
		return fs_real.close(fd);
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

	if (FS_GUARDED() || !fs_fdt_size || (flags & CLOSE_RANGE_CLOEXEC) || first > last)
		return fs_real.close_range(first, last, flags);
	hi = last < fs_fdt_size - 1 ? last : (unsigned int)fs_fdt_size - 1;
	for (unsigned int fd = first; fd <= hi && fd >= first; fd++) {
		struct fs_sock *peek = fs_fdt_peek((int)fd);

		if (fs_epoll_has_members((int)fd))
			fs_epoll_closed((int)fd);
		if (!peek)
			continue;
		if (peek == FS_SOCK_INTERNAL) {
			if (start < fd && fs_real.close_range(start, fd - 1, flags))
				return -1;
			start = fd + 1;
			continue;
		}
		close((int)fd); /* the stream's orderly close */
	}
	if (start > last || start < first)
		return 0;
	return fs_real.close_range(start, last, flags);
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
		fs_real.close(newfd);
		return (int)fs_ret(ret);
	}
	return newfd;
}

FS_EXPORT int dup(int fd)
{
	if (!fs_fdt_peek_any(fd))
		return fs_real.dup(fd);
	return fs_dup_done(fd, fs_real.dup(fd));
}

/* dup2/dup3 replace NEWFD: what fabsock had there goes first, as at
 * close() (the kernel does the replacement atomically; fabsock lets go of
 * its state just before). Nothing happens when the call would fail. */
static int fs_dup_replace(int fd, int newfd, int flags, bool three)
{
	struct fs_sock *target = fs_fdt_peek(newfd);

	if (fd == newfd || (!fs_fdt_peek_any(fd) && !target && !fs_epoll_has_members(newfd)) || FS_GUARDED())
		return three ? fs_real.dup3(fd, newfd, flags) : fs_real.dup2(fd, newfd);
	if (fs_real.fcntl(fd, F_GETFD) < 0)
		return -1; /* EBADF, and NEWFD stays as it was */
	if (target == FS_SOCK_INTERNAL)
		return (int)fs_ret(-EBADF); /* fabsock's own fd: not the application's to replace */
	if (three && (flags & ~O_CLOEXEC))
		return (int)fs_ret(-EINVAL);
	if (fs_epoll_has_members(newfd))
		fs_epoll_closed(newfd);
	if (target)
		fs_core_dup_target(newfd);
	return fs_dup_done(fd, three ? fs_real.dup3(fd, newfd, flags) : fs_real.dup2(fd, newfd));
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
	struct fs_sock *s = fs_sock_get(fd);
	long ret;

	if (!s)
		return fs_real.shutdown(fd, how);
	ret = fs_core_shutdown(s, how);
	fs_sock_put(s);
	if (ret == FS_PASS)
		return fs_real.shutdown(fd, how);
	return (int)fs_ret(ret);
}

FS_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	struct fs_sock *s = fs_sock_get(fd);
	long ret;

	if (!s)
		return fs_real.getsockopt(fd, level, name, val, len);
	ret = fs_core_getsockopt(s, level, name, val, len);
	fs_sock_put(s);
	if (ret == FS_PASS)
		return fs_real.getsockopt(fd, level, name, val, len);
	return (int)fs_ret(ret);
}

FS_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	int ret = fs_real.setsockopt(fd, level, name, val, len);
	struct fs_sock *s;

	if (ret == 0 && (s = fs_sock_get(fd))) {
		fs_core_setsockopt(s, level, name, val, len);
		fs_sock_put(s);
	}
	return ret;
}

FS_EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	long arg;
	int ret;
	struct fs_sock *s;

	va_start(ap, cmd);
	arg = va_arg(ap, long); /* every command's argument fits in a long */
	va_end(ap);
	ret = fs_real.fcntl(fd, cmd, arg);
	if (ret >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC))
		return fs_dup_done(fd, ret);
	if (ret >= 0 && cmd == F_SETFL && (s = fs_sock_get(fd))) {
		fs_core_set_nonblock(s, (arg & O_NONBLOCK) != 0);
		fs_sock_put(s);
	}
	return ret;
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
		return fs_real.ioctl(fd, request, arg);
	s = fs_sock_get(fd);
	if (!s)
		return fs_real.ioctl(fd, request, arg);
	if (request == FIONREAD) {
		long r = fs_core_fionread(s, arg);

		fs_sock_put(s);
		if (r == FS_PASS)
			return fs_real.ioctl(fd, request, arg);
		return (int)fs_ret(r);
	}
	ret = fs_real.ioctl(fd, request, arg);
	if (ret == 0 && arg)
		fs_core_set_nonblock(s, *(int *)arg != 0);
	fs_sock_put(s);
	return ret;
}

FS_EXPORT int getpeername(int fd, struct sockaddr *addr, socklen_t *len)
{
	return fs_real.getpeername(fd, addr, len);
}

FS_EXPORT int getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
	return fs_real.getsockname(fd, addr, len);
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
		return fs_real.poll(fds, nfds, timeout);
	return (int)fs_ret(fs_core_poll(fds, nfds, fs_ms_to_ns(timeout), NULL));
}

FS_EXPORT int __poll_chk(struct pollfd *fds, nfds_t nfds, int timeout, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < nfds || FS_GUARDED() || !fs_core_enabled)
		return fs_real.__poll_chk(fds, nfds, timeout, fdslen); /* reports the overflow */
	return (int)fs_ret(fs_core_poll(fds, nfds, fs_ms_to_ns(timeout), NULL));
}

FS_EXPORT int ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask)
{
	if (FS_GUARDED() || !fs_core_enabled)
		return fs_real.ppoll(fds, nfds, timeout, sigmask);
	if (timeout && (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L))
		return (int)fs_ret(-EINVAL);
	return (int)fs_ret(fs_core_poll(fds, nfds, fs_ts_to_ns(timeout), sigmask));
}

FS_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask,
			  size_t fdslen)
{
	if (fdslen / sizeof(*fds) < nfds || FS_GUARDED() || !fs_core_enabled)
		return fs_real.__ppoll_chk(fds, nfds, timeout, sigmask, fdslen);
	return ppoll(fds, nfds, timeout, sigmask);
}

FS_EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timeval *timeout)
{
	int64_t ns;
	int ret;

	if (FS_GUARDED() || !fs_core_enabled)
		return fs_real.select(nfds, r, w, x, timeout);
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
		return fs_real.pselect(nfds, r, w, x, timeout, sigmask);
	if (timeout && (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L))
		return (int)fs_ret(-EINVAL);
	return (int)fs_ret(fs_core_select(nfds, r, w, x, fs_ts_to_ns(timeout), sigmask));
}

FS_EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *event)
{
	struct fs_sock *s = fs_sock_get(fd);
	long ret = FS_PASS;

	if (s) {
		if (op != EPOLL_CTL_ADD || fs_epoll_wants(s))
			ret = fs_epoll_ctl(epfd, op, fd, event, s);
		fs_sock_put(s);
	} else if (!FS_GUARDED() && fs_core_enabled && fs_fdt_peek(fd) == NULL &&
		   (op != EPOLL_CTL_ADD || fs_epoll_is_instance(fd))) {
		/* an epoll instance inside another: its fabsock members must be
		 * seen through it */
		ret = fs_epoll_ctl_nested(epfd, op, fd, event);
	}
	if (ret == FS_PASS)
		return fs_real.epoll_ctl(epfd, op, fd, event);
	return (int)fs_ret(ret);
}

FS_EXPORT int epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout)
{
	if (FS_GUARDED() || !fs_epoll_has_members(epfd))
		return fs_real.epoll_wait(epfd, events, maxevents, timeout);
	return (int)fs_ret(fs_epoll_wait(epfd, events, maxevents, timeout, NULL));
}

FS_EXPORT int epoll_pwait(int epfd, struct epoll_event *events, int maxevents, int timeout, const sigset_t *sigmask)
{
	if (FS_GUARDED() || !fs_epoll_has_members(epfd))
		return fs_real.epoll_pwait(epfd, events, maxevents, timeout, sigmask);
	return (int)fs_ret(fs_epoll_wait(epfd, events, maxevents, timeout, sigmask));
}

FS_EXPORT int epoll_pwait2(int epfd, struct epoll_event *events, int maxevents, const struct timespec *timeout,
			   const sigset_t *sigmask)
{
	int ms;

	if (FS_GUARDED() || !fs_epoll_has_members(epfd))
		return fs_real.epoll_pwait2(epfd, events, maxevents, timeout, sigmask);
	if (timeout && (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L))
		return (int)fs_ret(-EINVAL);
	/* rounded up: never return before the caller's time is up */
	ms = !timeout ? -1
		      : timeout->tv_sec > 2000000 ? 2000000000
						  : (int)(timeout->tv_sec * 1000 + (timeout->tv_nsec + 999999) / 1000000);
	return (int)fs_ret(fs_epoll_wait(epfd, events, maxevents, ms, sigmask));
}

FS_EXPORT pid_t fork(void)
{
	return fs_real.fork();
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
		return fs_real.pthread_create(thread, attr, start, arg);
	ts = malloc(sizeof(*ts));
	if (!ts)
		return EAGAIN;
	ts->start = start;
	ts->arg = arg;
	ret = fs_real.pthread_create(thread, attr, fs_internal_thread, ts);
	if (ret)
		free(ts);
	return ret;
}
