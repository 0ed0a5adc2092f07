/* SPDX-License-Identifier: MIT */
/*
 * The listener side of the out-of-band capability probe.
 *
 * A fabsock listener binds the UDP port with the same number and address as
 * its TCP port, and answers ASK datagrams (probe.h is the side that asks).
 * Answers are recorded in a table in MAP_SHARED memory created at listen(),
 * so every process that inherits the listening socket (prefork workers, a
 * child forked per connection) sees them. A record ties one client TCP
 * endpoint (address, port) to a state:
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
 * The service thread (service.h) polls every listener's UDP socket, so
 * probes are answered whatever the application is doing.
 *
 * The UDP socket (the twin) lives as long as the listening socket (a short
 * grace for the probes of connections it accepted), and gives its port up
 * to the application's own bind (fs_listeners_yield); the records live as
 * long as connections hold the listener (docs/design.md, issue 26).
 */
#ifndef FS_CORE_LISTENER_H
#define FS_CORE_LISTENER_H

#include <stdbool.h>
#include <stdint.h>

struct sockaddr;

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

/* Where one connection's record sits in its listener's table, so that its
 * later lookups skip the work the first did: the key's hash (computed once)
 * and the slot it was found or made in (looked at first; a slot that no
 * longer holds the key costs the usual walk). Kept by the socket beside the
 * key it was made for (fs_sock.peer_key); all zero: nothing known. Plain
 * data under the socket's lock. */
struct fs_rec_hint {
	uint32_t hash;
	uint32_t slot;
	bool hashed;
	bool placed;
};

/* Binds the UDP twin of listening socket FD. NULL (with the reason logged
 * at info level) when it cannot: the listener then stays plain TCP. */
struct fs_listener *fs_listener_open(int fd);
void fs_listener_get(struct fs_listener *l);
void fs_listener_put(struct fs_listener *l);
/* Answers every probe waiting on the listener's UDP socket. */
void fs_listener_drain(struct fs_listener *l);
/* The application closed the listening socket: the twin goes (at once, or
 * once the connections it accepted had their probes, within 500 ms), the
 * records stay while connections hold L; drops a ref. */
void fs_listener_close(struct fs_listener *l);
/* A connection accepted from L while its twin was bound starts (MORE) or
 * ends (!MORE) waiting for its probe: a closed listener keeps its twin for
 * such connections only. */
void fs_listener_unsettled(struct fs_listener *l, bool more);
/* Whether L's twin is bound now (its connections' probes reach it). */
/* This process accepted a connection from L's socket (its listener record
 * notes a worker that runs as another user: core/records.h). */
void fs_listener_accepting(struct fs_listener *l);
bool fs_listener_has_twin(struct fs_listener *l);
/* The application binds (or bound, with SO_REUSEPORT) a UDP socket APP_FD
 * (-1: none to note) to PORT: every twin of this process on PORT lets the
 * port go, so that the application's bind succeeds and its socket is the
 * only one there. Returns how many did. Closing APP_FD lets them try again
 * (fs_listeners_fd_closed). */
int fs_listeners_yield(uint16_t port, int app_fd);
/* Whether a listener of this process, or one inherited from a parent whose
 * socket this process still holds and has accepted from (a prefork
 * worker's), listens where PEER points: its port, and its address or a
 * wildcard one. A client connected to it stays on TCP
 * (fs_sock_after_connect). */
bool fs_listeners_own(const struct sockaddr *peer);
/* Such a client, whose local address is LOCAL, is noted; the server end
 * asks whether the client at ADDR/PORT is one (it sends no HELLO). */
void fs_listeners_own_client(const struct sockaddr *local);
bool fs_listeners_is_own_client(const uint8_t addr[16], uint16_t port);
/* The application bound its UDP socket FD to PORT: closing it may free the
 * port for a twin (fs_listeners_fd_closed). */
void fs_listeners_note_udp(int fd, uint16_t port);
/* How many such sockets are noted (the close wrapper's fast look), and the
 * hook for closing an fd that is none of fabsock's. */
extern int fs_twin_displacers_n;
void fs_listeners_fd_closed(int fd);
int fs_listener_fd(struct fs_listener *l);
/* A descriptor of L's probe table that survives exec (no FD_CLOEXEC, out of
 * the application's way), for a connection accepted from L that a program
 * this process execs will negotiate (core/inherit.h); -1 if none. */
int fs_listener_exec_fd(struct fs_listener *l);
/* In that program: a listener made of the table at FD only (its own user's
 * file of the right size, else NULL). It answers no probes (the process
 * that listens does); its connections look their records up in it. */
struct fs_listener *fs_listener_attach(int fd);
/* Whether L's probes are answered without this thread's help: by this
 * process's service thread, or, for a parent's listener that a forked child
 * accepts from (nginx's and Apache's workers), by the parent's while its
 * twin is bound there and the parent lives, or by the process that took it
 * over from a parent that is gone (fs_listener_adopt) (a look at the shared table,
 * and at most every FS_ANSWERER_CHECK_NS a kill(pid, 0)). Otherwise only
 * the child's own waits answer them (fs_listener_drain). */
bool fs_listener_answered(struct fs_listener *l);
/* L was inherited (fork) and nobody answers its probes any more: the
 * process that made it is gone (a daemon: nginx's packaged `daemon on`,
 * memcached -d, slapd), its own answerer cleared or dead. This process
 * takes it over (one of those that hold it wins, by the shared table's
 * answerer): its service thread answers the probes from now on, and the
 * others' fs_listener_answered is true again. True if it did. At most
 * every FS_ANSWERER_CHECK_NS a kill(pid, 0). Nothing of L's locked. */
bool fs_listener_adopt(struct fs_listener *l);
/* The twin of L was bound or let go in this process: notes in L's private
 * table whether this process answers its probes. */
void fs_listener_note_answerer(struct fs_listener *l);
/* The socket L's probes arrive on (what fs_listener_drain reads), to poll
 * for them. */
int fs_listener_probe_fd(struct fs_listener *l);
/* The connection of ADDR/PORT is closed: forget its record. */
void fs_listener_forget(struct fs_listener *l, const uint8_t addr[16], uint16_t port, struct fs_rec_hint *hint);

/* Server side, first use of an accepted connection from ADDR/PORT (16-byte
 * v6 or v4-mapped, host-order port), accepted at ACCEPTED_NS (0: unknown).
 * If no record exists, or only one settled before ACCEPTED_NS (an earlier
 * connection's from the same client port), writes TCP. Returns the state
 * now recorded and copies the record into OUT. */
enum fs_rec_state fs_listener_claim_tcp(struct fs_listener *l, const uint8_t addr[16], uint16_t port,
					uint64_t accepted_ns, struct fs_probe_rec *out, struct fs_rec_hint *hint);
/* A settled record (TCP, DONE) older than the connection accepted at
 * ACCEPTED_NS belongs to an earlier connection from the same client port. */
bool fs_probe_rec_stale(const struct fs_probe_rec *r, uint64_t accepted_ns);
/* Whether L's table holds no record in state YES now (no lookup, no
 * lock): then no probe of a connection's client was answered yes. A "yes"
 * may come right after; the caller must find it later (the claim after
 * the first read does). */
bool fs_listener_yes_none(const struct fs_listener *l);
/* Reads the record without changing it. HINT (NULL: none) is the key's,
 * for this and later lookups (struct fs_rec_hint); so in the other calls. */
enum fs_rec_state fs_listener_lookup(struct fs_listener *l, const uint8_t addr[16], uint16_t port,
				     struct fs_probe_rec *out, struct fs_rec_hint *hint);
/* The process is ending: the kernel closes its listening sockets without
 * fabsock seeing it, so sign out of the shared probe tables (the last
 * process out removes the file). */
void fs_listeners_exit(void);
/* Moves a record from FROM to TO; returns true if it was in FROM. */
bool fs_listener_move(struct fs_listener *l, const uint8_t addr[16], uint16_t port, enum fs_rec_state from,
		      enum fs_rec_state to, struct fs_rec_hint *hint);
/* A forked child: the parent's listeners stay the parent's to answer. */
void fs_listeners_after_fork(void);

#endif
