/* SPDX-License-Identifier: MIT */
/*
 * What survives exec(). fabsock's state lives in the process's memory, which
 * exec() replaces, while a socket without FD_CLOEXEC survives into the new
 * program (inetd-style servers, a server re-exec'ing itself, a shell given
 * a socket). So every process that has fabsock sockets keeps a small record
 * per fd (its state and the socket's inode) in a memfd without FD_CLOEXEC;
 * the library in the new program finds it at start-up and:
 *  - LISTENING: rebuilds the listener (a fresh probe twin), so the new
 *    program's connections offload as before;
 *  - SERVER_PENDING (accepted, not yet used): adopts it as inherited. When
 *    the exec'ing process passed its listener's probe table along (an fd
 *    without FD_CLOEXEC, noted in the record: inetd, sshd's re-exec), the
 *    new program looks the connection's probe record up there and
 *    negotiates as the old one would have; without it, a HELLO the client
 *    sent is consumed and refused (NAK), so the client goes on over TCP
 *    and the new program never reads it;
 *  - ACK_DUE (TCP first's waitless client before the server's ACK):
 *    adopted in that state, so that its first receive takes the ACK;
 *  - OFFLOADED: a stream goes back to TCP before exec (core/handback.h),
 *    so this is only met when that failed (or after a vfork, where
 *    fabsock keeps its hands off): its stream's state died with the old
 *    program, so the connection is shut down (the new program reads EOF
 *    and gets EPIPE, the peer sees its control connection end) with a
 *    warning, never left silently hanging.
 * Records are only honoured by the same process (pid) that wrote them: a
 * forked or vfork'ed child that execs does not own its parent's streams
 * and leaves those sockets alone. The memfd leaves with the process; the
 * new program closes it at start-up.
 */
#ifndef FS_CORE_INHERIT_H
#define FS_CORE_INHERIT_H

enum fs_inherit_kind {
	FS_INH_NONE = 0,
	FS_INH_LISTENING = 1,
	FS_INH_PENDING = 2,
	FS_INH_OFFLOADED = 3,
	/* a client that wrote TCP first's waitless HELLO and has not taken
	 * the server's ACK yet (tcpfirst_hs.h): the new program takes it off
	 * the head at its first receive, so that it never reads it as data */
	FS_INH_ACK_DUE = 4,
};

/* Records FD's kind (FS_INH_NONE forgets it). Cheap: one store into the
 * mapping after the first call, plus an fstat for the inode. */
void fs_inherit_note(int fd, enum fs_inherit_kind kind);
/* FD (noted PENDING) came from a listener whose probe table the new
 * program finds at TABLE_FD (fs_listener_exec_fd). */
void fs_inherit_note_table(int fd, int table_fd);
/* In a forked child: the parent's records are not ours. */
void fs_inherit_after_fork(void);
/* At start-up: act on the records a previous program of this process left. */
void fs_inherit_restore(void);

#endif
