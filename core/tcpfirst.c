/* SPDX-License-Identifier: MIT */
/*
 * TCP first: a stream's directions on the kernel socket until their ONTO,
 * and the switch of each to the fabric (protocol and states: tcpfirst.h and
 * docs/design.md "TCP first: the switch to the fabric"). stream.c calls in
 * from its send, receive and poll paths, rxq.c on an ONTO's arrival,
 * negotiate.c at the handshake, sock_io.c for the kernel writes.
 */
#include "core/tcpfirst.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "config/log.h"
#include "config/params.h"
#include "core/engine.h"
#include "core/pool.h"
#include "core/stats.h"
#include "core/stream_internal.h"
#include "core/wire.h"
#include "preload/real.h"

/* How many iovec entries one kernel read of the TCP phase fills at most;
 * a longer one returns what the first of them took, as a short read. */
#define FS_TF_IOV 64

/* ---- the handshake ------------------------------------------------------- */

bool fs_tcpfirst_offer(struct fs_engine *e, struct fs_stream *s)
{
	if (!fs_params.tcp_first || !s)
		return false;
	pthread_mutex_lock(&e->lock);
	/* The reader takes the server's ONTO from now on, in case the ACK
	 * agrees and the server switches before we took the ACK. */
	fs_tf_set(&s->tf_rx_tcp, true);
	fs_engine_unlock(e);
	return true;
}

bool fs_tcpfirst_server_agree(struct fs_engine *e, struct fs_stream *s, uint16_t hello_flags)
{
	if (!fs_params.tcp_first || !(hello_flags & FS_HELLO_TCP_FIRST))
		return false;
	/* Before the ACK goes: the client may switch right after reading it. */
	pthread_mutex_lock(&e->lock);
	fs_tf_set(&s->tf_tx_tcp, true);
	fs_tf_set(&s->tf_rx_tcp, true);
	fs_engine_unlock(e);
	FS_STAT_INC(tcp_first_streams);
	return true;
}

/* Queues S's ONTO; AT_HEAD: ahead of what the queue holds (bytes held
 * before the ACK, not posted yet: the join gives the first credit). */
static int fs_tf_queue_onto(struct fs_engine *e, struct fs_stream *s, bool at_head)
{
	struct fs_buf *buf = fs_pool_get(&s->erail->tx_data);
	uint64_t n = s->tf_tx_bytes;

	if (!buf)
		return -ENOBUFS;
	buf->kind = FS_MSG_ONTO;
	buf->len = FS_WIRE_ONTO_LEN;
	buf->stream = s;
	for (unsigned i = 0; i < FS_WIRE_ONTO_LEN; i++)
		buf->mem[FS_WIRE_MSG_PREFIX + i] = (uint8_t)(n >> (8 * i));
	if (at_head && s->txq_head) {
		buf->next = s->txq_head;
		s->txq_head = buf;
		s->txq_count++;
	} else {
		fs_stream_enqueue(e, s, buf);
	}
	fs_tf_set(&s->tf_tx_tcp, false);
	FS_STAT_INC(tcp_first_switches);
	FS_STAT_ADD(tcp_first_tcp_bytes, n);
	FS_DBG("stream %u: our bytes go on the fabric after %llu on TCP", s->id, (unsigned long long)n);
	return 0;
}

void fs_tcpfirst_client_agreed(struct fs_engine *e, struct fs_stream *s, bool offered, uint16_t ack_flags)
{
	pthread_mutex_lock(&e->lock);
	if (!offered || !(ack_flags & FS_HELLO_TCP_FIRST)) {
		fs_tf_set(&s->tf_rx_tcp, false);
		fs_tf_set(&s->tf_tx_tcp, false);
		fs_engine_unlock(e);
		return;
	}
	FS_STAT_INC(tcp_first_streams);
	/* Bytes the application wrote before the ACK are in the queue for the
	 * fabric already: our direction starts there, behind ONTO(0). */
	if (s->txq_head || s->tx_seq) {
		if (fs_tf_queue_onto(e, s, true))
			fs_stream_reset(e, s, "no buffer for the ONTO");
	} else {
		fs_tf_set(&s->tf_tx_tcp, true);
	}
	fs_engine_unlock(e);
}

/* ---- the writer ---------------------------------------------------------- */

bool fs_tcpfirst_tx_switch(struct fs_engine *e, struct fs_stream *s, bool force)
{
	if (!s->tf_tx_tcp)
		return true;
	/* N must count every byte a kernel send of ours took: not while one
	 * is under way in another thread (it is counted when it returns). A
	 * FIN does not wait for it: a send racing a shutdown or close of its
	 * own socket has no order the kernel would promise either. */
	if ((s->tf_tx_busy && !force) || s->state == FS_STREAM_HELLO || s->error)
		return false;
	if (!force && s->tf_tx_bytes < fs_params.tcp_first_bytes)
		return false;
	if (fs_tf_queue_onto(e, s, false))
		return false; /* no buffer now: TCP a while longer */
	fs_stream_flush(e, s);
	fs_stream_changed(e, s);
	return true;
}

ssize_t fs_tcpfirst_kernel_send(struct fs_stream *s, int fd, const struct msghdr *msg, int flags, bool nonblock)
{
	struct fs_engine *e = fs_engine_peek();
	struct msghdr m = *msg;
	ssize_t n;
	int err;

	/* (the caller raises SIGPIPE for EPIPE, as for the fabric's) */
	n = fs_real.sendmsg(fd, &m, flags | MSG_NOSIGNAL | (nonblock ? MSG_DONTWAIT : 0));
	err = errno;
	pthread_mutex_lock(&e->lock);
	s->tf_tx_busy--;
	if (n > 0)
		s->tf_tx_bytes += (uint64_t)n;
	fs_engine_unlock(e);
	return n < 0 ? -err : n;
}

/* ---- the reader ---------------------------------------------------------- */

bool fs_tcpfirst_kernel_readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };

	return fd >= 0 && fs_real.poll(&p, 1, 0) > 0 && p.revents;
}

bool fs_tcpfirst_take_onto(struct fs_engine *e, struct fs_stream *s)
{
	struct fs_buf *head = s->rxq_head;

	if (!s->tf_rx_tcp || !head || s->pulling)
		return !s->tf_rx_tcp;
	if (head->kind != FS_MSG_ONTO) {
		/* the peer's bytes over the fabric before it said where TCP ends */
		if (!s->error)
			fs_stream_reset(e, s, "data over the fabric before the peer's ONTO");
		return false;
	}
	if (s->tf_rx_bytes != s->tf_rx_end)
		return false; /* TCP bytes before it still to read */
	fs_stream_consume_head(e, s);
	fs_tf_set(&s->tf_rx_tcp, false);
	FS_STAT_INC(tcp_first_rx_switches);
	FS_DBG("stream %u: the peer's bytes come over the fabric after %llu on TCP", s->id,
		 (unsigned long long)s->tf_rx_end);
	fs_stream_changed(e, s);
	return true;
}

ssize_t fs_tcpfirst_read(struct fs_engine *e, struct fs_stream *s, const struct iovec *iov, int iovcnt,
			 size_t done, size_t total, bool peek, int fd)
{
	struct iovec sub[FS_TF_IOV];
	struct msghdr m = { .msg_iov = sub };
	size_t want = total - done, skip = done;
	ssize_t n;
	int k = 0;

	(void)e;
	if (s->tf_onto_known) {
		uint64_t left = s->tf_rx_end - s->tf_rx_bytes;

		if (!left)
			return -EAGAIN; /* the rest is the fabric's (take_onto) */
		if (want > left)
			want = (size_t)left;
	}
	for (int i = 0; i < iovcnt && k < FS_TF_IOV && want; i++) {
		size_t len = iov[i].iov_len;

		if (skip >= len) {
			skip -= len;
			continue;
		}
		sub[k].iov_base = (char *)iov[i].iov_base + skip;
		sub[k].iov_len = len - skip < want ? len - skip : want;
		want -= sub[k].iov_len;
		skip = 0;
		k++;
	}
	m.msg_iovlen = (size_t)k;
	n = fs_real.recvmsg(fd, &m, MSG_DONTWAIT | (peek ? MSG_PEEK : 0));
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	if (n > 0 && !peek)
		s->tf_rx_bytes += (uint64_t)n;
	return n;
}

bool fs_tcpfirst_rx_onto(struct fs_engine *e, struct fs_stream *s, struct fs_buf *buf)
{
	uint64_t n = 0;

	if (!s->tf_rx_tcp || s->tf_onto_known || buf->len != FS_WIRE_ONTO_LEN) {
		fs_stream_reset(e, s, "an ONTO the stream did not expect");
		return false;
	}
	for (unsigned i = 0; i < FS_WIRE_ONTO_LEN; i++)
		n |= (uint64_t)buf->mem[FS_WIRE_MSG_PREFIX + i] << (8 * i);
	if (n < s->tf_rx_bytes) {
		fs_stream_reset(e, s, "the peer's ONTO ends TCP before bytes we read there");
		return false;
	}
	s->tf_rx_end = n;
	s->tf_onto_known = true;
	buf->len = 0; /* a marker in the queue now: no byte of the application's */
	return true;
}

unsigned fs_tcpfirst_events(struct fs_stream *s, unsigned ev)
{
	struct pollfd p = { .fd = s->app_fd, .events = POLLIN | POLLRDHUP | POLLOUT };
	unsigned kev = 0;

	if (p.fd >= 0 && fs_real.poll(&p, 1, 0) > 0)
		kev = (unsigned)p.revents;
	if (s->tf_rx_tcp && !s->error) {
		ev &= ~(unsigned)(POLLIN | POLLRDHUP | POLLHUP);
		/* bytes, or the kernel's end (the reader looks for an ONTO then) */
		if ((kev & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) || s->rxq_head || s->tf_rx_eof)
			ev |= POLLIN;
		if (s->tf_rx_eof)
			ev |= POLLRDHUP;
	}
	if (s->tf_tx_tcp && !s->error) {
		ev &= ~(unsigned)POLLOUT;
		ev |= kev & (POLLOUT | POLLERR);
	}
	return ev;
}
