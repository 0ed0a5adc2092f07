/* SPDX-License-Identifier: MIT */
/*
 * poll() and select() over any mix of kernel fds and offloaded sockets.
 * An offloaded socket's kernel fd never becomes readable (its data comes
 * over the fabric), so its readiness is computed from the stream; the
 * kernel fd stays in the set with no events so that a hang-up of the
 * control connection still wakes us. Like a blocking receive, a waiting
 * poll spins on the completion queue for FABSOCK_SPIN_US, then sleeps in
 * the real poll() in slices of at most FABSOCK_SLEEP_MAX_US (wait.c's pace).
 *
 * Pending sockets: a client socket is settled at once (at most the probe
 * timeout); a server-side one is watched as a kernel fd until bytes arrive
 * (the client's HELLO, or its data), then settled.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/params.h"
#include "core/engine.h"
#include "core/epoll.h"
#include "core/fdtable.h"
#include "core/sock.h"
#include "core/tcpfirst.h"
#include "core/wait.h"
#include "preload/real.h"

#define FS_POLL_STACK 64

static bool fs_poll_is_ours(int fd)
{
	struct fs_sock *s = fs_fdt_peek(fd);

	if (!s && fs_epoll_has_members(fd))
		return true; /* an epoll instance holding offloaded sockets */

	return s && s != FS_SOCK_INTERNAL && (fs_sock_state(s) == FS_SOCK_OFFLOADED || fs_sock_pending(s));
}

/* Fills REVENTS of the offloaded entries; returns how many are ready.
 * KERNEL holds the kernel's answers for this round (may be NULL). */
static int fs_poll_ours(struct pollfd *fds, nfds_t nfds, const struct pollfd *kernel, bool progress,
			bool *any_ours)
{
	const void *drained = NULL;
	int ready = 0;

	*any_ours = false;
	fs_wait_own_reset(); /* what a deep sleep beside other waiters waits for */
	if (!fs_wait_own_wanted())
		fs_wait_own_bad(); /* (no references taken for nothing) */
	/* One completion-queue round for the whole set (unless the caller ran
	 * it); members then only look at their stream's state. */
	if (progress)
		fs_engine_progress_locked();
	for (nfds_t i = 0; i < nfds; i++) {
		struct fs_sock *s;
		uint32_t gen;
		unsigned ev, want = (unsigned)fds[i].events | POLLERR | POLLHUP;

		if (fds[i].fd < 0 || !fs_poll_is_ours(fds[i].fd))
			continue;
		if (!fs_fdt_peek(fds[i].fd)) {
			/* epoll instance: readable if its members are (the kernel's
			 * own answer is merged by the caller) */
			*any_ours = true;
			fs_wait_own_bad();
			if ((fds[i].events & POLLIN) && fs_epoll_peek_ready(fds[i].fd)) {
				fds[i].revents |= POLLIN;
				ready++;
			}
			continue;
		}
		s = fs_sock_get(fds[i].fd);
		if (!s)
			continue;
		/* an accepted socket waiting for its client's probe: answer it
		 * here, as epoll_wait does (epoll_wait.c) */
		if (fs_sock_state(s) == FS_SOCK_SERVER_PENDING) {
			drained = fs_sock_drain_probes(s, drained);
			/* a nonblocking sender told -EAGAIN: POLLOUT once settled */
			fs_sock_settle_owed(s);
		}
		if (fs_sock_state(s) == FS_SOCK_CLIENT_PENDING || fs_sock_state(s) == FS_SOCK_CONNECTING)
			fs_sock_settle(s, false, fs_now_ns());
		else if (fs_sock_pending(s) && kernel && (kernel[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
			 !fs_sock_read_direct(s)) /* (its first receive settles it: epoll_wait.c) */
			fs_sock_settle(s, false, fs_now_ns());
		/* still negotiating: the fabric may carry its data soon, so the
		 * wait must keep looking at it between kernel slices */
		if (fs_sock_pending(s)) {
			*any_ours = true;
			fs_wait_own_bad();
		}
		if (fs_sock_state(s) == FS_SOCK_OFFLOADED && s->pid == fs_self_pid()) {
			*any_ours = true;
			fs_wait_own_add(s);
			if (kernel && (kernel[i].revents & (POLLIN | POLLHUP | POLLERR)))
				fs_stream_note_ctl(s->stream, s->fd);
			ev = fs_stream_poll_state(s->stream, &gen) & want;
			if (kernel && (kernel[i].revents & POLLPRI) && (fds[i].events & POLLPRI))
				ev |= POLLPRI;
			fds[i].revents = (short)ev;
			if (ev)
				ready++;
		}
		fs_sock_put(s);
	}
	return ready;
}

/* Offloaded sockets this process cannot wait on as such (forked after the
 * offload, or back on TCP: fs_sock_unshare) become kernel ones first. */
static void fs_poll_unshare(const struct pollfd *fds, nfds_t nfds)
{
	for (nfds_t i = 0; i < nfds; i++) {
		struct fs_sock *s = fds[i].fd >= 0 ? fs_fdt_peek(fds[i].fd) : NULL;
		int err;

		if (!s || s == FS_SOCK_INTERNAL || fs_sock_state(s) != FS_SOCK_OFFLOADED || !fs_sock_must_unshare(s))
			continue;
		s = fs_sock_get(fds[i].fd);
		if (s) {
			fs_sock_unshare(s, &err);
			fs_sock_put(s);
		}
	}
}

/* The kernel's set for one round, in KSET: FDS, but an offloaded socket's
 * entry watches its control connection only; and urgent data, which the
 * kernel carries (a peer's MSG_OOB took the stream back to TCP). */
static void fs_poll_kernel_set(struct pollfd *kset, const struct pollfd *fds, nfds_t nfds)
{
	memcpy(kset, fds, nfds * sizeof(*kset));
	for (nfds_t i = 0; i < nfds; i++) {
		struct fs_sock *s = kset[i].fd >= 0 ? fs_fdt_peek(kset[i].fd) : NULL;

		if (s && s != FS_SOCK_INTERNAL && fs_sock_state(s) == FS_SOCK_OFFLOADED)
			kset[i].events = (short)(POLLIN | POLLRDHUP | (fds[i].events & POLLPRI) |
						 /* TCP first: a writer still on the kernel socket */
						 (fs_tcpfirst_tx_on_tcp(s->stream) ? fds[i].events & POLLOUT : 0));
	}
}


/* Asks the kernel about KSET: without waiting on the FIRST round, while W
 * spins or once it is over, else for W's next slice, sleeping deeply on
 * the engine's fd where it can (fs_wait_deep_sleep). Returns the kernel's
 * count, or -1 with errno set.
 * The first round never sleeps because the offloaded sockets are looked
 * at after the kernel (fs_poll_ours): bytes that arrived before this call
 * and are still unread ring no doorbell, so a deep sleep taken before the
 * first look lasted its whole FS_BELL_SLICE_MS with the socket readable.
 * With FABSOCK_SPIN_US=0 (no spin: every round sleeps) that was every
 * poll of a reader that reads less than is queued (libpq: 250 ms per
 * 128 KiB, a psql download of 18 MB crawled at ~60 KB/s); with a spin,
 * a waiter preempted past its short spin (FS_SLEEPY_SPIN_US) before its
 * first round. */
static int fs_poll_kernel_wait(struct pollfd *kset, nfds_t nfds, struct fs_wait *w, const sigset_t *sigmask,
			       bool first, uint64_t *kernel_at)
{
	uint64_t now = fs_now_ns();
	enum fs_wait_step step = fs_wait_next(w, now);
	uint64_t ns = !first && step == FS_WAIT_SLEEP ? fs_wait_slice_ns(w, now) : 0;
	struct timespec ts = fs_wait_timespec(ns);
	bool slept = false, armed;
	int kready;

	kready = ns ? fs_wait_deep_sleep(w, kset, nfds, sigmask, &slept) : 0;
	if (slept && kready < 0) {
		errno = -kready;
		kready = -1;
	}
	armed = !slept && kready == -EAGAIN;
	if (armed)
		ts.tv_sec = ts.tv_nsec = 0; /* just armed: look again, then sleep */
	if (!slept && (armed || !ns) && step != FS_WAIT_OVER && fs_wait_kernel_later(w, now, *kernel_at, armed)) {
		/* the kernel is asked in a later round (its sleep) */
		for (nfds_t i = 0; i < nfds; i++)
			kset[i].revents = 0;
		return 0;
	}
	if (!slept)
		*kernel_at = now;
	if (!slept) {
		/* the provider's completion queue (tcp, net) in the free slot
		 * after the caller's fds (the deep sleep's, not used now):
		 * bytes that come wake us (fs_engine_cq_wait_fd) */
		int cq_fd = ns ? fs_engine_cq_wait_fd_try() : -1;

		if (cq_fd == -EAGAIN && ns > FS_WAIT_FIRST_SLICE_US * 1000ull)
			ts = fs_wait_timespec(FS_WAIT_FIRST_SLICE_US * 1000ull);
		kset[nfds].fd = cq_fd >= 0 ? cq_fd : -1;
		kset[nfds].events = POLLIN;
		kset[nfds].revents = 0;
		if (cq_fd >= 0)
			fs_engine_cq_sleep(fs_engine_peek(), true);
		kready = fs_real.ppoll(kset, nfds + 1, &ts, sigmask);
		if (cq_fd >= 0)
			fs_engine_cq_sleep(fs_engine_peek(), false);
		if (kready > 0 && kset[nfds].revents)
			kready--;
	}
	return kready;
}

/* Fills the REVENTS of FDS's entries that are not offloaded sockets (those
 * fs_poll_ours filled) from KSET, the kernel's answers. Returns how many
 * of them are ready. */
static int fs_poll_kernel_answers(struct pollfd *fds, nfds_t nfds, struct pollfd *kset)
{
	int total = 0;

	for (nfds_t i = 0; i < nfds; i++) {
		struct fs_sock *s = fds[i].fd >= 0 ? fs_fdt_peek(fds[i].fd) : NULL;

		if (s && s != FS_SOCK_INTERNAL && fs_sock_state(s) == FS_SOCK_OFFLOADED)
			continue; /* filled by fs_poll_ours */
		if (!s && fds[i].revents) {
			/* an epoll instance made ready by its offloaded members:
			 * counted by fs_poll_ours; add the kernel's own answer */
			fds[i].revents |= kset[i].revents;
			continue;
		}
		if (!s && (kset[i].revents & POLLIN) && fs_epoll_has_members(fds[i].fd) &&
		    !fs_epoll_kernel_readable(fds[i].fd))
			kset[i].revents &= ~POLLIN; /* only handshake bytes were there */
		fds[i].revents = kset[i].revents;
		/* a client that cannot take bytes yet (no HELLO sent, or
		 * its hold full): do not invite a nonblocking writer to spin */
		if (s && s != FS_SOCK_INTERNAL && !fs_sock_writable_early(s))
			fds[i].revents &= ~POLLOUT;
		if (fds[i].revents)
			total++;
	}
	return total;
}

/* Everything fell back to the kernel: a plain poll of FDS until W's
 * deadline will do. Returns its count or -errno. */
static int fs_poll_plain(struct pollfd *fds, nfds_t nfds, const struct fs_wait *w, const sigset_t *sigmask)
{
	uint64_t t = fs_now_ns();
	struct timespec ts = fs_wait_timespec(w->deadline > t ? w->deadline - t : 0);
	int ret = fs_real.ppoll(fds, nfds, w->deadline ? &ts : NULL, sigmask);

	return ret < 0 ? -errno : ret;
}

int fs_core_poll(struct pollfd *fds, nfds_t nfds, int64_t timeout_ns, const sigset_t *sigmask)
{
	struct pollfd stack[FS_POLL_STACK], *kset;
	uint64_t start = fs_now_ns();
	struct fs_wait w;
	bool has_ours = false, any_ours;
	uint64_t kernel_at = 0; /* when this wait last asked the kernel (0: not yet) */
	int ret;

	fs_poll_unshare(fds, nfds);
	for (nfds_t i = 0; i < nfds && !has_ours; i++)
		has_ours = fds[i].fd >= 0 && fs_poll_is_ours(fds[i].fd);
	if (!has_ours) {
		struct timespec ts = { (time_t)(timeout_ns / 1000000000), (long)(timeout_ns % 1000000000) };

		ret = fs_real.ppoll(fds, nfds, timeout_ns < 0 ? NULL : &ts, sigmask);
		return ret < 0 ? -errno : ret;
	}
	/* three slots more: the engine's deep fd, the doorbell and the ring
	 * (fs_wait_deep_sleep) */
	kset = nfds + FS_WAIT_DEEP_SLOTS <= FS_POLL_STACK ? stack : calloc(nfds + FS_WAIT_DEEP_SLOTS, sizeof(*kset));
	if (!kset)
		return -ENOMEM;
	fs_ready_wait_enter();
	fs_wait_own_reset();
	fs_wait_begin(&w, fs_engine_peek(), start, fs_wait_deadline_ns(start, timeout_ns));
	for (bool first = true;; first = false) {
		int kready, ours, total;
		enum fs_wait_step next;

		bool progressed = false;

		/* a spinning round after the first: when another thread is in
		 * the engine, its progress is ours too; look next round */
		if (!first && fs_wait_next(&w, fs_now_ns()) == FS_WAIT_SPIN) {
			if (!fs_engine_progress_try()) {
				fs_wait_spin(&w);
				continue;
			}
			progressed = true;
		}
		fs_poll_kernel_set(kset, fds, nfds);
		kready = fs_poll_kernel_wait(kset, nfds, &w, sigmask, first, &kernel_at);
		if (kready < 0) {
			ret = -errno;
			break;
		}
		for (nfds_t i = 0; i < nfds; i++)
			fds[i].revents = 0;
		ours = fs_poll_ours(fds, nfds, kset, !progressed, &any_ours);
		total = fs_poll_kernel_answers(fds, nfds, kset) + ours;
		if (total)
			fs_wait_done(&w, fs_engine_peek(), total);
		next = fs_wait_next(&w, fs_now_ns());
		if (total || next == FS_WAIT_OVER) {
			ret = total;
			break;
		}
		if (!any_ours) {
			ret = fs_poll_plain(fds, nfds, &w, sigmask);
			break;
		}
		if (next == FS_WAIT_SPIN)
			fs_wait_spin(&w);
	}
	fs_ready_wait_leave();
	fs_wait_own_reset(); /* the references fs_poll_ours took */
	if (kset != stack)
		free(kset);
	return ret;
}

int fs_core_select(int nfds, fd_set *r, fd_set *w, fd_set *x, int64_t timeout_ns, const sigset_t *sigmask)
{
	struct pollfd stack[FS_POLL_STACK], *pfd;
	nfds_t n = 0;
	bool has_ours = false;
	int ret;

	if (nfds < 0 || nfds > FD_SETSIZE)
		return -EINVAL;
	for (int fd = 0; fd < nfds && !has_ours; fd++)
		if ((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (x && FD_ISSET(fd, x)))
			has_ours = fs_poll_is_ours(fd);
	if (!has_ours) {
		struct timespec ts = { (time_t)(timeout_ns / 1000000000), (long)(timeout_ns % 1000000000) };

		ret = fs_real.pselect(nfds, r, w, x, timeout_ns < 0 ? NULL : &ts, sigmask);
		return ret < 0 ? -errno : ret;
	}
	pfd = nfds <= FS_POLL_STACK ? stack : calloc((size_t)nfds, sizeof(*pfd));
	if (!pfd)
		return -ENOMEM;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;

		if (r && FD_ISSET(fd, r))
			ev |= POLLIN;
		if (w && FD_ISSET(fd, w))
			ev |= POLLOUT;
		if (x && FD_ISSET(fd, x))
			ev |= POLLPRI;
		if (ev) {
			pfd[n].fd = fd;
			pfd[n].events = ev;
			pfd[n].revents = 0;
			n++;
		}
	}
	ret = fs_core_poll(pfd, n, timeout_ns, sigmask);
	if (ret >= 0) {
		int count = 0;

		if (r)
			FD_ZERO(r);
		if (w)
			FD_ZERO(w);
		if (x)
			FD_ZERO(x);
		for (nfds_t i = 0; i < n; i++) {
			short rev = pfd[i].revents;

			if (rev & POLLNVAL) {
				ret = -EBADF;
				break;
			}
			if (r && (pfd[i].events & POLLIN) && (rev & (POLLIN | POLLHUP | POLLERR))) {
				FD_SET(pfd[i].fd, r);
				count++;
			}
			if (w && (pfd[i].events & POLLOUT) && (rev & (POLLOUT | POLLERR))) {
				FD_SET(pfd[i].fd, w);
				count++;
			}
			if (x && (pfd[i].events & POLLPRI) && (rev & POLLPRI)) {
				FD_SET(pfd[i].fd, x);
				count++;
			}
		}
		if (ret >= 0)
			ret = count;
	}
	if (pfd != stack)
		free(pfd);
	return ret;
}
