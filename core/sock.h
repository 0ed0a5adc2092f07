/* SPDX-License-Identifier: MIT */
/*
 * fabsock's state for one application socket, and the core entry points
 * the interposer calls. Every entry point returns a value or a negative
 * errno; FS_PASS means "not fabsock's: call the real function with the
 * original arguments" (the preload layer does that, and turns negative
 * errnos into -1/errno in one helper).
 *
 * Socket state machine (all transitions in sock.c):
 *
 *   socket() --> FRESH --listen()--> LISTENING
 *                  |
 *                  +--connect() EINPROGRESS--> CONNECTING --connected--> CLIENT_PENDING
 *                  +--connect()--> CLIENT_PENDING --yes--> CLIENT_HELLO_SENT --ACK--> OFFLOADED
 *                  |                      \--probe no/timeout,     \--NAK, server spoke first--> (kernel)
 *                  |                         server spoke first--> (kernel)
 *   accept() on a LISTENING socket --> SERVER_PENDING --HELLO--> OFFLOADED
 *                                         \--plain client, bad HELLO, rule--> SERVER_PLAIN
 *   CONNECTING, CLIENT_PENDING --handed to POSIX AIO--> (kernel)   (nothing in-band sent yet)
 *
 * A server-side connection's probe record (listener.h) lives as long as the
 * connection: a late probe for it must still get "no", and a new connection
 * that reuses the client's port must not inherit the old answer. So
 * SERVER_PLAIN behaves exactly like (kernel) but keeps its entry until
 * close(), which clears the record.
 *
 * "(kernel)" means the entry leaves the fd table and the fd is the
 * application's plain kernel socket from then on, with the reason counted.
 * The server decides on first use, not in accept(), so a server that
 * accepts and then forks negotiates in the child. The client sends its
 * HELLO as soon as the probe is answered (the service thread does it), so
 * a connection opened early and used late still offloads; it reads the
 * HELLO-ACK on first use.
 *
 * Lock order: fs_sock.lock, then the engine lock (every lock: core/locks.h).
 */
#ifndef FS_CORE_SOCK_H
#define FS_CORE_SOCK_H

#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "core/history.h"
#include "core/listener.h"
#include "core/probe.h"
#include "core/service.h"
#include "core/stepback.h"

#define FS_PASS (-100000)

enum fs_sock_state {
	FS_SOCK_FRESH = 1,
	FS_SOCK_LISTENING,
	FS_SOCK_CLIENT_PENDING,
	FS_SOCK_CLIENT_HELLO_SENT,
	FS_SOCK_SERVER_PENDING,
	FS_SOCK_OFFLOADED,
	FS_SOCK_SERVER_PLAIN, /* accepted, settled as TCP: tracked only to clear its probe record at close */
	FS_SOCK_CONNECTING,   /* nonblocking connect() in progress */
	FS_SOCK_KERNEL,       /* left to the kernel; only epoll members still look at it */
};

struct fs_stream;
struct fs_listener;
struct fs_hb_page;

/* What only the handshake needs: allocated with the socket, freed when it
 * settles as offloaded or kernel (sock.c; a SERVER_PLAIN socket keeps it
 * for a HELLO it may still strip). An idle offloaded connection does not
 * carry it. Read and written under fs_sock.lock, and only in the states
 * that keep it. */
struct fs_sock_neg {
	/* server side: when accept() returned it (a probe record settled
	 * before then is an earlier connection's from the same client port) */
	uint64_t accepted_ns;
	/* the client's address as accept() returned it to the application
	 * (accepted_len 0: it passed no room): no getpeername to settle */
	struct sockaddr_storage accepted_peer;
	socklen_t accepted_len;
	/* the nonce a HELLO to strip must carry (0: any; fs_sock.strip_hello) */
	uint64_t strip_nonce;
	/* server side: a sender may leave the settling to a reader waiting in
	 * the kernel (FS_NEG_TO_READER; fs_sock_settle says so for each try,
	 * a bounded number of times), and has done so (counted once) */
	bool may_leave_to_reader, left_to_reader;
	/* client side */
	bool skip_probe;
	/* TCP first's waitless HELLO was written (tcpfirst_hs.h): no stream,
	 * the bytes go on TCP, the first receive takes the ACK */
	bool waitless;
	/* the kernel's listener for the destination, looked up before the
	 * kernel's connect(), has a record that strips a waitless HELLO */
	bool waitless_ok;
	/* taken over after exec (fs_core_adopt_ack_due): the HELLO's token
	 * died with the old program, so the ACK's is not checked */
	bool waitless_adopted;
	/* the listener records' answer looked up before the kernel's
	 * connect() (fs_sock_note_intent), for the decision after it and for
	 * a probe that times out (fs_negotiate_client_hello): an enum
	 * fs_record_hint plus one, 0: not looked up */
	unsigned char record_hint;
	unsigned provider; /* enum fs_wire_provider chosen at connect() */
	struct fs_probe_client probe;
	struct sockaddr_storage peer;
	uint64_t ack_seen_ns; /* FABSOCK_TEST_ACK_DELAY_MS: when the whole ACK was first there */
	/* server side: a sender's wait for its client's probe before it speaks
	 * first (fs_negotiate_server), kept across the calls of a nonblocking
	 * sender, which returns -EAGAIN instead of waiting: started, its end,
	 * who the client is (enum fs_client_kind) and its socket's inode */
	bool send_wait_started;
	unsigned char send_wait_kind;
	uint32_t send_client_inode;
	uint64_t send_wait_end_ns;
};

struct fs_sock {
	/* The kernel socket as fabsock uses it for its own calls: the
	 * application's fd, or, once the socket has been duplicated (dup,
	 * dup2, dup3, F_DUPFD), a private duplicate (fd_private) so that the
	 * application closing any one of its fds never pulls it away. */
	int fd;
	bool fd_private;
	/* The application's fds for this socket (dup adds, close removes);
	 * the stream closes with the last one, as a TCP socket closes with
	 * its last file reference. */
	int *app_fds;
	unsigned n_app_fds, app_fds_cap;
	int app_fds_inline[2];
	int refs;  /* atomic; 0 = free (objects are recycled, never freed) */
	pid_t pid; /* process whose engine owns the stream */
	pthread_mutex_t lock;
	enum fs_sock_state state;
	int family;
	bool nonblock;
	bool event_loop; /* added to an epoll set */
	/* epoll member records that name it (atomic; epoll.c): while one is
	 * left after fs_sock_release, its fds stay noted (fs_epoll_sock_left) */
	unsigned ep_members;
	/* fs_fds_spread when the socket was made (util.h): still its value,
	 * no other process can hold the socket's file */
	unsigned fds_spread;
	bool closed;     /* the application closed it (epoll members drop it) */
	/* closed before its HELLO-ACK: the handshake finishes in the service
	 * thread on a private duplicate (struct fs_sock_bg in sock.c) */
	bool bg_close;
	bool linger0;
	/* TCP_CORK as the last setsockopt that reached the kernel socket set it
	 * (one the stream kept did not: fs_stream_set_cork) */
	bool cork_kernel;
	/* A server connection left to TCP whose client may still send a HELLO
	 * (told yes by a probe this side cannot see, or told yes and late):
	 * the first receive strips it (fs_negotiate_strip_hello; the nonce is
	 * neg->strip_nonce). strip_sent: this side already sent, so no NAK. */
	bool strip_hello, strip_sent;
	bool shut_rd, shut_wr;
	/* A client before the HELLO-ACK whose stream could hold no more of
	 * what the application wrote: not writable until it settles
	 * (fs_sock_writable_early). */
	bool hold_full;
	/* A server connection whose nonblocking send returned -EAGAIN while
	 * it waited for its client's probe or HELLO (atomic): not writable
	 * while it stays SERVER_PENDING (fs_sock_writable_early), and the
	 * waits of poll and epoll settle it for the sender when the wait is
	 * over (fs_sock_settle_owed), so that the writability the kernel
	 * reported before the EAGAIN is reported again, to an edge-triggered
	 * waiter too. */
	bool send_owed;
	uint64_t rcvtimeo_ns, sndtimeo_ns;
	/* A receive error recvmmsg() met after it had messages to return:
	 * the next receive reports it (negative errno; atomic), as the
	 * kernel keeps it in sk_err. */
	int rx_deferred_error;

	struct fs_sock_neg *neg; /* while negotiating (above) */
	/* client: the service thread's watches: a nonblocking connect()
	 * finishing, then the handshake (probe answer, HELLO-ACK) */
	struct fs_watch connect_watch, client_watch;
	uint64_t token;
	/* client: its connection history (core/history.h): whether it chose
	 * TCP; an offloaded one reports sb's totals at its close */
	struct fs_history_conn hist;
	/* offloaded: its turns and bytes, counted once per data call for the
	 * step-back (whether the fabric pays for its turns) and the history
	 * (core/stepback.h) */
	struct fs_stepback sb;

	/* listener, and accepted connections (the listener they came from) */
	struct fs_listener *listener;
	uint16_t local_port;
	uint8_t peer_key[16]; /* server side: the client's address and port, */
	uint16_t peer_port;   /* the key of the probe record */
	bool have_peer_key;
	struct fs_rec_hint rec_hint; /* the key's, in the listener's table */
	/* fs_negotiate_server_before_read said the first receive may go to
	 * the kernel, and a receive after it with bytes in need not ask the
	 * table again: a "yes" given since is found by the claim after the
	 * read, as one given during the read is */
	bool direct_ok;
	/* accepted while the listener's twin was bound, and still waiting
	 * for its probe: counted in fs_listener_unsettled (atomic) */
	bool unsettled;
	/* accepted from a loopback client by a listener that may turn plain:
	 * how it settles counts in the listener's streak (core/plain.h) */
	bool plain_note;
	/* server side: threads waiting in the kernel for the first byte
	 * (fs_sock_first_read, not under the lock); while there are, no other
	 * thread offloads the connection (its reads would then wait on an
	 * idle TCP connection): a HELLO is refused, and the client's bytes
	 * follow on TCP. Under fs_sock.lock. */
	unsigned direct_readers;
	pid_t direct_pid; /* their process (a forked child's copy counts none) */

	struct fs_stream *stream;
	/* For a process forked after the offload (handback.h): the owner's
	 * request page and eventfd, and the stream's id there. */
	struct fs_hb_page *hb_page;
	int hb_evfd;
	uint32_t hb_stream_id;
	struct fs_sock *free_next;
};

/* The state is read without the socket lock on fast paths (is this socket
 * offloaded yet?), so it is read and written atomically; transitions still
 * happen under fs_sock.lock. */
static inline enum fs_sock_state fs_sock_state(const struct fs_sock *s)
{
	return __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
}

/* S is an accepted connection still waiting for its client's probe: its
 * listener's waiting probes are answered now, by this thread (the service
 * thread may be starved on a busy host). SKIP: a listener already drained
 * in this round; returns the one drained (or SKIP), for the next call. */
const void *fs_sock_drain_probes(struct fs_sock *s, const void *skip);
/* fs_sock_drain_probes' SKIP that skips every listener: a wait that polled
 * their probe sockets just now and found nothing there. */
#define FS_SOCK_DRAIN_NONE ((const void *)1)
/* What a waiter that sleeps in the kernel for S (SERVER_PENDING) must watch
 * so that fs_sock_drain_probes still helps in time: returns the probe socket
 * of S's listener to poll beside its wait (-1: none now), and lowers
 * *DRAIN_AT (0: none yet) to the time from which it should, when that is
 * later than NOW. */
int fs_sock_probe_watch(struct fs_sock *s, uint64_t now, uint64_t *drain_at);
/* S (SERVER_PENDING) owes a nonblocking sender its writability
 * (fs_sock.send_owed): settles it for that sender now, without waiting (a
 * -EAGAIN leaves it owed), so that a poll or epoll wait reports the
 * writability once the sender's wait is over. Returns whether it was owed.
 * Called by those waits for each pending socket they look at; a sleeping
 * wait looks again within 10 ms (fs_sock_probe_watch's *DRAIN_AT). */
bool fs_sock_settle_owed(struct fs_sock *s);

void fs_core_init(void);
extern bool fs_core_enabled;
/* True when fabsock must leave a call that creates, closes or duplicates
 * descriptors to the kernel untouched: fabsock's own calls (the guard),
 * fabsock disabled, or a vfork child, whose descriptor table is its own
 * while every table of fabsock's is its parent's (fs_vfork_child). */
bool fs_core_hands_off(void);
/* The process's effective user changed (setuid and friends). */
void fs_core_uid_changed(void);

/* Takes a reference on FD's state; NULL when fabsock has none (or inside
 * fabsock). */
struct fs_sock *fs_sock_get(int fd);
/* Takes another reference on S (which the caller holds one on). */
void fs_sock_ref(struct fs_sock *s);
void fs_sock_put(struct fs_sock *s);

/* Hooks around the real calls. */
void fs_core_socket(int fd, int domain, int type);
int fs_core_connect(struct fs_sock *s, const struct sockaddr *addr, socklen_t len);
int fs_core_listen(struct fs_sock *s, int backlog);
/* After a real accept on listening S returned NEWFD. SPREAD: fs_fds_spread
 * read before that accept (core/plain.h). */
void fs_core_accepted(struct fs_sock *s, int newfd, int flags, const struct sockaddr *addr, const socklen_t *len,
		      socklen_t room, unsigned spread);
ssize_t fs_core_recvmsg(struct fs_sock *s, struct msghdr *msg, int flags);
ssize_t fs_core_sendmsg(struct fs_sock *s, const struct msghdr *msg, int flags);
/* recvmmsg: ERR (not -EAGAIN) ended a batch that had messages already;
 * the next receive on S returns it. */
void fs_core_recv_defer_error(struct fs_sock *s, int err);
/* The application closes FD, one of S's fds. */
int fs_core_close(struct fs_sock *s, int fd);
/* FD (S's) was duplicated to NEWFD by the real call. Returns 0 or -ENOMEM
 * (the caller then closes NEWFD and fails the call). */
int fs_core_dup(struct fs_sock *s, int newfd);
/* The real dup2/dup3 is about to replace NEWFD: let go of whatever
 * fabsock had there, as close() would, without closing it. */
void fs_core_dup_target(int newfd);
bool fs_sock_has_fd(struct fs_sock *s, int fd);
int fs_core_shutdown(struct fs_sock *s, int how);
/* sendfile() onto S: COUNT bytes of IN_FD (a seekable file) from *OFFSET,
 * or from its file position when OFFSET is NULL (which then moves). */
ssize_t fs_core_sendfile(struct fs_sock *s, int in_fd, off_t *offset, size_t count);
/* splice() between S and the pipe PIPE_FD: from S into the pipe, or (OUT)
 * from the pipe onto S, at most LEN bytes; FLAGS are splice's. FS_PASS for
 * the kernel's splice: S is the kernel's, or the call is a misuse the
 * kernel refuses before it moves a byte (PIPE_FD no pipe, or not open for
 * the direction), with its own errno. */
ssize_t fs_core_splice(struct fs_sock *s, int pipe_fd, bool out, size_t len, unsigned flags);
/* A call that reaches the kernel socket past fabsock (POSIX AIO): S goes
 * back to TCP first, as for urgent data (a socket still negotiating settles
 * first; a client whose HELLO is not out yet, connecting or waiting for its
 * probe's answer, stays on TCP at once). FS_PASS (the kernel socket has
 * every byte now), or -errno. */
int fs_core_to_kernel(struct fs_sock *s);
int fs_core_getsockopt(struct fs_sock *s, int level, int name, void *val, socklen_t *len);
void fs_core_setsockopt(struct fs_sock *s, int level, int name, const void *val, socklen_t len);
/* Before the kernel sees a setsockopt: true if fabsock took it instead (a
 * TCP_CORK on an offloaded socket of this process: the stream keeps it and
 * the kernel socket is told when the stream goes back to it; nginx sets it
 * and clears it around every answer, two system calls), and the caller
 * returns 0. */
bool fs_core_setsockopt_kept(struct fs_sock *s, int level, int name, const void *val, socklen_t len);
void fs_core_set_nonblock(struct fs_sock *s, bool nonblock);
void fs_core_epoll_add(struct fs_sock *s);
int fs_core_fionread(struct fs_sock *s, int *avail);

/* Readiness: poll() and select() over any mix of fds. */
/* TIMEOUT_NS < 0: no timeout. SIGMASK (may be NULL) is in force while
 * waiting, as for ppoll/pselect. */
int fs_core_poll(struct pollfd *fds, nfds_t nfds, int64_t timeout_ns, const sigset_t *sigmask);
int fs_core_select(int nfds, fd_set *r, fd_set *w, fd_set *x, int64_t timeout_ns, const sigset_t *sigmask);

/* The process is ending (exit(), return from main, _exit(), a fatal signal
 * with its default action): every offloaded stream delivers what the
 * application wrote, then its FIN, within FABSOCK_LINGER_SEC, as the kernel
 * delivers a dead process's socket buffers; then the rails close and the
 * shared probe tables are left. Once per process. */
void fs_core_exit(void);
/* After exec: takes FD over as a listener (LISTENING) or as an accepted
 * connection not yet used (inherited), whose probe record is in FROM's
 * table (fs_listener_attach; NULL: none). See inherit.h. */
void fs_core_adopt(int fd, bool listening, struct fs_listener *from);
/* After exec: takes FD over as TCP first's waitless client still owed the
 * server's ACK (inherit.h FS_INH_ACK_DUE): its first receive takes it. */
void fs_core_adopt_ack_due(int fd);
/* Records S's state for each of its fds in the exec records. */
void fs_sock_note_inherit(struct fs_sock *s);

/* An offloaded socket that this process cannot use as such any more: its
 * stream is back on TCP (handback.h), or it belongs to the process that
 * offloaded it before this one was forked (which is asked to hand it back).
 * Lets go of it: from then on it is the kernel's here. Returns true when it
 * did (the caller treats the socket as a kernel one), with *ERR set to a
 * negative errno when the hand-back failed. */
bool fs_sock_unshare(struct fs_sock *s, int *err);
/* S (a client whose history follows it) has a stream its peer started to
 * hand back: its history counts a step-back (history.h). Any lock. */
void fs_sock_peer_handback_learnt(struct fs_sock *s);
/* True when S (offloaded) is such a socket. */
bool fs_sock_must_unshare(const struct fs_sock *s);
/* Before exec() (or a spawn, SPAWN: only what the child inherits): every
 * offloaded socket that survives into the new program goes back to TCP, as
 * does every one this process owns (its stream dies with the program). */
void fs_core_before_exec(bool spawn);
/* The exec after fs_core_before_exec returned (failed): what it made for
 * the new program goes. */
void fs_core_exec_failed(void);
/* Before descriptors are passed with SCM_RIGHTS in MSG: offloaded ones go
 * back to TCP, so the receiving process gets a plain kernel socket. */
void fs_core_before_pass(const struct msghdr *msg);

/* Whether S's first receive will take its client's first bytes straight
 * from the kernel and settle it (fs_sock_first_read): a readiness wait
 * then reports the kernel's event and leaves the settling to that receive
 * (no settling in the wait: no extra round). No system call. */
bool fs_sock_read_direct(struct fs_sock *s);
/* Threads of this process waiting in the kernel for S's first byte
 * (fs_sock.direct_readers). Socket lock held. */
unsigned fs_sock_direct_readers(const struct fs_sock *s);
/* Settles a pending socket (readiness.c uses it). See sock.c. */
int fs_sock_settle(struct fs_sock *s, bool for_send, uint64_t deadline_ns);
bool fs_sock_pending(const struct fs_sock *s);
/* Whether a socket still negotiating may report itself writable: not a
 * client that cannot take bytes yet (no HELLO sent, or its hold full), nor
 * a server connection whose nonblocking sender waits for its client's
 * probe or HELLO (fs_sock.send_owed), so that a nonblocking writer is not
 * invited to spin on EAGAIN. */
bool fs_sock_writable_early(const struct fs_sock *s);

#endif
