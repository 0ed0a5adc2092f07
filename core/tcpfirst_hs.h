/* SPDX-License-Identifier: MIT */
/*
 * TCP first's handshake that waits for nothing (FABSOCK_TCP_FIRST=1 with
 * FABSOCK_TCP_FIRST_WAITLESS=1; docs/design.md "TCP first: the switch to
 * the fabric", "The waitless handshake"), on one host:
 *   client  connect() up, the kernel names the listening socket, and this
 *           user's listener record for that very socket says it offloads
 *           us and strips a waitless HELLO -> the HELLO (flag TCP_FIRST,
 *           no fabric address, no probe nonce) written as the socket's
 *           first bytes, nothing waited for; the application's bytes
 *           follow on TCP at once; its first receive takes the server's
 *           ACK off the head of the stream (or finds the server's own
 *           bytes: the server stays plain and strips the HELLO).
 *   server  at first use, a waitless HELLO at the head of the stream whose
 *           client socket the kernel says is ours (sock_diag: same user,
 *           this host) -> consumed, the ACK (flag, no address) written as
 *           the connection's first bytes -> TCP. Not proved, or not a
 *           HELLO: the bytes are the application's.
 * Built: the handshake; the connection then stays on TCP for good (no
 * rail, no probe: OPEN/OPENED and the switch after it are not built).
 * No lock of fabsock's is taken here; the callers hold the socket's.
 */
#ifndef FS_CORE_TCPFIRST_HS_H
#define FS_CORE_TCPFIRST_HS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct fs_hello;

/* Client: whether the connection FD, about to connect to PEER (on this
 * host: loopback or an address of ours), may carry a waitless HELLO. A
 * sock_diag lookup and a record read: the kernel's listener for PEER, and
 * its record. Asked before the kernel's connect(), while the listener
 * that will accept it listens. */
bool fs_tfhs_client_may(int fd, const struct sockaddr *peer);
/* Client: a fresh token for a connection (no system call as a rule). */
uint64_t fs_tfhs_token(void);
/* Client: fills HELLO (zeroed by the caller) as the waitless one, for the
 * connection FD to PEER, with TOKEN and its MAC. */
void fs_tfhs_client_fill(struct fs_hello *hello, int fd, uint64_t token, const struct sockaddr *peer);
/* Client: whether ACK answers a waitless HELLO as a waitless server does. */
bool fs_tfhs_ack_agrees(const struct fs_hello *ack);
/* Whether a decoded HELLO is a waitless one (no probe, no address). */
bool fs_tfhs_is_waitless(const struct fs_hello *hello);

/* Server: looks at the head of the connection FD, whose first N_FIRST
 * bytes the application's receive took already (FIRST; 0: none, all in
 * the kernel), with nonblocking peeks; the rest of a HELLO whose start is
 * there is waited for up to FABSOCK_HELLO_TIMEOUT_MS. A waitless HELLO of
 * a client the kernel proves ours is consumed (*TAKEN: how many of the
 * N_FIRST were its) and answered with the ACK: returns 1. Returns 0 when
 * the head is no such HELLO (the bytes are the application's; nothing
 * consumed), -errno when the connection broke. */
int fs_tfhs_server_take(int fd, const uint8_t *first, size_t n_first, size_t *taken);

#endif
