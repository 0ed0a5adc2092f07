/* SPDX-License-Identifier: MIT */
/*
 * The local ring: a peer process of this host is woken by a write to an
 * eventfd it handed over once, not by a doorbell datagram (bell.h).
 *
 * Every process with a doorbell also has a ring eventfd, which its deep
 * sleepers and its service thread watch beside the doorbell socket, and a
 * unix SOCK_SEQPACKET socket in the abstract namespace,
 * "fabsock-ring-<pid>-<doorbell port>", on which it hands that eventfd
 * (SCM_RIGHTS) to whoever connects as its own user (SO_PEERCRED, checked on
 * accept: a connector of another user is closed with nothing sent).
 *
 * A process that joins a stream on the shm rail (same host, same user) with
 * a peer it holds no eventfd of connects to that peer's socket at once
 * (non-blocking; no wait on the critical path), checks that the listener is
 * the stream's peer process (SO_PEERCRED: its pid, our user), and takes the
 * eventfd when it rings next, if the peer's service thread has sent it by
 * then: until then, and for good if the handover fails (refused, the wrong
 * process, no answer within FS_RING_HANDOVER_MS), rings go by datagram.
 *
 * Beside the eventfd a process hands over a page (a sealed memfd) that
 * counts its threads asleep where a ring would wake them; a ringer that
 * finds none there writes nothing (the thread that sleeps next counts
 * itself, then looks at its queue, and finds the message).
 *
 * Only rings right after a message posted on the stream go by eventfd:
 * that message disarms the stream at the receiver when it arrives
 * (rxq.c), so a ring need not name its stream. Rings for messages posted
 * earlier (an ARM that came late) and for a refused post name it, as the
 * receiver must disarm it without a message: they stay datagrams.
 *
 * The peer table is bounded (FS_RING_PEERS); when it is full, entries of
 * processes that have exited are freed, and a peer that finds no room is
 * rung by datagram. Entries are keyed by pid and doorbell port, so a new
 * process that reuses a pid is not rung through its predecessor's eventfd.
 * Every descriptor is close-on-exec and internal (fdtable.h); a forked
 * child closes its copies and opens its own on first use.
 */
#ifndef FS_CORE_RING_H
#define FS_CORE_RING_H

#include <stdbool.h>
#include <stdint.h>

struct fs_stream;

#define FS_RING_PEERS 256
#define FS_RING_IDLE_MAX 32
#define FS_RING_IDLE_NS (2000ull * 1000000ull)
#define FS_RING_SWEEP_NS (250ull * 1000000ull)
#define FS_RING_HANDOVER_MS 5000

/* Opens this process's ring eventfd and handover socket, named after
 * BELL_PORT (host order). Called once the doorbell is open; failures leave
 * the peers on datagrams. fs_bell_lock held. */
void fs_ring_open(uint16_t bell_port);
/* Frees the idle entries whose process ended or that were idle for
 * FS_RING_IDLE_NS, at most every FS_RING_SWEEP_NS; whether idle ones are
 * left (the service thread looks again within FS_RING_SWEEP_NS then).
 * Engine lock held. */
bool fs_ring_sweep(uint64_t now);
/* Our ring eventfd, or -1: deep sleepers and the service thread watch it. */
int fs_ring_fd(void);
/* The handover socket, or -1: the service thread watches it. */
int fs_ring_listen_fd(void);
/* Hands our eventfd to the connectors waiting (at most 16 a call), of our
 * user only. The service thread calls it. */
void fs_ring_serve(void);
/* Reads our eventfd: true if someone rang it. */
bool fs_ring_take(void);

/* A thread of ours goes to sleep where a ring would wake it (a deep
 * sleeper, or one a progress round after a ring wakes): counted on the
 * page peers read before they ring (ring.c, struct fs_ring_page). The
 * caller must look at the completion queue after fs_ring_sleep_begin and
 * before it sleeps; fs_ring_sleep_end once awake. Any lock or none. */
void fs_ring_sleep_begin(void);
void fs_ring_sleep_end(void);
/* Whether this thread's count is on another page than ours now (it began
 * before our page was made): a long sleeper (the service thread) counts
 * itself again. */
bool fs_ring_sleep_stale(void);

/* S joined (its peer's doorbell port is known): start fetching its peer's
 * eventfd if S runs on shm and we have none. Engine lock held. */
void fs_ring_prepare(struct fs_stream *s);
/* Rings S's peer through its eventfd: false if we have none (yet), and the
 * caller sends a datagram. The write itself is owed until the engine lock
 * is dropped (fs_engine_unlock: fs_ring_flush). Engine lock held. */
bool fs_ring_peer(struct fs_stream *s);
/* Whether we ring S's peer through its eventfd and read its page of
 * sleepers first (so a ring it does not need costs us a memory read, not a
 * write). The peer fetched ours when it joined, as we fetched its: taken
 * as the sign that an ARM of ours costs it no more. Engine lock held. */
bool fs_ring_peer_paged(const struct fs_stream *s);
/* Whether a thread of S's peer (paged: fs_ring_peer_paged) sleeps where a
 * ring would wake it, read after a full fence: called after a post, a
 * false answer means its next sleeper's look finds the message. True when
 * it cannot tell. Engine lock held. */
bool fs_ring_peer_sleeps(const struct fs_stream *s);
/* Writes the rings this thread owes (fs_ring_owed_n of them). No lock
 * needed; called right after the engine lock is dropped. */
extern __thread unsigned fs_ring_owed_n __attribute__((tls_model("initial-exec")));
void fs_ring_flush(void);

/* S is being freed: the last stream with its peer closes the peer's
 * eventfd and frees its entry. Engine lock held. */
void fs_ring_release(struct fs_stream *s);

/* The child of a fork closes its copies (the parent's eventfd, socket and
 * peers' eventfds stay the parent's). */
void fs_ring_after_fork(void);

#endif
