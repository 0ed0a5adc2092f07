/* SPDX-License-Identifier: MIT */
/*
 * Between the socket module's files: sock.c (records, state, lifecycle,
 * the handshake's driving), sock_io.c (data entry points) and sock_close.c
 * (close, dup, exit, exec). Every change of a socket's state is written in
 * sock.c; the other two call these.
 */
#ifndef FS_CORE_SOCK_INTERNAL_H
#define FS_CORE_SOCK_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "core/service.h"

struct fs_sock;

/* Client sockets waiting for their HELLO-ACK, process-wide (sock.c keeps
 * the count as states change; the exit path reads it). */
extern unsigned fs_sock_hello_sent;

/* sock.c: S leaves fabsock's hands: its state becomes KERNEL, its probe
 * and watches go. Socket lock held. */
void fs_sock_release(struct fs_sock *s);
/* sock.c: the client's handshake steps (negotiate.c's, with the state
 * change): the HELLO once the probe is answered, then the HELLO-ACK, each
 * waited for until DEADLINE_NS (0: none; now: one look). 0, FS_PASS,
 * -EAGAIN or -errno. Socket lock held. */
int fs_sock_send_hello(struct fs_sock *s, uint64_t deadline_ns);
int fs_sock_take_ack(struct fs_sock *s, uint64_t deadline_ns);
/* sock.c: a socket in CONNECTING whose connect() finished moves on (its
 * probe is sent); false while the connection is not up. Socket lock held. */
bool fs_sock_connect_done(struct fs_sock *s);

/* sock.c: a client whose handshake has put nothing on its TCP connection
 * yet (CONNECTING, CLIENT_PENDING) settles as kernel TCP now, counted in
 * fallback_kernel_io: its caller hands the socket to a path only the
 * kernel sees (POSIX AIO). True when S is the kernel's now; false when its
 * HELLO is out (or it is no client): the caller settles and hands back.
 * Takes the socket lock. */
bool fs_sock_client_to_kernel(struct fs_sock *s);

/* sock.c: takes S's lock for a service-thread watch, or, when another
 * thread holds it, queues WATCH (FN, ARG) again for a look shortly and
 * returns false: the service thread never waits for a socket. */
bool fs_sock_watch_lock(struct fs_sock *s, struct fs_watch *watch, fs_watch_fn fn, void *arg);

/* sock.c: the server application's first receive on S (SERVER_PENDING),
 * from the kernel when negotiate.c allows it (fs_negotiate_server_before_read):
 * a nonblocking one takes the bytes and returns them (>= 0) or -errno; a
 * blocking one waits in the kernel for the first byte and settles S. Or
 * FS_FIRST_READ_NO: the usual path answers the call (S may have settled
 * meanwhile, as TCP or by a HELLO that the receive took whole). */
#define FS_FIRST_READ_NO (-100001)
ssize_t fs_sock_first_read(struct fs_sock *s, struct msghdr *msg, int flags, bool nonblock);

/* sock_close.c: the process ends; bytes held for a HELLO-ACK are delivered
 * if it comes within FABSOCK_LINGER_SEC (fs_core_exit). */
void fs_sock_exit_held(void);
/* sock_close.c: a forked child forgets its parent's background closes. */
void fs_sock_bg_after_fork(void);

#endif
