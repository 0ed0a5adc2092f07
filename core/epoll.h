/* SPDX-License-Identifier: MIT */
/*
 * epoll over offloaded sockets (see epoll.c). Entry points return a value
 * or a negative errno, or FS_PASS for "call the real function".
 */
#ifndef FS_CORE_EPOLL_H
#define FS_CORE_EPOLL_H

#include <signal.h>
#include <stdbool.h>
#include <sys/epoll.h>

struct fs_sock;

/* epoll_ctl for a fabsock socket S at FD, in any state: an ADD of one
 * that cannot become offloaded any more is the kernel's (FS_PASS). */
int fs_epoll_ctl(int epfd, int op, int fd, struct epoll_event *event, struct fs_sock *s);
/* epoll_wait / epoll_pwait (SIGMASK may be NULL). */
int fs_epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout_ms, const sigset_t *sigmask);
/* epoll_wait on an instance fabsock keeps no record for: the real call,
 * unless another thread gives it a fabsock member meanwhile. */
int fs_epoll_wait_plain(int epfd, struct epoll_event *events, int maxevents, int timeout_ms, const sigset_t *sigmask);
/* Removes from the K kernel events those that carry fabsock's tags;
 * returns how many are left. */
int fs_epoll_drop_ours(struct epoll_event *events, int k);
/* Whether EPFD holds fabsock members now. */
bool fs_epoll_has_members(int epfd);
/* Whether fabsock keeps a record for EPFD (it held fabsock sockets at some
 * point): its waits and its close must come through fabsock. */
bool fs_epoll_known(int epfd);
/* Level readiness of EPFD's fabsock members (for poll on an epoll fd). */
bool fs_epoll_peek_ready(int epfd);
/* Whether the kernel says EPFD is readable once its negotiating members
 * have consumed their handshake bytes. */
bool fs_epoll_kernel_readable(int epfd);
/* Is FD an epoll instance (asked at EPOLL_CTL_ADD of a non-socket fd)? */
bool fs_epoll_is_instance(int fd);
/* epoll_ctl of an epoll instance FD inside EPFD. */
int fs_epoll_ctl_nested(int epfd, int op, int fd, struct epoll_event *event);
/* FD, one of S's fds, is about to be closed (or replaced by dup2). */
void fs_epoll_fd_closing(struct fs_sock *s, int fd);
/* S's connect() may negotiate (called before the kernel's connect, S's
 * lock not held): its members that kept the application's own kernel
 * entry take our tag now, before the connection's events could reach the
 * application untranslated. */
void fs_epoll_sock_negotiates(struct fs_sock *s);
/* The application closed EPFD. */
void fs_epoll_closed(int epfd);
/* fabsock lets go of S (fs_sock_release; S's lock held): if epoll member
 * records still name it, notes its fds, whose epoll_ctl and close() no
 * longer come through S, so that they meet those records first. */
void fs_epoll_sock_left(struct fs_sock *s);
/* Whether FD has such a note (a cheap look). */
bool fs_epoll_left(int fd);
/* Before the kernel gets an epoll_ctl of such an FD on EPFD: EPFD's
 * record for it becomes the application's kernel entry (or, parked, goes). */
void fs_epoll_left_ctl(int epfd, int fd);
/* Before such an FD closes: its records go from every instance. */
void fs_epoll_left_closing(int fd);

#endif
