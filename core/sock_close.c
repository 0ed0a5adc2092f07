/* SPDX-License-Identifier: MIT */
/*
 * How a socket ends or leaves this program: close (in the background for a
 * client still waiting for its HELLO-ACK), dup, the process's exit with
 * bytes held for a handshake, exec/spawn/SCM_RIGHTS. Part of the socket
 * module: the state changes these need are sock.c's (sock_internal.h).
 */
#include "core/sock.h"
#include "core/sock_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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

static void fs_sock_bg_exit(uint64_t deadline_ns);

/* The exit path takes S, still waiting for its HELLO-ACK, to finish the
 * handshake. Another thread may hold S meanwhile: the service thread's
 * watch for a moment, or an application thread blocked in recv() for the
 * same ACK for as long as it takes (a reader thread waiting for the reply
 * while the main thread ends); when that one gets the ACK, S is offloaded
 * and the engine's shutdown delivers what S held. So wait, until
 * DEADLINE_NS, for the lock or for S to leave CLIENT_HELLO_SENT. Returns 0
 * with the lock held, 1 if S moved on, -EDEADLK if this thread holds it
 * (the exit interrupted a call on S) or -ETIMEDOUT. */
#define FS_SOCK_EXIT_SLICE_NS 10000000ull

static int fs_sock_exit_lock(struct fs_sock *s, uint64_t deadline_ns)
{
	for (;;) {
		uint64_t slice = fs_now_ns() + FS_SOCK_EXIT_SLICE_NS;
		int ret = fs_mutex_lock_until(&s->lock, slice < deadline_ns ? slice : deadline_ns);

		if (ret != -ETIMEDOUT)
			return ret;
		if (fs_sock_state(s) != FS_SOCK_CLIENT_HELLO_SENT)
			return 1;
		if (fs_now_ns() >= deadline_ns)
			return -ETIMEDOUT;
	}
}

/* The process ends (exit, _exit, a fatal signal) with bytes held for a
 * HELLO-ACK: a client that wrote and ended before the server read, a forked
 * child's usual _exit() after its reply. The kernel delivers what a process
 * wrote before it ended; so wait for those ACKs (FABSOCK_LINGER_SEC in all)
 * and the engine's shutdown then delivers the bytes, or they went over TCP
 * with a refusal. A socket another thread holds is waited for
 * (fs_sock_exit_lock); one whose call this exit interrupted is left, as are
 * a parent's sockets in a forked child. */
void fs_sock_exit_held(void)
{
	uint64_t deadline;

	if (!__atomic_load_n(&fs_sock_hello_sent, __ATOMIC_RELAXED))
		return;
	deadline = fs_now_ns() + fs_params.linger_sec * 1000000000ull;
	fs_sock_bg_exit(deadline);
	for (size_t fd = 0; fd < fs_fdt_size; fd++) {
		struct fs_sock *s = fs_fdt_peek((int)fd);
		int ret;

		if (!s || s == FS_SOCK_INTERNAL || fs_sock_state(s) != FS_SOCK_CLIENT_HELLO_SENT ||
		    __atomic_load_n(&s->pid, __ATOMIC_RELAXED) != fs_self_pid())
			continue;
		ret = fs_sock_exit_lock(s, deadline);
		if (ret < 0) {
			FS_WARN("fd %d: process ending %s before the HELLO-ACK: the bytes held for it, if any, are lost",
				(int)fd, ret == -EDEADLK ? "inside a call on the socket" : "with the socket busy");
			continue;
		}
		if (ret > 0)
			continue;
		if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT && !s->stream && s->neg && s->neg->waitless) {
			/* TCP first's waitless HELLO (tcpfirst_hs.h): nothing held,
			 * nothing to wait for; an ACK already in is taken, so that
			 * the kernel's close finds nothing unread and ends with a
			 * FIN, not a reset. One not in yet: the server, finding our
			 * FIN first, sends none. */
			fs_sock_take_ack(s, fs_now_ns());
		} else if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT && s->stream &&
			   fs_stream_holds(s->stream, deadline) && fs_sock_take_ack(s, deadline) == -EAGAIN)
			FS_WARN("fd %d: process ending: no HELLO-ACK within FABSOCK_LINGER_SEC; the bytes held for it "
				"are lost", s->fd);
		pthread_mutex_unlock(&s->lock);
	}
}

/* Takes FD out of S's application fds. Socket lock held. */
static void fs_sock_forget_fd(struct fs_sock *s, int fd)
{
	for (unsigned i = 0; i < s->n_app_fds; i++) {
		if (s->app_fds[i] != fd)
			continue;
		s->app_fds[i] = s->app_fds[--s->n_app_fds];
		fs_inherit_note(fd, FS_INH_NONE);
		if (fs_fdt_clear(fd, s))
			fs_sock_put(s); /* that slot's reference */
		break;
	}
	if (!s->fd_private && s->fd == fd && s->n_app_fds) {
		s->fd = s->app_fds[0]; /* no private duplicate could be made */
		/* the stream's kernel socket too (a reset or a hand-back uses
		 * it): FD is about to be closed, and its number reused */
		if (s->stream && fs_sock_state(s) == FS_SOCK_OFFLOADED && s->pid == fs_self_pid())
			s->stream->app_fd = s->fd;
	}
}

/* Closes S's offloaded stream with CTL as its control channel (SHARED: a
 * process forked after the offload may hold the socket) and has the
 * service thread finish what the close leaves (fs_stream_close). */
static void fs_sock_stream_close(struct fs_sock *s, int ctl, bool shared)
{
	switch (fs_stream_close(s->stream, ctl, s->linger0, shared)) {
	case FS_CLOSE_NOW:
		fs_service_kick();
		break;
	case FS_CLOSE_SOON:
		fs_service_kick_soon();
		break;
	case FS_CLOSE_DONE:
		break;
	}
}

/* A client socket closed before its HELLO-ACK. Returning from close() only
 * once the ACK is in would make a client that connects and closes (a health
 * check, wrk's address check) or writes and closes (a fire-and-forget
 * sender) wait for the server's first read; closing the half-made stream
 * at once would have the server read a reset (the connection gone without
 * the fabric's FIN) and lose held bytes. So, as the kernel finishes a close
 * in the background, the service thread finishes the handshake on a
 * private duplicate of the socket: with the ACK, the stream closes as any
 * (held bytes, then the FIN); with a refusal, held bytes go over TCP and
 * the duplicate closes; with neither within FABSOCK_LINGER_SEC, the held
 * bytes are dropped (warned). The record holds a socket reference; the
 * process's end finishes those it can (fs_sock_exit_held). */
struct fs_sock_bg {
	struct fs_watch watch;
	struct fs_sock *s;
	uint64_t deadline_ns;
	struct fs_sock_bg *next, *prev; /* fs_sock_bg_list, fs_sock_bg_lock */
};
static struct fs_sock_bg *fs_sock_bg_list;
static pthread_mutex_t fs_sock_bg_lock = PTHREAD_MUTEX_INITIALIZER;

static void fs_sock_bg_watch(void *arg, bool timed_out);

/* Ends a background close one way or the other (socket lock held): the
 * stream closes if the ACK came, the half-made one goes otherwise, and the
 * socket is released (its private duplicate closes, unless the stream
 * took it). */
static void fs_sock_bg_finish(struct fs_sock *s)
{
	if (!s->bg_close)
		return;
	s->bg_close = false;
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED && s->pid == fs_self_pid() && s->fd_private) {
		int ctl = s->fd;

		s->fd_private = false;
		s->fd = -1;
		fs_sock_stream_close(s, ctl, false);
	} else if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT) {
		if (s->stream && fs_stream_holds(s->stream, fs_now_ns()))
			FS_WARN("fd %d: closed before the server answered the handshake, which it did not within "
				"FABSOCK_LINGER_SEC: the bytes held for it are lost", s->fd);
		fs_negotiate_abort(s);
	}
	fs_sock_release(s);
}

static void fs_sock_bg_unlink(struct fs_sock_bg *bg)
{
	pthread_mutex_lock(&fs_sock_bg_lock);
	if (bg->prev)
		bg->prev->next = bg->next;
	else if (fs_sock_bg_list == bg)
		fs_sock_bg_list = bg->next;
	if (bg->next)
		bg->next->prev = bg->prev;
	pthread_mutex_unlock(&fs_sock_bg_lock);
}

/* Service thread: the ACK may be in, or the time is up. */
static void fs_sock_bg_watch(void *arg, bool timed_out)
{
	struct fs_sock_bg *bg = arg;
	struct fs_sock *s = bg->s;
	uint64_t now = fs_now_ns();
	int ret = 0;

	if (!fs_sock_watch_lock(s, &bg->watch, fs_sock_bg_watch, bg))
		return;
	if (s->bg_close && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT) {
		ret = fs_sock_take_ack(s, now);
		if (ret == -EAGAIN && now < bg->deadline_ns) {
			uint64_t next = timed_out ? bg->deadline_ns : now + 1000000ull;

			/* not yet (woken with part of an ACK: again in a
			 * millisecond); armed before unlocking, as the exit path
			 * may finish S and close s->fd (fs_sock_bg_exit) */
			fs_service_watch(&bg->watch, timed_out ? s->fd : -1, POLLIN,
					 next < bg->deadline_ns ? next : bg->deadline_ns, fs_sock_bg_watch, bg);
			pthread_mutex_unlock(&s->lock);
			return;
		}
	}
	fs_sock_bg_finish(s);
	pthread_mutex_unlock(&s->lock);
	fs_sock_bg_unlink(bg);
	free(bg);
	fs_sock_put(s);
}

/* A forked child: the parent's background closes are not its own (its
 * exit path leaves them: fs_sock_bg_exit), and the list's lock may have
 * been held by another thread of the parent. */
void fs_sock_bg_after_fork(void)
{
	pthread_mutex_init(&fs_sock_bg_lock, NULL);
}

/* The process ends (fs_sock_exit_held): each background close of this
 * process ends now, those holding bytes once their ACK is in (until
 * DEADLINE_NS); the engine's shutdown then delivers the closed streams. At
 * most FS_SOCK_BG_EXIT_MAX of them; one whose lock the service thread holds
 * is waited for (fs_sock_exit_lock). */
#define FS_SOCK_BG_EXIT_MAX 256

static void fs_sock_bg_exit(uint64_t deadline_ns)
{
	struct fs_sock *todo[FS_SOCK_BG_EXIT_MAX];
	unsigned n = 0;

	/* (held briefly by others; by this thread, if the exit interrupted it) */
	if (fs_mutex_lock_until(&fs_sock_bg_lock, deadline_ns)) {
		FS_WARN("process ending: cannot look at the sockets closed before their HELLO-ACK; bytes they held are "
			"lost");
		return;
	}
	for (struct fs_sock_bg *bg = fs_sock_bg_list; bg && n < FS_SOCK_BG_EXIT_MAX; bg = bg->next)
		if (bg->s->pid == fs_self_pid()) {
			fs_sock_ref(bg->s);
			todo[n++] = bg->s;
		}
	pthread_mutex_unlock(&fs_sock_bg_lock);
	for (unsigned i = 0; i < n; i++) {
		struct fs_sock *s = todo[i];

		if (!fs_sock_exit_lock(s, deadline_ns)) {
			if (s->bg_close && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT && s->stream &&
			    fs_stream_holds(s->stream, deadline_ns))
				fs_sock_take_ack(s, deadline_ns);
			else if (s->bg_close && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT && s->neg && s->neg->waitless)
				fs_sock_take_ack(s, fs_now_ns()); /* (fs_sock_exit_held) */
			fs_sock_bg_finish(s);
			pthread_mutex_unlock(&s->lock);
		}
		fs_sock_put(s);
	}
}

/* Hands S, closed by the application as its last descriptor FD while it
 * waits for the HELLO-ACK, to the service thread (struct fs_sock_bg).
 * Socket lock held. Returns false if it cannot (S is then closed here). */
static bool fs_sock_bg_close(struct fs_sock *s, int fd)
{
	struct fs_sock_bg *bg;
	int ctl;

	if (s->pid != fs_self_pid() || s->fd_private)
		return false;
	bg = calloc(1, sizeof(*bg));
	if (!bg)
		return false;
	ctl = fs_real.fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (ctl < 0) {
		free(bg);
		return false;
	}
	bg->s = s;
	bg->deadline_ns = fs_now_ns() + fs_params.linger_sec * 1000000000ull;
	fs_sock_ref(s); /* the record's */
	fs_sock_forget_fd(s, fd);
	s->fd = fs_internal_fd(ctl);
	s->fd_private = true;
	s->bg_close = true;
	s->closed = true;
	pthread_mutex_lock(&fs_sock_bg_lock);
	bg->next = fs_sock_bg_list;
	if (bg->next)
		bg->next->prev = bg;
	fs_sock_bg_list = bg;
	pthread_mutex_unlock(&fs_sock_bg_lock);
	/* the handshake's watch of the closed descriptor goes (it sees
	 * bg_close); this one watches the duplicate */
	fs_service_watch_expire(&s->client_watch);
	fs_service_watch(&bg->watch, s->fd, POLLIN, fs_now_ns(), fs_sock_bg_watch, bg);
	return true;
}

/* The application lets go of FD, one of S's fds: closes it (REAL_CLOSE) or
 * leaves that to dup2/dup3, which replace it. With other fds left, only
 * that fd goes; with the last one, the socket closes: an offloaded stream
 * delivers what was written and then its FIN (or resets, SO_LINGER 0),
 * and outlives the descriptor until then. */
static int fs_fd_close_maybe(int fd, bool real_close)
{
	return !real_close || fs_real.close(fd) == 0 ? 0 : -errno;
}

static int fs_sock_close_fd(struct fs_sock *s, int fd, bool real_close)
{
	if (__atomic_load_n(&s->event_loop, __ATOMIC_ACQUIRE))
		fs_epoll_fd_closing(s, fd);
	fs_lock(&s->lock);
	if (s->n_app_fds > 1) {
		fs_sock_forget_fd(s, fd);
		pthread_mutex_unlock(&s->lock);
		return fs_fd_close_maybe(fd, real_close);
	}
	if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT && fs_sock_bg_close(s, fd)) {
		pthread_mutex_unlock(&s->lock);
		return fs_fd_close_maybe(fd, real_close);
	}
	pthread_mutex_unlock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT) {
		/* no background close (no memory or descriptor for it): settle
		 * here, up to FABSOCK_LINGER_SEC */
		fs_sock_settle(s, true, fs_now_ns() + fs_params.linger_sec * 1000000000ull);
	}
	fs_lock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED && s->pid == fs_self_pid() &&
	    __atomic_load_n(&s->stream->hb, __ATOMIC_ACQUIRE) != FS_HB_DONE) {
		/* The engine keeps a private duplicate of the kernel socket as the
		 * stream's control channel until the FIN is delivered. The stream
		 * object stays attached to S (see fs_stream.app_ref): a thread
		 * still inside recv/send on it gets EBADF, not freed memory. */
		int ctl;

		if (s->fd_private) {
			ctl = s->fd;
			s->fd_private = false;
			s->fd = fd;
		} else {
			ctl = fs_real.fcntl(fd, F_DUPFD_CLOEXEC, 0);
			if (ctl >= 0)
				ctl = fs_internal_fd(ctl);
		}
		fs_sock_stream_close(s, ctl, fs_handback_maybe_shared(s->stream->fork_gen, fd));
	}
	if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT)
		fs_negotiate_abort(s);
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED) {
		uint64_t turns, bytes;

		fs_sock_peer_handback_learnt(s); /* (as at fs_sock_unshare) */
		fs_stepback_totals(&s->sb, &turns, &bytes);
		fs_history_offloaded_closed(&s->hist, turns, bytes, fs_stepback_losing(&s->sb),
					    fs_stepback_ns_turn(&s->sb));
	}
	/* release looks at the state (a listener stops answering probes, a
	 * server connection forgets its probe record) before it is reset */
	fs_sock_release(s);
	s->closed = true;
	/* (under the socket lock: a watch that fires meanwhile sees closed
	 * and is not queued again) */
	fs_service_watch_expire(&s->connect_watch);
	fs_service_watch_expire(&s->client_watch);
	pthread_mutex_unlock(&s->lock);
	return fs_fd_close_maybe(fd, real_close);
}

int fs_core_close(struct fs_sock *s, int fd)
{
	return fs_sock_close_fd(s, fd, true);
}

void fs_core_dup_target(int newfd)
{
	struct fs_sock *s = fs_sock_get(newfd);

	if (!s)
		return;
	fs_sock_close_fd(s, newfd, false);
	fs_sock_put(s);
}

int fs_core_dup(struct fs_sock *s, int newfd)
{
	struct fs_sock *old;

	fs_lock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_KERNEL || s->closed) {
		pthread_mutex_unlock(&s->lock);
		return 0; /* the kernel's alone: nothing to share */
	}
	if (s->n_app_fds == s->app_fds_cap) {
		unsigned cap = s->app_fds_cap * 2;
		int *fds = malloc(cap * sizeof(*fds));

		if (!fds) {
			pthread_mutex_unlock(&s->lock);
			return -ENOMEM;
		}
		memcpy(fds, s->app_fds, s->n_app_fds * sizeof(*fds));
		if (s->app_fds != s->app_fds_inline)
			free(s->app_fds);
		s->app_fds = fds;
		s->app_fds_cap = cap;
	}
	if (!s->fd_private) {
		int k = fs_real.fcntl(s->fd, F_DUPFD_CLOEXEC, 0);

		if (k >= 0) {
			s->fd = fs_internal_fd(k);
			s->fd_private = true;
			if (s->stream && fs_sock_state(s) == FS_SOCK_OFFLOADED && s->pid == fs_self_pid())
				s->stream->app_fd = s->fd;
		}
	}
	s->app_fds[s->n_app_fds++] = newfd;
	fs_sock_ref(s); /* the new slot's reference */
	old = fs_fdt_set(newfd, s);
	if (old && old != FS_SOCK_INTERNAL)
		fs_sock_put(old); /* stale entry of an fd closed behind our back */
	fs_sock_note_inherit(s);
	pthread_mutex_unlock(&s->lock);
	FS_DBG("fd %d: duplicated as fd %d", s->app_fds[0], newfd);
	return 0;
}

bool fs_sock_has_fd(struct fs_sock *s, int fd)
{
	return fs_fdt_peek(fd) == s;
}

/* ---- exec, spawn, SCM_RIGHTS: the socket leaves this program ------------- */

/* Hands the offloaded socket at FD back to TCP, whoever owns it. */
static void fs_sock_hand_back_fd(int fd)
{
	struct fs_sock *s = fs_sock_get(fd);
	int err;

	if (!s)
		return;
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED) {
		if (s->pid == fs_self_pid() && fs_stream_hb(s->stream) != FS_HB_DONE)
			fs_handback_sync(s->stream, s->fd);
		/* A child's socket that its owner could not hand back (a
		 * receive-only or reset stream: fs_handback_request): the
		 * program it execs or passes it to would read the kernel
		 * socket's clean end; it reads a reset, as this one would. */
		if (fs_sock_unshare(s, &err) && err)
			(void)fs_tcp_reset(fd);
	}
	fs_sock_put(s);
}

/* FD, accepted from listener L and not yet used, survives exec: the new
 * program gets L's probe table with it, to negotiate as this one would.
 * TABLES caches the fds made so far (per listener) in this exec. */
struct fs_exec_tables {
	unsigned n;
	struct {
		struct fs_listener *l;
		int fd;
	} t[16];
};

static void fs_sock_pass_table(struct fs_exec_tables *tables, struct fs_sock *s, int fd)
{
	int tfd = -1;
	unsigned i;

	for (i = 0; i < tables->n && tables->t[i].l != s->listener; i++)
		;
	if (i < tables->n)
		tfd = tables->t[i].fd;
	if (i == tables->n && tables->n < 16) {
		tfd = fs_listener_exec_fd(s->listener);
		tables->t[tables->n].l = s->listener;
		tables->t[tables->n++].fd = tfd;
	}
	for (unsigned k = 0; k < s->n_app_fds; k++)
		fs_inherit_note_table(s->app_fds[k], tfd);
	FS_DBG("fd %d: survives exec before its first use; its listener's probe table goes along as fd %d", fd, tfd);
}

/* The table fds made for the last exec (closed if it returns). */
static struct fs_exec_tables fs_exec_tables;

void fs_core_exec_failed(void)
{
	if (fs_core_hands_off())
		return;
	for (unsigned i = 0; i < fs_exec_tables.n; i++)
		if (fs_exec_tables.t[i].fd >= 0)
			fs_internal_fd_close(fs_exec_tables.t[i].fd);
	fs_exec_tables.n = 0;
	fs_handback_owner_ended(fs_engine_peek(), false);
}

void fs_core_before_exec(bool spawn)
{
	struct fs_exec_tables tables = { 0 };

	if (spawn)
		fs_fds_spread_note(); /* the child holds what has no FD_CLOEXEC */
	if (fs_core_hands_off())
		return;
	for (size_t fd = 0; fd < fs_fdt_size; fd++) {
		struct fs_sock *s = fs_fdt_peek((int)fd);
		int flags;

		if (!s || s == FS_SOCK_INTERNAL)
			continue;
		flags = fs_real.fcntl((int)fd, F_GETFD);
		if (!spawn && flags >= 0 && !(flags & FD_CLOEXEC)) {
			/* what the new program finds (inherit.h): after a fork
			 * the child has no records yet */
			fs_sock_note_inherit(s);
			if (fs_sock_state(s) == FS_SOCK_SERVER_PENDING && s->listener)
				fs_sock_pass_table(&tables, s, (int)fd);
		}
		if (fs_sock_state(s) != FS_SOCK_OFFLOADED)
			continue;
		/* A socket that survives exec (no FD_CLOEXEC) is used by the new
		 * program; every stream this process owns dies with this one,
		 * so it goes back to TCP whatever happens to the fd (if the
		 * exec fails, the program goes on with a kernel socket). A
		 * spawned child only takes what survives its exec. */
		if ((flags >= 0 && !(flags & FD_CLOEXEC)) || (!spawn && s->pid == fs_self_pid()))
			fs_sock_hand_back_fd((int)fd); /* (its record: none, a kernel socket) */
	}
	fs_exec_tables = tables;
	if (!spawn)
		fs_handback_owner_ended(fs_engine_peek(), true); /* this program's streams end here */
}

void fs_core_before_pass(const struct msghdr *msg)
{
	if (!msg || !msg->msg_controllen)
		return;
	fs_fds_spread_note(); /* (any control message: a look at each costs more) */
	if (fs_core_hands_off())
		return;
	for (struct cmsghdr *c = CMSG_FIRSTHDR((struct msghdr *)msg); c; c = CMSG_NXTHDR((struct msghdr *)msg, c)) {
		const int *fds = (const int *)CMSG_DATA(c);
		size_t n;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
			continue;
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, fds + i, sizeof(fd));
			if (fs_fdt_peek(fd) && fs_fdt_peek(fd) != FS_SOCK_INTERNAL)
				fs_sock_hand_back_fd(fd);
		}
	}
}
