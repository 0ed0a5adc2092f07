/* SPDX-License-Identifier: MIT */
/*
 * Socket records and state (see sock.h for the state machine), the
 * lifecycle hooks (socket, connect, listen, accept) and the driving of the
 * handshake (negotiate.c's steps, the service thread's watches, settling
 * on first use). Every transition of enum fs_sock_state is written in this
 * file, under fs_sock.lock; sock_io.c (send, receive, shutdown, options)
 * and sock_close.c (close, dup, exit, exec) call in through
 * sock_internal.h.
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
#include "core/history.h"
#include "core/guard.h"
#include "core/inherit.h"
#include "core/listener.h"
#include "core/negcache.h"
#include "core/records.h"
#include "core/negotiate.h"
#include "core/plain.h"
#include "core/service.h"
#include "core/sigs.h"
#include "core/stats.h"
#include "core/tcpfirst_hs.h"
#include "core/udp.h"
#include "core/wire.h"
#include "preload/real.h"

/* How long connect() waits for the probe's answer itself (see
 * fs_sock_after_connect). */
#define FS_CONNECT_PROBE_WAIT_NS 300000ull

bool fs_core_enabled;

bool fs_core_hands_off(void)
{
	return FS_GUARDED() || !fs_core_enabled || fs_vfork_child();
}

/* ---- state ----------------------------------------------------------- */

/* Client sockets waiting for their HELLO-ACK, process-wide: the exit path
 * looks for bytes held for one only when there are (fs_core_exit). */
unsigned fs_sock_hello_sent;

/* Every change of a socket's state is made here, in this file, under
 * fs_sock.lock (sock.h: the state machine). */
/* S no longer waits for its probe: its listener may let its twin go. */
static void fs_sock_settled(struct fs_sock *s)
{
	if (__atomic_exchange_n(&s->unsettled, false, __ATOMIC_ACQ_REL) && s->listener) {
		/* (a connection another process may have taken since its
		 * accept says nothing of its client here: postgres's postmaster
		 * forks a child for each, which settles it there, while the
		 * postmaster's close came first; such a server never turns
		 * plain, the streak starts again with each) */
		if (s->plain_note)
			fs_plain_settled(s->listener,
					 fs_sock_state(s) == FS_SOCK_OFFLOADED ||
						 s->fds_spread != __atomic_load_n(&fs_fds_spread, __ATOMIC_SEQ_CST));
		fs_listener_unsettled(s->listener, false);
	}
}

static void fs_sock_set_state(struct fs_sock *s, enum fs_sock_state state)
{
	enum fs_sock_state old = __atomic_exchange_n(&s->state, state, __ATOMIC_ACQ_REL);

	if (state != FS_SOCK_SERVER_PENDING)
		fs_sock_settled(s);

	if (old != state && (old == FS_SOCK_CLIENT_HELLO_SENT || state == FS_SOCK_CLIENT_HELLO_SENT))
		__atomic_add_fetch(&fs_sock_hello_sent, state == FS_SOCK_CLIENT_HELLO_SENT ? 1u : -1u,
				   __ATOMIC_RELAXED);
}

/* ---- allocation: type-stable, so lock-free readers may look ----------- */

static pthread_mutex_t fs_sock_free_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fs_sock *fs_sock_free_list;
/* Negotiation states kept for the next socket (at most FS_NEG_SPARE_MAX):
 * every TCP socket gets one at socket() or accept(), and one that stays on
 * the kernel (wrk's connections by their history, nginx's plain clients)
 * gives it back at once; a calloc and a free per connection were a fifth of
 * fabsock's user time in such a client. Only the first word is used while
 * one waits (struct fs_sock_neg_spare). fs_sock_free_lock. */
#define FS_NEG_SPARE_MAX 64u
#if defined(FS_SANITIZE_ADDRESS)
static const bool fs_neg_spares_on = false; /* every state freed: ASan sees a use after its socket settled */
#else
static const bool fs_neg_spares_on = true;
#endif
struct fs_sock_neg_spare {
	struct fs_sock_neg_spare *next;
};
_Static_assert(sizeof(struct fs_sock_neg) >= sizeof(struct fs_sock_neg_spare), "a spare fits a negotiation state");
static struct fs_sock_neg_spare *fs_neg_spares;
static unsigned fs_neg_spare_n;

static struct fs_sock *fs_sock_alloc(int fd, int family)
{
	struct fs_sock *s;
	struct fs_sock_neg *neg;

	pthread_mutex_lock(&fs_sock_free_lock);
	s = fs_sock_free_list;
	if (s)
		fs_sock_free_list = s->free_next;
	neg = (struct fs_sock_neg *)fs_neg_spares;
	if (neg) {
		fs_neg_spares = fs_neg_spares->next;
		fs_neg_spare_n--;
	}
	pthread_mutex_unlock(&fs_sock_free_lock);
	if (neg)
		memset(neg, 0, sizeof(*neg));
	else
		neg = calloc(1, sizeof(*neg));
	if (!neg) {
		if (s) {
			pthread_mutex_lock(&fs_sock_free_lock);
			s->free_next = fs_sock_free_list;
			fs_sock_free_list = s;
			pthread_mutex_unlock(&fs_sock_free_lock);
		}
		return NULL;
	}
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s) {
			free(neg);
			return NULL;
		}
	} else {
		memset(s, 0, sizeof(*s));
	}
	s->neg = neg;
	neg->probe.udp_fd = -1;
	pthread_mutex_init(&s->lock, NULL);
	s->fd = fd;
	s->app_fds = s->app_fds_inline;
	s->app_fds_cap = sizeof(s->app_fds_inline) / sizeof(s->app_fds_inline[0]);
	s->app_fds[0] = fd;
	s->n_app_fds = 1;
	s->family = family;
	s->pid = fs_self_pid();
	s->fds_spread = __atomic_load_n(&fs_fds_spread, __ATOMIC_SEQ_CST);
	fs_sock_set_state(s, FS_SOCK_FRESH);
	__atomic_store_n(&s->refs, 1, __ATOMIC_RELEASE); /* the fd table's reference */
	return s;
}

struct fs_sock *fs_sock_get(int fd)
{
	if (FS_GUARDED() || !fs_core_enabled)
		return NULL;
	for (;;) {
		struct fs_sock *s = fs_fdt_peek(fd);
		int refs;

		if (!s || s == FS_SOCK_INTERNAL)
			return NULL;
		refs = __atomic_load_n(&s->refs, __ATOMIC_ACQUIRE);
		if (refs <= 0)
			continue; /* being recycled; the slot will change */
		if (!__atomic_compare_exchange_n(&s->refs, &refs, refs + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			continue;
		if (fs_fdt_peek(fd) == s)
			return s;
		fs_sock_put(s);
	}
}

void fs_sock_ref(struct fs_sock *s)
{
	__atomic_fetch_add(&s->refs, 1, __ATOMIC_ACQ_REL);
}

/* The socket has settled (offloaded, kernel) or listens: what only the
 * handshake needed goes (its probe's UDP socket with it). Socket lock
 * held, or the last reference. */
static void fs_sock_neg_free(struct fs_sock *s)
{
	struct fs_sock_neg *neg = s->neg;

	if (!neg)
		return;
	if (neg->probe.udp_fd >= 0)
		fs_probe_cancel(&neg->probe);
	s->neg = NULL;
	pthread_mutex_lock(&fs_sock_free_lock);
	if (fs_neg_spares_on && fs_neg_spare_n < FS_NEG_SPARE_MAX) {
		struct fs_sock_neg_spare *spare = (struct fs_sock_neg_spare *)neg;

		spare->next = fs_neg_spares;
		fs_neg_spares = spare;
		fs_neg_spare_n++;
		neg = NULL;
	}
	pthread_mutex_unlock(&fs_sock_free_lock);
	free(neg);
}

void fs_sock_put(struct fs_sock *s)
{
	if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL))
		return;
	fs_sock_settled(s);
	fs_sock_neg_free(s);
	/* Nobody can look at S any more: the stream's memory may go once the
	 * engine is done with it (only in the process that owns it). */
	if (s->stream && s->pid == fs_self_pid())
		fs_stream_drop_app(s->stream);
	s->stream = NULL;
	if (s->app_fds != s->app_fds_inline)
		free(s->app_fds);
	s->app_fds = NULL;
	pthread_mutex_lock(&fs_sock_free_lock);
	s->free_next = fs_sock_free_list;
	fs_sock_free_list = s;
	pthread_mutex_unlock(&fs_sock_free_lock);
}

/* Drops fabsock's state for S: from now on its fd is a plain kernel socket. */
void fs_sock_release(struct fs_sock *s)
{
	struct fs_engine *e;

	/* a TCP_CORK the stream kept (fs_stream_set_cork) goes to the kernel
	 * socket, which is all there is from now on (a hand-back told it
	 * already, in fs_hb_begin) */
	if (s->stream && s->pid == fs_self_pid() && __atomic_load_n(&s->stream->cork_kept, __ATOMIC_RELAXED) &&
	    (e = fs_engine_peek())) {
		pthread_mutex_lock(&e->lock);
		fs_stream_cork_to_kernel(s->stream, s->fd);
		fs_engine_unlock(e);
	}
	/* (a record this socket made or found is where its hint points; with
	 * none, only a YES of a late probe can hold its key) */
	if (s->listener && s->have_peer_key && fs_sock_state(s) != FS_SOCK_LISTENING &&
	    (s->rec_hint.placed || !fs_listener_yes_none(s->listener))) {
		fs_listener_forget(s->listener, s->peer_key, s->peer_port, &s->rec_hint);
		s->have_peer_key = false;
	}
	fs_sock_neg_free(s);
	fs_sock_settled(s);
	if (s->listener) {
		if (fs_sock_state(s) == FS_SOCK_LISTENING)
			fs_listener_close(s->listener);
		else
			fs_listener_put(s->listener);
		s->listener = NULL;
	}
	/* Left to the kernel before its fds leave the table: a thread that
	 * finds an fd gone from it (fs_fdt_clear's release) then reads
	 * KERNEL here, not the state of before, which with the fd gone
	 * would mean "closed". epoll_wait's fixup of a member took it so
	 * and freed the member without its kernel entry, whose fabsock tag
	 * then named nobody: the application's events were dropped (a
	 * memcaslap worker waited for its last answer forever). */
	fs_sock_set_state(s, FS_SOCK_KERNEL);
	/* before the fds become plain ones: epoll records of S must meet the
	 * application's next epoll_ctl or close() of them (epoll.c) */
	fs_epoll_sock_left(s);
	for (unsigned i = 0; i < s->n_app_fds; i++) {
		fs_inherit_note(s->app_fds[i], FS_INH_NONE);
		/* (a socket: an event loop's epoll_ctl of it needs no fstat) */
		fs_plain_note_socket(s->app_fds[i]);
		if (fs_fdt_clear(s->app_fds[i], s))
			fs_sock_put(s); /* the table's reference */
	}
	if (fs_params.test_release_delay_us)
		usleep(fs_params.test_release_delay_us);
	if (s->fd_private) {
		/* the application's fds are plain kernel sockets now */
		fs_internal_fd_close(s->fd);
		s->fd_private = false;
		s->fd = s->n_app_fds ? s->app_fds[0] : -1;
	}
}

/* The log sink's hook: its file is fabsock's own descriptor. */
static void fs_core_mark_internal(int fd)
{
	fs_fdt_set(fd, FS_SOCK_INTERNAL);
}

/* ---- init and fork ----------------------------------------------------- */

void fs_sock_note_inherit(struct fs_sock *s)
{
	enum fs_inherit_kind kind = FS_INH_NONE;

	switch (s->closed ? FS_SOCK_KERNEL : fs_sock_state(s)) {
	case FS_SOCK_LISTENING:
		kind = FS_INH_LISTENING;
		break;
	case FS_SOCK_SERVER_PENDING:
		kind = FS_INH_PENDING;
		break;
	case FS_SOCK_OFFLOADED:
		kind = s->pid == fs_self_pid() ? FS_INH_OFFLOADED : FS_INH_NONE;
		break;
	case FS_SOCK_CLIENT_HELLO_SENT:
		kind = !s->stream && s->neg && s->neg->waitless ? FS_INH_ACK_DUE : FS_INH_NONE;
		break;
	default:
		break;
	}
	for (unsigned i = 0; i < s->n_app_fds; i++)
		fs_inherit_note(s->app_fds[i], kind);
}

void fs_core_adopt_ack_due(int fd)
{
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);
	struct fs_sock *s, *old;
	int flags = fs_real.fcntl(fd, F_GETFL, 0);

	if (!fs_core_enabled || fs_real.getpeername(fd, (struct sockaddr *)&peer, &plen) ||
	    (peer.ss_family != AF_INET && peer.ss_family != AF_INET6))
		return;
	s = fs_sock_alloc(fd, peer.ss_family);
	if (!s)
		return;
	s->nonblock = flags >= 0 && (flags & O_NONBLOCK);
	memcpy(&s->neg->peer, &peer, plen < sizeof(s->neg->peer) ? plen : sizeof(s->neg->peer));
	s->neg->skip_probe = true;
	s->neg->waitless = true;
	s->neg->waitless_adopted = true;
	fs_sock_set_state(s, FS_SOCK_CLIENT_HELLO_SENT);
	old = fs_fdt_set(fd, s);
	if (old && old != FS_SOCK_INTERNAL)
		fs_sock_put(old);
	fs_sock_note_inherit(s);
	FS_INFO("fd %d: TCP first's waitless client taken over after exec: its first receive takes the ACK", fd);
}

void fs_core_adopt(int fd, bool listening, struct fs_listener *from)
{
	struct sockaddr_storage local;
	socklen_t llen = sizeof(local);
	struct fs_sock *s, *old;
	uint8_t key[16];
	uint16_t port;
	int flags = fs_real.fcntl(fd, F_GETFL, 0);

	if (!fs_core_enabled || fs_real.getsockname(fd, (struct sockaddr *)&local, &llen) ||
	    (local.ss_family != AF_INET && local.ss_family != AF_INET6))
		return;
	s = fs_sock_alloc(fd, local.ss_family);
	if (!s)
		return;
	s->nonblock = flags >= 0 && (flags & O_NONBLOCK);
	fs_sockaddr_key((struct sockaddr *)&local, key, &port);
	s->local_port = port;
	if (listening) {
		s->listener = fs_listener_open(fd);
		fs_sock_set_state(s, FS_SOCK_LISTENING);
		fs_sock_neg_free(s);
		FS_INFO("fd %d: listener on port %u taken over after exec", fd, port);
	} else {
		/* FROM: the old program's listener's probe table, which has this
		 * connection's record; without it, see fs_negotiate_server */
		if (from) {
			fs_listener_get(from);
			s->listener = from;
		}
		fs_sock_set_state(s, FS_SOCK_SERVER_PENDING);
	}
	old = fs_fdt_set(fd, s);
	if (old && old != FS_SOCK_INTERNAL)
		fs_sock_put(old);
	fs_sock_note_inherit(s);
}

static void fs_core_atfork_prepare(void)
{
	fs_fds_spread_note(); /* the child will hold copies of every descriptor */
	fs_service_fork_prepare();
}

static void fs_core_atfork_parent(void)
{
	fs_service_fork_parent();
	fs_records_fork_parent();
}

static void fs_core_atfork_child(void)
{
	sigset_t all, old;

	/* No signal until every handler below ran: fabsock's exit handler
	 * (sigs.c) that a SIGTERM reached between fs_self_pid_refresh and
	 * fs_sigs_after_fork found the pid cache this process's and handed on
	 * to the parent's provider handler, which unlinked the parent's shm
	 * region (e2e_semantics fork_children, a child killed 50 ms after its
	 * fork on a loaded host). A signal that comes before these handlers
	 * run at all is fs_exit_signal's to tell (the pid cache is stale). */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	fs_self_pid_refresh();
	fs_lock_after_fork();
	fs_engine_forget_after_fork();
	fs_ready_wait_after_fork();
	fs_service_after_fork();
	fs_listeners_after_fork();
	fs_records_after_fork();
	fs_diag_after_fork();
	fs_bell_after_fork();
	fs_inherit_after_fork();
	fs_sigs_after_fork();
	fs_stats_after_fork();
	fs_handback_after_fork();
	pthread_mutex_init(&fs_sock_free_lock, NULL);
	fs_sock_bg_after_fork();
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* The negotiation's steps as this file runs them: negotiate.c answers with
 * an outcome, and the socket's state changes here. Socket lock held. */
int fs_sock_send_hello(struct fs_sock *s, uint64_t deadline_ns)
{
	int ret = fs_negotiate_client_hello(s, deadline_ns);

	if (ret == 0)
		fs_sock_set_state(s, FS_SOCK_CLIENT_HELLO_SENT);
	return ret;
}

static void fs_sock_offloaded(struct fs_sock *s)
{
	fs_sock_set_state(s, FS_SOCK_OFFLOADED);
	fs_sock_neg_free(s);
	fs_sock_note_inherit(s);
	/* The handshake's watch is done with (this thread read the ACK): out
	 * of the service thread's poll set now, not when its deadline comes.
	 * Every client that connects and reads itself leaves one, and a
	 * process opening thousands of connections made that thread poll
	 * thousands of idle sockets in every round. */
	fs_service_watch_drop(&s->client_watch);
}

int fs_sock_take_ack(struct fs_sock *s, uint64_t deadline_ns)
{
	int ret = fs_negotiate_client_ack(s, deadline_ns);

	if (ret == 0)
		fs_sock_offloaded(s);
	return ret;
}

static int fs_sock_serve_hello(struct fs_sock *s, bool for_send, uint64_t deadline_ns)
{
	int ret = fs_negotiate_server(s, for_send, deadline_ns);

	if (ret == 0)
		fs_sock_offloaded(s);
	return ret;
}


void fs_core_exit(void)
{
	static int done;

	if (!fs_core_enabled || __atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL))
		return;
	fs_sock_exit_held();
	fs_history_exit();
	if (fs_params.stats)
		fs_stats_log_once();
	fs_engine_shutdown();
	/* children forked earlier find what was handed back in the page;
	 * nothing more will be */
	fs_handback_owner_ended(fs_engine_peek(), true);
	fs_listeners_exit();
	fs_records_exit();
}

void fs_core_uid_changed(void)
{
	fs_self_euid_refresh();
	if (fs_core_enabled)
		fs_records_uid_changed();
}

static void fs_core_atexit(void)
{
	fs_core_exit();
}

void fs_sigs_exit_hook(void)
{
	if (fs_core_enabled && !fs_vfork_child())
		fs_service_exit();
}

/* FABSOCK_PROFILE sets the polling defaults; explicit values win. */
static void fs_core_apply_profile(void)
{
	static const struct {
		uint64_t spin_us, sleep_max_us;
	} profiles[] = {
		[1] = { 2000, 50 },   /* latency: like EF_POLL_USEC / VMA_RX_POLL set high */
		[2] = { 20, 10000 },  /* idle: least CPU, slower wake-ups */
	};

	if (fs_params.profile == 0 || fs_params.profile >= sizeof(profiles) / sizeof(profiles[0]))
		return;
	if (!getenv("FABSOCK_SPIN_US"))
		fs_params.spin_us = profiles[fs_params.profile].spin_us;
	if (!getenv("FABSOCK_SLEEP_MAX_US"))
		fs_params.sleep_max_us = profiles[fs_params.profile].sleep_max_us;
}

void fs_core_init(void)
{
	fs_real_init();
	fs_self_pid_refresh();
	fs_self_euid_refresh();
	fs_params_load();
	fs_core_apply_profile();
	if (fs_fdt_init()) {
		fs_log_init();
		FS_WARN("cannot map the fd table; fabsock stays out of the way");
		return;
	}
	fs_log_fd_hook = fs_core_mark_internal;
	fs_log_init();
	fs_rules_load_global();
	/* a typo (efaa) named no provider and was silent until a peer on
	 * another host was tried: say it at start, as for every bad value */
	if (fs_params.provider[0] && fs_fabric_prov_parse(fs_params.provider) == FS_PROV_NONE)
		FS_WARN("FABSOCK_PROVIDER=%s is not one of shm, efa, tcp, net; peers on other hosts stay on kernel TCP",
			fs_params.provider);
	pthread_atfork(fs_core_atfork_prepare, fs_core_atfork_parent, fs_core_atfork_child);
	/* Registered now, before the application's main can register its own:
	 * handlers run last-in first-out, so every handler of the application
	 * (which may still write and close sockets) runs before this one, and
	 * this one before the dynamic linker runs libfabric's destructor. */
	atexit(fs_core_atexit);
	fs_fabric_set_exit_teardown(fs_core_atexit);
	fs_core_enabled = fs_params.enable;
	if (fs_core_enabled)
		fs_inherit_restore();
}

/* ---- lifecycle hooks --------------------------------------------------- */

void fs_core_socket(int fd, int domain, int type)
{
	struct fs_sock *s, *old;

	if (FS_GUARDED() || !fs_core_enabled)
		return;
	if ((domain != AF_INET && domain != AF_INET6) || (type & 0xf) != SOCK_STREAM)
		return;
	s = fs_sock_alloc(fd, domain);
	if (!s)
		return;
	s->nonblock = (type & SOCK_NONBLOCK) != 0;
	old = fs_fdt_set(fd, s);
	if (old && old != FS_SOCK_INTERNAL)
		fs_sock_put(old); /* stale entry of an fd closed behind our back */
}

/* Takes a client handshake as far as it goes: the HELLO once the probe is
 * answered (waiting until HELLO_BY_NS), then the ACK (until ACK_BY_NS).
 * Settles the socket when it ends as TCP or broken (the kernel socket
 * reports a broken one to the application from now on). Returns what the
 * last step returned: 0, -EAGAIN (still open), FS_PASS or -errno. Socket
 * lock held. */
static int fs_sock_client_step(struct fs_sock *s, uint64_t hello_by_ns, uint64_t ack_by_ns)
{
	int ret = 0;

	if (fs_sock_state(s) == FS_SOCK_CLIENT_PENDING)
		ret = fs_sock_send_hello(s, hello_by_ns);
	if (ret == 0 && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT)
		ret = fs_sock_take_ack(s, ack_by_ns);
	if (ret == FS_PASS) {
		fs_sock_release(s);
	} else if (ret < 0 && ret != -EAGAIN && fs_sock_pending(s)) {
		fs_negotiate_abort(s);
		fs_sock_release(s);
	}
	return ret;
}

static void fs_sock_client_watch(void *arg, bool timed_out);
static void fs_sock_connect_watch(void *arg, bool timed_out);

/* The service thread's watches of a client socket, each holding a
 * reference: the probe's answer (none to wait for with skip_probe), the
 * HELLO-ACK, a nonblocking connect() finishing. The long ones look again
 * after FS_SOCK_WATCH_NS in case no event ever comes. */
#define FS_SOCK_WATCH_NS (10 * 1000000000ull)

/* The service thread never waits for a socket's lock: an application
 * thread may hold it for as long as a handshake takes (a blocking recv()
 * waiting for the HELLO-ACK), and every other socket's probes and watches
 * wait on this thread. Busy: WATCH (FN, ARG) looks again in
 * FS_SOCK_BUSY_NS, keeping its reference. */
#define FS_SOCK_BUSY_NS 10000000ull

bool fs_sock_watch_lock(struct fs_sock *s, struct fs_watch *watch, fs_watch_fn fn, void *arg)
{
	if (fs_trylock(&s->lock) == 0)
		return true;
	fs_service_watch(watch, -1, 0, fs_now_ns() + FS_SOCK_BUSY_NS, fn, arg);
	return false;
}

static void fs_sock_watch_probe(struct fs_sock *s)
{
	fs_service_watch(&s->client_watch, s->neg->skip_probe ? -1 : s->neg->probe.udp_fd, POLLIN,
			 s->neg->skip_probe ? fs_now_ns() : s->neg->probe.deadline_ns + 1000000ull, fs_sock_client_watch, s);
}

static void fs_sock_watch_ack(struct fs_sock *s)
{
	fs_service_watch(&s->client_watch, s->fd, POLLIN, fs_now_ns() + FS_SOCK_WATCH_NS, fs_sock_client_watch, s);
}

/* After a blocking connect(): the application's next call on the socket
 * reads the ACK itself, as a rule; the watch only covers one that waits
 * without calling, so it costs no thread wake-up now. */
static void fs_sock_watch_ack_soon(struct fs_sock *s)
{
	fs_service_watch_soon(&s->client_watch, s->fd, POLLIN, fs_now_ns() + FS_SOCK_WATCH_NS, fs_sock_client_watch, s);
}

static void fs_sock_watch_connect(struct fs_sock *s)
{
	fs_service_watch(&s->connect_watch, s->fd, POLLOUT, fs_now_ns() + FS_SOCK_WATCH_NS, fs_sock_connect_watch, s);
}

/* Service thread: the probe of client socket ARG was answered or timed out. */
static void fs_sock_client_watch(void *arg, bool timed_out)
{
	struct fs_sock *s = arg;
	int ret;

	if (!fs_sock_watch_lock(s, &s->client_watch, fs_sock_client_watch, s))
		return;
	if (s->bg_close) {
		/* closed before the ACK: fs_sock_bg_watch finishes it */
		pthread_mutex_unlock(&s->lock);
		fs_sock_put(s);
		return;
	}
	ret = fs_sock_client_step(s, fs_now_ns(), fs_now_ns());
	FS_DBG("fd %d: handshake watch (timed out %d): %d, state %d", s->fd, timed_out, ret, fs_sock_state(s));
	if (fs_sock_state(s) == FS_SOCK_CLIENT_PENDING && !s->closed) {
		/* woken without a final answer (an fd number shared over time);
		 * the probe is read under the lock (settling frees it) */
		fs_sock_watch_probe(s);
		pthread_mutex_unlock(&s->lock);
		return;
	}
	if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT && !s->closed) {
		/* Wait for the ACK (the server answers when its application first
		 * uses the connection), keeping our reference. Woken with bytes
		 * that are not yet a whole ACK: look again in a millisecond, not
		 * in a tight loop. Armed before unlocking: a close() then moves
		 * s->fd to its duplicate under the lock (fs_sock_bg_close). */
		if (timed_out)
			fs_sock_watch_ack(s);
		else
			fs_service_watch(&s->client_watch, -1, 0, fs_now_ns() + 1000000ull, fs_sock_client_watch, s);
		pthread_mutex_unlock(&s->lock);
		return;
	}
	pthread_mutex_unlock(&s->lock);
	fs_sock_put(s);
}

/* The TCP connection to PEER is up: decide whether to try offloading it and
 * send the probe (WAIT_HERE: and briefly wait for its answer in this
 * thread, for a blocking connect()). UP false: a nonblocking connect() has
 * just begun; a connection that stays on TCP is settled, one that may
 * offload is left as it was (the probe waits until the connection is up).
 * Returns true when the socket was settled or its negotiation started.
 * Socket lock held. */
static bool fs_sock_after_connect(struct fs_sock *s, bool wait_here, bool up)
{
	const struct sockaddr *addr = (const struct sockaddr *)&s->neg->peer;
	struct sockaddr_storage local;
	socklen_t llen = sizeof(local);
	enum fs_rule_action rule;
	const char *why = NULL;
	enum fs_record_hint hint = FS_RECORD_UNKNOWN;
	uint16_t port;
	uint8_t key[16];
	bool loopback;

	fs_sockaddr_key(addr, key, &port);
	rule = fs_rules_match(&fs_rules_global, FS_SIDE_CLIENT, addr, port);
	if (rule == FS_RULE_KERNEL) {
		FS_STAT_INC(fallback_rule);
		why = "a FABSOCK_RULES rule says kernel";
		goto kernel;
	}
	/* A loopback destination is on this host whatever our address: no
	 * getsockname (a system call per connection) unless it is needed */
	loopback = fs_negotiate_loopback(key);
	if (!loopback && fs_real.getsockname(s->fd, (struct sockaddr *)&local, &llen)) {
		why = "getsockname failed";
		goto kernel;
	}
	s->neg->provider = fs_negotiate_pick_provider(loopback ? addr : (struct sockaddr *)&local, addr, &why);
	if (s->neg->provider == FS_PROV_NONE) {
		FS_STAT_INC(fallback_remote);
		goto kernel;
	}
	if (fs_listeners_own(addr)) {
		/* the server end is this process's to accept: see fs_listeners_own */
		FS_STAT_INC(fallback_own_listener);
		if (!loopback || fs_real.getsockname(s->fd, (struct sockaddr *)&local, &llen) == 0)
			fs_listeners_own_client((struct sockaddr *)&local);
		why = "the listener is this process's own";
		goto kernel;
	}
	if (s->hist.chose_tcp && rule != FS_RULE_OFFLOAD) {
		/* decided before the kernel's connect() (fs_core_connect), so
		 * that a server speaking first finds the note; after the checks
		 * above, whose reasons (and the own listener's note) stand */
		if (s->hist.busy) {
			FS_STAT_INC(fallback_busy_history);
			why = "a recent connection of this program to the destination stepped back while work beside "
			      "took the host's cores, and the host is still crowded";
		} else if (s->hist.measured) {
			FS_STAT_INC(fallback_fabric_slower_measured);
			why = "this program's recent connections to the destination ran slower per turn on the fabric "
			      "than on TCP";
		} else if (s->hist.stepped) {
			FS_STAT_INC(fallback_fabric_slower_history);
			why = "a recent connection of this program to the destination stepped back from the fabric";
		} else if (s->hist.by_command) {
			FS_STAT_INC(fallback_short_history_command);
			why = "this command line and its family are new to the destination, and the command's recent "
			      "processes each made one connection, short";
		} else if (s->hist.by_family) {
			FS_STAT_INC(fallback_short_history_family);
			why = "this command line is new to the destination, and the recent connections of the same "
			      "program with other last arguments were short";
		} else {
			FS_STAT_INC(fallback_short_history);
			why = "this program's recent connections to the destination were short";
		}
		fs_history_track(&s->hist, s->fd);
		goto kernel;
	}
	if (s->neg->provider == FS_PROV_SHM && rule != FS_RULE_OFFLOAD) {
		hint = s->neg->record_hint ? (enum fs_record_hint)(s->neg->record_hint - 1) : fs_records_lookup(port);
		s->neg->record_hint = (unsigned char)(hint + 1); /* for a probe that times out */
	}
	if (rule == FS_RULE_OFFLOAD) {
		s->neg->skip_probe = true;
	} else if (hint == FS_RECORD_NONE || hint == FS_RECORD_REFUSES) {
		/* on this host only a listener of our own user can be a fabric
		 * peer, and every such listener publishes a record: without
		 * one, or with only refusing ones, a probe could only cost */
		FS_STAT_INC(fallback_no_record);
		why = hint == FS_RECORD_NONE ? "no listener record of this user for the port"
					     : "the port's listener records refuse this user";
		goto kernel;
	} else if (hint != FS_RECORD_PRESENT && fs_negcache_hit(addr)) {
		/* (not where a record of our own user says a listener may
		 * offload: that outweighs one probe lost under load, which
		 * would otherwise send every later connection to TCP) */
		FS_STAT_INC(fallback_neg_cache);
		why = "destination cached as not fabsock";
		goto kernel;
	}
	if (!up)
		return false;
	if (hint == FS_RECORD_PRESENT && rule != FS_RULE_OFFLOAD && s->neg->waitless_ok) {
		/* TCP first, waitless (tcpfirst_hs.h): the HELLO now, as the
		 * socket's first bytes, and nothing waited for: no probe, no
		 * rail, no watch (the application's first receive takes the
		 * ACK; a close before it is a background close, as for an
		 * empty HELLO) */
		int ret;

		s->neg->skip_probe = true;
		s->neg->waitless = true;
		fs_sock_set_state(s, FS_SOCK_CLIENT_PENDING);
		ret = fs_sock_send_hello(s, 0);
		if (ret != 0)
			fs_sock_release(s); /* not sent (FS_PASS: reset if a part went) */
		return true;
	}
	if (rule != FS_RULE_OFFLOAD && fs_probe_start(&s->neg->probe, s->fd, addr)) {
		FS_STAT_INC(fallback_probe_refused);
		why = "cannot send the probe";
		goto kernel;
	}
	fs_sock_set_state(s, FS_SOCK_CLIENT_PENDING);
	if (!s->neg->skip_probe && wait_here) {
		/* A blocking connect(): on this host the answer takes tens of
		 * microseconds, so wait that long here and send the HELLO from
		 * this thread; the ACK follows as soon as the server application
		 * reads, so look for it for FABSOCK_SPIN_US (the wait spins).
		 * Each saves a thread hand-off, a wake-up on the connection's
		 * critical path. What is still open goes on in the service
		 * thread, as below. (Not for a nonblocking connect, whose caller
		 * must not wait.) */
		uint64_t now = fs_now_ns();

		fs_sock_client_step(s, now + FS_CONNECT_PROBE_WAIT_NS, fs_spin_end(now));
		if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT) {
			fs_sock_ref(s);
			fs_sock_watch_ack_soon(s);
			return true;
		}
		if (fs_sock_state(s) != FS_SOCK_CLIENT_PENDING)
			return true; /* offloaded, or settled as TCP */
	}
	/* The service thread sends the HELLO as soon as the probe is answered. */
	fs_sock_ref(s);
	fs_sock_watch_probe(s);
	return true;
kernel:
	/* a server that speaks first and found our intent stops waiting */
	fs_history_withdraw_intent(&s->hist);
	FS_INFO("fd %d: stays on kernel TCP: %s", s->fd, why ? why : "unknown");
	FS_STAT_INC(kernel);
	fs_sock_release(s);
	return true;
}

/* Before the kernel's connect() of S to ADDR: if the connection will probe,
 * as far as can be told without its local address (a destination that is
 * not loopback may be this host's or another's), note its intent for a
 * server of our user that speaks first (history.h, issue 27 target 7): that
 * server then waits for our probe, and writes at once to a client that
 * noted nothing. The checks are those of fs_sock_after_connect, which takes
 * the intent back if it decides otherwise. Socket lock not needed: S is
 * FRESH and this thread's. */
static void fs_sock_note_intent(struct fs_sock *s, const struct sockaddr *addr)
{
	enum fs_record_hint hint = FS_RECORD_UNKNOWN;
	const char *why;
	uint8_t key[16];
	uint16_t port;

	if (s->hist.chose_tcp)
		return; /* noted as TCP */
	fs_sockaddr_key(addr, key, &port);
	if (fs_rules_match(&fs_rules_global, FS_SIDE_CLIENT, addr, port) != FS_RULE_PROBE)
		return; /* kernel, or an offload rule: no probe either way */
	if (fs_negotiate_loopback(key) && fs_negotiate_pick_provider(addr, addr, &why) == FS_PROV_NONE)
		return;
	if (fs_listeners_own(addr))
		return;
	if (fs_params.shm) {
		/* the records decide for a destination on this host, and a
		 * remote one's server never reads our notes */
		hint = fs_records_lookup(port);
		s->neg->record_hint = (unsigned char)(hint + 1);
	}
	if (hint == FS_RECORD_NONE || hint == FS_RECORD_REFUSES)
		return;
	if (hint != FS_RECORD_PRESENT && fs_negcache_hit(addr))
		return;
	/* TCP first's waitless HELLO: asked now, while the listener that will
	 * accept surely listens (a server that accepts one connection may
	 * close it before a nonblocking connect is seen to finish) */
	if (hint == FS_RECORD_PRESENT)
		s->neg->waitless_ok = fs_tfhs_client_may(s->fd, addr);
	fs_history_note_intent(&s->hist, s->fd);
}

/* Whether a connect() of S to ADDR will stay on TCP, known before the
 * kernel's connect (what fs_sock_after_connect decides first from what
 * fs_core_connect knows already: a rule, the history, this user's
 * listener records; the rest, false). */
static bool fs_sock_tcp_surely(struct fs_sock *s, const struct sockaddr *addr)
{
	enum fs_rule_action rule;
	uint8_t key[16];
	uint16_t port;
	unsigned char hint = s->neg->record_hint;

	fs_sockaddr_key(addr, key, &port);
	rule = fs_rules_match(&fs_rules_global, FS_SIDE_CLIENT, addr, port);
	if (rule == FS_RULE_KERNEL || (s->hist.chose_tcp && rule != FS_RULE_OFFLOAD))
		return true;
	return rule != FS_RULE_OFFLOAD && hint &&
	       ((enum fs_record_hint)(hint - 1) == FS_RECORD_NONE || (enum fs_record_hint)(hint - 1) == FS_RECORD_REFUSES);
}

/* A nonblocking connect() finished (or the caller wants to know if it did).
 * Socket lock held. Returns true once the socket left CONNECTING. */
bool fs_sock_connect_done(struct fs_sock *s)
{
	struct pollfd p = { .fd = s->fd, .events = POLLOUT };
	int err = 0;
	socklen_t elen = sizeof(err);

	if (fs_sock_state(s) != FS_SOCK_CONNECTING)
		return true;
	if (fs_real.poll(&p, 1, 0) <= 0)
		return false;
	/* Peek at the result without consuming it: SO_ERROR is the
	 * application's to read. A connected socket has a peer. */
	{
		struct sockaddr_storage peer;
		socklen_t plen = sizeof(peer);

		if (fs_real.getpeername(s->fd, (struct sockaddr *)&peer, &plen) == 0) {
			fs_sock_after_connect(s, false, true);
			return true;
		}
	}
	(void)err;
	(void)elen;
	/* failed: the kernel reports it; nothing to offload */
	fs_history_withdraw_intent(&s->hist);
	FS_STAT_INC(kernel);
	fs_sock_release(s);
	return true;
}

/* Why only before the HELLO: glibc's AIO helper thread writes on the
 * kernel socket later, past every wrapper, while the service thread goes
 * on with the handshake once the connection is up and the probe answered;
 * its HELLO would then follow the application's bytes on TCP, and the
 * server (which decides on the first bytes, and found data) would read it
 * as data (issue 26). Before the HELLO there is nothing in-band to take
 * back: the server settles as TCP on the application's first bytes, as
 * for any client that was told yes and did not send one. After it, the
 * handshake ends first and the stream is handed back (fs_core_to_kernel). */
bool fs_sock_client_to_kernel(struct fs_sock *s)
{
	bool kernel = true;

	fs_lock(&s->lock);
	switch (fs_sock_state(s)) {
	case FS_SOCK_CONNECTING:
	case FS_SOCK_CLIENT_PENDING:
		/* a server that speaks first and found our intent stops waiting */
		fs_history_withdraw_intent(&s->hist);
		FS_INFO("fd %d: stays on kernel TCP: handed to POSIX AIO before its handshake", s->fd);
		FS_STAT_INC(fallback_kernel_io);
		FS_STAT_INC(kernel);
		fs_sock_release(s);
		break;
	case FS_SOCK_KERNEL:
		break;
	default:
		kernel = false;
	}
	pthread_mutex_unlock(&s->lock);
	return kernel;
}

static void fs_sock_connect_watch(void *arg, bool timed_out)
{
	struct fs_sock *s = arg;

	(void)timed_out;
	if (!fs_sock_watch_lock(s, &s->connect_watch, fs_sock_connect_watch, s))
		return;
	if (!s->closed && !fs_sock_connect_done(s)) {
		fs_sock_watch_connect(s); /* reads s->fd: under the lock */
		pthread_mutex_unlock(&s->lock);
		return;
	}
	pthread_mutex_unlock(&s->lock);
	fs_sock_put(s);
}

int fs_core_connect(struct fs_sock *s, const struct sockaddr *addr, socklen_t len)
{
	int ret;

	if (fs_sock_state(s) != FS_SOCK_FRESH || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
		return FS_PASS;
	/* before the kernel's connect: a client that goes TCP by its history
	 * leaves a note a server that speaks first looks for (history.h) */
	fs_history_decide(&s->hist, addr);
	s->sb.hist = &s->hist;
	fs_sock_note_intent(s, addr);
	/* An epoll entry made while the socket was FRESH is the application's
	 * own (epoll.c): unless the connection surely stays on TCP, the
	 * negotiation's events must be ours before the kernel's connect()
	 * (an answer, a HELLO-ACK, reported untranslated to another thread's
	 * wait, would be a readiness the application's receive then lacks) */
	if (__atomic_load_n(&s->ep_members, __ATOMIC_ACQUIRE) && !fs_sock_tcp_surely(s, addr))
		fs_epoll_sock_negotiates(s);
	ret = fs_real.connect(s->fd, addr, len);
	if (ret && errno != EINPROGRESS) {
		int err = errno;

		fs_history_withdraw_intent(&s->hist);
		return -err;
	}
	fs_lock(&s->lock);
	memcpy(&s->neg->peer, addr, len < sizeof(s->neg->peer) ? len : sizeof(s->neg->peer));
	/* Nonblocking: whether the connection stays on TCP is known now (a
	 * rule, no record of a listener, the history: nothing of it needs the
	 * connection up, and the local address is bound already). Then it is
	 * settled here, not by the service thread once the connection is up:
	 * that was a watch, a wake-up of that thread, a poll and a getpeername
	 * for every connection an event loop (wrk, nginx's upstream
	 * connections) made to a plain server or by its history, which the
	 * kernel does not pay. */
	if (ret && fs_sock_after_connect(s, false, false)) {
		pthread_mutex_unlock(&s->lock);
		return -EINPROGRESS;
	}
	if (ret) {
		/* Nonblocking: the service thread goes on when the connection is
		 * up; the application sees EINPROGRESS as from the kernel. */
		fs_sock_set_state(s, FS_SOCK_CONNECTING);
		fs_sock_ref(s);
		fs_sock_watch_connect(s);
		pthread_mutex_unlock(&s->lock);
		return -EINPROGRESS;
	}
	fs_sock_after_connect(s, true, true);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int fs_core_listen(struct fs_sock *s, int backlog)
{
	struct sockaddr_storage local;
	socklen_t llen = sizeof(local);
	uint8_t key[16];
	uint16_t port = 0;
	struct fs_listener *early = NULL;
	bool tried = false;
	int ret;

	/* A bound socket gets its probe port before it listens: a client that
	 * connects the moment the port listens (one that retries until it
	 * can: a test harness, a supervisor's health check) would otherwise
	 * find the probe port closed, and take this host for one without
	 * fabsock (the negative cache keeps it so for a while). Seen in CI:
	 * e2e_load's client on TCP. */
	fs_lock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_FRESH && !fs_real.getsockname(s->fd, (struct sockaddr *)&local, &llen)) {
		fs_sockaddr_key((struct sockaddr *)&local, key, &port);
		if (port && fs_rules_match(&fs_rules_global, FS_SIDE_SERVER, NULL, port) != FS_RULE_KERNEL) {
			early = fs_listener_open(s->fd);
			tried = true; /* a refusal (a planted table, a taken UDP port) stands */
		}
	}
	pthread_mutex_unlock(&s->lock);
	ret = fs_real.listen(s->fd, backlog);
	if (!ret && fs_params.test_listen_delay_ms)
		usleep((useconds_t)(fs_params.test_listen_delay_ms * 1000));
	if (ret) {
		int err = errno;

		if (early)
			fs_listener_close(early);
		return -err;
	}
	fs_lock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_LISTENING) { /* listen() again: backlog change */
		pthread_mutex_unlock(&s->lock);
		if (early)
			fs_listener_close(early); /* another thread listened meanwhile */
		return 0;
	}
	llen = sizeof(local);
	if (fs_sock_state(s) != FS_SOCK_FRESH || fs_real.getsockname(s->fd, (struct sockaddr *)&local, &llen))
		goto plain;
	fs_sockaddr_key((struct sockaddr *)&local, key, &port);
	if (fs_rules_match(&fs_rules_global, FS_SIDE_SERVER, NULL, port) == FS_RULE_KERNEL) {
		FS_INFO("listener on port %u: a FABSOCK_RULES rule says kernel", port);
		goto plain;
	}
	s->listener = tried ? early : fs_listener_open(s->fd);
	early = NULL;
	s->local_port = port;
	fs_sock_set_state(s, FS_SOCK_LISTENING);
	fs_sock_neg_free(s);
	fs_sock_note_inherit(s);
	pthread_mutex_unlock(&s->lock);
	fs_fabric_warm();
	return 0;
plain:
	fs_sock_release(s);
	pthread_mutex_unlock(&s->lock);
	if (early)
		fs_listener_close(early);
	return 0;
}

void fs_core_accepted(struct fs_sock *ls, int newfd, int flags, const struct sockaddr *addr, const socklen_t *len,
		      socklen_t room, unsigned spread)
{
	struct fs_sock *s, *old;
	uint64_t mark;

	if (fs_sock_state(ls) != FS_SOCK_LISTENING)
		return;
	/* A plain listener's connection from this host: nothing of fabsock's
	 * from here on (core/plain.h) */
	if (ls->listener) {
		fs_listener_accepting(ls->listener);
		if (fs_plain_accept(ls->listener, newfd, addr, len, room, spread))
			return;
	}
	/* a mark left at this number by a close fabsock did not see */
	if ((mark = fs_plain_take(newfd)) != 0)
		fs_plain_release(mark);
	s = fs_sock_alloc(newfd, ls->family);
	if (!s)
		return;
	fs_sock_set_state(s, FS_SOCK_SERVER_PENDING);
	s->neg->accepted_ns = fs_now_ns();
	/* (only a whole address of the listener's family: a truncated one,
	 * *LEN > ROOM, is not the client's) */
	if (addr && len && *len <= room && *len <= sizeof(s->neg->accepted_peer) && *len >= sizeof(sa_family_t) &&
	    addr->sa_family == ls->family) {
		memcpy(&s->neg->accepted_peer, addr, *len);
		s->neg->accepted_len = *len;
	}
	s->nonblock = (flags & SOCK_NONBLOCK) != 0;
	s->local_port = ls->local_port;
	/* A listener without its twin (the application holds the UDP port)
	 * answers no probe: its connections go as those of no listener (stay
	 * on TCP, strip a HELLO another twin may have asked for). */
	if (ls->listener && fs_listener_has_twin(ls->listener)) {
		fs_listener_get(ls->listener);
		s->listener = ls->listener;
		s->unsettled = true;
		s->plain_note = fs_params.plain_after && s->neg->accepted_len &&
				fs_plain_loopback((const struct sockaddr *)&s->neg->accepted_peer);
		fs_listener_unsettled(s->listener, true);
	}
	old = fs_fdt_set(newfd, s);
	if (old && old != FS_SOCK_INTERNAL)
		fs_sock_put(old);
	/* No exec record now (an fstat per connection): fs_core_before_exec
	 * writes one for every socket that survives into the new program. */
}

#define FS_DRAIN_AFTER_NS 2000000ull

/* Whether a waiter should drain the probes of S's listener at NOW (the
 * one condition of fs_sock_drain_probes and fs_sock_probe_watch). The
 * service thread answers this process's listeners' probes; a waiter helps
 * only once the connection has waited FS_DRAIN_AFTER_NS (a starved service
 * thread), not on every look at a fresh one (a failing recvmsg per
 * connection for nginx's plain clients), and always for a listener
 * inherited from a parent that no longer answers (fs_listener_answered:
 * gone, or its twin let go). S in SERVER_PENDING with a listener; its lock
 * held. */
static bool fs_sock_drain_due(struct fs_sock *s, uint64_t now)
{
	return !fs_listener_answered(s->listener) || now - s->neg->accepted_ns > FS_DRAIN_AFTER_NS;
}

const void *fs_sock_drain_probes(struct fs_sock *s, const void *skip)
{
	struct fs_listener *l = NULL;

	if (skip == FS_SOCK_DRAIN_NONE)
		return skip;
	fs_lock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_SERVER_PENDING && s->listener && s->listener != skip &&
	    fs_sock_drain_due(s, fs_now_ns())) {
		l = s->listener;
		fs_listener_get(l);
	}
	pthread_mutex_unlock(&s->lock);
	if (!l)
		return skip;
	fs_listener_adopt(l); /* nobody answers: a daemon's listener, its maker gone */
	fs_listener_drain(l);
	fs_listener_put(l);
	return l;
}

/* How often a wait looks at a server connection whose nonblocking sender
 * was told -EAGAIN (fs_sock_settle_owed): what ends the sender's wait (a
 * HELLO, the wait's end) may not wake it (an entry of the application's
 * events only, EPOLLOUT, is not woken by the HELLO). */
#define FS_SEND_OWED_LOOK_NS 10000000ull

bool fs_sock_settle_owed(struct fs_sock *s)
{
	if (fs_sock_state(s) != FS_SOCK_SERVER_PENDING || !__atomic_load_n(&s->send_owed, __ATOMIC_ACQUIRE))
		return false;
	fs_sock_settle(s, true, fs_now_ns());
	return true;
}

int fs_sock_probe_watch(struct fs_sock *s, uint64_t now, uint64_t *drain_at)
{
	int fd = -1;

	if (__atomic_load_n(&s->send_owed, __ATOMIC_ACQUIRE) && (!*drain_at || now + FS_SEND_OWED_LOOK_NS < *drain_at))
		*drain_at = now + FS_SEND_OWED_LOOK_NS;
	fs_lock(&s->lock);
	/* fs_sock_drain_probes' condition: what it would drain now is
	 * watched now; a listener it helps only after FS_DRAIN_AFTER_NS is
	 * watched from then on (the waiter wakes then and asks again) */
	if (fs_sock_state(s) == FS_SOCK_SERVER_PENDING && s->listener) {
		if (fs_sock_drain_due(s, now)) {
			fd = fs_listener_probe_fd(s->listener);
		} else {
			uint64_t at = s->neg->accepted_ns + FS_DRAIN_AFTER_NS + 1;

			if (!*drain_at || at < *drain_at)
				*drain_at = at;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return fd;
}

/* Threads of this process waiting in the kernel for S's first byte (a
 * forked child's copy of the count is its parent's threads'). Lock held. */
unsigned fs_sock_direct_readers(const struct fs_sock *s)
{
	return s->direct_pid == fs_self_pid() ? s->direct_readers : 0;
}

/* Another thread waits in the kernel for S's first byte (direct_readers):
 * it settles S when the byte comes, a HELLO included (an offload by this
 * thread would leave it waiting on an idle TCP connection). So this call
 * waits for it, without the lock, as it would have waited for the HELLO
 * itself: until S settles, DEADLINE_NS (-EAGAIN), or, for a send, while a
 * "yes" may still bring a HELLO, up to the server's HELLO wait (with no
 * "yes", a sender goes on to wait for a noted probe or speak first: a
 * "yes" that comes meanwhile sends it back here, FS_NEG_TO_READER; else
 * the connection is TCP and the reader's byte comes over it). 0 when S
 * settled meanwhile or the caller goes on. Socket lock held. */
static int fs_sock_wait_direct_readers(struct fs_sock *s, bool for_send, uint64_t deadline_ns)
{
	uint64_t hello_by = 0;
	useconds_t slice = 200;

	while (fs_sock_direct_readers(s) && fs_sock_state(s) == FS_SOCK_SERVER_PENDING) {
		uint64_t now = fs_now_ns();

		if (deadline_ns && now >= deadline_ns)
			return -EAGAIN;
		if (for_send) {
			uint64_t by = fs_negotiate_server_hello_by(s);

			if (!by)
				return 0; /* no "yes": the sender decides (TCP) */
			if (!hello_by)
				hello_by = by;
			if (now >= hello_by)
				return 0; /* the HELLO never came: as when nobody reads */
		}
		pthread_mutex_unlock(&s->lock);
		usleep(slice);
		if (slice < 5000)
			slice *= 2;
		fs_lock(&s->lock);
	}
	return 0;
}

/* A server connection settled as TCP. Still tracked if it must be: to
 * clear its probe record at close, or to strip a HELLO on the first
 * receive; else let go. Socket lock held. */
static void fs_sock_settled_tcp(struct fs_sock *s)
{
	if (fs_sock_state(s) == FS_SOCK_KERNEL)
		return;
	if ((s->listener && s->have_peer_key) || s->strip_hello) {
		fs_sock_set_state(s, FS_SOCK_SERVER_PLAIN);
		fs_sock_note_inherit(s);
	} else
		fs_sock_release(s);
}

#define FS_LEAVE_TO_READER_ROUNDS 4u

/* Settles a pending socket. Returns 0 (offloaded), FS_PASS (kernel: the
 * entry is gone), -EAGAIN (server side undecided by DEADLINE), -errno. */
int fs_sock_settle(struct fs_sock *s, bool for_send, uint64_t deadline_ns)
{
	int ret;

	fs_lock(&s->lock);
	switch (fs_sock_state(s)) {
	case FS_SOCK_OFFLOADED:
		ret = 0;
		break;
	case FS_SOCK_CONNECTING:
		if (!fs_sock_connect_done(s)) {
			ret = FS_PASS; /* the kernel answers for a connection not yet up */
			pthread_mutex_unlock(&s->lock);
			return ret;
		}
		if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT) {
			/* the probe was answered while connect completed */
			ret = fs_sock_take_ack(s, deadline_ns);
			break;
		}
		if (fs_sock_state(s) != FS_SOCK_CLIENT_PENDING) {
			ret = FS_PASS;
			break;
		}
		/* fall through */
	case FS_SOCK_CLIENT_PENDING:
		ret = fs_sock_send_hello(s, deadline_ns);
		if (ret == 0)
			ret = fs_sock_take_ack(s, deadline_ns);
		break;
	case FS_SOCK_CLIENT_HELLO_SENT:
		ret = fs_sock_take_ack(s, deadline_ns);
		break;
	case FS_SOCK_SERVER_PENDING:
		/* A sender that met a "yes" with a reader waiting in the kernel
		 * leaves that reader the HELLO (FS_NEG_TO_READER) and waits for
		 * it here, up to the HELLO wait; then it finds the socket
		 * settled, or settles it itself. Each wait ends by the reader, a
		 * deadline or the HELLO wait's end, so one round is the rule;
		 * the bound keeps a "yes" that this wait and the negotiation
		 * were to see differently from looping. */
		for (unsigned round = 0;; round++) {
			ret = fs_sock_wait_direct_readers(s, for_send, deadline_ns);
			if (ret != 0 || fs_sock_state(s) != FS_SOCK_SERVER_PENDING) {
				if (ret == 0)
					ret = fs_sock_state(s) == FS_SOCK_OFFLOADED ? 0 : FS_PASS;
				break;
			}
			s->neg->may_leave_to_reader = round < FS_LEAVE_TO_READER_ROUNDS;
			ret = fs_sock_serve_hello(s, for_send, deadline_ns);
			if (ret != FS_NEG_TO_READER)
				break;
		}
		break;
	default:
		ret = FS_PASS;
		break;
	}
	if (ret == -EAGAIN && for_send && fs_sock_state(s) == FS_SOCK_SERVER_PENDING)
		__atomic_store_n(&s->send_owed, true, __ATOMIC_RELEASE); /* (fs_sock_settle_owed) */
	if (ret == FS_PASS) {
		fs_sock_settled_tcp(s);
	} else if (ret < 0 && ret != -EAGAIN && fs_sock_pending(s) && fs_sock_state(s) != FS_SOCK_SERVER_PENDING) {
		/* The client's handshake ended with the kernel connection's
		 * error (a reset, or the server's end before its answer), which
		 * the handshake's read took: this call reports it, as the
		 * kernel's would have once; every later call is the kernel's
		 * (an end of stream, EPIPE), as fs_sock_client_step leaves it.
		 * Left pending, every call read the ended stream again and
		 * reported the reset for ever. */
		fs_negotiate_abort(s);
		fs_sock_release(s);
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

/* Copies the first LEN bytes MSG's vector holds into OUT. */
static void fs_iov_head(const struct msghdr *msg, uint8_t *out, size_t len)
{
	for (size_t i = 0; i < msg->msg_iovlen && len; i++) {
		size_t k = msg->msg_iov[i].iov_len < len ? msg->msg_iov[i].iov_len : len;

		memcpy(out, msg->msg_iov[i].iov_base, k);
		out += k;
		len -= k;
	}
}

/* Drops the first SKIP of the N bytes in MSG's vector: the rest moves to
 * its start. Returns N - SKIP. */
static size_t fs_iov_drop_head(const struct msghdr *msg, size_t n, size_t skip)
{
	size_t from_i = 0, from_off = skip, to_i = 0, to_off = 0, left = n - skip;

	if (!skip)
		return n; /* a plain client's first bytes: nothing to move (it
			   * copied every byte onto itself, one at a time) */
	while (from_i < msg->msg_iovlen && from_off >= msg->msg_iov[from_i].iov_len)
		from_off -= msg->msg_iov[from_i++].iov_len;
	while (left) {
		/* skip empty entries on both sides */
		while (to_off == msg->msg_iov[to_i].iov_len) {
			to_i++;
			to_off = 0;
		}
		while (from_off == msg->msg_iov[from_i].iov_len) {
			from_i++;
			from_off = 0;
		}
		((uint8_t *)msg->msg_iov[to_i].iov_base)[to_off++] =
			((const uint8_t *)msg->msg_iov[from_i].iov_base)[from_off++];
		left--;
	}
	return n - skip;
}

bool fs_sock_read_direct(struct fs_sock *s)
{
	bool direct;

	if (fs_sock_state(s) != FS_SOCK_SERVER_PENDING)
		return false;
	fs_lock(&s->lock);
	direct = fs_sock_state(s) == FS_SOCK_SERVER_PENDING && fs_negotiate_server_before_read(s, true) == 1;
	pthread_mutex_unlock(&s->lock);
	return direct;
}

/* A blocking first receive: waits in the kernel for the client's first
 * byte with a peek (no spin, no poll, not under the socket lock), then
 * settles the socket as TCP if still no probe record says otherwise; the
 * application's receive then reads as from the kernel. Not the receive
 * itself: another thread of the application may settle the socket
 * meanwhile (a sender of a server that speaks first, waiting for a HELLO
 * under the lock), and must find that HELLO still in the socket. */
static ssize_t fs_sock_first_read_wait(struct fs_sock *s)
{
	char byte;
	ssize_t n;
	int err;

	fs_lock(&s->lock);
	if (fs_sock_state(s) != FS_SOCK_SERVER_PENDING || fs_negotiate_server_before_read(s, false) != 1) {
		pthread_mutex_unlock(&s->lock);
		return FS_FIRST_READ_NO;
	}
	if (s->direct_pid != fs_self_pid()) {
		s->direct_pid = fs_self_pid();
		s->direct_readers = 0; /* a parent's, copied by fork */
	}
	s->direct_readers++;
	pthread_mutex_unlock(&s->lock);
	n = fs_real.recv(s->fd, &byte, 1, MSG_PEEK);
	err = errno;
	fs_lock(&s->lock);
	if (s->direct_readers && s->direct_pid == fs_self_pid())
		s->direct_readers--;
	if (n < 0) {
		pthread_mutex_unlock(&s->lock);
		return -err; /* SO_RCVTIMEO, a signal, a reset: nothing taken */
	}
	if (fs_sock_state(s) == FS_SOCK_SERVER_PENDING && fs_negotiate_server_before_read(s, true) == 1 &&
	    ((n > 0 && fs_negotiate_server_waitless(s, NULL, 0, NULL) == FS_PASS) ||
	     fs_negotiate_server_claim(s, n == 0) == FS_PASS)) {
		fs_sock_settled_tcp(s);
		FS_STAT_INC(server_first_read_direct);
	}
	pthread_mutex_unlock(&s->lock);
	return FS_FIRST_READ_NO; /* TCP now, or a "yes" came: the usual path */
}

ssize_t fs_sock_first_read(struct fs_sock *s, struct msghdr *msg, int flags, bool nonblock)
{
	uint8_t first[FS_WIRE_HELLO_MAX];
	size_t taken = 0;
	ssize_t n;
	int ret;

	/* a peek leaves the bytes where the usual settling looks; a whole
	 * count could wait for bytes a client sends only after its ACK */
	if (flags & (MSG_PEEK | MSG_WAITALL | MSG_OOB | MSG_ERRQUEUE))
		return FS_FIRST_READ_NO;
	if (!nonblock)
		return fs_sock_first_read_wait(s);
	/* Nonblocking (an event loop, told the socket is readable): the
	 * application's receive itself, under the lock (it cannot wait), its
	 * bytes judged after the fact. */
	fs_lock(&s->lock);
	if (fs_sock_state(s) != FS_SOCK_SERVER_PENDING || fs_negotiate_server_before_read(s, true) != 1) {
		pthread_mutex_unlock(&s->lock);
		return FS_FIRST_READ_NO;
	}
	if (fs_params.tcp_first && fs_negotiate_server_waitless(s, NULL, 0, NULL) == FS_PASS) {
		/* TCP first's waitless HELLO taken off: the receive is the kernel's */
		fs_sock_settled_tcp(s);
		pthread_mutex_unlock(&s->lock);
		return FS_FIRST_READ_NO;
	}
	n = fs_real.recvmsg(s->fd, msg, flags | MSG_DONTWAIT);
	if (n < 0) {
		ret = -errno; /* nothing taken: still undecided (EAGAIN...) */
		pthread_mutex_unlock(&s->lock);
		return ret;
	}
	if (n == 0) {
		if (fs_negotiate_server_claim(s, true) == FS_PASS) {
			fs_sock_settled_tcp(s);
			FS_STAT_INC(server_first_read_direct);
		}
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	fs_iov_head(msg, first, (size_t)n < sizeof(first) ? (size_t)n : sizeof(first));
	ret = fs_negotiate_server_after_read(s, first, (size_t)n, &taken);
	if (ret == 0) {
		fs_sock_offloaded(s);
	} else if (ret == FS_PASS) {
		fs_sock_settled_tcp(s);
		FS_STAT_INC(server_first_read_direct);
	}
	pthread_mutex_unlock(&s->lock);
	if (taken < (size_t)n)
		return (ssize_t)fs_iov_drop_head(msg, (size_t)n, taken);
	if (ret < 0 && ret != FS_PASS)
		return ret;
	/* the whole receive was the HELLO: the application's receive goes
	 * on, on the connection as it now is */
	return FS_FIRST_READ_NO;
}

bool fs_sock_pending(const struct fs_sock *s)
{
	enum fs_sock_state st = fs_sock_state(s);

	return st == FS_SOCK_CLIENT_PENDING || st == FS_SOCK_CLIENT_HELLO_SENT || st == FS_SOCK_SERVER_PENDING ||
	       st == FS_SOCK_CONNECTING;
}

bool fs_sock_must_unshare(const struct fs_sock *s)
{
	return s->pid != fs_self_pid() || (s->stream && __atomic_load_n(&s->stream->hb, __ATOMIC_ACQUIRE) == FS_HB_DONE);
}

void fs_sock_peer_handback_learnt(struct fs_sock *s)
{
	/* Our server handed the stream back: its step-back (the answers it
	 * waited for came after sleeps), or a process of its that took the
	 * socket (sshd's children). Either way the program's next connection
	 * would pay the offload for a window or less: it starts on TCP, as
	 * after a step-back of ours (relearnt now and then). A server's
	 * step-back used to teach nothing: pgbench -c 4 -j 2's backends
	 * stepped back every round. (Once: it clears the history tag.) */
	if (s->pid == fs_self_pid() && s->stream && __atomic_load_n(&s->stream->hb_by_peer, __ATOMIC_RELAXED))
		fs_history_stepped_back(&s->hist);
}

bool fs_sock_unshare(struct fs_sock *s, int *err)
{
	bool foreign = s->pid != fs_self_pid();

	*err = 0;
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED || !fs_sock_must_unshare(s))
		return false;
	if (foreign)
		*err = fs_handback_request(s);
	else
		fs_sock_peer_handback_learnt(s);
	fs_lock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED)
		fs_sock_release(s);
	pthread_mutex_unlock(&s->lock);
	return true;
}

