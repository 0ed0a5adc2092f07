/* SPDX-License-Identifier: MIT */
/*
 * Handing an offloaded stream back to its kernel TCP connection, at a byte
 * boundary both ends agree on. With the kernel, a socket is a file: a forked
 * child, a program exec'd with it, a process it was passed to (SCM_RIGHTS)
 * all use the same connection. An offloaded stream lives in one process's
 * memory (buffers, endpoint, sequence numbers); no other process can use
 * it. So when another process needs the socket, the stream goes back to TCP
 * and every process then uses the kernel socket, byte-exact:
 *  - a process forked after the offload uses the socket (rsync's client, the
 *    privilege-separated children of sshd): it asks the owner through a page
 *    both share (mapped before the fork) and waits for the hand-back;
 *  - the owner exec()s with the socket open (no FD_CLOEXEC), spawns a child
 *    that inherits it, or passes it with SCM_RIGHTS: it hands back first;
 *  - the owner closes it or exits while a child forked after the offload
 *    may still hold it: it hands back instead of sending a FIN.
 *
 * Protocol (three data-class messages, sequence-numbered and credited like
 * data, so they keep their place in the stream):
 *   SWITCH      "after this, my bytes come over TCP"
 *   RETURN      bytes you sent me that my reader will not read: write them
 *               to TCP before anything else of yours
 *   RETURN_END  "no more RETURN"
 * The side that starts (the initiator) freezes its reader: from now on its
 * application reads the kernel socket. It queues SWITCH behind the data it
 * already queued, then sends back as RETURN every byte its reader had not
 * read, and every byte still arriving until the peer's SWITCH, then
 * RETURN_END. The other side (the responder), on the initiator's SWITCH,
 * queues its own SWITCH and at once RETURN_END (its reader goes on reading
 * the fabric up to the initiator's SWITCH, so it has nothing to return).
 * Each side writes to its kernel socket, in this order: the RETURN bytes it
 * receives (its own bytes, unread by the peer), then what its application
 * wrote after its SWITCH (held until the peer's RETURN_END says no RETURN
 * is left); after that its application writes the kernel socket itself. A
 * reader reads the fabric until the peer's SWITCH, then the kernel socket.
 * So each direction's TCP bytes start exactly where the fabric bytes ended.
 * Both sides may start at once: both are then initiators, and the same
 * rules hold. A FIN sent before the SWITCH becomes shutdown(SHUT_WR) of the
 * kernel socket at the end.
 *
 * When both directions are on TCP and the last messages are delivered, the
 * stream's resources go and the socket is a plain kernel socket in every
 * process (fs_handback_done).
 */
#ifndef FS_CORE_HANDBACK_H
#define FS_CORE_HANDBACK_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

struct fs_engine;
struct fs_stream;
struct fs_sock;

enum fs_hb_state {
	FS_HB_NONE = 0,
	FS_HB_SWITCHING = 1, /* SWITCH queued or received: on the way back to TCP */
	FS_HB_DONE = 2,      /* on TCP in both directions; the stream's resources are gone */
};

/* "Use the kernel socket for this call": the stream's reader or writer is
 * on TCP now. Core entry points turn it into FS_PASS (the real call). */
#define FS_TCP (-100001)

/* ---- the owner's side (engine lock held) ---------------------------------- */

/* Starts the hand-back of S as initiator (its reader freezes). FD is the
 * kernel socket; a private duplicate is taken. Returns 0 or -errno. */
int fs_handback_start(struct fs_engine *e, struct fs_stream *s, int fd);
/* The peer's SWITCH was delivered on S: respond (or, as initiator, stop
 * returning after it). */
void fs_handback_peer_switch(struct fs_engine *e, struct fs_stream *s);
/* One round of every stream on its way back: returns, TCP writes, the end.
 * Called by fs_engine_progress. */
void fs_handback_progress(struct fs_engine *e);
/* True when S's writer writes the kernel socket itself (nothing of ours is
 * left to go before its bytes). */
bool fs_handback_tx_tcp(const struct fs_stream *s);
/* Copies up to LEN bytes into S's held output (behind what must go first).
 * Returns bytes taken (0: full). */
size_t fs_handback_hold(struct fs_engine *e, struct fs_stream *s, const struct iovec *iov, int iovcnt, size_t done,
			size_t total);
/* poll() events of S on its way back: the fabric's before the SWITCH, the
 * kernel socket's after. */
unsigned fs_handback_events(struct fs_stream *s);
/* The fds the service thread must watch for POLLOUT (TCP writes that got
 * EAGAIN): fills up to MAX, returns how many. */
unsigned fs_handback_blocked_fds(struct fs_engine *e, int *fds, unsigned max);

/* Hands S back synchronously and waits (bounded by FABSOCK_LINGER_SEC)
 * until its writer is on TCP and its last messages are delivered: before
 * exec, a spawn, SCM_RIGHTS, or instead of a FIN at close or exit. No locks
 * held. Returns 0, or -errno (the peer did not answer in time: the stream
 * is then shut down). */
int fs_handback_sync(struct fs_stream *s, int fd);

/* ---- requests from other processes ------------------------------------------ */

/* Engine creation: the page that processes forked later share with this
 * one, and the eventfd that rings its service thread. */
int fs_handback_page_create(struct fs_engine *e);
/* The owner's end is handled (exit, or an exec under way: ENDED), or the
 * exec failed (!ENDED): processes forked earlier stop asking. */
void fs_handback_owner_ended(struct fs_engine *e, bool ended);
/* The service thread's fd for requests (-1: none). */
int fs_handback_request_fd(struct fs_engine *e);
/* The service thread: answers requests written into the page. */
void fs_handback_serve(struct fs_engine *e);

/* In a process that is not S's owner (a child forked after the offload):
 * asks the owner to hand the stream back and waits for it (bounded). The
 * socket is then the kernel's in this process too: the caller releases it.
 * Returns 0, or -ECONNRESET when the owner could not. */
int fs_handback_request(struct fs_sock *s);

/* ---- forks ------------------------------------------------------------------- */

/* fork() returned PID in the parent: remembered while it lives, so that a
 * close or exit hands back streams a child may still share. */
void fs_handback_forked(pid_t pid);
/* The fork generation now (bumped by every fork of this process). */
uint32_t fs_handback_fork_gen(void);
/* True when a child forked after generation GEN may still hold the socket
 * FD (one of this process's descriptors of it): it lives, and it has it
 * among its descriptors, or we cannot tell. */
bool fs_handback_maybe_shared(uint32_t gen, int fd);
/* In the child after fork(): no children of its own yet. */
void fs_handback_after_fork(void);

#endif
