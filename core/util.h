/* SPDX-License-Identifier: MIT */
/*
 * Small helpers every part of the core uses, kept where a reader looks for
 * them: the monotonic clock, getpid() without a system call, a lock with a
 * deadline for the exit paths, fabsock's own threads, the reentrancy
 * guard's depth (guard.h) and an intrusive list.
 */
#ifndef FS_CORE_UTIL_H
#define FS_CORE_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>
#include <unistd.h>

/* CLOCK_MONOTONIC in nanoseconds: every deadline of the core is one. */
uint64_t fs_now_ns(void);
/* CLOCK_MONOTONIC_COARSE in nanoseconds: a tick old at most (1-4 ms), a
 * quarter of fs_now_ns's cost (39 against 10 ns here, a PVM guest's TSC
 * read). For intervals of 100 ms and more, compared only with stamps of
 * its own: never against fs_now_ns's, which may run ahead of it. */
uint64_t fs_now_coarse_ns(void);
/* pthread_mutex_timedlock until DEADLINE_NS (CLOCK_MONOTONIC, fs_now_ns):
 * 0, -ETIMEDOUT, or -EDEADLK at once when the calling thread holds M. For
 * the exit paths, whose own thread may hold M (an exit run from a signal
 * handler that interrupted a call). */
int fs_mutex_lock_until(pthread_mutex_t *m, uint64_t deadline_ns);

/* Locks of the core that a forked child may find held by a thread of its
 * parent: every socket's and epoll instance's lock and the tables' (the
 * locks the fork handlers re-initialise are not among them, core/locks.h).
 * Such a thread does not exist in the child, so the lock would stay taken
 * for good: a threaded program whose child closes its fds (Python's
 * subprocess) while another thread was inside connect() hung. In a forked
 * child, a lock whose holder is no thread of this process is taken over
 * (what it guards is as that thread left it). Elsewhere it is
 * pthread_mutex_lock. */
extern bool fs_lock_forked; /* set in a forked child (atomic) */
void fs_lock_slow(pthread_mutex_t *m);
static inline void fs_lock(pthread_mutex_t *m)
{
	if (__builtin_expect(__atomic_load_n(&fs_lock_forked, __ATOMIC_RELAXED), 0))
		fs_lock_slow(m);
	else
		pthread_mutex_lock(m);
}
/* pthread_mutex_trylock, taking over a lock as fs_lock does. */
int fs_trylock(pthread_mutex_t *m);
/* The child's fork handler: from now on, look for such locks. */
void fs_lock_after_fork(void);

/* Starts a detached thread of fabsock's own (service, watchdog) running
 * FN with a stack of STACK bytes. It never takes the application's signals:
 * all are blocked in it. Returns 0, or the error of pthread_create. */
int fs_thread_start(void *(*fn)(void *), size_t stack);

/* getpid() without a system call (glibc no longer caches it): the value is
 * cached at start-up and renewed in the child at fork (fs_self_pid_refresh).
 * A vfork child (no fork handlers run) sees its parent's pid here. */
extern pid_t fs_pid_cache;
/* The process called vfork() or clone() (their wrappers, preload/vfork.c):
 * a child sharing its memory may exist (engine.h, fs_vfork_child). */
extern bool fs_vfork_seen;
/* Counts the moments another process may have come to hold descriptors of
 * this one (atomic): a fork (its prepare handler, both sides see it), a
 * vfork or clone, posix_spawn, system, popen, a descriptor sent with
 * SCM_RIGHTS, a duplicate of a socket fabsock let go of. A socket made
 * when it had its present value (fs_sock.fds_spread) is held by the
 * application's descriptors alone (epoll.c, fs_member_close_alone). */
extern unsigned fs_fds_spread;
static inline void fs_fds_spread_note(void)
{
	__atomic_add_fetch(&fs_fds_spread, 1, __ATOMIC_SEQ_CST);
}
/* Nonzero where fs_pid_cache is this process's: a byte on a page the kernel
 * wipes in every forked child (MADV_WIPEONFORK) before it runs, set again
 * by fs_self_pid_refresh (the child's fork handler). A child of fork()
 * before its handlers ran, or of _Fork() (none run), reads 0 there. NULL
 * before start-up or without MADV_WIPEONFORK: unknown. */
extern const unsigned char *fs_pid_mark;
pid_t fs_self_pid_slow(void);
void fs_self_pid_refresh(void);
static inline pid_t fs_self_pid(void)
{
	pid_t pid = __atomic_load_n(&fs_pid_cache, __ATOMIC_RELAXED);

	return pid ? pid : fs_self_pid_slow();
}

/* geteuid() without a system call: fabsock asks it on every accept (a
 * listener's record follows its process's user) and every local connect
 * (the record directory is the user's), and on this kind of VM a system
 * call costs as much as a loopback round trip. Cached at start-up and
 * renewed by fs_self_euid_refresh after every setuid, seteuid, setreuid
 * and setresuid the preload sees (a forked child keeps its parent's user;
 * a vfork child's change is not written: the memory is its parent's). A
 * change made with a raw syscall() is per thread in the kernel and unseen
 * here: once syscall() passes such a number, every look asks the kernel
 * again (fs_self_euid_uncached). */
extern uid_t fs_euid_cache;
extern bool fs_euid_uncached;
void fs_self_euid_refresh(void);
static inline uid_t fs_self_euid(void)
{
	if (__builtin_expect(__atomic_load_n(&fs_euid_uncached, __ATOMIC_RELAXED), 0))
		return geteuid();
	return __atomic_load_n(&fs_euid_cache, __ATOMIC_RELAXED);
}

/* An intrusive doubly linked list: the engine keeps the streams that need
 * attention (queued sends, sleeping threads) on lists, so that progress and
 * wake-ups cost what is pending, not what exists. A node not on a list has
 * next == NULL. */
struct fs_dlist {
	struct fs_dlist *prev, *next;
};

static inline void fs_dlist_init(struct fs_dlist *head)
{
	head->prev = head->next = head;
}

static inline bool fs_dlist_linked(const struct fs_dlist *node)
{
	return node->next != NULL;
}

static inline void fs_dlist_add(struct fs_dlist *head, struct fs_dlist *node)
{
	node->next = head->next;
	node->prev = head;
	head->next->prev = node;
	head->next = node;
}

static inline void fs_dlist_del(struct fs_dlist *node)
{
	node->prev->next = node->next;
	node->next->prev = node->prev;
	node->prev = node->next = NULL;
}

static inline bool fs_dlist_empty(const struct fs_dlist *head)
{
	return head->next == head;
}

/* NODE becomes HEAD's last. */
static inline void fs_dlist_add_tail(struct fs_dlist *head, struct fs_dlist *node)
{
	fs_dlist_add(head->prev, node);
}

/* Every node of FROM moves to TO (whatever TO held is forgotten); FROM is
 * left empty. */
static inline void fs_dlist_take_all(struct fs_dlist *from, struct fs_dlist *to)
{
	fs_dlist_init(to);
	if (fs_dlist_empty(from))
		return;
	to->next = from->next;
	to->prev = from->prev;
	to->next->prev = to;
	to->prev->next = to;
	fs_dlist_init(from);
}

/* Resets the TCP connection of socket FD as a peer's RST would, for every
 * process that holds it: connect(AF_UNSPEC) disconnects it (the peer gets
 * an RST; ECONNRESET is pending here), and the shutdown that follows makes
 * later reads an end of stream and writes EPIPE; poll then reports
 * POLLIN|POLLOUT|POLLERR|POLLHUP|POLLRDHUP, as after a kernel reset. For a
 * connection that cannot go on (issue 26: never a clean end of stream
 * where bytes were lost). Returns 0 or -errno (connect's). */
int fs_tcp_reset(int fd);

/* The nodes of LIST go in front of HEAD's, in their order; LIST is left
 * empty. */
static inline void fs_dlist_splice_front(struct fs_dlist *head, struct fs_dlist *list)
{
	if (fs_dlist_empty(list))
		return;
	list->prev->next = head->next;
	head->next->prev = list->prev;
	head->next = list->next;
	list->next->prev = head;
	fs_dlist_init(list);
}

#endif
