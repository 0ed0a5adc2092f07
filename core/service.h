/* SPDX-License-Identifier: MIT */
/*
 * The service thread: one per process, started when first needed (a
 * listener, a watch, a kick). It answers probes whatever the application is
 * doing, and keeps the engine moving (queued sends waiting for credit,
 * closing streams) while no application thread is inside fabsock. Each
 * round it polls its wake-up eventfd and timer, the engine's doorbell and
 * hand-back requests, the descriptors another module registered (the
 * listeners' probe sockets), the one-shot watches, and the kernel sockets
 * a hand-back waits to write to; serves what is ready; then makes a
 * progress round of the engine.
 */
#ifndef FS_CORE_SERVICE_H
#define FS_CORE_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
/* W is not needed any more (what it waits for was done by another thread):
 * if queued, it leaves the thread's poll set and fires (timed out) at the
 * thread's next round, without waking it now. Returns whether W was
 * queued. */
bool fs_service_watch_drop(struct fs_watch *w);
void fs_service_watch(struct fs_watch *w, int fd, short events, uint64_t deadline_ns, fs_watch_fn fn, void *arg);
/* The same, looked at within FS_SERVICE_SOON_NS instead of at once: for a
 * watch that is only a safety net (the application's own next call on the
 * socket usually finishes the work first), so that queueing it costs no
 * thread wake-up. */
void fs_service_watch_soon(struct fs_watch *w, int fd, short events, uint64_t deadline_ns, fs_watch_fn fn,
			   void *arg);

/* Descriptors another module keeps in the service thread's poll set: the
 * listeners' probe sockets (listener.c; one module registers). At the
 * start of every round, with the service lock held, COUNT() says how many
 * PUT() will add, then PUT() adds them with fs_service_set_add until one
 * does not fit. After the poll, each one's READY(ARG, revents) runs once
 * (revents 0 when it did not fire), before the watches fire. */
struct fs_service_set;
typedef void (*fs_service_ready_fn)(void *arg, short revents);
struct fs_service_fds {
	size_t (*count)(void);
	void (*put)(struct fs_service_set *set);
};
void fs_service_on_fds(const struct fs_service_fds *fds);
/* Adds FD, polled for EVENTS, to this round; false (READY will not run)
 * when it does not fit. */
bool fs_service_set_add(struct fs_service_set *set, int fd, short events, fs_service_ready_fn ready, void *arg);

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
