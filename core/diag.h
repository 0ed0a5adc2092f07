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

/* A socket's owner the kernel did not give. */
#define FS_DIAG_NO_UID 0xffffffffu

/* Whether the TCP connection LOCAL:LPORT <-> CLIENT:CPORT (16-byte
 * addresses, host-order ports) exists, established or in the accept queue:
 * 1 (exists), 0 (does not), -1 (cannot tell). For a client on this host,
 * *CLIENT_INODE is the inode of its socket (else 0) and *CLIENT_UID the user
 * that owns it (else FS_DIAG_NO_UID). */
int fs_conn_exists(const uint8_t local[16], uint16_t lport, const uint8_t client[16], uint16_t cport,
		   uint32_t *client_inode, uint32_t *client_uid);
/* The listening TCP socket that a connection from FROM to ADDR:PORT reaches
 * (16-byte addresses, host-order port): 1 (found: *INODE and *UID, its
 * owner), 0 (none), -1 (cannot tell). One exact lookup. */
int fs_diag_listener(const uint8_t addr[16], uint16_t port, const uint8_t from[16], uint32_t *inode, uint32_t *uid);
/* The owner (*UID) of the UDP socket bound to ADDR:PORT that a datagram from
 * PEER:PEER_PORT would reach (a client's probe socket, connected to the
 * listener): 1 (found), 0 (no such socket), -1 (cannot tell). A probe from
 * this host is honoured only if its socket belongs to the user whose socket
 * made the connection (docs/security.md). */
int fs_udp_owner(const uint8_t addr[16], uint16_t port, const uint8_t peer[16], uint16_t peer_port, uint32_t *uid);
/* Whether a descriptor of this process holds the server end of the TCP
 * connection LOCAL:LPORT <-> CLIENT:CPORT: 1 (yes), 0 (no, or not accepted
 * yet, or no such connection), -1 (cannot tell). A sock_diag lookup and a
 * look through /proc/self/fd: for a closed listener's last probes only. */
int fs_conn_held_here(const uint8_t local[16], uint16_t lport, const uint8_t client[16], uint16_t cport);
/* The inode of the socket at the other end of the TCP connection FD, if
 * that end lives in this network namespace: one exact sock_diag lookup.
 * 1: found (*INODE set; 0 when no descriptor holds it any more), 0: no
 * such socket, -1: cannot tell. */
int fs_conn_peer_inode(int fd, uint32_t *inode);
/* The inodes of this network namespace's listening TCP sockets (IPv4 and
 * IPv6) into INODE[] (room for MAX), their number into *N: one sock_diag
 * dump of the listening state, which the kernel answers from its table of
 * listeners alone (/proc/net/tcp lists every socket: a host with tens of
 * thousands in TIME_WAIT made that read tens of milliseconds). 0: the list
 * is complete; -1: it is not (no netlink, an error, more than MAX). */
int fs_diag_listeners(uint64_t *inode, unsigned max, unsigned *n);
/* A forked child: the parent's netlink socket stays the parent's. */
void fs_diag_after_fork(void);

#endif
