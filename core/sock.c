/* SPDX-License-Identifier: MIT */
/*
 * Socket state and the core entry points (see sock.h for the state
 * machine). Every transition of enum fs_sock_state happens in this file or
 * in negotiate.c, under fs_sock.lock.
 */
#include "core/sock.h"

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

#define FS_SENDFILE_CHUNK (256u << 10)
/* How long connect() waits for the probe's answer itself (see
 * fs_sock_after_connect). */
#define FS_CONNECT_PROBE_WAIT_NS 300000ull

__thread int fs_guard_depth __attribute__((tls_model("initial-exec")));
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
static void fs_sock_set_state(struct fs_sock *s, enum fs_sock_state state)
{
	enum fs_sock_state old = __atomic_exchange_n(&s->state, state, __ATOMIC_ACQ_REL);

	if (old != state && (old == FS_SOCK_CLIENT_HELLO_SENT || state == FS_SOCK_CLIENT_HELLO_SENT))
		__atomic_add_fetch(&fs_sock_hello_sent, state == FS_SOCK_CLIENT_HELLO_SENT ? 1u : -1u,
				   __ATOMIC_RELAXED);
}

/* ---- allocation: type-stable, so lock-free readers may look ----------- */

static pthread_mutex_t fs_sock_free_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fs_sock *fs_sock_free_list;

static struct fs_sock *fs_sock_alloc(int fd, int family)
{
	struct fs_sock *s;

	pthread_mutex_lock(&fs_sock_free_lock);
	s = fs_sock_free_list;
	if (s)
		fs_sock_free_list = s->free_next;
	pthread_mutex_unlock(&fs_sock_free_lock);
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s)
			return NULL;
	} else {
		memset(s, 0, sizeof(*s));
	}
	pthread_mutex_init(&s->lock, NULL);
	s->fd = fd;
	s->app_fds = s->app_fds_inline;
	s->app_fds_cap = sizeof(s->app_fds_inline) / sizeof(s->app_fds_inline[0]);
	s->app_fds[0] = fd;
	s->n_app_fds = 1;
	s->family = family;
	s->pid = fs_self_pid();
	fs_sock_set_state(s, FS_SOCK_FRESH);
	s->probe.udp_fd = -1;
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

void fs_sock_put(struct fs_sock *s)
{
	if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL))
		return;
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
static void fs_sock_release(struct fs_sock *s)
{
	if (s->listener && s->have_peer_key && fs_sock_state(s) != FS_SOCK_LISTENING) {
		fs_listener_forget(s->listener, s->peer_key, s->peer_port);
		s->have_peer_key = false;
	}
	if (s->probe.udp_fd >= 0)
		fs_probe_cancel(&s->probe);
	if (s->listener) {
		if (fs_sock_state(s) == FS_SOCK_LISTENING)
			fs_listener_close(s->listener);
		else
			fs_listener_put(s->listener);
		s->listener = NULL;
	}
	for (unsigned i = 0; i < s->n_app_fds; i++) {
		fs_inherit_note(s->app_fds[i], FS_INH_NONE);
		if (fs_fdt_clear(s->app_fds[i], s))
			fs_sock_put(s); /* the table's reference */
	}
	if (s->fd_private) {
		/* the application's fds are plain kernel sockets now */
		fs_internal_fd_close(s->fd);
		s->fd_private = false;
		s->fd = s->n_app_fds ? s->app_fds[0] : -1;
	}
	fs_sock_set_state(s, FS_SOCK_KERNEL);
}

int fs_internal_fd(int fd)
{
	static int cached_high; /* one getrlimit per process, not per close() */
	int high = __atomic_load_n(&cached_high, __ATOMIC_RELAXED), moved;

	if (!high) {
		struct rlimit lim;

		high = 512;
		if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && (rlim_t)high >= lim.rlim_cur)
			high = (int)(lim.rlim_cur / 2);
		__atomic_store_n(&cached_high, high, __ATOMIC_RELAXED);
	}
	moved = fs_real.fcntl(fd, F_DUPFD_CLOEXEC, high);
	if (moved < 0 && errno == EINVAL) {
		/* the limit was lowered since: ask again next time */
		__atomic_store_n(&cached_high, 0, __ATOMIC_RELAXED);
		return fd;
	}
	if (moved < 0)
		return fd;
	fs_real.close(fd);
	fs_fdt_set(moved, FS_SOCK_INTERNAL);
	return moved;
}

/* The log sink's hook: its file is fabsock's own descriptor. */
static void fs_core_mark_internal(int fd)
{
	fs_fdt_set(fd, FS_SOCK_INTERNAL);
}

void fs_internal_fd_close(int fd)
{
	struct fs_sock *expected = FS_SOCK_INTERNAL;

	if (fd >= 0 && (size_t)fd < fs_fdt_size)
		__atomic_compare_exchange_n(&fs_fdt[fd], &expected, NULL, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
	fs_real.close(fd);
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
	default:
		break;
	}
	for (unsigned i = 0; i < s->n_app_fds; i++)
		fs_inherit_note(s->app_fds[i], kind);
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
	fs_service_fork_prepare();
}

static void fs_core_atfork_parent(void)
{
	fs_service_fork_parent();
}

static void fs_sock_bg_after_fork(void);

void fs_core_atfork_child(void)
{
	fs_self_pid_refresh();
	fs_engine_forget_after_fork();
	fs_service_after_fork();
	fs_listeners_after_fork();
	fs_diag_after_fork();
	fs_bell_after_fork();
	fs_inherit_after_fork();
	fs_sigs_after_fork();
	fs_stats_after_fork();
	fs_handback_after_fork();
	pthread_mutex_init(&fs_sock_free_lock, NULL);
	fs_sock_bg_after_fork();
}

/* The negotiation's steps as this file runs them: negotiate.c answers with
 * an outcome, and the socket's state changes here. Socket lock held. */
static int fs_sock_send_hello(struct fs_sock *s, uint64_t deadline_ns)
{
	int ret = fs_negotiate_client_hello(s, deadline_ns);

	if (ret == 0)
		fs_sock_set_state(s, FS_SOCK_CLIENT_HELLO_SENT);
	return ret;
}

static void fs_sock_offloaded(struct fs_sock *s)
{
	fs_sock_set_state(s, FS_SOCK_OFFLOADED);
	fs_sock_note_inherit(s);
}

static int fs_sock_take_ack(struct fs_sock *s, uint64_t deadline_ns)
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


/* The process ends (exit, _exit, a fatal signal) with bytes held for a
 * HELLO-ACK: a client that wrote and ended before the server read, a forked
 * child's usual _exit() after its reply. The kernel delivers what a process
 * wrote before it ended; so wait for those ACKs (FABSOCK_LINGER_SEC in all)
 * and the engine's shutdown then delivers the bytes, or they went over TCP
 * with a refusal. A socket whose lock is taken (the exit interrupted a
 * call on it) is left, as are a parent's sockets in a forked child. */
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

static void fs_sock_exit_held(void)
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
		    s->pid != fs_self_pid())
			continue;
		ret = fs_sock_exit_lock(s, deadline);
		if (ret < 0) {
			FS_WARN("fd %d: process ending %s before the HELLO-ACK: the bytes held for it, if any, are lost",
				(int)fd, ret == -EDEADLK ? "inside a call on the socket" : "with the socket busy");
			continue;
		}
		if (ret > 0)
			continue;
		if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT && s->stream && fs_stream_holds(s->stream, deadline) &&
		    fs_sock_take_ack(s, deadline) == -EAGAIN)
			FS_WARN("fd %d: process ending: no HELLO-ACK within FABSOCK_LINGER_SEC; the bytes held for it "
				"are lost", s->fd);
		pthread_mutex_unlock(&s->lock);
	}
}

void fs_core_exit(void)
{
	static int done;

	if (!fs_core_enabled || __atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL))
		return;
	fs_sock_exit_held();
	if (fs_params.stats)
		fs_stats_log_once();
	fs_engine_shutdown();
	/* children forked earlier find what was handed back in the page;
	 * nothing more will be */
	fs_handback_owner_ended(fs_engine_peek(), true);
	fs_listeners_exit();
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

static uint64_t fs_timeout_ns(const struct timeval *tv)
{
	return (uint64_t)tv->tv_sec * 1000000000ull + (uint64_t)tv->tv_usec * 1000ull;
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

static void fs_sock_watch_probe(struct fs_sock *s)
{
	fs_service_watch(&s->client_watch, s->skip_probe ? -1 : s->probe.udp_fd, POLLIN,
			 s->skip_probe ? fs_now_ns() : s->probe.deadline_ns + 1000000ull, fs_sock_client_watch, s);
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

	pthread_mutex_lock(&s->lock);
	if (s->bg_close) {
		/* closed before the ACK: fs_sock_bg_watch finishes it */
		pthread_mutex_unlock(&s->lock);
		fs_sock_put(s);
		return;
	}
	ret = fs_sock_client_step(s, fs_now_ns(), fs_now_ns());
	FS_DBG("fd %d: handshake watch (timed out %d): %d, state %d", s->fd, timed_out, ret, fs_sock_state(s));
	if (fs_sock_state(s) == FS_SOCK_CLIENT_PENDING && !s->closed) {
		/* woken without a final answer (an fd number shared over time) */
		pthread_mutex_unlock(&s->lock);
		fs_sock_watch_probe(s);
		return;
	}
	if (fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT && !s->closed) {
		/* Wait for the ACK (the server answers when its application first
		 * uses the connection), keeping our reference. Woken with bytes
		 * that are not yet a whole ACK: look again in a millisecond, not
		 * in a tight loop. */
		pthread_mutex_unlock(&s->lock);
		if (timed_out)
			fs_sock_watch_ack(s);
		else
			fs_service_watch(&s->client_watch, -1, 0, fs_now_ns() + 1000000ull, fs_sock_client_watch, s);
		return;
	}
	pthread_mutex_unlock(&s->lock);
	fs_sock_put(s);
}

/* The TCP connection to PEER is up: decide whether to try offloading it and
 * send the probe (WAIT_HERE: and briefly wait for its answer in this
 * thread, for a blocking connect()). Socket lock held. */
static void fs_sock_after_connect(struct fs_sock *s, bool wait_here)
{
	const struct sockaddr *addr = (const struct sockaddr *)&s->peer;
	struct sockaddr_storage local;
	socklen_t llen = sizeof(local);
	enum fs_rule_action rule;
	const char *why = NULL;
	uint16_t port;
	uint8_t key[16];

	fs_sockaddr_key(addr, key, &port);
	rule = fs_rules_match(&fs_rules_global, FS_SIDE_CLIENT, addr, port);
	if (rule == FS_RULE_KERNEL) {
		FS_STAT_INC(fallback_rule);
		why = "a FABSOCK_RULES rule says kernel";
		goto kernel;
	}
	if (fs_real.getsockname(s->fd, (struct sockaddr *)&local, &llen)) {
		why = "getsockname failed";
		goto kernel;
	}
	s->provider = fs_negotiate_pick_provider((struct sockaddr *)&local, addr, &why);
	if (s->provider == FS_PROV_NONE) {
		FS_STAT_INC(fallback_remote);
		goto kernel;
	}
	if (rule == FS_RULE_OFFLOAD) {
		s->skip_probe = true;
	} else if (fs_negcache_hit(addr)) {
		FS_STAT_INC(fallback_neg_cache);
		why = "destination cached as not fabsock";
		goto kernel;
	} else if (fs_probe_start(&s->probe, s->fd, addr)) {
		FS_STAT_INC(fallback_probe_refused);
		why = "cannot send the probe";
		goto kernel;
	}
	fs_sock_set_state(s, FS_SOCK_CLIENT_PENDING);
	if (!s->skip_probe && wait_here) {
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
			return;
		}
		if (fs_sock_state(s) != FS_SOCK_CLIENT_PENDING)
			return; /* offloaded, or settled as TCP */
	}
	/* The service thread sends the HELLO as soon as the probe is answered. */
	fs_sock_ref(s);
	fs_sock_watch_probe(s);
	return;
kernel:
	FS_INFO("fd %d: stays on kernel TCP: %s", s->fd, why ? why : "unknown");
	FS_STAT_INC(kernel);
	fs_sock_release(s);
}

/* A nonblocking connect() finished (or the caller wants to know if it did).
 * Socket lock held. Returns true once the socket left CONNECTING. */
static bool fs_sock_connect_done(struct fs_sock *s)
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
			fs_sock_after_connect(s, false);
			return true;
		}
	}
	(void)err;
	(void)elen;
	/* failed: the kernel reports it; nothing to offload */
	FS_STAT_INC(kernel);
	fs_sock_release(s);
	return true;
}

static void fs_sock_connect_watch(void *arg, bool timed_out)
{
	struct fs_sock *s = arg;

	pthread_mutex_lock(&s->lock);
	if (!s->closed && !fs_sock_connect_done(s)) {
		pthread_mutex_unlock(&s->lock);
		fs_sock_watch_connect(s);
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
	ret = fs_real.connect(s->fd, addr, len);
	if (ret && errno != EINPROGRESS)
		return -errno;
	pthread_mutex_lock(&s->lock);
	memcpy(&s->peer, addr, len < sizeof(s->peer) ? len : sizeof(s->peer));
	if (ret) {
		/* Nonblocking: the service thread goes on when the connection is
		 * up; the application sees EINPROGRESS as from the kernel. */
		fs_sock_set_state(s, FS_SOCK_CONNECTING);
		pthread_mutex_unlock(&s->lock);
		fs_sock_ref(s);
		fs_sock_watch_connect(s);
		return -EINPROGRESS;
	}
	fs_sock_after_connect(s, true);
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
	pthread_mutex_lock(&s->lock);
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
	pthread_mutex_lock(&s->lock);
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
	fs_sock_note_inherit(s);
	pthread_mutex_unlock(&s->lock);
	return 0;
plain:
	fs_sock_release(s);
	pthread_mutex_unlock(&s->lock);
	if (early)
		fs_listener_close(early);
	return 0;
}

void fs_core_accepted(struct fs_sock *ls, int newfd, int flags)
{
	struct fs_sock *s, *old;

	if (fs_sock_state(ls) != FS_SOCK_LISTENING)
		return;
	s = fs_sock_alloc(newfd, ls->family);
	if (!s)
		return;
	fs_sock_set_state(s, FS_SOCK_SERVER_PENDING);
	s->accepted_ns = fs_now_ns();
	s->nonblock = (flags & SOCK_NONBLOCK) != 0;
	s->local_port = ls->local_port;
	if (ls->listener) {
		fs_listener_get(ls->listener);
		s->listener = ls->listener;
	}
	old = fs_fdt_set(newfd, s);
	if (old && old != FS_SOCK_INTERNAL)
		fs_sock_put(old);
	if (!(flags & SOCK_CLOEXEC))
		fs_inherit_note(newfd, FS_INH_PENDING);
}

const void *fs_sock_drain_probes(struct fs_sock *s, const void *skip)
{
	struct fs_listener *l = NULL;

	pthread_mutex_lock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_SERVER_PENDING && s->listener && s->listener != skip) {
		l = s->listener;
		fs_listener_get(l);
	}
	pthread_mutex_unlock(&s->lock);
	if (!l)
		return skip;
	fs_listener_drain(l);
	fs_listener_put(l);
	return l;
}

/* Settles a pending socket. Returns 0 (offloaded), FS_PASS (kernel: the
 * entry is gone), -EAGAIN (server side undecided by DEADLINE), -errno. */
int fs_sock_settle(struct fs_sock *s, bool for_send, uint64_t deadline_ns)
{
	int ret;

	pthread_mutex_lock(&s->lock);
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
		ret = fs_sock_send_hello(s, deadline_ns ? deadline_ns : UINT64_MAX);
		if (ret == 0)
			ret = fs_sock_take_ack(s, deadline_ns);
		break;
	case FS_SOCK_CLIENT_HELLO_SENT:
		ret = fs_sock_take_ack(s, deadline_ns);
		break;
	case FS_SOCK_SERVER_PENDING:
		ret = fs_sock_serve_hello(s, for_send, deadline_ns);
		break;
	default:
		ret = FS_PASS;
		break;
	}
	if (ret == FS_PASS && fs_sock_state(s) != FS_SOCK_KERNEL) {
		if ((s->listener && s->have_peer_key) || s->strip_hello) {
			/* still tracked: to clear its probe record at close, or to
			 * strip a HELLO on the first receive */
			fs_sock_set_state(s, FS_SOCK_SERVER_PLAIN);
			fs_sock_note_inherit(s);
		} else
			fs_sock_release(s);
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
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

bool fs_sock_unshare(struct fs_sock *s, int *err)
{
	bool foreign = s->pid != fs_self_pid();

	*err = 0;
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED || !fs_sock_must_unshare(s))
		return false;
	if (foreign)
		*err = fs_handback_request(s);
	pthread_mutex_lock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED)
		fs_sock_release(s);
	pthread_mutex_unlock(&s->lock);
	return true;
}

/* A socket this process cannot use as offloaded (fs_sock_unshare): the
 * kernel's, or the hand-back's error. */
static int fs_sock_foreign(struct fs_sock *s)
{
	int err;

	fs_sock_unshare(s, &err);
	return err ? err : FS_PASS;
}

/* FS_TCP from the stream: the kernel socket answers this call. */
static ssize_t fs_tcp_pass(ssize_t ret)
{
	return ret == FS_TCP ? FS_PASS : ret;
}

static uint64_t fs_deadline(uint64_t timeout_ns)
{
	return timeout_ns ? fs_now_ns() + timeout_ns : 0;
}

ssize_t fs_core_recvmsg(struct fs_sock *s, struct msghdr *msg, int flags)
{
	bool nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	uint64_t deadline = fs_deadline(s->rcvtimeo_ns);
	ssize_t ret;

	if (fs_sock_state(s) != FS_SOCK_OFFLOADED) {
		if (fs_sock_pending(s)) {
			ret = fs_sock_settle(s, false, nonblock ? fs_now_ns() : deadline);
			if (ret && ret != FS_PASS)
				return ret == -EAGAIN && !nonblock && !deadline ? -EIO : ret;
		}
		if (fs_sock_state(s) != FS_SOCK_OFFLOADED) {
			/* TCP; a HELLO its client may still send goes first */
			if (s->strip_hello && fs_negotiate_strip_hello(s, nonblock ? fs_now_ns() : deadline) == -EAGAIN)
				return -EAGAIN;
			return FS_PASS;
		}
	}
	if (s->pid != fs_self_pid() || fs_stream_hb(s->stream) == FS_HB_DONE)
		return fs_sock_foreign(s);
	if (flags & MSG_OOB)
		return FS_PASS; /* a peer's urgent byte came over TCP (it took the stream back there): the kernel has it, or says EINVAL */
	if (flags & ~(MSG_PEEK | MSG_WAITALL | MSG_DONTWAIT | MSG_NOSIGNAL | MSG_CMSG_CLOEXEC))
		return -EOPNOTSUPP; /* MSG_TRUNC, MSG_ERRQUEUE... have no fabric meaning */
	if (s->shut_rd)
		return 0;
	ret = fs_tcp_pass(fs_stream_recv(s->stream, msg->msg_iov, (int)msg->msg_iovlen, flags, nonblock, deadline, s->fd));
	if (ret != FS_PASS) {
		msg->msg_flags = 0;
		msg->msg_namelen = 0;
		msg->msg_controllen = 0;
	}
	return ret;
}

/* A socket in CONNECTING whose connect() finished before the service
 * thread noticed moves on now (fs_sock_connect_done). Returns false while
 * the connection is not up yet. */
static bool fs_sock_connect_advance(struct fs_sock *s)
{
	bool up;

	if (fs_sock_state(s) != FS_SOCK_CONNECTING)
		return true;
	pthread_mutex_lock(&s->lock);
	up = fs_sock_connect_done(s);
	pthread_mutex_unlock(&s->lock);
	return up;
}

bool fs_sock_writable_early(const struct fs_sock *s)
{
	enum fs_sock_state st = fs_sock_state(s);

	return st != FS_SOCK_CLIENT_PENDING && !(st == FS_SOCK_CLIENT_HELLO_SENT && s->hold_full);
}

/* A send on a socket that has not settled. A client whose connection is up
 * holds the bytes in its stream until the HELLO-ACK lets them go, like
 * TCP's send buffer: the server application need not have read yet. A
 * nonblocking send never waits for the server (it answers the HELLO on its
 * first read, which may come seconds later): -EAGAIN while the probe is
 * unanswered or the hold is full, and the socket is not reported writable
 * until it settles (fs_sock_writable_early). A blocking one waits for the
 * ACK as long as SO_SNDTIMEO allows. The server side settles as before
 * (its wait is bounded by FABSOCK_FIRST_SEND_WAIT_MS and the probe's
 * timeout). Returns bytes held (> 0), 0 when the socket is offloaded now
 * (send on its stream), FS_PASS, -EAGAIN or -errno. */
static ssize_t fs_sock_send_early(struct fs_sock *s, const struct msghdr *msg, bool nonblock)
{
	uint64_t deadline = nonblock ? fs_now_ns() : fs_deadline(s->sndtimeo_ns);
	ssize_t ret;

	if (s->shut_wr && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT)
		return -EPIPE; /* shut down before the ACK (fs_sock_shutdown_early) */
	if (!fs_sock_connect_advance(s))
		return FS_PASS; /* the kernel answers for a connection not yet up */
	if ((fs_sock_state(s) == FS_SOCK_CLIENT_PENDING || fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT) &&
	    !s->shut_wr) {
		pthread_mutex_lock(&s->lock);
		ret = 0;
		if (fs_sock_state(s) == FS_SOCK_CLIENT_PENDING)
			ret = fs_sock_send_hello(s, deadline ? deadline : UINT64_MAX);
		if (ret == FS_PASS) {
			fs_sock_release(s);
			pthread_mutex_unlock(&s->lock);
			return FS_PASS;
		}
		if (ret == 0 && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT)
			ret = s->stream ? fs_stream_send(s->stream, msg->msg_iov, (int)msg->msg_iovlen, true, 0, s->fd)
					: -EAGAIN; /* an empty HELLO: the kernel's, once the NAK is read */
		if (ret > 0 || ret == -EAGAIN)
			s->hold_full = ret == -EAGAIN;
		pthread_mutex_unlock(&s->lock);
		if (ret > 0)
			return ret;
		if (nonblock && (ret == -EAGAIN || ret == 0))
			return -EAGAIN;
	}
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED)
		return 0;
	if (!fs_sock_pending(s))
		return FS_PASS;
	return fs_sock_settle(s, true, fs_sock_state(s) == FS_SOCK_SERVER_PENDING ? 0 : deadline);
}

/* How many iovec entries a blocking send's rest may span (fs_sock_send_rest);
 * beyond them the send returns a partial count. */
#define FS_SEND_REST_IOV 64

/* A blocking send whose first DONE bytes of MSG the pre-ACK hold took: the
 * kernel's would not return before it sent everything, and programs count
 * on that (write() != len is an error to them), so send the rest where the
 * connection goes (fs_core_sendmsg waits for the ACK, bounded by
 * SO_SNDTIMEO; over TCP if it stays TCP). Returns the count sent, at least
 * DONE: an error after DONE bytes is the next call's, as the kernel's is. */
static ssize_t fs_sock_send_rest(struct fs_sock *s, const struct msghdr *msg, int flags, size_t done)
{
	struct iovec rest[FS_SEND_REST_IOV];
	struct msghdr m = *msg;
	size_t skip = done;
	ssize_t ret;
	int n = 0;

	for (size_t i = 0; i < msg->msg_iovlen && n < FS_SEND_REST_IOV; i++) {
		if (skip >= msg->msg_iov[i].iov_len) {
			skip -= msg->msg_iov[i].iov_len;
			continue;
		}
		rest[n].iov_base = (char *)msg->msg_iov[i].iov_base + skip;
		rest[n++].iov_len = msg->msg_iov[i].iov_len - skip;
		skip = 0;
	}
	if (!n)
		return (ssize_t)done;
	m.msg_iov = rest;
	m.msg_iovlen = (size_t)n;
	ret = fs_core_sendmsg(s, &m, flags | MSG_NOSIGNAL);
	if (ret == FS_PASS) {
		/* it went to TCP: the held bytes went first (fs_negotiate_abort_ex) */
		ret = fs_real.sendmsg(s->fd, &m, flags | MSG_NOSIGNAL);
	}
	return (ssize_t)done + (ret > 0 ? ret : 0);
}

ssize_t fs_core_sendmsg(struct fs_sock *s, const struct msghdr *msg, int flags)
{
	bool nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	ssize_t ret;

	if (s->strip_hello)
		s->strip_sent = true; /* a HELLO still to come is then dropped without a NAK */
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED) {
		size_t total = 0;

		ret = fs_sock_send_early(s, msg, nonblock);
		if (ret == -EPIPE && !(flags & MSG_NOSIGNAL))
			pthread_kill(pthread_self(), SIGPIPE);
		if (ret > 0 && !nonblock) {
			for (size_t i = 0; i < msg->msg_iovlen; i++)
				total += msg->msg_iov[i].iov_len;
			if ((size_t)ret < total)
				return fs_sock_send_rest(s, msg, flags, (size_t)ret);
		}
		if (ret)
			return ret;
	}
	if (s->pid != fs_self_pid() || fs_stream_hb(s->stream) == FS_HB_DONE)
		return fs_sock_foreign(s);
	if (msg->msg_controllen || (flags & MSG_OOB)) {
		/* ancillary data and urgent data have no fabric meaning: the
		 * stream goes back to TCP (descriptors passed with it go back
		 * first), then the kernel sends it, as it would have (an urgent
		 * byte sent as data would reach the peer's reader inline: telnet's
		 * Data Mark, ftp's abort) */
		fs_core_before_pass(msg);
		fs_handback_sync(s->stream, s->fd);
		return fs_sock_foreign(s);
	}
	if (s->shut_wr)
		ret = -EPIPE;
	else
		ret = fs_tcp_pass(fs_stream_send(s->stream, msg->msg_iov, (int)msg->msg_iovlen, nonblock,
						 fs_deadline(s->sndtimeo_ns), s->fd));
	if (ret == FS_PASS)
		return ret;
	if (ret == -EPIPE && !(flags & MSG_NOSIGNAL))
		pthread_kill(pthread_self(), SIGPIPE);
	return ret;
}

ssize_t fs_core_sendfile(struct fs_sock *s, int in_fd, off_t *offset, size_t count)
{
	static __thread char *chunk;
	off_t pos = offset ? *offset : lseek(in_fd, 0, SEEK_CUR);
	size_t total = 0;
	ssize_t ret = 0;

	if (fs_sock_state(s) == FS_SOCK_SERVER_PENDING) {
		ret = fs_sock_settle(s, true, 0);
		if (ret)
			return ret;
	} else {
		fs_sock_connect_advance(s);
	}
	/* a client still negotiating: the chunks go through fs_core_sendmsg,
	 * which holds them until the ACK without waiting for the server */
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED && fs_sock_state(s) != FS_SOCK_CLIENT_PENDING &&
	    fs_sock_state(s) != FS_SOCK_CLIENT_HELLO_SENT)
		return FS_PASS; /* the kernel's socket: its own sendfile */
	if (pos < 0) {
		/* A pipe cannot be read back into on a partial send. */
		FS_WARN_ONCE("sendfile from a non-seekable fd onto an offloaded socket is not supported: EINVAL");
		return -EINVAL;
	}
	if (!chunk && !(chunk = malloc(FS_SENDFILE_CHUNK)))
		return -ENOMEM;
	while (total < count) {
		size_t want = count - total < FS_SENDFILE_CHUNK ? count - total : FS_SENDFILE_CHUNK;
		ssize_t got = pread(in_fd, chunk, want, pos);
		struct iovec iov = { chunk, 0 };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

		if (got < 0 && errno == EINTR && total)
			break;
		if (got < 0) {
			ret = -errno;
			break;
		}
		if (got == 0)
			break; /* end of file */
		iov.iov_len = (size_t)got;
		ret = fs_core_sendmsg(s, &msg, 0);
		if (ret <= 0)
			break;
		total += (size_t)ret;
		pos += ret;
		if (ret < got)
			break; /* nonblocking, partial */
	}
	if (offset)
		*offset = pos;
	else if (total)
		lseek(in_fd, pos, SEEK_SET);
	return total ? (ssize_t)total : ret;
}

int fs_core_splice(struct fs_sock *s, bool out)
{
	if (fs_sock_pending(s) && fs_sock_state(s) != FS_SOCK_CONNECTING) {
		int ret = fs_sock_settle(s, out, out ? 0 : fs_now_ns());

		if (ret == -EAGAIN)
			return -EAGAIN;
		if (ret && ret != FS_PASS)
			return ret;
	}
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED)
		return FS_PASS;
	FS_WARN_ONCE("splice() on an offloaded socket is not supported (its data is not in the kernel): EINVAL; "
		     "keep such sockets on kernel TCP with FABSOCK_RULES");
	return -EINVAL;
}

/* shutdown(SHUT_WR or SHUT_RDWR) of a client before the HELLO-ACK, which
 * must not wait for the server any more than a send does (the kernel's
 * shutdown never waits): the FIN is queued behind the held bytes and goes
 * with them when the ACK comes, or as the kernel's shutdown after them if
 * the connection stays TCP (fs_negotiate_abort_ex). After an empty HELLO
 * the kernel's own shutdown follows it at once. The wait for the probe's
 * answer (if not in yet) is bounded by FABSOCK_PROBE_TIMEOUT_MS. Returns 0
 * (done), FS_PASS, -errno, or 1: not a case for here, settle first. */
static int fs_sock_shutdown_early(struct fs_sock *s, int how)
{
	int ret = 0;

	fs_sock_connect_advance(s);
	if (fs_sock_state(s) != FS_SOCK_CLIENT_PENDING && fs_sock_state(s) != FS_SOCK_CLIENT_HELLO_SENT)
		return 1;
	pthread_mutex_lock(&s->lock);
	if (fs_sock_state(s) == FS_SOCK_CLIENT_PENDING)
		ret = fs_sock_send_hello(s, UINT64_MAX);
	if (ret == FS_PASS) {
		fs_sock_release(s);
	} else if (ret == 0 && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT) {
		if (!s->stream) {
			ret = FS_PASS; /* nothing held: the NAK is read later, as usual */
		} else if (s->shut_wr || fs_stream_shutdown_wr(s->stream) == 0) {
			s->shut_wr = true;
			s->shut_rd = s->shut_rd || how == SHUT_RDWR;
		} else {
			ret = 1; /* no buffer for the FIN: settle first */
		}
	} else if (ret == 0) {
		ret = 1;
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

int fs_core_shutdown(struct fs_sock *s, int how)
{
	int ret;

	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return -EINVAL;
	if (fs_sock_pending(s) && how != SHUT_RD) {
		ret = fs_sock_shutdown_early(s, how);
		if (ret <= 0)
			return ret;
	}
	if (fs_sock_pending(s)) {
		/* Settle first, so the peer's view stays consistent. */
		ret = fs_sock_settle(s, true, 0);
		if (ret)
			return ret;
	}
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED)
		return FS_PASS;
	if (s->pid != fs_self_pid() || fs_stream_hb(s->stream) == FS_HB_DONE)
		return fs_sock_foreign(s);
	/* The kernel checks that the socket is connected and the argument. */
	if (how == SHUT_RD || how == SHUT_RDWR)
		s->shut_rd = true;
	if ((how == SHUT_WR || how == SHUT_RDWR) && !s->shut_wr) {
		s->shut_wr = true;
		if (fs_stream_shutdown_wr(s->stream) == FS_TCP)
			return FS_PASS; /* back on TCP: the kernel's own shutdown */
		fs_service_kick();
	}
	return 0;
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
	if (!s->fd_private && s->fd == fd && s->n_app_fds)
		s->fd = s->app_fds[0]; /* no private duplicate could be made */
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

	pthread_mutex_lock(&s->lock);
	if (s->bg_close && fs_sock_state(s) == FS_SOCK_CLIENT_HELLO_SENT) {
		ret = fs_sock_take_ack(s, now);
		if (ret == -EAGAIN && now < bg->deadline_ns) {
			uint64_t next = timed_out ? bg->deadline_ns : now + 1000000ull;

			/* not yet (woken with part of an ACK: again in a millisecond) */
			pthread_mutex_unlock(&s->lock);
			fs_service_watch(&bg->watch, timed_out ? s->fd : -1, POLLIN,
					 next < bg->deadline_ns ? next : bg->deadline_ns, fs_sock_bg_watch, bg);
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
static void fs_sock_bg_after_fork(void)
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

	pthread_mutex_lock(&fs_sock_bg_lock);
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
	pthread_mutex_lock(&s->lock);
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
	pthread_mutex_lock(&s->lock);
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

	pthread_mutex_lock(&s->lock);
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

int fs_core_getsockopt(struct fs_sock *s, int level, int name, void *val, socklen_t *len)
{
	if (fs_sock_state(s) == FS_SOCK_OFFLOADED && level == SOL_SOCKET && name == SO_ERROR && val && len &&
	    *len >= sizeof(int) && s->pid == fs_self_pid()) {
		int err = 0;
		struct fs_stream *st = s->stream;

		if (st && st->error && !st->error_reported) {
			err = -st->error;
			st->error_reported = true;
		}
		*(int *)val = err;
		*len = sizeof(int);
		return 0;
	}
	return FS_PASS;
}

void fs_core_setsockopt(struct fs_sock *s, int level, int name, const void *val, socklen_t len)
{
	if (level != SOL_SOCKET || !val)
		return;
	if ((name == SO_RCVTIMEO || name == SO_SNDTIMEO) && len >= sizeof(struct timeval)) {
		uint64_t ns = fs_timeout_ns(val);

		if (name == SO_RCVTIMEO)
			s->rcvtimeo_ns = ns;
		else
			s->sndtimeo_ns = ns;
	} else if (name == SO_LINGER && len >= sizeof(struct linger)) {
		const struct linger *lin = val;

		s->linger0 = lin->l_onoff && lin->l_linger == 0;
	}
}

void fs_core_set_nonblock(struct fs_sock *s, bool nonblock)
{
	s->nonblock = nonblock;
}

/* Remembered so that close() knows to look for epoll members (epoll.c
 * handles the membership itself). */
void fs_core_epoll_add(struct fs_sock *s)
{
	__atomic_store_n(&s->event_loop, true, __ATOMIC_RELEASE);
}

int fs_core_fionread(struct fs_sock *s, int *avail)
{
	size_t n;

	/* A negotiating socket may hold handshake bytes (a HELLO, an ACK) the
	 * kernel would count: settle first, without waiting. */
	if (fs_sock_pending(s) && fs_sock_state(s) != FS_SOCK_CONNECTING && fs_sock_settle(s, false, fs_now_ns()) == FS_PASS)
		return FS_PASS;
	if (fs_sock_state(s) != FS_SOCK_OFFLOADED)
		return FS_PASS;
	if (s->pid != fs_self_pid()) {
		fs_sock_foreign(s);
		return FS_PASS; /* the kernel counts from now on */
	}
	if (fs_stream_hb(s->stream) != FS_HB_NONE)
		return FS_PASS; /* what is on its way over TCP */
	n = fs_stream_readable(s->stream);
	*avail = n > INT32_MAX ? INT32_MAX : (int)n;
	return 0;
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
		fs_sock_unshare(s, &err);
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
	if (fs_core_hands_off() || !msg || !msg->msg_controllen)
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
