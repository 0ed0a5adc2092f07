/* SPDX-License-Identifier: MIT */
/*
 * The in-band HELLO / HELLO-ACK handshake, client and server side, under
 * the rule that a peer which is not running fabsock never receives a byte
 * it did not ask for and never has one taken from it:
 *  - the client sends a HELLO only after the server's listener answered its
 *    probe "yes" (or a rule says the server runs fabsock), and only if the
 *    server has not spoken first;
 *  - the server interprets the first bytes of a connection only if it
 *    answered that connection's probe "yes" (or a rule says so), and
 *    consumes them only once they form a complete, valid HELLO carrying the
 *    probe's nonce; anything else is the application's data;
 *  - the server waits for the HELLO at most as long as the client could
 *    still send one (its probe timeout plus a margin), so a client whose
 *    "yes" was lost costs a server-first protocol one bounded delay.
 */
#include "core/negotiate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "config/rules.h"
#include "core/bell.h"
#include "core/diag.h"
#include "core/engine.h"
#include "core/inherit.h"
#include "core/fabric.h"
#include "core/listener.h"
#include "core/negcache.h"
#include "core/plain.h"
#include "core/records.h"
#include "core/probe.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/tcpfirst.h"
#include "core/tcpfirst_hs.h"
#include "core/udp.h"
#include "core/wait.h"
#include "core/wire.h"
#include "preload/real.h"

#define FS_MS 1000000ull
/* How long after its "yes" the server waits for the HELLO beyond the
 * client's probe timeout: the client opens its rail (loading libfabric the
 * first time) before it can send the HELLO. */
#define FS_HELLO_MARGIN_MS 3000ull
/* How often a server waiting for the probe of a client that noted its
 * intent looks whether the note was taken back (the client decided, after
 * its connect(), not to probe). */
#define FS_INTENT_LOOK_NS (10ull * FS_MS)

bool fs_negotiate_loopback(const uint8_t a[16])
{
	static const uint8_t v6_loop[16] = { [15] = 1 };
	static const uint8_t v4_mapped[12] = { [10] = 0xff, [11] = 0xff };

	return memcmp(a, v6_loop, 16) == 0 || (memcmp(a, v4_mapped, 12) == 0 && a[12] == 127);
}

unsigned fs_negotiate_pick_provider(const struct sockaddr *local, const struct sockaddr *peer,
				    const char **why)
{
	uint8_t la[16], pa[16];
	uint16_t lp, pp;
	unsigned named;

	*why = NULL;
	/* (a loopback peer with shm on, every local connection's case, needs
	 * neither the local address's key nor the provider's name parsed) */
	fs_sockaddr_key(peer, pa, &pp);
	if (fs_params.shm && fs_negotiate_loopback(pa))
		return FS_PROV_SHM;
	fs_sockaddr_key(local, la, &lp);
	named = fs_fabric_prov_parse(fs_params.provider);
	if (fs_negotiate_loopback(pa) || memcmp(la, pa, 16) == 0) {
		if (fs_params.shm)
			return FS_PROV_SHM;
		if (named != FS_PROV_NONE)
			return named;
		*why = "shm disabled by FABSOCK_SHM=0";
		return FS_PROV_NONE;
	}
	if (named != FS_PROV_NONE)
		return named;
	if (fs_params.provider[0]) {
		*why = "unknown FABSOCK_PROVIDER (warned at start)";
		return FS_PROV_NONE;
	}
	if (fs_fabric_host_has_efa())
		return FS_PROV_EFA;
	*why = "remote peer and no EFA device (set FABSOCK_PROVIDER to use another provider)";
	return FS_PROV_NONE;
}

/* Whether a client may use PROVIDER with this side, as configured here
 * (a HELLO names the provider; the peer only picks among ours): shm for a
 * peer on this host if FABSOCK_SHM allows it, the FABSOCK_PROVIDER named,
 * efa when none is named and the host has an EFA device. */
static bool fs_negotiate_provider_allowed(const struct sockaddr *local, const struct sockaddr *peer, unsigned provider)
{
	uint8_t la[16], pa[16];
	uint16_t lp, pp;
	unsigned named = fs_fabric_prov_parse(fs_params.provider);

	fs_sockaddr_key(local, la, &lp);
	fs_sockaddr_key(peer, pa, &pp);
	if (provider == FS_PROV_SHM)
		return fs_params.shm && (fs_negotiate_loopback(pa) || memcmp(la, pa, 16) == 0);
	if (named != FS_PROV_NONE || fs_params.provider[0])
		return provider == named;
	return provider == FS_PROV_EFA && fs_fabric_host_has_efa();
}

/* ---- blocking helpers on the kernel socket ----------------------------- */

/* Writes all of BUF, waiting for room even on a nonblocking socket, until
 * DEADLINE_NS (0: none, the core's convention: core/wait.h). */
static int fs_send_all(int fd, const uint8_t *buf, size_t len, uint64_t deadline_ns)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = fs_real.send(fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n > 0) {
			done += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };

			if (deadline_ns && fs_now_ns() >= deadline_ns)
				return -ETIMEDOUT;
			fs_real.poll(&p, 1, 10);
			continue;
		}
		return n < 0 ? -errno : -EPIPE;
	}
	return 0;
}

static int fs_peek_message_ex(int fd, uint32_t magic, struct fs_hello *msg, uint64_t deadline_ns, size_t *got,
			      bool stop_on_prefix);

/* Peeks at the first bytes of the connection and decodes a HELLO or ACK
 * (MAGIC). Waits until a verdict or DEADLINE (0: none). Returns the decoder's answer
 * (> 0 length, -EBADMSG), 0 if only a valid prefix (or nothing) arrived by
 * the deadline, or -ECONNRESET if the connection ended. *GOT is the number
 * of bytes seen. */
static int fs_peek_message(int fd, uint32_t magic, struct fs_hello *msg, uint64_t deadline_ns, size_t *got)
{
	return fs_peek_message_ex(fd, magic, msg, deadline_ns, got, false);
}

static int fs_peek_message_ex(int fd, uint32_t magic, struct fs_hello *msg, uint64_t deadline_ns, size_t *got,
			      bool stop_on_prefix)
{
	uint8_t buf[FS_WIRE_HELLO_MAX];
	/* The peer's message usually follows within tens of microseconds:
	 * spin FABSOCK_SPIN_US before sleeping, as the data path does (never
	 * the sleepy engine's short spin: this is no data-path wait). */
	struct fs_wait w;

	fs_wait_init(&w, fs_now_ns(), deadline_ns, false);
	*got = 0;
	for (;;) {
		ssize_t n = fs_real.recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
		struct pollfd p = { .fd = fd, .events = POLLIN };
		enum fs_wait_step next;
		uint64_t now;
		int ret, left_ms;

		if (n == 0)
			return *got ? -EBADMSG : -ECONNRESET;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return -errno;
		if (n > 0) {
			*got = (size_t)n;
			ret = fs_wire_hello_decode(buf, (size_t)n, magic, msg);
			if (ret != 0)
				return ret;
		}
		now = fs_now_ns();
		next = fs_wait_next(&w, now);
		if (next == FS_WAIT_OVER || (stop_on_prefix && n > 0))
			return 0;
		/* more bytes may be on the way: wait for them, not for the same ones */
		if (n > 0) {
			usleep(200);
			continue;
		}
		if (next == FS_WAIT_SPIN) {
			fs_wait_spin(&w);
			continue;
		}
		/* at most a second per poll, then look again */
		left_ms = fs_wait_ms_until(now, deadline_ns);
		fs_real.poll(&p, 1, left_ms < 0 || left_ms > 1000 ? 1000 : left_ms);
	}
}

static int fs_consume(int fd, size_t len)
{
	uint8_t buf[FS_WIRE_HELLO_MAX];
	size_t done = 0;

	while (done < len) {
		ssize_t n = fs_real.recv(fd, buf, len - done, MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -EIO; /* they were peeked: they must be there */
		done += (size_t)n;
	}
	return 0;
}

/* Whether the kernel says process PID holds socket INODE as its
 * descriptor PEER_FD: 1 yes, 0 no (no such process or descriptor, or
 * another file), -1 it will not say (a process that changed user is not
 * dumpable, and the kernel shows its descriptors to no one of its user but
 * root). One readlink. */
static int fs_pid_fd_is(long pid, uint32_t peer_fd, uint32_t inode)
{
	char path[64], link[64], want[32];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%ld/fd/%u", pid, peer_fd);
	snprintf(want, sizeof(want), "socket:[%u]", inode);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0 && (errno == EACCES || errno == EPERM))
		return -1;
	return n >= 0 && (size_t)n == strlen(want) && memcmp(link, want, (size_t)n) == 0;
}

/* Whether process PID holds socket INODE under any descriptor: a client
 * that closed its descriptor before the handshake ended finishes it on a
 * private duplicate (fs_sock_bg_close), under another number than its
 * HELLO names. 1 yes, 0 no, -1 it will not say. Looks at most
 * FS_PEER_SCAN_MAX of the process's descriptors. */
#define FS_PEER_SCAN_MAX 65536

static int fs_pid_holds(long pid, uint32_t inode)
{
	char path[64], want[32], link[64];
	struct dirent *de;
	unsigned seen = 0;
	int ret = 0;
	size_t wlen;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%ld/fd", pid);
	d = opendir(path);
	if (!d)
		return errno == EACCES || errno == EPERM ? -1 : 0;
	wlen = (size_t)snprintf(want, sizeof(want), "socket:[%u]", inode);
	while ((de = readdir(d)) && seen++ < FS_PEER_SCAN_MAX) {
		ssize_t n;

		if (de->d_name[0] == '.')
			continue;
		n = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
		if (n < 0 && (errno == EACCES || errno == EPERM)) {
			ret = -1;
			break;
		}
		if (n >= 0 && (size_t)n == wlen && memcmp(link, want, wlen) == 0) {
			ret = 1;
			break;
		}
	}
	closedir(d);
	return ret;
}

/* Whether the peer of TCP connection FD closed its end (its FIN came):
 * sock_diag may still show that end's inode, and its descriptor number may
 * name another file by now. */
static bool fs_conn_peer_finished(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (fs_real.getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len))
		return false;
	return ti.tcpi_state == TCP_CLOSE_WAIT || ti.tcpi_state == TCP_LAST_ACK || ti.tcpi_state == TCP_CLOSE;
}

/* After fs_rail_peer_check (issue 16): asks the kernel whether the process
 * named in the shm address ADDR holds, as its descriptor PEER_FD, the socket
 * at the other end of our TCP connection FD. PROBE_INODE is that socket's
 * inode as sock_diag gave it when the client's probe came (0: unknown, then
 * it is asked now). 0: confirmed, or the kernel will not say (a peer that
 * changed user hides its descriptors; one that closed its end already;
 * counted as peers_unconfirmed: the owner check stands); -EPERM: it says
 * otherwise. Other providers: 0. The server asks it of a client's HELLO,
 * where a refusal leaves the connection on TCP. */
static int fs_peer_confirm(const struct fs_rail *rail, const void *addr, size_t len, int fd, uint32_t peer_fd,
			   uint32_t probe_inode)
{
	uint32_t inode = 0;
	long pid;
	int found, is;

	if (rail->kind != FS_PROV_SHM)
		return 0;
	pid = fs_shm_addr_pid(addr, len); /* fs_rail_peer_check: a name of our PID namespace */
	if (pid <= 0)
		return -EPERM;
	if (probe_inode) {
		/* the common case: one readlink */
		is = fs_pid_fd_is(pid, peer_fd, probe_inode);
		if (is == 1)
			return 0;
		if (is < 0) {
			FS_STAT_INC(peers_unconfirmed);
			return 0;
		}
		/* not that socket: the client may have closed its end since it
		 * probed; ask the kernel what its end is now */
	}
	found = fs_conn_peer_inode(fd, &inode);
	if (found == 0 && !fs_conn_peer_finished(fd))
		return -EPERM; /* the other end is not in this network namespace */
	if (found <= 0 || !inode) {
		/* sock_diag is not ours to use (a sandbox), or the peer closed
		 * its end already (wrote and closed: the connection is ending;
		 * gone from sock_diag's table once its FIN came): the owner
		 * check stands */
		FS_STAT_INC(peers_unconfirmed);
		return 0;
	}
	is = fs_pid_fd_is(pid, peer_fd, inode);
	if (!is)
		is = fs_pid_holds(pid, inode); /* under another number now */
	if (is < 0 || (!is && fs_conn_peer_finished(fd))) {
		/* (a client that connected and closed at once - wrk's address
		 * check - and whose descriptor number was reused since: its
		 * connection is ending, the owner check stands) */
		FS_STAT_INC(peers_unconfirmed);
		return 0;
	}
	return is ? 0 : -EPERM;
}

static void fs_fill_hello(struct fs_hello *h, uint32_t magic, struct fs_engine *e, struct fs_stream *st,
			  unsigned provider, int fd)
{
	struct fs_engine_rail *er = st ? st->erail : NULL;

	h->magic = magic;
	h->stream_id = st ? st->id : 0;
	h->window = st ? st->credit.floor : 0; /* the first grant */
	h->chunk = er ? er->chunk : 0;
	memcpy(h->host_id, e->host_id, 16);
	h->provider = (uint8_t)(st ? provider : FS_PROV_NONE);
	h->pull_shift = (uint8_t)(er ? fs_engine_pull_shift(er) : 0);
	h->addr_len = er ? (uint16_t)er->rail.addr_len : 0;
	h->bell_port = st ? fs_bell_port() : 0;
	h->sock_fd = fd >= 0 ? (uint32_t)fd : 0;
	if (er)
		memcpy(h->addr, er->rail.addr, er->rail.addr_len);
	/* wire 12: the stream's further rails (stripe.c), one address each */
	h->rails = (uint8_t)(st && st->nrails ? st->nrails : 1);
	for (unsigned i = 1; i < h->rails; i++) {
		const struct fs_rail *rail = &st->rail_ep[i]->rail;

		h->more[i - 1].len = (uint16_t)rail->addr_len;
		memcpy(h->more[i - 1].addr, rail->addr, rail->addr_len);
	}
}

/* The fallback counter of a refusal, on either side. */
static void fs_count_nak(unsigned nak)
{
	if (nak == FS_NAK_USER)
		FS_STAT_INC(fallback_other_user);
	else
		FS_STAT_INC(fallback_hello_nak);
}

static int fs_kernel(struct fs_sock *s, const char *why)
{
	FS_INFO("fd %d: stays on kernel TCP: %s", s->fd, why);
	FS_STAT_INC(kernel);
	return FS_PASS;
}

/* The handshake failed after the peer took the connection to the fabric
 * (it sent its HELLO-ACK, or may read ours as one): it may have sent bytes
 * over the fabric already, or taken ours, so the connection can go on as
 * TCP no more than as a stream, and an end of stream would be a lie (issue
 * 26). It ends as a reset does, on both ends and by the kernel itself
 * (fs_tcp_reset): the peer's control connection gets an RST (its stream
 * reports ECONNRESET after FABSOCK_PEER_GRACE_MS), and the application's
 * calls, which go to the kernel socket from now on, ECONNRESET once, then
 * an end of stream or EPIPE. Returns FS_PASS. */
static int fs_reset_tcp(struct fs_sock *s, const char *why)
{
	int ret;

	FS_WARN("fd %d: %s; resetting the connection", s->fd, why);
	if ((ret = fs_tcp_reset(s->fd)) != 0)
		FS_WARN("fd %d: cannot reset the connection: %s", s->fd, strerror(-ret));
	FS_STAT_INC(resets_at_join);
	return FS_PASS;
}

static void fs_offloaded(struct fs_sock *s, const char *side)
{
	struct fs_engine *e = fs_engine_peek();

	uint32_t grant;

	/* The stream is live: another thread's progress may already be taking
	 * the peer's grants (peer_limit), so it is read under the engine lock. */
	pthread_mutex_lock(&e->lock);
	s->stream->app_fd = s->fd;
	grant = s->stream->peer_limit;
	fs_engine_unlock(e);
	/* what a process forked later needs to ask for the stream back */
	s->hb_page = e->hb_page;
	s->hb_evfd = e->hb_evfd;
	s->hb_stream_id = s->stream->id;
	s->token = s->stream->token;
	FS_STAT_INC(offloaded);
	FS_INFO("fd %d: offloaded (%s) over %s, stream %u -> %u, first grant %u", s->fd, side,
		fs_fabric_prov_name(s->stream->erail->rail.kind), s->stream->id, s->stream->peer_id, grant);
}

/* ---- client ------------------------------------------------------------ */

/* The client's check of its rail (fs_engine_open_stream): its shm region
 * must be its own (another user's process could read it). */
static int fs_client_rail_check(struct fs_engine_rail *er, void *arg, char *why, size_t whylen)
{
	const char *self_why;

	(void)arg;
	if (fs_rail_self_check(&er->rail, &self_why) == 0)
		return FS_NAK_NONE;
	snprintf(why, whylen, "%s", self_why);
	return FS_NAK_USER;
}

/* Sends MSG (a HELLO or its ACK) on S's connection within
 * FABSOCK_HELLO_TIMEOUT_MS; when that fails, ST (if any) is abandoned.
 * Returns 0 or -errno. */
static int fs_send_hello(struct fs_sock *s, const struct fs_hello *msg, struct fs_engine *e, struct fs_stream *st)
{
	uint8_t wire[FS_WIRE_HELLO_MAX];
	int len = fs_wire_hello_encode(msg, wire, sizeof(wire));
	int ret = len > 0 ? fs_send_all(s->fd, wire, (size_t)len, fs_now_ns() + fs_params.hello_timeout_ms * FS_MS)
			  : -EINVAL;

	if (ret && st) {
		pthread_mutex_lock(&e->lock);
		fs_stream_abandon(e, st);
		fs_engine_unlock(e);
	}
	return ret;
}

/* S's local address, in LOCAL; -errno when the kernel has none. */
static int fs_sock_local(const struct fs_sock *s, struct sockaddr_storage *local)
{
	socklen_t llen = sizeof(*local);

	return fs_real.getsockname(s->fd, (struct sockaddr *)local, &llen) ? -errno : 0;
}

/* Phase 1, run by the service thread as soon as the probe is answered (or
 * by the application's first use if that comes first): on "yes", open the
 * rail, create the stream and send the HELLO. Returns 0 once the HELLO is
 * sent (the socket moves to CLIENT_HELLO_SENT), FS_PASS (kernel), -EAGAIN
 * or -errno. */
int fs_negotiate_client_hello(struct fs_sock *s, uint64_t wait_deadline_ns)
{
	struct fs_engine *e;
	struct fs_stream *st = NULL;
	struct fs_hello hello = { 0 };
	struct sockaddr_storage local;
	char why[200] = "";
	int ret, nak = FS_NAK_NONE;

	if (!s->neg->skip_probe) {
		bool tcp_readable;
		enum fs_probe_outcome out = fs_probe_result(&s->neg->probe, s->fd, wait_deadline_ns, &tcp_readable);

		if (tcp_readable) {
			fs_probe_cancel(&s->neg->probe);
			FS_STAT_INC(fallback_server_first);
			return fs_kernel(s, "the server spoke first");
		}
		switch (out) {
		case FS_PROBE_PENDING:
			return -EAGAIN;
		case FS_PROBE_OUT_YES:
			break;
		case FS_PROBE_OUT_NO:
			FS_STAT_INC(fallback_probe_no);
			return fs_kernel(s, "the server's listener said no");
		case FS_PROBE_OUT_REFUSED:
			fs_negcache_add((struct sockaddr *)&s->neg->peer, true);
			if (s->neg->provider == FS_PROV_SHM) /* a record led us here: a stale one */
				fs_records_sweep_port(ntohs(((struct sockaddr_in *)&s->neg->peer)->sin_port));
			FS_STAT_INC(fallback_probe_refused);
			return fs_kernel(s, "no fabsock listener (probe port unreachable)");
		default:
			/* The negative cache is for destinations that are no
			 * fabsock listeners. One that a record of our user says
			 * is (a listener on this host, confirmed by the kernel
			 * when it published) answered late: a burst of
			 * connections, a loaded or stopped server. This
			 * connection stays on TCP; the next one probes again
			 * (fs_sock_after_connect does not look at the cache
			 * for it either). */
			if (s->neg->record_hint == FS_RECORD_PRESENT + 1)
				FS_STAT_INC(probes_timeout_listener);
			else
				fs_negcache_add((struct sockaddr *)&s->neg->peer, false);
			FS_STAT_INC(fallback_probe_timeout);
			return fs_kernel(s, "no probe answer in time");
		}
	}

	if (s->neg->waitless) {
		/* TCP first, waitless (tcpfirst_hs.h): no engine, no rail */
		uint64_t token = fs_tfhs_token();

		fs_tfhs_client_fill(&hello, s->fd, token, (const struct sockaddr *)&s->neg->peer);
		ret = fs_send_hello(s, &hello, NULL, NULL);
		if (ret) {
			snprintf(why, sizeof(why), "cannot send the waitless HELLO: %s", strerror(-ret));
			return fs_reset_tcp(s, why);
		}
		FS_STAT_INC(tcp_first_waitless_sent);
		s->stream = NULL;
		s->token = token;
		return 0;
	}
	/* The server now waits for our HELLO: from here we always send one,
	 * empty (provider none) if we cannot offload, so it need not time out. */
	ret = fs_sock_local(s, &local);
	if (ret)
		return ret;
	e = fs_engine_get();
	if (getrandom(&hello.token, sizeof(hello.token), GRND_NONBLOCK) != sizeof(hello.token))
		hello.token = fs_now_ns() * 0x9e3779b97f4a7c15ull;
	hello.nonce = s->neg->skip_probe ? 0 : s->neg->probe.nonce;
	if (e)
		st = fs_engine_open_stream(e, s->neg->provider, (struct sockaddr *)&local, NULL, 0, hello.token,
					   fs_client_rail_check, NULL, &nak, why, sizeof(why));
	if (!st && !why[0])
		snprintf(why, sizeof(why), "no resources for a new stream");
	if (e) {
		fs_fill_hello(&hello, FS_WIRE_HELLO_MAGIC, e, st, s->neg->provider, s->fd);
		if (st && fs_tcpfirst_offer(e, st))
			hello.flags |= FS_HELLO_TCP_FIRST;
	} else
		hello.magic = FS_WIRE_HELLO_MAGIC;
	if (fs_params.test_hello_delay_ms)
		usleep((useconds_t)(fs_params.test_hello_delay_ms * 1000));
	ret = fs_send_hello(s, &hello, e, st);
	if (ret) {
		/* (a part of it may be in the stream: the server would read
		 * it as the application's bytes once its HELLO wait ends) */
		snprintf(why, sizeof(why), "cannot send the HELLO: %s", strerror(-ret));
		return fs_reset_tcp(s, why);
	}
	if (!st) {
		FS_INFO("fd %d: sent an empty HELLO: %s", s->fd, why);
		if (nak == FS_NAK_USER)
			FS_STAT_INC(fallback_other_user);
		else
			FS_STAT_INC(fallback_provider);
	}
	s->stream = st;
	s->token = hello.token;
	return 0;
}

static int fs_send_held(void *arg, const void *data, size_t len)
{
	struct fs_sock *s = arg;

	return fs_send_all(s->fd, data, len, 0);
}

/* Drops the half-made stream of a socket in CLIENT_HELLO_SENT. What the
 * application wrote meanwhile was held back, never sent: it goes out over
 * TCP now, in order, if the connection stays TCP (TO_TCP). */
void fs_negotiate_abort_ex(struct fs_sock *s, bool to_tcp)
{
	struct fs_engine *e = fs_engine_peek();

	if (s->stream && e) {
		pthread_mutex_lock(&e->lock);
		if (to_tcp && fs_stream_take_queued(e, s->stream, fs_send_held, s))
			FS_WARN("fd %d: could not pass held bytes to TCP", s->fd);
		else if (to_tcp && s->shut_wr)
			fs_real.shutdown(s->fd, SHUT_WR); /* shut down before the answer: after the held bytes */
		fs_stream_abandon(e, s->stream);
		fs_engine_unlock(e);
	}
	s->stream = NULL;
}

void fs_negotiate_abort(struct fs_sock *s)
{
	fs_negotiate_abort_ex(s, false);
}

/* Phase 2, on first use: the server's HELLO-ACK. It comes when the server
 * application first uses the connection, which may be late (a server that
 * accepts, forks and serves in the child): wait as long as the connection
 * lives, or until DEADLINE_NS (0 = no deadline). */
int fs_negotiate_client_ack(struct fs_sock *s, uint64_t deadline_ns)
{
	struct fs_engine *e = fs_engine_peek();
	struct fs_stream *st = s->stream;
	struct fs_hello ack;
	char why[120];
	size_t got;
	int ret;

	ret = fs_peek_message(s->fd, FS_WIRE_ACK_MAGIC, &ack, deadline_ns, &got);
	if (ret == -EBADMSG) {
		/* The server committed to TCP before our HELLO arrived; it drops
		 * the HELLO. What is there is the application's data. */
		fs_negotiate_abort_ex(s, true);
		FS_STAT_INC(fallback_server_first);
		if (s->neg->waitless)
			FS_STAT_INC(tcp_first_waitless_plain);
		return fs_kernel(s, "the server committed to TCP before our HELLO");
	}
	if (ret == 0)
		return -EAGAIN;
	if (ret < 0 && s->neg->waitless) {
		/* the server's end (or a reset) before any byte: it saw our FIN
		 * first and sent no ACK, or it ended; the kernel says which */
		FS_STAT_INC(tcp_first_waitless_plain);
		return fs_kernel(s, "TCP first, waitless: the connection ended before the ACK");
	}
	if (ret < 0) {
		fs_negotiate_abort(s);
		return ret;
	}
	if (fs_params.test_ack_delay_ms) {
		/* Testing: the whole ACK is there, but is looked at only this
		 * much later; meanwhile progress goes on (a delay that slept
		 * here would stop the service thread's progress too). */
		uint64_t now = fs_now_ns();

		if (!s->neg->ack_seen_ns)
			s->neg->ack_seen_ns = now;
		if (now < s->neg->ack_seen_ns + fs_params.test_ack_delay_ms * FS_MS)
			return -EAGAIN;
	}
	fs_consume(s->fd, (size_t)ret);
	if (ack.token != s->token && !s->neg->waitless_adopted) {
		fs_negotiate_abort(s);
		return fs_reset_tcp(s, "HELLO-ACK for another connection");
	}
	if (s->neg->waitless) {
		/* no stream, nothing held: the connection is TCP either way */
		if (ack.status == FS_NAK_NONE && fs_tfhs_ack_agrees(&ack)) {
			FS_STAT_INC(tcp_first_waitless_acked);
			return fs_kernel(s, "TCP first, waitless: the server took the HELLO (no switch: OPEN not built)");
		}
		FS_STAT_INC(tcp_first_waitless_plain);
		fs_count_nak(ack.status);
		return fs_kernel(s, "TCP first, waitless: the server refused the HELLO");
	}
	if (ack.status != FS_NAK_NONE || !st) {
		fs_negotiate_abort_ex(s, true);
		if (!st)
			return fs_kernel(s, "this side declined (see the log line before)");
		fs_count_nak(ack.status);
		snprintf(why, sizeof(why), "the server refused the HELLO (%s)", fs_nak_name(ack.status));
		return fs_kernel(s, why);
	}
	/* (The server's descriptor is not confirmed here: it may be closed
	 * and reused already, a server that answers, writes and closes, and
	 * a refusal now could only reset a connection the server has taken
	 * to the fabric. The owner check of fs_rail_peer_check stands.) */
	/* TCP first: decided before the join, whose first grant lets what
	 * the application wrote meanwhile go (tcpfirst.h) */
	fs_tcpfirst_client_agreed(e, st, fs_params.tcp_first, ack.flags);
	/* A server that answers, writes, closes and exits may be gone by now
	 * (its fabric address names a region that no longer exists); what it
	 * sent came to us before it ended: the stream stays for receiving
	 * only (fs_stream_peer_ended, e2e_tail answer_exit). */
	ret = fs_engine_join_stream(e, st, &ack, s->fd, true);
	if (ret < 0) {
		/* The server believes we are offloaded and may have written
		 * over the fabric already; what the application wrote here was
		 * dropped with the stream (fs_engine_join_stream abandons it). */
		s->stream = NULL;
		snprintf(why, sizeof(why), "cannot reach the server's fabric address: %s", strerror(-ret));
		return fs_reset_tcp(s, why);
	}
	/* atomic: the exit path looks at it before it takes the lock */
	__atomic_store_n(&s->pid, fs_self_pid(), __ATOMIC_RELAXED);
	fs_offloaded(s, "client");
	return 0;
}

/* ---- server ------------------------------------------------------------ */

static void fs_send_nak(struct fs_sock *s, uint64_t token, uint64_t nonce, unsigned nak, struct fs_engine *e)
{
	struct fs_hello ack = { .magic = FS_WIRE_ACK_MAGIC, .status = (uint8_t)nak, .token = token, .nonce = nonce };
	uint8_t wire[FS_WIRE_HELLO_MAX];
	int len;

	if (e)
		memcpy(ack.host_id, e->host_id, 16);
	len = fs_wire_hello_encode(&ack, wire, sizeof(wire));
	if (len > 0)
		fs_send_all(s->fd, wire, (size_t)len, fs_now_ns() + fs_params.hello_timeout_ms * FS_MS);
}

static int fs_server_refuse(struct fs_sock *s, uint64_t token, uint64_t nonce, unsigned nak,
			    struct fs_engine *e)
{
	fs_send_nak(s, token, nonce, nak, e);
	fs_count_nak(nak);
	FS_INFO("fd %d: refused a HELLO: %s", s->fd, fs_nak_name(nak));
	return fs_kernel(s, "HELLO refused");
}

/* The server's check of its rail against the client's HELLO (through
 * fs_engine_open_stream, before any stream or receive is set up): the
 * client's fabric address must belong to this user's processes, and the
 * kernel must say its process holds this connection. Logs its refusals. */
struct fs_server_check {
	struct fs_sock *s;
	const struct fs_hello *hello;
	const struct fs_probe_rec *rec;
};

static int fs_server_rail_check(struct fs_engine_rail *er, void *arg, char *why, size_t whylen)
{
	const struct fs_server_check *c = arg;
	const struct fs_hello *hello = c->hello;
	int chk = fs_rail_peer_check(&er->rail, hello->addr, hello->addr_len);

	(void)why;
	(void)whylen;
	if (chk == -EPERM) {
		const char *self_why;

		if (fs_rail_self_check(&er->rail, &self_why))
			FS_INFO("fd %d: %s", c->s->fd, self_why);
		else
			FS_INFO("fd %d: the client runs as another user than this process (uid %u)", c->s->fd,
				(unsigned)fs_self_euid());
		return FS_NAK_USER;
	}
	if (!chk && fs_peer_confirm(&er->rail, hello->addr, hello->addr_len, c->s->fd, hello->sock_fd,
				    c->rec ? c->rec->client_inode : 0)) {
		FS_INFO("fd %d: the kernel says the client's fabric address names a process that does not hold "
			"this connection", c->s->fd);
		return FS_NAK_PEER;
	}
	return FS_NAK_NONE;
}

/* Answers a complete HELLO (already checked for our nonce), first taking
 * CONSUME bytes of it off the socket (the rest the application's first
 * receive took already: fs_negotiate_server_after_read). */
static int fs_server_accept_hello(struct fs_sock *s, const struct fs_hello *hello, size_t consume,
				  const struct fs_probe_rec *rec)
{
	struct fs_engine *e;
	struct fs_stream *st = NULL;
	struct fs_hello ack = { 0 };
	struct sockaddr_storage local = { 0 };
	char why[200] = "";
	int nak = FS_NAK_PROVIDER, ret;

	if (consume && fs_consume(s->fd, consume))
		return -EIO;
	if (fs_sock_direct_readers(s)) {
		/* another thread of the application waits in the kernel for
		 * this connection's first byte (fs_sock_first_read): offloaded,
		 * the connection would bring it nothing more; on TCP the
		 * client's bytes wake it. A sender leaves the HELLO to such a
		 * reader (FS_NEG_TO_READER), whose peek the HELLO ends; this is
		 * the last resort when that reader did not come back within the
		 * HELLO wait (a reader stopped in a signal handler, say) */
		FS_INFO("fd %d: a reader waits on the kernel socket: the connection stays on TCP", s->fd);
		FS_STAT_INC(hello_reader_refused);
		return fs_server_refuse(s, hello->token, hello->nonce, FS_NAK_RESOURCES, NULL);
	}
	e = fs_engine_get();
	if (!e)
		return fs_server_refuse(s, hello->token, hello->nonce, FS_NAK_RESOURCES, NULL);
	if (hello->provider == FS_PROV_NONE || hello->provider >= FS_PROV_MAX_) {
		/* the client declined; its own counters say why */
		return fs_server_refuse(s, hello->token, hello->nonce, FS_NAK_PROVIDER, e);
	}
	if (hello->provider == FS_PROV_SHM && memcmp(hello->host_id, e->host_id, 16) != 0)
		return fs_server_refuse(s, hello->token, hello->nonce, FS_NAK_HOST, e);
	if (!hello->stream_id || !hello->window || !hello->chunk)
		return fs_server_refuse(s, hello->token, hello->nonce, FS_NAK_VERSION, e);
	(void)fs_sock_local(s, &local);
	{
		struct sockaddr_storage peer;
		socklen_t plen = sizeof(peer);

		if (fs_real.getpeername(s->fd, (struct sockaddr *)&peer, &plen) ||
		    !fs_negotiate_provider_allowed((struct sockaddr *)&local, (struct sockaddr *)&peer,
						   hello->provider)) {
			FS_INFO("fd %d: the client asks for %s, which this side is not configured for", s->fd,
				fs_fabric_prov_name(hello->provider));
			return fs_server_refuse(s, hello->token, hello->nonce, FS_NAK_PROVIDER, e);
		}
	}

	{
		struct fs_server_check chk = { s, hello, rec };

		st = fs_engine_open_stream(e, hello->provider, (struct sockaddr *)&local, hello->addr, hello->addr_len,
					   hello->token, fs_server_rail_check, &chk, &nak, why, sizeof(why));
	}
	if (!st && why[0])
		FS_INFO("fd %d: %s", s->fd, why);
	if (st && (ret = fs_engine_join_stream(e, st, hello, s->fd, false)) != 0) {
		FS_INFO("fd %d: the client's fabric address is unusable: %s", s->fd, strerror(-ret));
		st = NULL;
		nak = ret == -ENOSPC ? FS_NAK_RESOURCES : ret == -EPERM ? FS_NAK_USER : FS_NAK_PROVIDER;
	}
	if (!st)
		return fs_server_refuse(s, hello->token, hello->nonce, (unsigned)nak, e);

	fs_fill_hello(&ack, FS_WIRE_ACK_MAGIC, e, st, hello->provider, s->fd);
	ack.token = hello->token;
	ack.nonce = hello->nonce;
	if (fs_tcpfirst_server_agree(e, st, hello->flags))
		ack.flags |= FS_HELLO_TCP_FIRST;
	ret = fs_send_hello(s, &ack, e, st);
	if (ret) {
		/* (a part of it may be in the stream: the client would wait
		 * for the rest as long as the connection lives) */
		snprintf(why, sizeof(why), "cannot send the HELLO-ACK: %s", strerror(-ret));
		return fs_reset_tcp(s, why);
	}
	s->stream = st;
	/* atomic: the exit path looks at it before it takes the lock */
	__atomic_store_n(&s->pid, fs_self_pid(), __ATOMIC_RELAXED);
	fs_offloaded(s, "server");
	return 0;
}

/* The connection settles as TCP, but its client may still send a HELLO
 * (NONCE: the one it must carry, 0 for any): the first receive strips it
 * (fs_negotiate_strip_hello). SENT: this side spoke first, so the client
 * takes the connection as TCP and expects no NAK. */
static void fs_strip_hello_later(struct fs_sock *s, uint64_t nonce, bool sent)
{
	s->strip_hello = true;
	s->neg->strip_nonce = nonce;
	s->strip_sent = sent;
}

/* The probe said yes (or a rule vouches for the client): the first bytes
 * should be its HELLO. */
static int fs_server_expect_hello(struct fs_sock *s, const struct fs_probe_rec *rec, bool vouched,
				  const uint8_t addr[16], uint16_t port, bool for_send, uint64_t caller_deadline_ns)
{
	struct fs_hello hello;
	size_t got = 0;
	uint64_t wait_ms = rec ? rec->wait_ms : fs_params.probe_timeout_ms;
	uint64_t start = rec ? rec->stamp_ns : fs_now_ns();
	/* The client sends its HELLO before its own probe deadline, which
	 * precedes ours: wait its timeout plus a margin for scheduling. */
	uint64_t first_byte_deadline = start + (wait_ms + FS_HELLO_MARGIN_MS) * FS_MS;
	int ret;

	/* its client wants the fabric (a "yes" to its probe): not a plain
	 * client, whether or not it offloads (core/plain.h) */
	if (s->listener && s->plain_note)
		fs_plain_settled(s->listener, true);

	/* A sender (a server that speaks first) got a "yes" while another
	 * thread of the application waits in the kernel for this connection's
	 * first byte (fs_sock_first_read: it peeked before there was a record,
	 * so it holds no lock and knows nothing of the "yes"). Offloading here
	 * would leave that reader on an idle TCP socket, and refusing (as
	 * before) left a connection both ends wanted on TCP (e2e_semantics
	 * threads_duplex, about half the runs under load). The HELLO ends the
	 * reader's peek, and the reader settles the connection with it, as it
	 * would with no sender: so nothing is touched here (the record stays
	 * YES, the HELLO in the socket), and the sender waits for the reader
	 * without the lock (fs_sock_settle, fs_sock_wait_direct_readers), at
	 * most until this same deadline (which fs_negotiate_server_hello_by
	 * gives it): a sender whose wait ended settles itself (a HELLO then
	 * refused with hello_reader_refused, or TCP if none came). */
	if (for_send && rec && s->neg->may_leave_to_reader && fs_sock_direct_readers(s) &&
	    fs_now_ns() < first_byte_deadline) {
		if (!s->neg->left_to_reader)
			FS_STAT_INC(server_send_left_to_reader);
		s->neg->left_to_reader = true;
		FS_DBG("fd %d: a \"yes\" came while a reader waits in the kernel: it settles the connection", s->fd);
		return FS_NEG_TO_READER;
	}
	/* Wait for the first bytes; once some are there, the rest of a HELLO
	 * gets FABSOCK_HELLO_TIMEOUT_MS to follow. A caller with a deadline
	 * (a nonblocking one) gets -EAGAIN while the answer is still open. */
	if (caller_deadline_ns) {
		uint64_t whole = start + (wait_ms + FS_HELLO_MARGIN_MS + fs_params.hello_timeout_ms) * FS_MS;

		ret = fs_peek_message(s->fd, FS_WIRE_HELLO_MAGIC, &hello,
				      caller_deadline_ns < first_byte_deadline ? caller_deadline_ns : first_byte_deadline,
				      &got);
		if (ret == 0 && ((!got && fs_now_ns() < first_byte_deadline) || (got && fs_now_ns() < whole)))
			return -EAGAIN;
	} else {
		/* A blocking receive waits for the first bytes as the application
		 * would, however late the HELLO (a client whose first fabric open
		 * took long). Only a send needs the margin: the client may be
		 * waiting for this side to speak. */
		if (!for_send)
			first_byte_deadline = 0; /* none */
		ret = fs_peek_message_ex(s->fd, FS_WIRE_HELLO_MAGIC, &hello, first_byte_deadline, &got, true);
		if (ret == 0 && got)
			ret = fs_peek_message(s->fd, FS_WIRE_HELLO_MAGIC, &hello,
					      fs_now_ns() + fs_params.hello_timeout_ms * FS_MS, &got);
	}
	if (ret > 0 && (vouched || (rec && hello.nonce == rec->nonce))) {
		/* the record did its work: from now on it only answers a late
		 * probe NO, and is kept as briefly as a settled one */
		if (s->listener)
			fs_listener_move(s->listener, addr, port, FS_REC_YES, FS_REC_DONE, NULL);
		return fs_server_accept_hello(s, &hello, (size_t)ret, rec);
	}
	if (s->listener)
		fs_listener_move(s->listener, addr, port, FS_REC_YES, FS_REC_TCP, NULL);
	if (ret == -ECONNRESET) {
		FS_STAT_INC(fallback_peer_closed);
		return fs_kernel(s, "the client closed before negotiating");
	}
	if (ret < 0 || got) {
		FS_STAT_INC(fallback_bad_hello);
		FS_INFO("fd %d: %zu first bytes, decode %d, nonce %#llx, probe nonce %#llx", s->fd, got, ret,
			ret > 0 ? (unsigned long long)hello.nonce : 0ull, rec ? (unsigned long long)rec->nonce : 0ull);
		return fs_kernel(s, "the first bytes were not a valid HELLO");
	}
	FS_STAT_INC(fallback_peer_plain);
	if (rec) /* the client was told yes: its HELLO may still come */
		fs_strip_hello_later(s, rec->nonce, for_send);
	return fs_kernel(s, "no HELLO arrived in time");
}

int fs_negotiate_strip_hello(struct fs_sock *s, uint64_t deadline_ns)
{
	struct fs_hello hello;
	size_t got = 0;
	int ret;

	fs_lock(&s->lock);
	if (!s->strip_hello) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	/* The first bytes, awaited as the application would await them. */
	ret = fs_peek_message_ex(s->fd, FS_WIRE_HELLO_MAGIC, &hello, deadline_ns, &got, true);
	if (ret == 0 && got) {
		/* the start of a HELLO: the rest follows within the HELLO
		 * timeout, or the caller's deadline, whichever comes first */
		uint64_t rest = fs_now_ns() + fs_params.hello_timeout_ms * FS_MS;
		bool caller_first = deadline_ns && deadline_ns < rest;

		ret = fs_peek_message(s->fd, FS_WIRE_HELLO_MAGIC, &hello, caller_first ? deadline_ns : rest, &got);
		if (ret == 0 && caller_first) {
			pthread_mutex_unlock(&s->lock);
			return -EAGAIN;
		}
	}
	if (ret == 0 && !got) {
		pthread_mutex_unlock(&s->lock);
		return -EAGAIN;
	}
	s->strip_hello = false;
	FS_DBG("fd %d: looking for a HELLO to strip: %zu first bytes, decode %d", s->fd, got, ret);
	if (ret > 0 && (!s->neg->strip_nonce || hello.nonce == s->neg->strip_nonce) && fs_consume(s->fd, (size_t)ret) == 0) {
		FS_INFO("fd %d: dropped the client's HELLO (this side stays on TCP)", s->fd);
		if (!s->strip_sent)
			fs_send_nak(s, hello.token, hello.nonce, FS_NAK_RESOURCES, NULL);
		ret = 1;
	} else {
		ret = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

/* Who the client of a connection is, as a server about to write first sees
 * it (fs_client_kind). */
enum fs_client_kind {
	FS_CLIENT_UNKNOWN,    /* not on this host (or not found): a probe may come */
	FS_CLIENT_OTHER_USER, /* on this host, another user: found no record of ours, sends no probe */
	FS_CLIENT_CHOSE_TCP,  /* our user; its history sent it to TCP: no probe */
	FS_CLIENT_PLAIN,      /* our user; noted nothing: a program without fabsock */
	FS_CLIENT_INTENT,     /* our user; noted that it will probe */
};

/* What the client of S (PEER, its key ADDR:PORT) is, for a server about to
 * write first with no probe there (issue 27, target 7): one getsockname and
 * one sock_diag lookup, which gives the client socket's owner and inode when
 * it is on this host; the notes of our user's history file then say whether
 * it will probe (history.h). A client of another user (with listener records
 * on) finds no record of ours and sends no probe. *INODE: the client
 * socket's, for a look again. */
static enum fs_client_kind fs_client_kind(struct fs_sock *s, const struct sockaddr *peer, const uint8_t addr[16],
					  uint16_t port, uint32_t *inode)
{
	struct sockaddr_storage local;
	socklen_t llen = sizeof(local);
	uint32_t uid = FS_DIAG_NO_UID;
	const char *why = NULL;
	uint8_t laddr[16];
	uint16_t lport;

	*inode = 0;
	if (fs_real.getsockname(s->fd, (struct sockaddr *)&local, &llen))
		return FS_CLIENT_UNKNOWN;
	if (fs_negotiate_pick_provider((struct sockaddr *)&local, peer, &why) != FS_PROV_SHM)
		return FS_CLIENT_UNKNOWN;
	fs_sockaddr_key((struct sockaddr *)&local, laddr, &lport);
	if (fs_conn_exists(laddr, lport, addr, port, inode, &uid) != 1 || uid == FS_DIAG_NO_UID) {
		FS_DBG("fd %d: the client socket of a server that speaks first is not on this host (or not found)", s->fd);
		return FS_CLIENT_UNKNOWN;
	}
	if (uid != (uint32_t)fs_self_euid())
		/* (without records such a client probes, and its HELLO is
		 * refused: wait for it as before) */
		return fs_params.records ? FS_CLIENT_OTHER_USER : FS_CLIENT_UNKNOWN;
	/* our user's notes: only our user can write them (the file is ours,
	 * mode 0600, in our 0700 directory) */
	switch (fs_history_client_note(*inode)) {
	case FS_HISTORY_NOTE_TCP:
		return FS_CLIENT_CHOSE_TCP;
	case FS_HISTORY_NOTE_INTENT:
		return FS_CLIENT_INTENT;
	case FS_HISTORY_NOTE_NONE:
		return FS_CLIENT_PLAIN;
	default:
		return FS_CLIENT_UNKNOWN;
	}
}

/* S's probe-record key is ADDR/PORT (its client's): a hint kept for another
 * key is dropped, HINT (found for this key, NULL: none) taken if given. */
static void fs_peer_key_note(struct fs_sock *s, const uint8_t addr[16], uint16_t port, const struct fs_rec_hint *hint)
{
	if (!s->have_peer_key || s->peer_port != port || memcmp(s->peer_key, addr, sizeof(s->peer_key)) != 0)
		s->rec_hint = (struct fs_rec_hint){ 0 };
	if (hint)
		s->rec_hint = *hint;
	memcpy(s->peer_key, addr, sizeof(s->peer_key));
	s->peer_port = port;
	s->have_peer_key = true;
}

int fs_negotiate_server_waitless(struct fs_sock *s, const uint8_t *first, size_t n, size_t *taken)
{
	size_t none;

	if (!taken)
		taken = &none;
	*taken = 0;
	/* (whatever FABSOCK_TCP_FIRST_WAITLESS says: our record says we strip
	 * one whenever TCP first is on, and that setting is the client's) */
	if (!fs_params.tcp_first || fs_tfhs_server_take(s->fd, first, n, taken) != 1)
		return 0;
	/* (a late probe for it, which a waitless client never sends, is
	 * answered no) */
	if (s->listener && s->have_peer_key)
		fs_listener_claim_tcp(s->listener, s->peer_key, s->peer_port, s->neg->accepted_ns, NULL, &s->rec_hint);
	s->strip_hello = false;
	return fs_kernel(s, "TCP first, waitless: the client's HELLO taken, the ACK sent (no switch: OPEN not built)");
}

int fs_negotiate_server(struct fs_sock *s, bool for_send, uint64_t deadline_ns)
{
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);
	struct fs_probe_rec rec;
	enum fs_rule_action rule;
	enum fs_rec_state state;
	uint8_t addr[16];
	uint16_t port;
	short seen = POLLRDHUP; /* what the last readable poll said (unknown: as if closed) */

	if (s->neg->accepted_len) {
		/* what accept() returned: the same answer without a system call
		 * (a client gone meanwhile shows in the poll and peek below) */
		memcpy(&peer, &s->neg->accepted_peer, s->neg->accepted_len);
	} else if (fs_real.getpeername(s->fd, (struct sockaddr *)&peer, &plen)) {
		FS_STAT_INC(fallback_peer_closed); /* gone already (ENOTCONN) */
		return fs_kernel(s, "not connected");
	}
	fs_sockaddr_key((struct sockaddr *)&peer, addr, &port);
	fs_peer_key_note(s, addr, port, NULL);
	/* a waitless HELLO goes whatever else decides (its client waits for
	 * nothing, so it is at the head by now as a rule; later ones: below) */
	if (fs_negotiate_server_waitless(s, NULL, 0, NULL) == FS_PASS)
		return FS_PASS;
	rule = fs_rules_match(&fs_rules_global, FS_SIDE_SERVER, (struct sockaddr *)&peer, s->local_port);
	if (rule == FS_RULE_KERNEL) {
		if (s->listener)
			fs_listener_claim_tcp(s->listener, addr, port, s->neg->accepted_ns, NULL, &s->rec_hint);
		FS_STAT_INC(fallback_rule);
		return fs_kernel(s, "a FABSOCK_RULES rule says kernel");
	}
	if (fs_listeners_is_own_client(addr, port)) {
		/* a client of this process kept on TCP (fs_listeners_own): no
		 * probe, no HELLO, whatever a rule says; nothing to wait for */
		if (s->listener)
			fs_listener_claim_tcp(s->listener, addr, port, s->neg->accepted_ns, NULL, &s->rec_hint);
		fs_strip_hello_later(s, 0, for_send);
		FS_STAT_INC(fallback_peer_plain);
		return fs_kernel(s, "a client of this process's own (kept on TCP)");
	}
	if (!s->listener) {
		if (rule == FS_RULE_OFFLOAD)
			return fs_server_expect_hello(s, NULL, true, addr, port, for_send, deadline_ns);
		/* No probe record to judge by: the connection reached this
		 * program through exec() before it was used (inherit.h; the
		 * record went with the old program), or its listener has no
		 * probe twin (another twin on the port may have answered). It
		 * stays on TCP; a HELLO its client may have sent is stripped. */
		fs_strip_hello_later(s, 0, for_send);
		FS_STAT_INC(fallback_peer_plain);
		return fs_kernel(s, "no probe record (accepted before exec(), or a listener without a probe twin)");
	}
	for (;;) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN | POLLRDHUP };
		bool readable = fs_real.poll(&p, 1, 0) > 0;

		/* A client that probes writes nothing on TCP before our answer
		 * (its writes wait for it, up to its probe timeout): its bytes or
		 * its end here mean it waits for none. An answer given already
		 * (the service thread's) is in the table; a probe still queued
		 * is from a client that gave up on it. So only a connection with
		 * nothing to read yet drains the twin: a plain client's
		 * connection saves a failing recvmsg (each of a fabsock nginx
		 * worker's plain requests paid one). */
		if (!readable)
			fs_listener_drain(s->listener);
		else if (fs_params.tcp_first && fs_negotiate_server_waitless(s, NULL, 0, NULL) == FS_PASS)
			return FS_PASS;
		rec = (struct fs_probe_rec){ 0 };
		state = fs_listener_lookup(s->listener, addr, port, &rec, &s->rec_hint);
		if (fs_probe_rec_stale(&rec, s->neg->accepted_ns))
			state = FS_REC_NONE; /* an earlier connection's, from the same client port */
		if (state == FS_REC_YES)
			return fs_server_expect_hello(s, &rec, rule == FS_RULE_OFFLOAD, addr, port, for_send, deadline_ns);
		if (state == FS_REC_TCP || state == FS_REC_DONE)
			break;
		if (rule == FS_RULE_OFFLOAD)
			return fs_server_expect_hello(s, NULL, true, addr, port, for_send, deadline_ns);
		/* No record yet. Bytes from the client, or the application
		 * speaking first, settle it as TCP, unless a "yes" beats us. */
		seen = readable ? p.revents : POLLRDHUP;
		if (for_send && !readable && fs_params.first_send_wait_ms) {
			/* The client sends its probe as its connect() returns, about
			 * when our accept() does. How long to give it depends on who
			 * the client is (fs_client_kind): a client on this host of
			 * our user noted before its connect() whether it will probe;
			 * one that will gets up to a probe timeout (a loaded machine
			 * delays its probe past FIRST_SEND_WAIT_MS: a gRPC server's
			 * SETTINGS left its clients on TCP), one that will not (a
			 * plain program, a client of another user, one its history
			 * sent to TCP) none; a client we cannot see (another host)
			 * FIRST_SEND_WAIT_MS, as before. Another client's probe (or a
			 * signal) may end a poll early, so the wait runs to its end,
			 * not to the first datagram; the client's own bytes or FIN
			 * end it. The wait is the connection's (s->neg), not the
			 * call's: a nonblocking sender (DEADLINE_NS) never waits in
			 * it, it gets -EAGAIN until the wait is over (a send never
			 * blocks in the kernel), and its next call goes on with the
			 * same wait; fs_sock_settle then owes it its writability. */
			struct pollfd u[2] = { { .fd = fs_listener_fd(s->listener), .events = POLLIN },
					       { .fd = s->fd, .events = POLLIN | POLLRDHUP } };
			struct fs_sock_neg *neg = s->neg;
			uint64_t now = fs_now_ns(), slice;

			if (!neg->send_wait_started) {
				neg->send_wait_started = true;
				neg->send_wait_kind = (unsigned char)fs_client_kind(s, (struct sockaddr *)&peer, addr,
										    port, &neg->send_client_inode);
				neg->send_wait_end_ns = now;
				if (neg->send_wait_kind == FS_CLIENT_UNKNOWN)
					neg->send_wait_end_ns += fs_params.first_send_wait_ms * FS_MS;
				else if (neg->send_wait_kind == FS_CLIENT_INTENT)
					neg->send_wait_end_ns += fs_params.probe_timeout_ms * FS_MS;
				if (neg->send_wait_kind == FS_CLIENT_INTENT)
					FS_STAT_INC(server_first_intent_waits);
				else if (neg->send_wait_kind == FS_CLIENT_UNKNOWN)
					FS_STAT_INC(server_first_unseen_waits);
			} else if (neg->send_wait_kind == FS_CLIENT_INTENT && now < neg->send_wait_end_ns &&
				   fs_history_client_note(neg->send_client_inode) != FS_HISTORY_NOTE_INTENT) {
				/* taken back: the client decided not to probe after all */
				neg->send_wait_kind = FS_CLIENT_PLAIN;
				neg->send_wait_end_ns = now;
			}
			if (now < neg->send_wait_end_ns) {
				if (deadline_ns && now >= deadline_ns)
					return -EAGAIN;
				/* (an intent is looked at again every 10 ms) */
				slice = neg->send_wait_end_ns - now;
				if (neg->send_wait_kind == FS_CLIENT_INTENT && slice > FS_INTENT_LOOK_NS)
					slice = FS_INTENT_LOOK_NS;
				if (deadline_ns && slice > deadline_ns - now)
					slice = deadline_ns - now;
				fs_real.poll(u, 2, (int)((slice + 999999) / 1000000));
				continue;
			}
		}
		if (for_send || readable) {
			state = fs_listener_claim_tcp(s->listener, addr, port, s->neg->accepted_ns, &rec, &s->rec_hint);
			if (state == FS_REC_YES)
				return fs_server_expect_hello(s, &rec, false, addr, port, for_send, deadline_ns);
			break;
		}
		if (deadline_ns && fs_now_ns() >= deadline_ns)
			return -EAGAIN;
		p.events = POLLIN;
		fs_real.poll(&p, 1, 5);
	}
	if (for_send) {
		enum fs_client_kind kind = s->neg->send_wait_kind;
		static const char *const why[] = {
			[FS_CLIENT_UNKNOWN] = "the server application spoke first",
			[FS_CLIENT_OTHER_USER] = "the server application spoke first to a client of another user",
			[FS_CLIENT_CHOSE_TCP] = "the server application spoke first to a client its history kept on TCP",
			[FS_CLIENT_PLAIN] = "the server application spoke first to a plain client of this host",
			[FS_CLIENT_INTENT] = "the server application spoke first: the probe the client noted did not come in time",
		};

		FS_STAT_INC(fallback_server_first);
		if (kind == FS_CLIENT_INTENT && fs_params.tcp_first)
			/* a waitless HELLO of this client's may still come (its
			 * process was slow): the first receive strips it, and the
			 * client, finding our bytes first, stays on TCP */
			fs_strip_hello_later(s, 0, true);
		if (kind == FS_CLIENT_CHOSE_TCP)
			FS_STAT_INC(server_first_client_tcp);
		else if (kind == FS_CLIENT_PLAIN)
			FS_STAT_INC(server_first_plain_local);
		else if (kind == FS_CLIENT_INTENT)
			FS_STAT_INC(server_first_intent_missed);
		return fs_kernel(s, why[kind]);
	}
	{
		/* Readable with no record: a client without fabsock sent bytes,
		 * or a client closed before it could probe (nginx dropping an
		 * upstream connection it no longer needs): nothing but the FIN
		 * came, and that is not a connection lost to TCP. */
		char byte;

		/* (the peek only when the poll saw the client's FIN or a hang-up:
		 * bytes without either are a plain client's, one system call
		 * less on every connection that stays on TCP) */
		if ((seen & (POLLRDHUP | POLLHUP | POLLERR)) && fs_real.recv(s->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
			FS_STAT_INC(fallback_peer_closed);
			return fs_kernel(s, "the client closed before negotiating");
		}
	}
	FS_STAT_INC(fallback_peer_plain);
	return fs_kernel(s, "the client did not probe");
}

/* ---- the server's first receive, straight from the kernel ------------- */

/* The server application's first receive on a connection whose client has
 * not probed yet goes to the kernel as it is, blocking there if the
 * application's socket blocks: no spin, no poll, no system call of
 * fabsock's. What it returns is judged after the fact: the client sends
 * nothing but its HELLO after a "yes" and holds its bytes until its probe is
 * answered, so bytes that arrive while the record is not YES are a plain
 * client's, and the record, claimed as TCP once they are in, stays so (a
 * late probe is answered no). Only a "yes" given while the receive waited
 * makes the bytes possibly a HELLO; then they are decoded, and the rest of
 * a HELLO the application's buffer could not hold is taken from the socket.
 * This is the usual shape for a fabsock client of a thread-per-connection
 * server (its read waits before the probe lands), and the rare one for a
 * plain client (a probe of its that came and was answered after its own
 * timeout). */

/* Whether S's first receive may go to the kernel first: 1 when nothing is
 * known of its client yet (no probe record: the usual case for a plain
 * client), 0 when the usual settling must run (a record, a rule, a client
 * of this process, no listener, no address from accept()). Socket lock
 * held; S is SERVER_PENDING. */
int fs_negotiate_server_before_read(struct fs_sock *s, bool bytes_in)
{
	struct fs_probe_rec rec = { 0 };
	struct fs_rec_hint hint = { 0 };
	enum fs_rec_state state;
	uint8_t addr[16];
	uint16_t port;

	if (!s->listener || !s->neg->accepted_len || s->strip_hello)
		return 0;
	/* asked already (epoll_wait's look at the bytes, then the receive):
	 * what else it checked does not change (the rules, whose client this
	 * is), and the record is looked at again by the claim after the read */
	if (bytes_in && s->direct_ok && s->have_peer_key)
		return 1;
	/* A blocking receive that would wait for the first byte: when nobody
	 * answers the listener's probes (a forked child's inherited listener
	 * whose parent is gone, as a daemonizing server's workers have it, or
	 * its twin let go), the usual wait drains them, or a probing client
	 * would wait out its probe. With bytes in, no client waits for an
	 * answer (a probing one writes nothing before it), and the claim
	 * (fs_negotiate_server_claim) makes a late probe's answer "no". */
	if (!bytes_in && !fs_listener_answered(s->listener))
		return 0;
	fs_sockaddr_key((struct sockaddr *)&s->neg->accepted_peer, addr, &port);
	if (fs_rules_match(&fs_rules_global, FS_SIDE_SERVER, (struct sockaddr *)&s->neg->accepted_peer,
			   s->local_port) != FS_RULE_PROBE)
		return 0;
	if (fs_listeners_is_own_client(addr, port))
		return 0;
	/* no "yes" in the table: no record of this client can ask for the
	 * usual settling (any other says TCP, or is an earlier connection's),
	 * and one given from now on is the claim's to find */
	if (fs_listener_yes_none(s->listener))
		FS_STAT_INC(probe_lookups_skipped);
	else if ((state = fs_listener_lookup(s->listener, addr, port, &rec, &hint)) != FS_REC_NONE &&
		 !fs_probe_rec_stale(&rec, s->neg->accepted_ns))
		return 0;
	fs_peer_key_note(s, addr, port, &hint);
	s->direct_ok = bytes_in;
	return 1;
}

/* The HELLO whose first HAVE bytes are in BUF (room FS_WIRE_HELLO_MAX) is
 * not whole yet: its rest is peeked from the socket, waited for at most
 * FABSOCK_HELLO_TIMEOUT_MS (the client writes it in one send). Returns the
 * decoder's answer on the whole (> 0: its length), 0 if still a prefix at
 * the deadline, -ECONNRESET if the connection ended. */
static int fs_hello_rest(int fd, uint8_t *buf, size_t have, struct fs_hello *hello)
{
	uint64_t deadline = fs_now_ns() + fs_params.hello_timeout_ms * FS_MS;

	for (;;) {
		ssize_t n = fs_real.recv(fd, buf + have, FS_WIRE_HELLO_MAX - have, MSG_PEEK | MSG_DONTWAIT);
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int ret, left_ms;

		if (n == 0)
			return -ECONNRESET;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return -errno;
		ret = fs_wire_hello_decode(buf, have + (n > 0 ? (size_t)n : 0), FS_WIRE_HELLO_MAGIC, hello);
		if (ret != 0)
			return ret;
		left_ms = fs_wait_ms_until(fs_now_ns(), deadline);
		if (left_ms <= 0)
			return 0;
		if (n > 0)
			usleep(200); /* more is on its way: not the same bytes again */
		else
			fs_real.poll(&p, 1, left_ms);
	}
}

uint64_t fs_negotiate_server_hello_by(struct fs_sock *s)
{
	struct fs_probe_rec rec = { 0 };

	if (!s->listener || !s->have_peer_key ||
	    fs_listener_lookup(s->listener, s->peer_key, s->peer_port, &rec, &s->rec_hint) != FS_REC_YES)
		return 0;
	return rec.stamp_ns + (rec.wait_ms + FS_HELLO_MARGIN_MS) * FS_MS;
}

/* Whether a plain client's connection, its first bytes (or its end) in,
 * needs its record claimed as TCP: only while a record of the table says
 * yes, which may be its own (then the bytes may be a HELLO). With none,
 * nothing is written: the claim makes a later probe of the connection's
 * answered no, and none can matter to it now (its client wrote without
 * waiting for an answer, or gave up waiting: a probing client holds its
 * bytes until then, and one that gave up reads no later answer). A
 * connection that claimed nothing forgets nothing at its close
 * (fs_sock_release). So a server of plain clients takes no lock of the
 * table its workers share. */
static bool fs_server_claim_needed(struct fs_sock *s)
{
	if (fs_listener_yes_none(s->listener)) {
		FS_STAT_INC(probe_claims_skipped);
		return false;
	}
	return true;
}

int fs_negotiate_server_claim(struct fs_sock *s, bool closed)
{
	if (fs_server_claim_needed(s) &&
	    fs_listener_claim_tcp(s->listener, s->peer_key, s->peer_port, s->neg->accepted_ns, NULL, &s->rec_hint) ==
		    FS_REC_YES)
		return 0; /* a "yes" came meanwhile: the usual settling looks for the HELLO */
	if (closed) {
		FS_STAT_INC(fallback_peer_closed);
		return fs_kernel(s, "the client closed before negotiating");
	}
	FS_STAT_INC(fallback_peer_plain);
	return fs_kernel(s, "the client did not probe");
}

int fs_negotiate_server_after_read(struct fs_sock *s, const uint8_t *first, size_t n, size_t *taken)
{
	uint8_t buf[FS_WIRE_HELLO_MAX];
	size_t have = n < sizeof(buf) ? n : sizeof(buf);
	struct fs_probe_rec rec = { 0 };
	struct fs_hello hello;
	enum fs_rec_state state;
	int ret;

	*taken = 0;
	/* a waitless HELLO that came between the look before the receive and
	 * the receive itself */
	if (fs_negotiate_server_waitless(s, first, n, taken) == FS_PASS)
		return FS_PASS;
	state = fs_server_claim_needed(s) ? fs_listener_claim_tcp(s->listener, s->peer_key, s->peer_port,
								     s->neg->accepted_ns, &rec, &s->rec_hint)
					  : FS_REC_NONE;
	if (state != FS_REC_YES) {
		FS_STAT_INC(fallback_peer_plain);
		return fs_kernel(s, "the client did not probe");
	}
	/* a "yes" came while the receive waited: the bytes may be the HELLO */
	memcpy(buf, first, have);
	ret = fs_wire_hello_decode(buf, have, FS_WIRE_HELLO_MAGIC, &hello);
	if (ret == 0 && have == n)
		ret = fs_hello_rest(s->fd, buf, have, &hello);
	if (ret > 0 && hello.nonce == rec.nonce) {
		fs_listener_move(s->listener, s->peer_key, s->peer_port, FS_REC_YES, FS_REC_DONE, &s->rec_hint);
		*taken = (size_t)ret < n ? (size_t)ret : n;
		return fs_server_accept_hello(s, &hello, (size_t)ret > n ? (size_t)ret - n : 0, &rec);
	}
	fs_listener_move(s->listener, s->peer_key, s->peer_port, FS_REC_YES, FS_REC_TCP, &s->rec_hint);
	FS_STAT_INC(fallback_bad_hello);
	FS_INFO("fd %d: %zu first bytes, decode %d, nonce %#llx, probe nonce %#llx", s->fd, n, ret,
		ret > 0 ? (unsigned long long)hello.nonce : 0ull, (unsigned long long)rec.nonce);
	return fs_kernel(s, "the first bytes were not a valid HELLO");
}
