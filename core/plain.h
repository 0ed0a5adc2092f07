/* SPDX-License-Identifier: MIT */
/*
 * Plain listeners (issue 27; docs/design.md, "Plain listeners"). A listener
 * whose recent connections from this host all stayed on TCP (no probe's
 * "yes" claimed one, none offloaded) turns plain in this process: its
 * later connections from a loopback address get no socket record, no
 * epoll member and no close work. What keeps that safe is one rule: such
 * an untracked connection never gets a "yes" to a probe. Its client port
 * is counted in the listener's shared probe table while a process holds
 * the connection (and stamped when the count is lowered, for a probe still
 * on its way); the answerer says "no" to a probe for a counted or freshly
 * stamped port and turns the listener back (every process tracks again).
 *
 * The count is raised at the accept and lowered at a close fabsock sees
 * (close, dup2/dup3 over it), and only when no other process can hold the
 * connection: its mark in a table beside the fd table keeps fs_fds_spread
 * as it was at the accept; a fork, a spawn, SCM_RIGHTS or a duplicate of
 * the descriptor changes that, and the count is then never lowered (the
 * port's probes get "no": only slower, never unsafe). A close fabsock does
 * not see leaves the count raised too; the mark it leaves behind is taken
 * by the next close of that number or the next plain accept there.
 */
#ifndef FS_CORE_PLAIN_H
#define FS_CORE_PLAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

struct fs_listener;
struct fs_probe_table;

/* The marks (one word per descriptor, 0: none): NULL until a listener of
 * this process first turned plain. */
extern uint64_t *fs_plain_marks;
extern unsigned long fs_plain_marks_size;

/* Accepts connection FD (its client ADDR, of length *LEN as accept() gave it, ROOM the
 * room it had) untracked if L is plain in this process and the client is
 * on a loopback address: true then (FD is marked; no socket record is to
 * be made), false to track it as before. SPREAD: fs_fds_spread read before
 * the kernel's accept (a fork in another thread after it gave the child
 * the descriptor, however soon it came). */
bool fs_plain_accept(struct fs_listener *l, int fd, const struct sockaddr *addr, const socklen_t *len,
		     socklen_t room, unsigned spread);

/* Whether ADDR (an AF_INET or AF_INET6 address) is a loopback one. */
bool fs_plain_loopback(const struct sockaddr *addr);

/* A connection of L from a loopback client settled without the fabric
 * (WANTED false), or its client showed it wants the fabric (WANTED: a
 * "yes" to its probe, an offload): the streak of the former, which
 * WANTED ends, turns L plain. */
void fs_plain_settled(struct fs_listener *l, bool wanted);

/* Whether a probe for client port PORT, which waits WAIT_MS for its answer,
 * must be answered no: an untracked connection from that port is held, or
 * was let go of within WAIT_MS. After the caller recorded its "yes" (full
 * fence inside). Counts the refusal and turns the listener back. */
bool fs_plain_refuses(struct fs_probe_table *t, uint16_t port, uint32_t wait_ms);

/* FD's mark, taken out of the table (0: none), before FD is closed or
 * replaced; fs_plain_release lowers its count once that is done (or
 * fs_plain_restore puts it back when it was not). */
static inline uint64_t fs_plain_take(int fd)
{
	uint64_t *marks = __atomic_load_n(&fs_plain_marks, __ATOMIC_ACQUIRE);

	if (!marks || fd < 0 || (unsigned long)fd >= fs_plain_marks_size || !__atomic_load_n(&marks[fd], __ATOMIC_RELAXED))
		return 0;
	return __atomic_exchange_n(&marks[fd], 0, __ATOMIC_ACQ_REL);
}
void fs_plain_release(uint64_t mark);
/* The mark of a socket fabsock let go of (a kernel socket from now on):
 * nothing is counted behind it; it tells fs_epoll_is_instance that the
 * descriptor is no epoll instance without an fstat (an event loop's every
 * connection to a server without a record of its user). Made by
 * fs_plain_note_socket, taken like any mark at a close; a new descriptor
 * at a number whose close fabsock did not see drops what was left there
 * (fs_plain_forget: epoll_create, the dup calls, SCM_RIGHTS). */
#define FS_PLAIN_SOCKET 1ull
void fs_plain_note_socket(int fd);
static inline void fs_plain_forget(int fd)
{
	uint64_t mark = fs_plain_take(fd);

	if (mark)
		fs_plain_release(mark);
}
void fs_plain_restore(int fd, uint64_t mark);
/* The mark is left (a close_range: the count stays raised). */
void fs_plain_drop(uint64_t mark);

static inline bool fs_plain_marked(int fd)
{
	uint64_t *marks = __atomic_load_n(&fs_plain_marks, __ATOMIC_ACQUIRE);

	return marks && fd >= 0 && (unsigned long)fd < fs_plain_marks_size &&
	       __atomic_load_n(&marks[fd], __ATOMIC_RELAXED) != 0;
}

/* A second descriptor of FD is being made (dup, F_DUPFD): if FD is marked,
 * its count must not be lowered by one close any more. */
void fs_plain_dup(int fd);

#endif
