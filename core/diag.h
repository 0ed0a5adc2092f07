/* SPDX-License-Identifier: MIT */
/*
 * What the kernel says of a TCP connection, over NETLINK_SOCK_DIAG: whether
 * it exists (a listener answers a probe yes only for a real connection),
 * and the inode of the socket at its other end (a HELLO's shm address is
 * checked against it). One exact socket lookup per question, on one
 * netlink socket per process, one question at a time.
 */
#ifndef FS_CORE_DIAG_H
#define FS_CORE_DIAG_H

#include <stdint.h>

/* Whether the TCP connection LOCAL:LPORT <-> CLIENT:CPORT (16-byte
 * addresses, host-order ports) exists, established or in the accept queue:
 * 1 (exists), 0 (does not), -1 (cannot tell). For a client on this host,
 * *CLIENT_INODE is the inode of its socket (else 0). */
int fs_conn_exists(const uint8_t local[16], uint16_t lport, const uint8_t client[16], uint16_t cport,
		   uint32_t *client_inode);
/* The inode of the socket at the other end of the TCP connection FD, if
 * that end lives in this network namespace: one exact sock_diag lookup.
 * 1: found (*INODE set; 0 when no descriptor holds it any more), 0: no
 * such socket, -1: cannot tell. */
int fs_conn_peer_inode(int fd, uint32_t *inode);
/* A forked child: the parent's netlink socket stays the parent's. */
void fs_diag_after_fork(void);

#endif
