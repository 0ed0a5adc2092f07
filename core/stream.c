/* SPDX-License-Identifier: MIT */
/*
 * The application's view of an offloaded stream: send, receive, shutdown,
 * close, and the wait loop that drives progress while a caller blocks.
 *
 * Waiting: a blocked caller polls the completion queue itself for up to
 * FABSOCK_SPIN_US (this is what beats the kernel's latency), then sleeps in
 * ppoll() on the stream's kernel TCP socket with a growing timeout capped at
 * FABSOCK_SLEEP_MAX_US, polling again on every wake (the pace is wait.c's;
 * the engine lock, the poller and the sleep set are this file's). The
 * kernel socket is the control channel: it becomes readable when the peer
 * process closes it or dies, which is how a vanished peer is noticed
 * within a few seconds.
 *
 * Kernel TCP semantics kept here: partial reads, MSG_PEEK, MSG_WAITALL,
 * EOF only after every byte sent before the peer's FIN, EPIPE after the
 * peer closed, ECONNRESET (once, then EOF/EPIPE) when it vanished, EAGAIN
 * for nonblocking calls and expired SO_RCVTIMEO/SO_SNDTIMEO, EINTR when a
 * signal handler without SA_RESTART ran.
 *
 * The queues themselves are not here: send appends to the send queue
 * through txq.c (fs_txq_append), recv copies out of the receive queue
 * through rxq.c (fs_recv_copy).
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "config/log.h"
#include "config/params.h"
#include "core/bell.h"
#include "core/ring.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/handback.h"
#include "core/tcpfirst.h"
#include "core/sigs.h"
#include "core/service.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/stream_internal.h"
#include "core/util.h"
#include "core/wait.h"
#include "preload/real.h"

void fs_stream_reset(struct fs_engine *e, struct fs_stream *s, const char *why)
{
	/* The kernel socket: the application's while the stream is open
	 * (app_fd follows its duplicates), its own once closed; on its way
	 * back to TCP it carries data, and the hand-back's own error path
	 * ends it. */
	int fd = s->hb != FS_HB_NONE ? -1 : s->state == FS_STREAM_CLOSED ? s->ctl_fd : s->app_fd;

	FS_WARN("stream %u: %s; resetting", s->id, why);
	s->error = -ECONNRESET;
	fs_stream_changed(e, s);
	FS_STAT_INC(resets);
	if (fd >= 0 && !s->peer_gone)
		(void)fs_tcp_reset(fd);
}

/* Looks at the control connection: EOF or reset means the peer closed the
 * socket or its process died. */
static void fs_stream_check_ctl(struct fs_stream *s, int ctl_fd)
{
	char byte;
	ssize_t n;

	if (ctl_fd < 0 || s->peer_gone)
		return;
	if (s->hb != FS_HB_NONE) {
		/* on its way back to TCP: the kernel socket carries data now */
		if (!s->dead)
			fs_stream_changed(fs_engine_peek(), s);
		return;
	}
	if ((s->tf_rx_tcp || s->tf_tx_tcp) && !s->dead)
		fs_stream_changed(fs_engine_peek(), s); /* TCP first: its bytes or its room (tcpfirst.h) */
	if (s->tf_rx_tcp)
		return; /* the peer's bytes until its ONTO; their end is the reader's to find */
	n = fs_real.recv(ctl_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n > 0) {
		/* Nothing may follow the handshake on the control channel. */
		fs_stream_reset(fs_engine_peek(), s, "unexpected bytes on the control connection");
	} else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
		s->peer_gone = true;
		s->peer_gone_ns = fs_now_ns();
		fs_stream_changed(fs_engine_peek(), s);
	}
}

/* A vanished peer whose FIN never came is a reset, once the grace period
 * for its last messages is over. */
static bool fs_stream_grace_runs(const struct fs_stream *s)
{
	return s->peer_gone && !s->peer_fin && !s->error;
}

static void fs_stream_check_gone(struct fs_stream *s, uint64_t now)
{
	if (fs_stream_grace_runs(s) && now >= s->peer_gone_ns + fs_params.peer_grace_ms * 1000000ull) {
		s->error = -ECONNRESET;
		fs_stream_changed(fs_engine_peek(), s);
		FS_STAT_INC(resets);
		FS_INFO("stream %u: peer closed its connection without a FIN: reset", s->id);
	}
}

/* Waits with the engine lock held (released while sleeping) until READY,
 * an error, or DEADLINE. Returns 0 when ready, else -EAGAIN (deadline),
 * -EINTR, or the stream's error. */
static int fs_stream_wait_once(struct fs_engine *e, struct fs_stream *s, fs_ready_fn ready, void *arg,
			       uint64_t deadline_ns, int ctl_fd, bool *poller, bool *counted);

/* Waits with the engine lock held (released while sleeping) until READY,
 * an error, or DEADLINE. Returns 0 when ready, else -EAGAIN (deadline),
 * -EINTR, or the stream's error.
 *
 * After the spin, one waiting thread per process is the poller: it sleeps
 * in short, growing slices and polls the completion queue between them.
 * Any other waiter sleeps on its control socket and the stream's eventfd
 * until the poller (or the service thread) rings it after a progress round
 * that changed its stream, or 50 ms pass. So N threads blocked in recv cost
 * what one does. Beside other waiters of a sleepy engine, a waiter whose
 * stream asked its peer for a ring with our last message sleeps on that
 * stream instead, as poll's waiters do (wait.h, fs_wait_stream_beside).
 * A signal still interrupts every sleeper (EINTR). */
int fs_stream_wait(struct fs_engine *e, struct fs_stream *s, fs_ready_fn ready, void *arg,
		   uint64_t deadline_ns, int ctl_fd)
{
	bool poller = false, counted = false;
	int ret = fs_stream_wait_once(e, s, ready, arg, deadline_ns, ctl_fd, &poller, &counted);

	if (counted)
		fs_ready_wait_leave();
	if (poller && e->has_poller && pthread_equal(e->poller, pthread_self())) {
		e->has_poller = false;
		fs_engine_wake_all(e); /* one of the sleepers takes over */
	}
	return ret;
}

/* Whether this waiter may leave the poller's round to the others and sleep
 * on its own stream (fs_wait_stream_beside): yes unless it is the poller
 * and another waiter sleeps until the poller rings it. A poller that may
 * gives the role up (the next waiter that needs one takes it). Lock held. */
static bool fs_stream_poller_free(struct fs_engine *e)
{
	if (!e->has_poller || !pthread_equal(e->poller, pthread_self()))
		return true;
	if (e->poller_deps)
		return false;
	e->has_poller = false;
	return true;
}

/* One step of W's spin, the engine lock let go: it is taken back without
 * queueing on it while the spin lasts (see fs_engine_progress_try), and
 * waited for after. */
static void fs_stream_spin_step(struct fs_engine *e, struct fs_wait *w)
{
	bool locked;

	fs_engine_unlock(e);
	do {
		fs_wait_spin(w);
		locked = pthread_mutex_trylock(&e->lock) == 0;
	} while (!locked && fs_wait_next(w, fs_now_ns()) == FS_WAIT_SPIN);
	if (!locked)
		pthread_mutex_lock(&e->lock);
}

static int fs_stream_wait_once(struct fs_engine *e, struct fs_stream *s, fs_ready_fn ready, void *arg,
			       uint64_t deadline_ns, int ctl_fd, bool *poller, bool *counted)
{
	struct fs_wait w;
	uint64_t now;

	fs_wait_begin(&w, e, fs_now_ns(), deadline_ns);
	for (;;) {
		enum fs_wait_step next;

		fs_engine_progress(e); /* retries a CREDIT whose post failed, too */
		if (s->state == FS_STREAM_CLOSED)
			return -EBADF; /* another thread closed the socket */
		if (ready(s, arg)) {
			fs_wait_done(&w, e, 1);
			return 0;
		}
		now = fs_now_ns();
		fs_stream_check_gone(s, now);
		if (s->error)
			return s->error;
		next = fs_wait_next(&w, now);
		if (next == FS_WAIT_OVER)
			return -EAGAIN;
		if (next == FS_WAIT_SPIN) {
			fs_stream_spin_step(e, &w);
			continue;
		}
		if (!*counted && fs_ring_peer_paged(s)) {
			/* Past its spin, a blocking waiter on a stream to a peer of
			 * this host counts among the threads that wait (wake.c):
			 * with two of them the engine no longer arms its every
			 * stream by datagram for one of them, and each sleeps on
			 * its own stream, armed by its own messages, instead. A
			 * remote peer arms no message of ours beside others (it
			 * has no page of sleepers to read): there the poller's
			 * engine-wide arming stays. */
			fs_ready_wait_enter();
			*counted = true;
		}
		/* (without an eventfd for S, the scheme below: that sleep
		 * would return at once and this loop would spin) */
		if (fs_wait_stream_beside(e, s) && fs_stream_wake_fd(s) >= 0 && fs_stream_poller_free(e)) {
			short rev = 0;
			int r = fs_wait_stream_beside_sleep(e, &w, s, ctl_fd < 0 || s->peer_gone ? -1 : ctl_fd, &rev);

			pthread_mutex_lock(&e->lock);
			if (r == -EINTR && !fs_sigs_restart())
				return -EINTR;
			if (r > 0 && (rev & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)))
				fs_stream_check_ctl(s, ctl_fd);
			continue;
		}
		if (!e->has_poller) {
			e->has_poller = true;
			e->poller = pthread_self();
		}
		*poller = pthread_equal(e->poller, pthread_self());
		if (!*poller)
			(void)fs_stream_wake_fd(s);
		{
			/* Deeply idle with every stream armed: the doorbell wakes us
			 * (the poller through the engine's deep fd, the others through
			 * their stream's eventfd), the slice is only a safety net. */
			bool deep = fs_engine_wait_deep(e, true);
			struct pollfd pfd[6] = {
				{ .fd = ctl_fd, .events = POLLIN | POLLRDHUP },
				{ .fd = *poller ? -1 : s->wake_fd, .events = POLLIN },
				{ .fd = deep && *poller ? fs_engine_deep_begin(e) : -1, .events = POLLIN },
				/* a deep sleeper reads a ring itself (fs_engine_bell_watched) */
				{ .fd = -1, .events = POLLIN },
				/* and a ring of a peer of this host (ring.h) */
				{ .fd = -1, .events = POLLIN },
				/* the provider's completion queue (tcp, net) */
				{ .fd = -1, .events = POLLIN },
			};
			struct timespec ts;
			uint64_t ns;
			bool relooked;
			int ret;

			if (*poller) {
				/* idle since the later of the wait's start and the
				 * engine's last activity: a doorbell ring means "poll
				 * briskly again" */
				fs_wait_note_activity(&w, e->active_ns);
				ns = fs_wait_slice_ns(&w, now);
			} else {
				/* rung by the poller; without an eventfd, polls at the
				 * first slice */
				ns = s->wake_fd < 0 ? FS_WAIT_FIRST_SLICE_US * 1000ull : 50000000ull;
			}
			if (deep && (pfd[2].fd >= 0 || (!*poller && s->wake_fd >= 0)))
				ns = FS_BELL_SLICE_MS * 1000000ull;
			if (*poller) {
				/* A provider that moves bytes only inside our calls
				 * (tcp, net) wakes the poller when they come, rather
				 * than leaving them in the kernel for a whole slice;
				 * one that has work pending gets a short one. */
				int cq_fd = fs_engine_cq_wait_fd(e);

				if (cq_fd >= 0)
					pfd[5].fd = cq_fd;
				else if (cq_fd == -EAGAIN && ns > FS_WAIT_FIRST_SLICE_US * 1000ull)
					ns = FS_WAIT_FIRST_SLICE_US * 1000ull;
			}
			if (ctl_fd < 0 || s->peer_gone)
				pfd[0].fd = -1;
			ns = fs_wait_clamp_ns(&w, now, ns);
			ts = fs_wait_timespec(ns);
			if (!*poller)
				fs_stream_sleep_begin(e, s);
			/* Counted as asleep now (fs_ring_sleep_begin): a peer of
			 * this host that posted before it saw the count did not
			 * ring, so look once more before sleeping. */
			relooked = false;
			if (pfd[2].fd >= 0 || !*poller) {
				fs_engine_progress(e);
				relooked = ready(s, arg) || s->error || s->state == FS_STREAM_CLOSED;
			}
			if (pfd[2].fd >= 0) {
				pfd[3].fd = fs_bell_fd();
				pfd[4].fd = fs_ring_fd();
			}
			if (relooked) {
				ret = 0; /* no sleep: the loop's look returns */
				fs_engine_unlock(e);
			} else {
				if (!*poller)
					e->poller_deps++;
				fs_engine_unlock(e);
				if (pfd[5].fd >= 0)
					fs_engine_cq_sleep(e, true);
				ret = fs_real.ppoll(pfd, 6, &ts, NULL);
				if (pfd[5].fd >= 0)
					fs_engine_cq_sleep(e, false);
			}
			pthread_mutex_lock(&e->lock);
			if (!relooked && !*poller)
				e->poller_deps--;
			if (pfd[2].fd >= 0)
				fs_engine_deep_end(e);
			if (ret > 0 && (pfd[3].revents & POLLIN))
				fs_bell_take_arms(e); /* and the progress round below reads what a ring announced */
			if (ret > 0 && (pfd[4].revents & POLLIN))
				fs_bell_take_ring(e);
			if (!*poller) {
				fs_stream_sleep_end(e, s);
				if (ret > 0 && (pfd[1].revents & POLLIN)) {
					uint64_t v;
					ssize_t n = fs_real.read(s->wake_fd, &v, sizeof(v));
					(void)n;
				}
				/* a sleeper looks at its control connection now and then */
				if (ret == 0 && !relooked)
					fs_stream_check_ctl(s, ctl_fd);
			}
			if (ret < 0 && errno == EINTR && !fs_sigs_restart())
				return -EINTR;
			if (ret > 0 && (pfd[0].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)))
				fs_stream_check_ctl(s, ctl_fd);
		}
	}
}

/* ---- send -------------------------------------------------------------- */

static bool fs_send_ready(struct fs_stream *s, void *arg)
{
	if (s->hb != FS_HB_NONE)
		return fs_handback_tx_tcp(s) || s->hb_held_count < fs_params.send_queue || s->error;
	return s->txq_count < fs_params.send_queue || s->peer_gone || s->fin_queued;
}

/* The error a writer sees: a reset once, then EPIPE like the kernel. */
static int fs_send_error(struct fs_stream *s)
{
	if (s->error && !s->error_reported) {
		s->error_reported = true;
		return s->error;
	}
	return -EPIPE;
}

static size_t fs_iov_total(const struct iovec *iov, int iovcnt)
{
	size_t total = 0;

	for (int i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	return total;
}

/* Copies up to LEN bytes starting at byte OFFSET of the iovec into DST. */
size_t fs_iov_copy_out(void *dst, size_t len, const struct iovec *iov, int iovcnt, size_t offset)
{
	size_t copied = 0;

	for (int i = 0; i < iovcnt && copied < len; i++) {
		size_t n;

		if (offset >= iov[i].iov_len) {
			offset -= iov[i].iov_len;
			continue;
		}
		n = iov[i].iov_len - offset;
		if (n > len - copied)
			n = len - copied;
		memcpy((char *)dst + copied, (const char *)iov[i].iov_base + offset, n);
		copied += n;
		offset = 0;
	}
	return copied;
}

/* splice's wait during a hand-back: until the kernel socket takes the
 * bytes (fs_stream_send_from answers FS_TCP then) or the stream broke. */
static bool fs_send_ready_tcp(struct fs_stream *s, void *arg)
{
	return fs_handback_tx_tcp(s) || s->error;
}

/* fs_stream_send (SOURCE NULL: the iovec's TOTAL bytes) and
 * fs_stream_send_from (at most TOTAL bytes from SOURCE), one loop. */
static ssize_t fs_stream_send_any(struct fs_stream *s, const struct iovec *iov, int iovcnt, size_t total,
				  fs_stream_io_fn source, void *arg, bool nonblock, uint64_t deadline_ns, int ctl_fd,
				  bool more)
{
	struct fs_engine *e = fs_engine_peek();
	size_t done = 0;
	ssize_t result;
	bool had_queue, queued;

	if (!e)
		return -EIO;
	pthread_mutex_lock(&e->lock);
	if (s->state == FS_STREAM_CLOSED) {
		/* another thread closed the socket */
		fs_engine_unlock(e);
		return -EBADF;
	}
	s->users++;
	/* (a held corked tail is no queue the service thread was told of) */
	had_queue = s->txq_head != NULL && !fs_stream_cork_holds(s);
	/* MSG_MORE: this send's tail waits for the next send, as under
	 * TCP_CORK (txq.c); a send without it lets what waited go */
	if (more && !s->more)
		FS_STAT_INC(more_held);
	s->more = more;
	if (!more)
		s->cork_held_ns = s->corked ? s->cork_held_ns : 0;
	/* After the peer's FIN, writing is only legal if it merely shut down
	 * its sending side: a closed control connection says it closed. */
	if (s->peer_fin && !s->peer_gone)
		fs_stream_check_ctl(s, ctl_fd);
	for (;;) {
		if (s->hb != FS_HB_NONE && !s->error && !s->fin_queued) {
			/* on its way back to TCP (handback.h): held behind what must
			 * reach the kernel socket first, then the kernel socket */
			if (fs_handback_tx_tcp(s)) {
				result = done ? (ssize_t)done : FS_TCP;
				break;
			}
			if (source) {
				/* splice waits for the kernel socket rather than
				 * read the pipe into the hand-back's hold */
				int ret;

				if (done || nonblock) {
					result = done ? (ssize_t)done : -EAGAIN;
					break;
				}
				ret = fs_stream_wait(e, s, fs_send_ready_tcp, NULL, deadline_ns, ctl_fd);
				if (ret == -EAGAIN || ret == -EINTR || ret == -EBADF) {
					result = ret;
					break;
				}
				continue;
			}
			done += fs_handback_hold(e, s, iov, iovcnt, done, total);
		} else if (s->peer_gone && !s->error && !s->fin_queued && !s->wrote_after_gone && !done) {
			/* The kernel accepts the first write after the peer closed
			 * (the peer answers it with a reset) and fails the next ones
			 * with EPIPE: a client that finds its idle keep-alive
			 * connection closed learns it from the read that follows,
			 * not from a SIGPIPE. The bytes go where the kernel's go. */
			s->wrote_after_gone = true;
			result = (ssize_t)total;
			if (source) {
				char sink[4096]; /* a splice's bytes go the same way */
				ssize_t n = source(arg, sink, total < sizeof(sink) ? total : sizeof(sink));

				result = n > 0 ? n : n == 0 ? 0 : n == -EAGAIN ? -ENODATA : n;
			}
			break;
		} else if (s->error || s->peer_gone || s->fin_queued) {
			result = done ? (ssize_t)done : fs_send_error(s);
			break;
		}
		/* TCP first: a splice's source switches the writer now, as a
		 * sendfile does (the pipe's bytes go where the stream goes) */
		if (s->tf_tx_tcp && !fs_tcpfirst_tx_switch(e, s, source != NULL)) {
			/* TCP first: the caller writes the kernel socket, and counts */
			if (done) {
				result = (ssize_t)done;
			} else if (source) {
				result = -EAGAIN; /* no buffer for the ONTO now */
			} else {
				s->tf_tx_busy++;
				result = FS_TCP_FIRST;
			}
			break;
		}
		if (source) {
			bool drained;
			ssize_t n = fs_txq_append_from(e, s, source, arg, total - done, &drained);

			fs_stream_flush(e, s);
			if (n > 0)
				done += (size_t)n;
			if (drained || done == total) {
				/* the source's end of file or error counts only
				 * when nothing was sent */
				result = done ? (ssize_t)done : n == -EAGAIN ? -ENODATA : n;
				break;
			}
		} else {
			done = fs_txq_append(e, s, iov, iovcnt, done, total);
			fs_stream_flush(e, s);
		}
		if (done == total) {
			result = (ssize_t)done;
			break;
		}
		if (nonblock) {
			result = done ? (ssize_t)done : -EAGAIN;
			break;
		}
		{
			int ret = fs_stream_wait(e, s, fs_send_ready, NULL, deadline_ns, ctl_fd);

			if (ret == -EAGAIN || ret == -EINTR || ret == -EBADF) {
				result = done ? (ssize_t)done : ret;
				break;
			}
		}
	}
	if (result > 0 && s->peer_fin && !s->tf_rx_tcp)
		s->wrote_after_gone = true; /* sent after the FIN: that was the one */
	/* (a corked tail waits for the uncork, not for the service thread) */
	queued = s->txq_head != NULL && !fs_stream_cork_holds(s);
	s->users--;
	fs_engine_unlock(e);
	/* Someone must post what waits for credit: wake the service thread when
	 * the queue starts, not with a syscall on every send while it lasts. */
	if (result > 0 && queued && !had_queue)
		fs_service_kick();
	return result;
}

bool fs_stream_set_cork(struct fs_stream *s, bool on, bool kernel)
{
	struct fs_engine *e = fs_engine_peek();
	bool kept = false, kick = false;

	if (!e)
		return false;
	pthread_mutex_lock(&e->lock);
	/* a stream that writes the kernel socket (TCP first, on its way back)
	 * leaves TCP_CORK to the kernel, which needs it there */
	if (s->state != FS_STREAM_CLOSED && s->hb == FS_HB_NONE && !s->tf_tx_tcp) {
		bool held = fs_stream_cork_holds(s);

		/* (cork_kept and corked are read without the lock: getsockopt,
		 * fs_sock_release) */
		if (!s->cork_kept) {
			s->cork_kernel = kernel;
			__atomic_store_n(&s->cork_kept, true, __ATOMIC_RELAXED);
		}
		__atomic_store_n(&s->corked, on, __ATOMIC_RELAXED);
		FS_STAT_INC(cork_kept);
		if (!on) {
			/* what the cork held goes now, as the kernel's uncork sends
			 * it; what waits for credit then is a queue that starts,
			 * for the service thread as after a send */
			s->cork_held_ns = 0;
			fs_stream_flush(e, s);
			kick = held && s->txq_head;
		}
		kept = true;
	}
	fs_engine_unlock(e);
	if (kick)
		fs_service_kick();
	return kept;
}

void fs_stream_cork_to_kernel(struct fs_stream *s, int fd)
{
	if (s->cork_kept && s->corked != s->cork_kernel && fd >= 0) {
		int on = s->corked;

		(void)fs_real.setsockopt(fd, IPPROTO_TCP, TCP_CORK, &on, sizeof(on));
	}
	s->cork_kernel = s->cork_kept ? s->corked : s->cork_kernel;
	__atomic_store_n(&s->cork_kept, false, __ATOMIC_RELAXED);
	__atomic_store_n(&s->corked, false, __ATOMIC_RELAXED);
	s->more = false;
	s->cork_held_ns = 0;
}

ssize_t fs_stream_send(struct fs_stream *s, const struct iovec *iov, int iovcnt, bool nonblock,
		       uint64_t deadline_ns, int ctl_fd, bool more)
{
	return fs_stream_send_any(s, iov, iovcnt, fs_iov_total(iov, iovcnt), NULL, NULL, nonblock, deadline_ns,
				  ctl_fd, more);
}

ssize_t fs_stream_send_from(struct fs_stream *s, fs_stream_io_fn source, void *arg, size_t total, bool nonblock,
			    uint64_t deadline_ns, int ctl_fd)
{
	if (!total)
		return 0;
	return fs_stream_send_any(s, NULL, 0, total, source, arg, nonblock, deadline_ns, ctl_fd, false);
}

/* ---- receive ----------------------------------------------------------- */

struct fs_recv_want {
	size_t bytes; /* how many must be buffered (0: any) */
	int fd;       /* the kernel socket (TCP first: the reader's while on TCP) */
};

static bool fs_recv_ready(struct fs_stream *s, void *arg)
{
	struct fs_recv_want *want = arg;

	if (s->tf_rx_tcp) {
		/* TCP first: a byte on the kernel socket, or the peer's ONTO
		 * with nothing before it left to read there */
		if (s->error || s->tf_rx_eof || (s->rxq_head && (!s->tf_onto_known || s->tf_rx_bytes == s->tf_rx_end)))
			return true;
		return fs_tcpfirst_kernel_readable(want ? want->fd : -1);
	}
	if (s->error || (s->hb != FS_HB_NONE && (s->hb_frozen || s->hb_rx_done)))
		return true;
	if (s->pulling)
		return false; /* another reader owns the head of the queue for now */
	if (s->peer_fin)
		return true;
	if (want && want->bytes)
		return s->rx_bytes >= want->bytes;
	return s->rxq_head != NULL;
}

/* fs_stream_recv_to's step: up to TOTAL bytes of the queue's head into
 * IOV's one buffer without consuming them, then to SINK with the engine
 * lock released. Meanwhile the head is this reader's (pulling: other
 * readers, the service thread's stale pulls and a hand-back leave it
 * alone, as while a pull waits), so exactly what SINK took is consumed
 * afterwards, and what it did not take stays first in the queue. Returns
 * what SINK took (> 0), 0 when the queue had nothing to copy, -ENOSPC when
 * SINK took nothing, or SINK's -errno. */
static ssize_t fs_recv_to_sink(struct fs_engine *e, struct fs_stream *s, const struct iovec *iov, size_t total,
			       fs_stream_io_fn sink, void *arg, int ctl_fd)
{
	size_t n = fs_recv_copy(e, s, iov, 1, 0, total, true, false, ctl_fd);
	ssize_t took;

	if (!n || s->pulling)
		return 0;
	s->pulling = true;
	fs_engine_unlock(e);
	took = sink(arg, iov->iov_base, n);
	pthread_mutex_lock(&e->lock);
	s->pulling = false;
	/* readers that waited for the head meanwhile (only they: a change
	 * for every splice woke an event loop for nothing each time) */
	if (s->sleepers)
		fs_stream_changed(e, s);
	if (took > (ssize_t)n)
		took = (ssize_t)n; /* (a sink never takes more than it was given) */
	/* a socket closed meanwhile has no queue to consume from */
	if (took > 0 && s->state != FS_STREAM_CLOSED)
		fs_recv_skip(e, s, (size_t)took);
	return took ? took : -ENOSPC;
}

/* fs_stream_recv (SINK NULL) and fs_stream_recv_to, one loop. */
static ssize_t fs_stream_recv_any(struct fs_stream *s, const struct iovec *iov, int iovcnt, int flags, bool nonblock,
				  uint64_t deadline_ns, int ctl_fd, fs_stream_io_fn sink, void *arg)
{
	struct fs_engine *e = fs_engine_peek();
	size_t total = fs_iov_total(iov, iovcnt), done = 0;
	bool peek = flags & MSG_PEEK, waitall = (flags & MSG_WAITALL) && !nonblock;
	ssize_t result;

	if (!e)
		return -EIO;
	if (!total)
		return 0;
	pthread_mutex_lock(&e->lock);
	if (s->state == FS_STREAM_CLOSED) {
		fs_engine_unlock(e);
		return -EBADF;
	}
	s->users++;
	if (!s->rxq_head)
		fs_engine_progress(e);
	for (;;) {
		struct fs_recv_want want = { .fd = ctl_fd };
		int ret;

		if (s->hb != FS_HB_NONE && (s->hb_frozen || s->hb_rx_done)) {
			/* the reader is on TCP now (handback.h) */
			result = done ? (ssize_t)done : FS_TCP;
			break;
		}
		if (s->tf_rx_tcp && !fs_tcpfirst_take_onto(e, s)) {
			/* TCP first: the peer's bytes come on the kernel socket,
			 * read here without blocking (tcpfirst.h) */
			ssize_t n;

			if (sink) {
				/* a splice out of a reader still on TCP is not
				 * built (design.md "TCP first"): refused, never a
				 * byte taken past the count */
				result = done ? (ssize_t)done : -EINVAL;
				break;
			}
			if (s->error) {
				if (!s->error_reported) {
					s->error_reported = true;
					result = done ? (ssize_t)done : s->error;
				} else {
					result = (ssize_t)done;
				}
				break;
			}
			if (s->tf_rx_eof) {
				result = (ssize_t)done;
				break;
			}
			n = fs_tcpfirst_read(e, s, iov, iovcnt, peek ? 0 : done, total, peek, ctl_fd);
			if (n > 0) {
				done = peek ? (size_t)n : done + (size_t)n;
				if (!waitall || peek || done == total) {
					result = (ssize_t)done;
					break;
				}
				continue;
			}
			if (n == 0) {
				/* The kernel's end: an ONTO sent before it may be on its
				 * way (a peer's close sends its FIN over the fabric,
				 * behind the ONTO, and lets TCP go once that is out) */
				fs_engine_progress(e);
				if (s->tf_onto_known) {
					/* (bytes before N were left: take_onto said so) */
					fs_stream_reset(e, s, "the peer's TCP ended before its ONTO's offset");
					continue;
				}
				if (s->rxq_head)
					continue;
				s->tf_rx_eof = true; /* it ended on TCP: the kernel's end of stream */
				fs_stream_changed(e, s);
				result = (ssize_t)done;
				break;
			}
			if (n != -EAGAIN) {
				result = done ? (ssize_t)done : n;
				break;
			}
			if (nonblock) {
				result = done ? (ssize_t)done : -EAGAIN;
				break;
			}
			ret = fs_stream_wait(e, s, fs_recv_ready, &want, deadline_ns, ctl_fd);
			if (ret == -EAGAIN || ret == -EINTR || ret == -EBADF) {
				result = done ? (ssize_t)done : ret;
				break;
			}
			continue;
		}
		if (sink) {
			ssize_t took = fs_recv_to_sink(e, s, iov, total, sink, arg, ctl_fd);

			if (took) {
				result = took;
				break;
			}
		} else if (peek) {
			done = fs_recv_copy(e, s, iov, iovcnt, 0, total, true, false, ctl_fd);
		} else {
			done += fs_recv_copy(e, s, iov, iovcnt, done, total, false, !waitall, ctl_fd);
		}
		if (done && (!waitall || done == total || s->peer_fin || s->error)) {
			result = (ssize_t)done;
			break;
		}
		/* End of stream only for a stream that is not broken: a reset
		 * wins over the FIN behind it, as the kernel reports ECONNRESET,
		 * never 0, for a connection that was reset. Bytes on the control
		 * connection are such a reset (fs_stream_check_ctl): a process
		 * that wrote on a descriptor fabsock did not know (a duplicate
		 * made past it) and then closed the one it knew sent the FIN
		 * over the fabric, and the rest of its bytes over TCP, before
		 * it. They are looked for here, once, before the 0 is given:
		 * the waits only look when they sleep. */
		if (s->rxq_head && s->rxq_head->kind == FS_MSG_FIN && !done && !s->error)
			fs_stream_check_ctl(s, ctl_fd);
		if (s->rxq_head && s->rxq_head->kind == FS_MSG_FIN && !(s->error && !s->error_reported && !done)) {
			s->fin_consumed = true;
			result = (ssize_t)done;
			break;
		}
		if (s->rxq_head && s->rxq_head->kind == FS_MSG_SWITCH && !peek) {
			/* the peer's bytes go on over TCP from here */
			fs_stream_consume_head(e, s);
			s->hb_rx_done = true;
			fs_handback_progress(e);
			continue;
		}
		if (s->rxq_head && s->rxq_head->kind == FS_MSG_SWITCH) {
			result = FS_TCP; /* MSG_PEEK at the switch: the kernel's data */
			break;
		}
		if (s->error) {
			if (!s->error_reported) {
				s->error_reported = true;
				result = done ? (ssize_t)done : s->error;
			} else {
				result = (ssize_t)done;
			}
			break;
		}
		if (nonblock) {
			result = done ? (ssize_t)done : -EAGAIN;
			break;
		}
		/* MSG_WAITALL consumes as it goes, so the window keeps moving:
		 * return the credits for what was consumed before waiting for
		 * more, and wake for any new data, not for the whole rest (which
		 * may be more than the window can ever hold). */
		if (!peek)
			fs_stream_maybe_credit(e, s);
		ret = fs_stream_wait(e, s, fs_recv_ready, &want, deadline_ns, ctl_fd);
		if (ret == -EAGAIN || ret == -EINTR || ret == -EBADF) {
			result = done ? (ssize_t)done : ret;
			break;
		}
	}
	if (!peek && s->state != FS_STREAM_CLOSED) {
		fs_stream_maybe_credit(e, s);
		/* A read shorter than asked while more is readable (it stopped
		 * before a payload to pull, or its buffer was one iovec of many):
		 * with kernel TCP a short read means the socket is drained, and
		 * nginx (EPOLLRDHUP) then waits for the next edge. Make one. */
		if (result > 0 && (size_t)result < total && (s->rxq_head || s->error))
			fs_stream_changed(e, s);
	}
	s->users--;
	fs_engine_unlock(e);
	return result;
}

ssize_t fs_stream_recv(struct fs_stream *s, const struct iovec *iov, int iovcnt, int flags, bool nonblock,
		       uint64_t deadline_ns, int ctl_fd)
{
	return fs_stream_recv_any(s, iov, iovcnt, flags, nonblock, deadline_ns, ctl_fd, NULL, NULL);
}

ssize_t fs_stream_recv_to(struct fs_stream *s, void *buf, size_t len, fs_stream_io_fn sink, void *arg,
			  bool nonblock, uint64_t deadline_ns, int ctl_fd)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };

	return fs_stream_recv_any(s, &iov, 1, 0, nonblock, deadline_ns, ctl_fd, sink, arg);
}

size_t fs_stream_readable(struct fs_stream *s)
{
	struct fs_engine *e = fs_engine_lock_cur();
	size_t n = 0;

	if (e) {
		fs_engine_progress(e);
		n = s->rx_bytes;
		fs_engine_unlock(e);
	}
	return n;
}

int fs_stream_shutdown_wr(struct fs_stream *s)
{
	struct fs_engine *e = fs_engine_lock_cur();
	int ret;

	if (!e)
		return -EIO;
	if (s->state == FS_STREAM_CLOSED)
		ret = -EBADF;
	else if (s->hb != FS_HB_NONE && fs_handback_tx_tcp(s))
		ret = FS_TCP; /* the kernel socket's own shutdown */
	else if (s->hb != FS_HB_NONE)
		s->hb_fin = true, ret = 0; /* after the bytes held for TCP */
	else
		ret = s->error ? 0 : fs_stream_queue_fin(e, s);
	fs_engine_unlock(e);
	return ret;
}

enum fs_close_need fs_stream_close(struct fs_stream *s, int ctl_fd, bool abort, bool shared)
{
	struct fs_engine *e = fs_engine_peek();
	uint64_t now = fs_now_ns();
	enum fs_close_need need;

	if (!e) {
		if (ctl_fd >= 0)
			fs_internal_fd_close(ctl_fd);
		return FS_CLOSE_DONE;
	}
	pthread_mutex_lock(&e->lock);
	s->app_fd = -1;
	if (s->state == FS_STREAM_CLOSED || s->dead) {
		/* The process's end took it over (fs_engine_shutdown: its FIN is
		 * queued or delivered) and this close comes from an atexit
		 * handler or a destructor that ran later. It is an orphan
		 * already: adding it again would free it twice. */
		fs_engine_unlock(e);
		if (ctl_fd >= 0)
			fs_internal_fd_close(ctl_fd);
		return FS_CLOSE_DONE;
	}
	fs_engine_progress(e);
	if (s->dead) {
		/* that round ended its way back to TCP (handback.c): the kernel
		 * socket's close is all there is */
		fs_engine_unlock(e);
		if (ctl_fd >= 0)
			fs_internal_fd_close(ctl_fd);
		return FS_CLOSE_DONE;
	}
	/* Other processes may still hold the socket (forked after the offload):
	 * with the kernel the connection lives on for them, so no FIN: the
	 * stream goes back to TCP (handback.h), what our reader had not read
	 * included, for them to read. */
	if (s->hb == FS_HB_NONE && shared && !s->error && !abort && fs_handback_start(e, s, ctl_fd) == 0)
		FS_INFO("stream %u: closed here while a process forked later may still hold it", s->id);
	if (s->hb != FS_HB_NONE) {
		/* the hand-back holds its own duplicate of the kernel socket:
		 * closing it, the last one, is the FIN */
		s->state = FS_STREAM_CLOSED;
		if (ctl_fd >= 0)
			fs_internal_fd_close(ctl_fd);
		s->ctl_fd = -1;
		s->close_deadline_ns = now + fs_params.linger_sec * 1000000000ull;
		fs_stream_changed(e, s);
		fs_engine_add_orphan(e, s);
		fs_engine_progress(e);
		fs_engine_unlock(e);
		return FS_CLOSE_NOW;
	}
	/* Closing with unread data resets the connection, as TCP does. */
	if (s->rx_bytes)
		abort = true;
	s->state = FS_STREAM_CLOSED;
	if (abort || s->error) {
		struct linger lin = { .l_onoff = 1, .l_linger = 0 };

		if (ctl_fd >= 0) {
			fs_real.setsockopt(ctl_fd, SOL_SOCKET, SO_LINGER, &lin, sizeof(lin));
			fs_internal_fd_close(ctl_fd);
		}
		ctl_fd = -1;
		if (!s->error)
			s->error = -ECONNRESET;
		fs_stream_flush(e, s); /* drops the queue */
		s->close_deadline_ns = now + fs_params.peer_grace_ms * 1000000ull;
	} else {
		if (fs_stream_queue_fin(e, s))
			s->error = -ENOBUFS;
		s->close_deadline_ns = now + fs_params.linger_sec * 1000000000ull;
	}
	s->ctl_fd = ctl_fd;
	/* threads blocked on it in other threads return EBADF */
	fs_stream_changed(e, s);
	fs_engine_add_orphan(e, s);
	fs_engine_progress(e); /* reaps, and rings the sleepers */
	/* S stays readable after a reap: the socket still holds it (app_ref). */
	need = s->txq_head ? FS_CLOSE_NOW : e->orphans ? FS_CLOSE_SOON : FS_CLOSE_DONE;
	fs_engine_unlock(e);
	return need;
}

bool fs_stream_timed_locked(const struct fs_stream *s)
{
	return s->state != FS_STREAM_CLOSED && s->hb == FS_HB_NONE && fs_stream_grace_runs(s);
}

unsigned fs_stream_events_locked(struct fs_stream *s, uint32_t *gen)
{
	unsigned ev = 0;

	if (s->state == FS_STREAM_CLOSED) {
		/* closed by another thread while the caller looked */
		*gen = s->ev_gen;
		return POLLNVAL;
	}
	if (s->hb != FS_HB_NONE) {
		*gen = s->ev_gen;
		return fs_handback_events(s);
	}
	if (s->tf_rx_tcp)
		fs_tcpfirst_take_onto(fs_engine_peek(), s); /* a marker is no readable byte */
	if (s->peer_gone)
		fs_stream_check_gone(s, fs_now_ns());
	if (s->rx_bytes || s->peer_fin || s->error)
		ev |= POLLIN;
	if (s->peer_fin)
		ev |= POLLRDHUP;
	if (s->error) {
		ev |= POLLERR | POLLHUP | POLLOUT;
	} else if (s->peer_gone) {
		ev |= POLLOUT; /* a write will fail at once: EPIPE */
		if (s->peer_fin)
			ev |= POLLHUP;
	} else if (!s->fin_queued && s->txq_count < fs_params.send_queue) {
		ev |= POLLOUT;
	}
	if (s->peer_fin && s->fin_queued)
		ev |= POLLHUP;
	if (s->tf_rx_tcp || s->tf_tx_tcp)
		ev = fs_tcpfirst_events(s, ev);
	*gen = s->ev_gen;
	return ev;
}

unsigned fs_stream_poll_state(struct fs_stream *s, uint32_t *gen)
{
	struct fs_engine *e = fs_engine_lock_cur();
	unsigned ev;

	if (!e)
		return POLLERR;
	ev = fs_stream_events_locked(s, gen);
	fs_engine_unlock(e);
	return ev;
}

/* Checks the control connection after poll() reported it readable/hung up. */
void fs_stream_note_ctl(struct fs_stream *s, int ctl_fd)
{
	struct fs_engine *e = fs_engine_lock_cur();

	if (!e)
		return;
	if (s->state != FS_STREAM_CLOSED)
		fs_stream_check_ctl(s, ctl_fd);
	fs_engine_unlock(e);
}
