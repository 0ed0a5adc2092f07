/* SPDX-License-Identifier: MIT */
/*
 * The out-of-band capability probe, both sides, and the service thread.
 *
 * Listener side: a fabsock listener binds the UDP port with the same number
 * and address as its TCP port, and answers ASK datagrams. Answers are
 * recorded in a table in MAP_SHARED memory created at listen(), so every
 * process that inherits the listening socket (prefork workers, a child
 * forked per connection) sees them. A record ties one client TCP endpoint
 * (address, port) to a state:
 *
 *     (none) --probe--> YES --HELLO ok--> DONE
 *        \                \--no HELLO in time / bad HELLO--> TCP
 *         \--server used the connection first (banner, data)--> TCP
 *
 * YES is only ever given while no record says TCP, and TCP is only ever
 * written over no record or over YES once the client can no longer send a
 * HELLO: so a plain client is never answered yes, and a fabsock client that
 * got yes always finds the server waiting for its HELLO.
 *
 * Client side: fs_probe_start() sends the ASK right after connect() and
 * fs_probe_result() collects the answer on first use, bounded by
 * FABSOCK_PROBE_TIMEOUT_MS; "no", a timeout or ICMP port unreachable mean
 * plain TCP, and the destination is remembered as such for
 * FABSOCK_NEG_CACHE_SEC (negcache.h).
 *
 * The service thread answers probes whatever the application is doing, and
 * keeps the engine moving (queued sends waiting for credit, closing streams)
 * while no application thread is inside fabsock.
 */
#ifndef FS_CORE_PROBE_H
#define FS_CORE_PROBE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/wire.h"

enum fs_rec_state { FS_REC_NONE = 0, FS_REC_YES = 1, FS_REC_TCP = 2, FS_REC_DONE = 3 };

struct fs_probe_rec {
	uint32_t state;
	uint32_t wait_ms;  /* the client's probe timeout */
	uint64_t nonce;
	uint64_t stamp_ns; /* CLOCK_MONOTONIC when the state was set */
	uint8_t addr[16];
	uint16_t port;
	/* the inode of the client's socket, when its end is on this host
	 * (sock_diag when the probe came); 0: unknown */
	uint32_t client_inode;
};

struct fs_listener;

/* Binds the UDP twin of listening socket FD. NULL (with the reason logged
 * at info level) when it cannot: the listener then stays plain TCP. */
struct fs_listener *fs_listener_open(int fd);
void fs_listener_get(struct fs_listener *l);
void fs_listener_put(struct fs_listener *l);
/* Answers every probe waiting on the listener's UDP socket. */
void fs_listener_drain(struct fs_listener *l);
/* The application closed the listening socket: stop answering, drop a ref. */
void fs_listener_close(struct fs_listener *l);
int fs_listener_fd(struct fs_listener *l);
/* A descriptor of L's probe table that survives exec (no FD_CLOEXEC, out of
 * the application's way), for a connection accepted from L that a program
 * this process execs will negotiate (core/inherit.h); -1 if none. */
int fs_listener_exec_fd(struct fs_listener *l);
/* In that program: a listener made of the table at FD only (its own user's
 * file of the right size, else NULL). It answers no probes (the process
 * that listens does); its connections look their records up in it. */
struct fs_listener *fs_listener_attach(int fd);
/* The connection of ADDR/PORT is closed: forget its record. */
void fs_listener_forget(struct fs_listener *l, const uint8_t addr[16], uint16_t port);

/* Server side, first use of an accepted connection from ADDR/PORT (16-byte
 * v6 or v4-mapped, host-order port), accepted at ACCEPTED_NS (0: unknown).
 * If no record exists, or only one settled before ACCEPTED_NS (an earlier
 * connection's from the same client port), writes TCP. Returns the state
 * now recorded and copies the record into OUT. */
enum fs_rec_state fs_listener_claim_tcp(struct fs_listener *l, const uint8_t addr[16], uint16_t port,
					uint64_t accepted_ns, struct fs_probe_rec *out);
/* A settled record (TCP, DONE) older than the connection accepted at
 * ACCEPTED_NS belongs to an earlier connection from the same client port. */
bool fs_probe_rec_stale(const struct fs_probe_rec *r, uint64_t accepted_ns);
/* Reads the record without changing it. */
enum fs_rec_state fs_listener_lookup(struct fs_listener *l, const uint8_t addr[16], uint16_t port,
				     struct fs_probe_rec *out);
/* The process is ending: the kernel closes its listening sockets without
 * fabsock seeing it, so sign out of the shared probe tables (the last
 * process out removes the file). */
void fs_listeners_exit(void);
/* Moves a record from FROM to TO; returns true if it was in FROM. */
bool fs_listener_move(struct fs_listener *l, const uint8_t addr[16], uint16_t port, enum fs_rec_state from,
		      enum fs_rec_state to);

/* Client side. */
enum fs_probe_outcome {
	FS_PROBE_PENDING = 0,
	FS_PROBE_OUT_YES,
	FS_PROBE_OUT_NO,
	FS_PROBE_OUT_TIMEOUT,
	FS_PROBE_OUT_REFUSED,
};

struct fs_probe_client {
	int udp_fd;
	uint64_t nonce;
	uint64_t deadline_ns;      /* CLOCK_MONOTONIC */
	uint64_t deadline_real_ns; /* the same in CLOCK_REALTIME, for arrival stamps */
	uint8_t pkt[FS_WIRE_PROBE_LEN]; /* the ASK, sent again while no answer comes */
	unsigned resends;
	uint64_t resend_ns;             /* CLOCK_MONOTONIC: when to send it again */
};

/* Sends the ASK for TCP socket FD connected to PEER. Returns 0 or -errno. */
int fs_probe_start(struct fs_probe_client *pc, int fd, const struct sockaddr *peer);
/* Waits until an answer or DEADLINE (absolute CLOCK_MONOTONIC ns, 0 = poll
 * once) while also watching TCP socket FD for incoming bytes: *TCP_READABLE
 * is set if the server spoke first. Closes the UDP socket once final. */
enum fs_probe_outcome fs_probe_result(struct fs_probe_client *pc, int fd, uint64_t deadline_ns,
				      bool *tcp_readable);
void fs_probe_cancel(struct fs_probe_client *pc);

/* The inode of the socket at the other end of the TCP connection FD, if
 * that end lives in this network namespace: one exact sock_diag lookup.
 * 1: found (*INODE set; 0 when no descriptor holds it any more), 0: no
 * such socket, -1: cannot tell. */
int fs_conn_peer_inode(int fd, uint32_t *inode);

/* Wakes the service thread (e.g. queued sends appeared); starts it if
 * needed. */
void fs_service_kick(void);
/* Has the service thread look within FS_SERVICE_SOON_NS, without waking it
 * now: for work that is not urgent (a closed stream waiting for its FIN's
 * completion or the peer's FIN), so that a connection's close does not pay
 * for a thread wake-up on its critical path. Requests coalesce. */
#define FS_SERVICE_SOON_NS 1000000L
void fs_service_kick_soon(void);

/* One-shot watch: the service thread calls FN(ARG, timed_out) once FD
 * reports one of EVENTS (POLLIN, POLLOUT) or DEADLINE_NS (CLOCK_MONOTONIC)
 * has passed. The watch lives in its owner (a socket has one per kind), so
 * queueing one cannot fail however many are pending: it must not be queued
 * twice at once, and its owner must outlive it (hold a reference until FN).
 * FN may queue the same watch again. FD -1 is a timer. */
typedef void (*fs_watch_fn)(void *arg, bool timed_out);
struct fs_watch {
	int fd;
	short events;
	bool ready;  /* the service thread's poll saw EVENTS */
	bool queued; /* on the service thread's list (fs_service_lock) */
	uint64_t deadline_ns;
	fs_watch_fn fn;
	void *arg;
	struct fs_watch *next, *prev;
};
/* The application closed the descriptor W polls: if W is queued, it fires
 * (timed out) at the service thread's next round, which starts at once.
 * Otherwise that thread's poll would keep the closed socket's file open -
 * its FIN waits until the poll ends, up to the watch's deadline - and its
 * next round would poll whatever file took the number. Returns whether W
 * was queued. */
bool fs_service_watch_expire(struct fs_watch *w);
void fs_service_watch(struct fs_watch *w, int fd, short events, uint64_t deadline_ns, fs_watch_fn fn, void *arg);
/* The same, looked at within FS_SERVICE_SOON_NS instead of at once: for a
 * watch that is only a safety net (the application's own next call on the
 * socket usually finishes the work first), so that queueing it costs no
 * thread wake-up. */
void fs_service_watch_soon(struct fs_watch *w, int fd, short events, uint64_t deadline_ns, fs_watch_fn fn,
			   void *arg);
/* pthread_atfork's prepare and parent handlers: a fork waits (bounded)
 * until the service thread is asleep in poll, holding no lock. */
void fs_service_fork_prepare(void);
void fs_service_fork_parent(void);
void fs_service_after_fork(void);
/* From a signal handler that is about to let the process die: has the
 * service thread run fs_core_exit() and waits for it, at most
 * FABSOCK_LINGER_SEC and a second (async-signal-safe in this thread). */
void fs_service_exit(void);

#endif
