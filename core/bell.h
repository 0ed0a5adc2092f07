/* SPDX-License-Identifier: MIT */
/*
 * The doorbell: an idle process sleeps until a peer rings it, instead of
 * polling the completion queue every few milliseconds.
 *
 * libfabric gives no cross-process wake-up that works on every provider
 * (shm has none; efa's completion queues have no wait object), so fabsock
 * brings its own: one UDP socket per process, the bell, whose port travels
 * in the HELLO. The peer's bell is at the address of the stream's TCP
 * connection: the same reachability the UDP probe already relies on.
 *
 * Protocol, per stream:
 *  - Arm. When the engine has seen no completion for IDLE_AFTER_MS and has
 *    no send in flight, the service thread sends each stream's peer an ARM
 *    naming the stream and how many messages it has received on it (data
 *    class) and processed (control class).
 *  - The peer, on the ARM: if it has already posted more than that, it rings
 *    at once (those messages are on their way); otherwise it marks the
 *    stream and rings right after it next posts a message on it. One ring
 *    per ARM.
 *  - We disarm a stream when any message arrives on it.
 *  - A RING names the stream it rings for (id and token), and is taken only
 *    from that stream's peer doorbell, as an ARM is. It wakes our service
 *    thread: it counts as activity (so every waiter polls at the normal
 *    pace for the next IDLE_AFTER_MS: on efa the ring may overtake the
 *    message), runs the completion queue, and wakes the waiters that sleep
 *    deeply.
 * With every stream armed and nothing in flight, waiters sleep in slices of
 * FS_BELL_SLICE_MS, a safety net for a lost datagram. A stream that cannot
 * be armed (a peer without a bell, a send that failed) keeps the process on
 * the old polling (FABSOCK_IDLE_SLEEP_US slices). FABSOCK_DOORBELL=0 turns
 * the whole mechanism off.
 */
#ifndef FS_CORE_BELL_H
#define FS_CORE_BELL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

struct fs_engine;
struct fs_stream;

/* The longest sleep of a waiter while every stream is armed. */
#define FS_BELL_SLICE_MS 250

/* This process's doorbell port for the HELLO (opened on first use); 0 when
 * there is none (FABSOCK_DOORBELL=0, or the socket could not be opened). */
uint16_t fs_bell_port(void);
/* The doorbell socket, or -1: the service thread sleeps on it. */
int fs_bell_fd(void);
/* The child of a fork opens its own doorbell. */
void fs_bell_after_fork(void);

/* Records where the peer of S rings: the address of the stream's TCP
 * connection PEER, and the port of its HELLO (0: it has no doorbell); and
 * LOCAL, our address of that connection. Datagrams between the two
 * doorbells travel between the connection's two addresses, and an ARM is
 * taken only from the peer's address and doorbell port, to our address,
 * with the stream's token. */
void fs_bell_set_peer(struct fs_stream *s, const struct sockaddr *peer, const struct sockaddr *local, uint16_t port);

/* We just posted a message on S and its peer is armed: ring it, by its
 * eventfd if it is a process of this host that handed us one (ring.h),
 * else by datagram. Lock held. */
void fs_bell_ring_posted(struct fs_stream *s);

/* Arms every stream not armed yet. Engine lock held; the service thread
 * calls it once the engine is idle. True when every stream is armed. */
bool fs_bell_arm_all(struct fs_engine *e);
/* The peer of S asked for a ring after our next message: ring it now. Lock
 * held. */
void fs_bell_ring(struct fs_stream *s);
/* The peer of S armed it (by datagram, or by FS_MSG_ARM on a message),
 * having seen DATA_SEEN data and CTRL_SEEN control messages of ours: ring
 * now if we posted more, else after our next message. Lock held. */
void fs_bell_armed_by(struct fs_stream *s, uint32_t data_seen, uint32_t ctrl_seen);
/* Reads every datagram waiting on the doorbell and acts on it. Takes the
 * engine lock. */
void fs_bell_drain(struct fs_engine *e);
/* The same for the ready ones only: DATAGRAMS, the doorbell socket; RING,
 * our ring eventfd (ring.h). */
void fs_bell_drain_some(struct fs_engine *e, bool datagrams, bool ring);
/* fs_bell_drain_some with the engine lock held. */
void fs_bell_drain_locked(struct fs_engine *e, bool datagrams, bool ring);
/* fs_bell_drain_some if the engine lock is free; false (nothing read) if
 * another thread holds it. For the service thread, which must not queue
 * for the lock behind the application's threads: the probes it answers
 * wait meanwhile (service.c, fs_service_main). */
bool fs_bell_try_drain(struct fs_engine *e, bool datagrams, bool ring);
/* Reads our ring eventfd and counts a ring as activity (the progress
 * round the caller runs next reads what it announced). Lock held. True if
 * rung. */
bool fs_bell_take_ring(struct fs_engine *e);
/* The same with the engine lock held, from a send: the ARMs are acted on
 * (so that this send rings whom it owes), a RING only noted (the caller's
 * next progress round reads what it announced). */
void fs_bell_take_arms(struct fs_engine *e);

#endif
