/* SPDX-License-Identifier: MIT */
/*
 * TCP first (FABSOCK_TCP_FIRST; docs/design.md "TCP first: the switch to the
 * fabric"): a stream whose HELLO and ACK both carried FS_HELLO_TCP_FIRST
 * carries the application's bytes on its kernel socket after the handshake,
 * unframed, and each direction moves to the fabric on its own:
 *   writer  TCP --(FABSOCK_TCP_FIRST_BYTES written, no kernel send of ours
 *           in flight)--> ONTO(N) queued: every later byte on the fabric
 *   reader  TCP --(the peer's ONTO at the head of the queue and exactly N
 *           bytes read from TCP)--> the fabric
 * The reader reads TCP through fabsock (non-blocking kernel reads, the
 * stream's wait), so that a blocked reader or an epoll waiter sees the
 * switch; a TCP byte is always below N, so reading TCP is always safe.
 * This is the hand-back (handback.h) in the other direction.
 *
 * Built: the switch after today's handshake. Not built (design.md): the
 * handshake without waits, fork/exec/SCM_RIGHTS before the switch,
 * MSG_OOB and the kernel's sendfile in the TCP phase.
 *
 * Every function here runs with the engine lock held unless it says not.
 */
#ifndef FS_CORE_TCPFIRST_H
#define FS_CORE_TCPFIRST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

struct fs_engine;
struct fs_stream;
struct fs_buf;

/* fs_stream_send's answer "write this on the kernel socket yourself, then
 * fs_tcpfirst_sent": the writer is in its TCP phase. */
#define FS_TCP_FIRST (-100002)

/* Either direction of S still on TCP (a hint, no lock needed). */
static inline bool fs_tcpfirst_any(const struct fs_stream *s);

/* The handshake: the client offers (its HELLO carries the flag), the
 * server agrees (its ACK echoes it) or not; the client learns which. */
bool fs_tcpfirst_offer(struct fs_engine *e, struct fs_stream *s);
bool fs_tcpfirst_server_agree(struct fs_engine *e, struct fs_stream *s, uint16_t hello_flags);
void fs_tcpfirst_client_agreed(struct fs_engine *e, struct fs_stream *s, bool offered, uint16_t ack_flags);

/* The writer: moves S's writer to the fabric when it may (FORCE: whatever
 * it wrote so far; a FIN, sendfile). Returns true when the writer is on
 * the fabric (now or before), false while it stays on TCP. */
bool fs_tcpfirst_tx_switch(struct fs_engine *e, struct fs_stream *s, bool force);
/* After FS_TCP_FIRST: writes MSG on FD, the kernel's way, and counts what
 * the kernel took. No lock held. Returns bytes or -errno. */
ssize_t fs_tcpfirst_kernel_send(struct fs_stream *s, int fd, const struct msghdr *msg, int flags, bool nonblock);

/* The reader: takes the peer's ONTO off the head when every TCP byte
 * before it was read (true: the reader is on the fabric now). A data-class
 * message before the ONTO resets the stream. */
bool fs_tcpfirst_take_onto(struct fs_engine *e, struct fs_stream *s);
/* One non-blocking kernel read into bytes DONE.. of the iovec (PEEK: not
 * counted), capped at the peer's N once known. Returns bytes, 0 at the
 * kernel's end of stream, -EAGAIN or -errno. */
ssize_t fs_tcpfirst_read(struct fs_engine *e, struct fs_stream *s, const struct iovec *iov, int iovcnt,
			 size_t done, size_t total, bool peek, int fd);
/* Whether FD has something for the reader (bytes, its end, an error). */
bool fs_tcpfirst_kernel_readable(int fd);
/* The peer's ONTO delivered in sequence order: checked, N noted. Returns
 * false when it breaks the protocol (the stream is reset; drop BUF). */
bool fs_tcpfirst_rx_onto(struct fs_engine *e, struct fs_stream *s, struct fs_buf *buf);
/* poll() events of S with a direction on TCP: EV (the fabric's view)
 * corrected by the kernel socket's. */
unsigned fs_tcpfirst_events(struct fs_stream *s, unsigned ev);

#include "core/engine.h"

/* The two direction flags are written under the engine lock, but read by
 * fs_tcpfirst_any without it: every write is atomic. */
static inline void fs_tf_set(bool *flag, bool value)
{
	__atomic_store_n(flag, value, __ATOMIC_RELAXED);
}

/* S's writer writes the kernel socket: its writability is the kernel's, so
 * poll and epoll watch the kernel socket for POLLOUT too (a hint). */
static inline bool fs_tcpfirst_tx_on_tcp(const struct fs_stream *s)
{
	return s && __atomic_load_n(&s->tf_tx_tcp, __ATOMIC_RELAXED);
}

static inline bool fs_tcpfirst_any(const struct fs_stream *s)
{
	return __atomic_load_n(&s->tf_tx_tcp, __ATOMIC_RELAXED) || __atomic_load_n(&s->tf_rx_tcp, __ATOMIC_RELAXED);
}

#endif
