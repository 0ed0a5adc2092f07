/* SPDX-License-Identifier: MIT */
/*
 * The UDP capability probe, client side: the ASK sent right after
 * connect(), sent again while no answer comes, and the answer collected on
 * first use. See probe.h; the side that answers is listener.c.
 */
#include "core/probe.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "config/params.h"
#include "core/engine.h"
#include "core/stats.h"
#include "core/udp.h"
#include "core/wait.h"
#include "core/wire.h"
#include "preload/real.h"

/* A client sends its probe again FS_PROBE_RESEND_FIRST_MS after the first
 * one if no answer came (a datagram dropped in a burst), then after twice
 * as long each time, within its probe timeout. The server answers a
 * repeated probe as it answered the first (same record, same nonce). */
#define FS_PROBE_RESEND_FIRST_MS 30u
#define FS_PROBE_RESENDS_MAX 4u

int fs_probe_start(struct fs_probe_client *pc, int fd, const struct sockaddr *peer)
{
	struct sockaddr_storage local;
	socklen_t len = sizeof(local);
	struct fs_probe ask = { .type = FS_PROBE_ASK };
	uint8_t pkt[FS_WIRE_PROBE_LEN];
	socklen_t peerlen = peer->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	int udp;

	pc->udp_fd = -1;
	if (fs_params.test_probe_delay_ms)
		usleep((useconds_t)(fs_params.test_probe_delay_ms * 1000));
	if (fs_real.getsockname(fd, (struct sockaddr *)&local, &len))
		return -errno;
	fs_sockaddr_key((struct sockaddr *)&local, ask.client_addr, &ask.client_port);
	if (getrandom(&ask.nonce, sizeof(ask.nonce), GRND_NONBLOCK) != sizeof(ask.nonce))
		ask.nonce = fs_now_ns() ^ ((uint64_t)fs_self_pid() << 32);
	ask.wait_ms = (uint32_t)fs_params.probe_timeout_ms;
	if (fs_wire_probe_encode(&ask, pkt, sizeof(pkt)) != FS_WIRE_PROBE_LEN)
		return -EINVAL;
	udp = fs_real.socket(local.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (udp < 0)
		return -errno;
	/* Send from the TCP connection's own address so the server can check
	 * that the probe speaks for this connection. */
	if (local.ss_family == AF_INET)
		((struct sockaddr_in *)&local)->sin_port = 0;
	else
		((struct sockaddr_in6 *)&local)->sin6_port = 0;
	if (fs_real.bind(udp, (struct sockaddr *)&local, len) || fs_real.connect(udp, peer, peerlen) ||
	    fs_real.send(udp, pkt, sizeof(pkt), MSG_NOSIGNAL) != (ssize_t)sizeof(pkt)) {
		int err = -errno;

		fs_real.close(udp);
		return err;
	}
	FS_STAT_INC(probes_sent);
	pc->udp_fd = udp;
	pc->nonce = ask.nonce;
	pc->deadline_ns = fs_now_ns() + fs_params.probe_timeout_ms * 1000000ull;
	memcpy(pc->pkt, pkt, sizeof(pkt));
	pc->resends = 0;
	pc->resend_ns = fs_now_ns() + FS_PROBE_RESEND_FIRST_MS * 1000000ull;
	{
		struct timespec rt;
		int on = 1;

		/* the answer is judged by when it arrived, not by when a busy
		 * service thread got round to reading it */
		clock_gettime(CLOCK_REALTIME, &rt);
		pc->deadline_real_ns = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec +
				       fs_params.probe_timeout_ms * 1000000ull;
		fs_real.setsockopt(udp, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on));
	}
	return 0;
}

void fs_probe_cancel(struct fs_probe_client *pc)
{
	if (pc->udp_fd >= 0)
		fs_real.close(pc->udp_fd);
	pc->udp_fd = -1;
}

/* Sends the probe again when no answer came by its resend time NOW (the
 * first datagram may have been dropped). Returns UNTIL, brought forward to
 * the next resend if that comes first. */
static uint64_t fs_probe_resend(struct fs_probe_client *pc, uint64_t now, uint64_t until)
{
	if (now >= pc->resend_ns && pc->resends < FS_PROBE_RESENDS_MAX) {
		fs_real.send(pc->udp_fd, pc->pkt, sizeof(pc->pkt), MSG_NOSIGNAL | MSG_DONTWAIT);
		pc->resends++;
		FS_STAT_INC(probes_resent);
		pc->resend_ns = now + ((uint64_t)FS_PROBE_RESEND_FIRST_MS << pc->resends) * 1000000ull;
	}
	if (pc->resends < FS_PROBE_RESENDS_MAX && pc->resend_ns < until)
		until = pc->resend_ns;
	return until;
}

/* The kernel's arrival stamp (SCM_TIMESTAMPNS, realtime ns) in MSG, or 0. */
static uint64_t fs_probe_arrival(struct msghdr *msg)
{
	uint64_t arrival_real = 0;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
			struct timespec at;

			memcpy(&at, CMSG_DATA(c), sizeof(at));
			arrival_real = (uint64_t)at.tv_sec * 1000000000ull + (uint64_t)at.tv_nsec;
		}
	}
	return arrival_real;
}

/* Reads one datagram from the probe socket: the answer (yes or no, with its
 * arrival stamp in *ARRIVAL_REAL), a refusal (no one listens on the UDP
 * port), or FS_PROBE_PENDING for anything else, which is not an answer to
 * us. */
static enum fs_probe_outcome fs_probe_read_answer(struct fs_probe_client *pc, uint64_t *arrival_real)
{
	uint8_t pkt[FS_WIRE_PROBE_LEN + 1];
	struct fs_probe answer;
	union {
		struct cmsghdr align;
		char bytes[128];
	} control;
	struct iovec iov = { .iov_base = pkt, .iov_len = sizeof(pkt) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &control,
			      .msg_controllen = sizeof(control) };
	ssize_t n = fs_real.recvmsg(pc->udp_fd, &msg, MSG_DONTWAIT);

	if (n < 0 && errno == ECONNREFUSED)
		return FS_PROBE_OUT_REFUSED;
	if (n == FS_WIRE_PROBE_LEN && fs_wire_probe_decode(pkt, (size_t)n, &answer) == 0 &&
	    answer.nonce == pc->nonce && (answer.type == FS_PROBE_YES || answer.type == FS_PROBE_NO)) {
		*arrival_real = fs_probe_arrival(&msg);
		return answer.type == FS_PROBE_YES ? FS_PROBE_OUT_YES : FS_PROBE_OUT_NO;
	}
	return FS_PROBE_PENDING;
}

/* The probe's outcome OUT is known: a yes that came too late counts as a
 * timeout, and after a yes *TCP_READABLE says whether the server spoke
 * first on FD. Closes the probe socket. Returns the outcome. */
static enum fs_probe_outcome fs_probe_finish(struct fs_probe_client *pc, int fd, enum fs_probe_outcome out,
					     uint64_t arrival_real, bool *tcp_readable)
{
	/* A yes that arrived after our deadline is too late: the server may
	 * have stopped waiting for the HELLO. Judged by the kernel's arrival
	 * stamp where there is one (the server waits seconds beyond our
	 * deadline, so reading it late is fine); else by now. */
	if (out == FS_PROBE_OUT_YES &&
	    (arrival_real ? arrival_real > pc->deadline_real_ns : fs_now_ns() > pc->deadline_ns + 5000000ull))
		out = FS_PROBE_OUT_TIMEOUT;
	/* The server may have spoken first after all. */
	if (out == FS_PROBE_OUT_YES) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (fs_real.poll(&p, 1, 0) > 0)
			*tcp_readable = true;
	}
	fs_probe_cancel(pc);
	return out;
}

enum fs_probe_outcome fs_probe_result(struct fs_probe_client *pc, int fd, uint64_t deadline_ns,
				      bool *tcp_readable)
{
	enum fs_probe_outcome out = FS_PROBE_PENDING;
	uint64_t arrival_real = 0;
	/* The answer takes tens of microseconds on one host: a caller willing
	 * to wait polls without sleeping for FABSOCK_SPIN_US first, as a
	 * blocking receive does. Waking from a sleep costs as much again on a
	 * virtual machine, and that is on every connection's critical path. */
	struct fs_wait w;

	*tcp_readable = false;
	if (pc->udp_fd < 0)
		return FS_PROBE_OUT_TIMEOUT;
	/* until the caller's deadline or the probe's, whichever comes first */
	fs_wait_init(&w, fs_now_ns(), deadline_ns && deadline_ns < pc->deadline_ns ? deadline_ns : pc->deadline_ns,
		     false);
	for (;;) {
		struct pollfd pfd[2] = {
			{ .fd = pc->udp_fd, .events = POLLIN },
			{ .fd = fd, .events = POLLIN },
		};
		uint64_t now = fs_now_ns();
		bool spin = fs_wait_next(&w, now) == FS_WAIT_SPIN;
		/* a sleep ends at the next resend, if one is due before */
		uint64_t until = fs_probe_resend(pc, now, w.deadline);
		int ret = fs_real.poll(pfd, 2, spin ? 0 : fs_wait_ms_until(now, until));

		if (ret == 0 && spin) {
			fs_wait_spin(&w);
			continue;
		}

		if (ret < 0 && errno == EINTR)
			continue;
		if (ret > 0 && (pfd[0].revents & (POLLIN | POLLERR))) {
			out = fs_probe_read_answer(pc, &arrival_real);
			if (out != FS_PROBE_PENDING)
				break;
			continue; /* anything else is not an answer to us */
		}
		if (ret > 0 && (pfd[1].revents & (POLLIN | POLLHUP | POLLERR))) {
			*tcp_readable = true;
			return FS_PROBE_PENDING;
		}
		if (fs_now_ns() >= pc->deadline_ns) {
			out = FS_PROBE_OUT_TIMEOUT;
			break;
		}
		if (deadline_ns && fs_now_ns() >= deadline_ns)
			return FS_PROBE_PENDING;
	}
	return fs_probe_finish(pc, fd, out, arrival_real, tcp_readable);
}
