/* SPDX-License-Identifier: MIT */
/*
 * The batch and positional forms of receive and send: recvmmsg, sendmmsg,
 * preadv2 and pwritev2. On a socket of fabsock's each becomes a sequence of
 * calls to the core's one receive entry or one send entry (fs_msg_entry),
 * with the kernel's rules for how a batch ends and what it returns
 * (net/socket.c: do_recvmmsg, __sys_sendmmsg; fs/read_write.c). Everything
 * else goes to the real function.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "core/sock.h"
#include "preload/real.h"
#include "preload/wrappers.h"

#ifndef UIO_MAXIOV
#define UIO_MAXIOV 1024
#endif

static int64_t fs_batch_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * recvmmsg: one receive per message. MSG_WAITFORONE makes every receive
 * after the first nonblocking. The batch ends at the first error; the error
 * is the answer only when no message came, otherwise the count is, and the
 * error (other than EAGAIN) waits for the next receive, as the kernel keeps
 * it in sk_err. The timeout is looked at after each message, as the kernel
 * does (it bounds no single wait), and what is left of it is written back.
 * A stream that goes back to TCP in the middle (FS_PASS) ends the batch;
 * the kernel has the rest.
 */
FS_EXPORT int recvmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags, struct timespec *timeout)
{
	struct fs_sock *s;
	int64_t end_ns = 0;
	unsigned int done = 0;
	ssize_t ret = 0;

	if (!fs_fdt_peek_any(fd) || !(s = fs_sock_get(fd)))
		return FS_REAL(recvmmsg)(fd, vec, vlen, flags, timeout);
	if (timeout) {
		if (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L) {
			fs_sock_put(s);
			return (int)fs_ret(-EINVAL);
		}
		end_ns = fs_batch_now_ns() + (int64_t)timeout->tv_sec * 1000000000 + timeout->tv_nsec;
	}
	if (vlen > UIO_MAXIOV)
		vlen = UIO_MAXIOV;
	while (done < vlen) {
		int this_flags = flags & ~MSG_WAITFORONE;

		if (done && (flags & MSG_WAITFORONE))
			this_flags |= MSG_DONTWAIT;
		ret = fs_core_recvmsg(s, &vec[done].msg_hdr, this_flags);
		if (ret < 0)
			break;
		vec[done].msg_len = (unsigned int)ret;
		done++;
		if (timeout) {
			int64_t left = end_ns - fs_batch_now_ns();

			if (left <= 0) {
				timeout->tv_sec = 0;
				timeout->tv_nsec = 0;
				break;
			}
			timeout->tv_sec = left / 1000000000;
			timeout->tv_nsec = left % 1000000000;
		}
	}
	if (ret == FS_PASS && !done) {
		fs_sock_put(s);
		return FS_REAL(recvmmsg)(fd, vec, vlen, flags, timeout);
	}
	if (ret < 0 && ret != FS_PASS && done && ret != -EAGAIN)
		fs_core_recv_defer_error(s, (int)ret);
	fs_sock_put(s);
	if (done || ret >= 0 || ret == FS_PASS)
		return (int)done;
	return (int)fs_ret(ret);
}

/*
 * sendmmsg: one send per message; the batch ends at an error or at a
 * message sent in part (a full send queue on a nonblocking socket). The
 * count is the answer when any message went, the error otherwise.
 */
FS_EXPORT int sendmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags)
{
	struct fs_sock *s;
	unsigned int done = 0;
	ssize_t ret = 0;

	/* descriptors passed with SCM_RIGHTS leave as plain kernel sockets,
	 * as with sendmsg() */
	for (unsigned int i = 0; i < vlen && i < UIO_MAXIOV; i++)
		if (vec[i].msg_hdr.msg_controllen)
			fs_core_before_pass(&vec[i].msg_hdr);
	if (!fs_fdt_peek_any(fd) || !(s = fs_sock_get(fd)))
		return FS_REAL(sendmmsg)(fd, vec, vlen, flags);
	if (vlen > UIO_MAXIOV)
		vlen = UIO_MAXIOV;
	while (done < vlen) {
		const struct msghdr *m = &vec[done].msg_hdr;
		size_t want = 0;

		for (size_t i = 0; i < m->msg_iovlen; i++)
			want += m->msg_iov[i].iov_len;
		ret = fs_core_sendmsg(s, m, flags);
		if (ret < 0)
			break;
		vec[done].msg_len = (unsigned int)ret;
		done++;
		if ((size_t)ret < want)
			break;
	}
	fs_sock_put(s);
	if (ret == FS_PASS && !done)
		return FS_REAL(sendmmsg)(fd, vec, vlen, flags);
	if (done || ret == FS_PASS)
		return (int)done;
	return (int)fs_ret(ret);
}

/*
 * preadv2/pwritev2 at offset -1 are readv/writev with per-call flags
 * (RWF_NOWAIT: MSG_DONTWAIT; RWF_HIPRI, RWF_DSYNC, RWF_SYNC and RWF_APPEND
 * mean nothing to a socket, and the kernel takes them). At any other offset
 * the kernel refuses a socket (ESPIPE, or EINVAL) without touching its
 * data: the real call gives that answer.
 */
#define FS_RWF_KNOWN (RWF_HIPRI | RWF_DSYNC | RWF_SYNC | RWF_NOWAIT | RWF_APPEND)

static ssize_t fs_rw2_entry(int fd, const struct iovec *iov, int iovcnt, off_t offset, int flags, bool send)
{
	struct msghdr msg = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };

	if (offset != -1 || !fs_fdt_peek_any(fd))
		return FS_PASS;
	if (flags & ~FS_RWF_KNOWN)
		return -EOPNOTSUPP;
	if (iovcnt < 0 || iovcnt > IOV_MAX)
		return -EINVAL;
	return fs_msg_entry(fd, &msg, (flags & RWF_NOWAIT) ? MSG_DONTWAIT : 0, send);
}

FS_EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int iovcnt, off_t offset, int flags)
{
	ssize_t ret = fs_rw2_entry(fd, iov, iovcnt, offset, flags, false);

	return ret == FS_PASS ? FS_REAL(preadv2)(fd, iov, iovcnt, offset, flags) : fs_ret(ret);
}

FS_EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int iovcnt, off_t offset, int flags)
{
	ssize_t ret = fs_rw2_entry(fd, iov, iovcnt, offset, flags, true);

	return ret == FS_PASS ? FS_REAL(pwritev2)(fd, iov, iovcnt, offset, flags) : fs_ret(ret);
}

/* the _FILE_OFFSET_BITS=64 names (the same on 64-bit; their own real
 * functions, so that a 32-bit offset never stands in for a 64-bit one) */
FS_EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int iovcnt, off64_t offset, int flags)
{
	ssize_t ret = fs_rw2_entry(fd, iov, iovcnt, offset == -1 ? -1 : 0, flags, false);

	return ret == FS_PASS ? FS_REAL(preadv64v2)(fd, iov, iovcnt, offset, flags) : fs_ret(ret);
}

FS_EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int iovcnt, off64_t offset, int flags)
{
	ssize_t ret = fs_rw2_entry(fd, iov, iovcnt, offset == -1 ? -1 : 0, flags, true);

	return ret == FS_PASS ? FS_REAL(pwritev64v2)(fd, iov, iovcnt, offset, flags) : fs_ret(ret);
}
