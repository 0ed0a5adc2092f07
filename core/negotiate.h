/* SPDX-License-Identifier: MIT */
/*
 * The in-band handshake that moves a TCP connection onto the fabric, run
 * on first use of the connection (see sock.h for when). Each step returns
 * an outcome and leaves the socket's state alone (sock.c alone changes it):
 * 0 when the step succeeded (the HELLO is sent; the stream is connected
 * and the socket may be offloaded), FS_PASS when it stays on kernel TCP
 * (the reason counted and logged), -EAGAIN when the answer is not in by
 * DEADLINE, or another negative errno if the connection broke. Called
 * with the socket's lock held.
 */
#ifndef FS_CORE_NEGOTIATE_H
#define FS_CORE_NEGOTIATE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

struct fs_sock;

/* Client phase 1 (probe answer, HELLO) and phase 2 (HELLO-ACK). Phase 1
 * returns -EAGAIN if the probe is unanswered at WAIT_DEADLINE_NS (0: none). */
int fs_negotiate_client_hello(struct fs_sock *s, uint64_t wait_deadline_ns);
int fs_negotiate_client_ack(struct fs_sock *s, uint64_t deadline_ns);
void fs_negotiate_abort(struct fs_sock *s);
void fs_negotiate_abort_ex(struct fs_sock *s, bool to_tcp);
/* FOR_SEND: the server application wants to send first. DEADLINE_NS 0
 * waits as long as needed for the client to speak. FS_NEG_TO_READER (a
 * sender only, when fs_sock_neg.may_leave_to_reader allows it): a "yes"
 * came and a reader of the application waits in the kernel for the first
 * byte (fs_sock.direct_readers); nothing was settled or taken, and the
 * caller waits, without the lock, for that reader to settle S (the HELLO
 * ends its peek), up to the HELLO wait (fs_negotiate_server_hello_by). */
#define FS_NEG_TO_READER (-100003)
int fs_negotiate_server(struct fs_sock *s, bool for_send, uint64_t deadline_ns);

/* The server application's first receive straight from the kernel
 * (negotiate.c says when and why). Before it: 1 if it may (no probe
 * record of the client yet), 0 if fs_negotiate_server must settle S first.
 * BYTES_IN: the client's bytes (or its end) are in, or the receive will
 * not wait for them: a client that waits for a probe's answer has sent
 * none, so it need not be known that someone answers S's probes.
 * After it took N > 0 bytes, the first of which are FIRST (up to
 * FS_WIRE_HELLO_MAX of them): FS_PASS, TCP and the bytes the application's;
 * 0, offloaded by a HELLO at their head; -errno; *TAKEN is how many of
 * the N were the HELLO's. Socket lock held, S SERVER_PENDING. */
int fs_negotiate_server_before_read(struct fs_sock *s, bool bytes_in);
/* After a peek saw the client's first byte (CLOSED: its FIN) with no record
 * before: claims the record TCP; FS_PASS (TCP) or 0 (a "yes" beat it). */
int fs_negotiate_server_claim(struct fs_sock *s, bool closed);
/* When S's client, told "yes", must have sent its HELLO by (the server's
 * HELLO wait); 0 without a "yes". */
uint64_t fs_negotiate_server_hello_by(struct fs_sock *s);
int fs_negotiate_server_after_read(struct fs_sock *s, const uint8_t *first, size_t n, size_t *taken);

/* TCP first's waitless HELLO at the head of S's connection (tcpfirst_hs.h;
 * FIRST, N: what the application's receive took already, as
 * fs_negotiate_server_after_read's): taken and answered, FS_PASS (TCP;
 * *TAKEN of the N were the HELLO's; TAKEN may be NULL when N is 0); else
 * 0, nothing taken. Socket lock held, S SERVER_PENDING. */
int fs_negotiate_server_waitless(struct fs_sock *s, const uint8_t *first, size_t n, size_t *taken);

/* Provider for a client connection from LOCAL to PEER, or FS_PROV_NONE with
 * the fallback counter to bump in *REASON (an offset into fs_stats). */
unsigned fs_negotiate_pick_provider(const struct sockaddr *local, const struct sockaddr *peer,
				    const char **why);
/* Whether the 16-byte address key A (fs_sockaddr_key) is a loopback address
 * (::1, or 127.0.0.0/8 as v4-mapped): on this host whatever the local one. */
bool fs_negotiate_loopback(const uint8_t a[16]);

/* A server connection left to TCP while its client may still send a HELLO
 * (s->strip_hello): waits for the first bytes until DEADLINE_NS (0: as the
 * application would, without limit); a complete HELLO at the head (with
 * s->strip_nonce unless 0) is consumed and refused with a NAK unless this
 * side already sent. Returns 1 (stripped), 0 (the bytes are the
 * application's, or the peer closed), -EAGAIN (nothing yet). */
int fs_negotiate_strip_hello(struct fs_sock *s, uint64_t deadline_ns);

#endif
