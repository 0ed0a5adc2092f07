/* SPDX-License-Identifier: MIT */
/*
 * Datagrams that travel between the two addresses of a TCP connection: the
 * probe's answer and the doorbell's ARMs and RINGs. A socket bound to the
 * wildcard address sends from its route's source address unless told
 * otherwise, and the other side checks (probe: its connected UDP socket
 * drops an answer from another address; doorbell: ARMs are taken only from
 * the connection's peer address). Addresses are 16 bytes, IPv4 v4-mapped,
 * as fs_sockaddr_key gives them: the one form in which the core keys and
 * compares addresses (probe records, the negative cache, the doorbell).
 */
#ifndef FABSOCK_CORE_UDP_H
#define FABSOCK_CORE_UDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* 16-byte form (v4-mapped for IPv4) and host-order port of a sockaddr. */
void fs_sockaddr_key(const struct sockaddr *sa, uint8_t addr[16], uint16_t *port);

/* Asks the kernel for each datagram's destination address (IP_PKTINFO, and
 * IPV6_RECVPKTINFO on an AF_INET6 socket). */
void fs_udp_want_dest(int fd, int family);

/* One datagram from FD (MSG_DONTWAIT) into BUF (LEN bytes): its length,
 * or -1 with errno. *FROM and *FROMLEN: where it came from; DST: the
 * address it came to (from PKTINFO), all zero if the kernel did not say. */
ssize_t fs_udp_recv(int fd, void *buf, size_t len, struct sockaddr_storage *from, socklen_t *fromlen,
		    uint8_t dst[16]);

/* sendmsg() of LEN bytes at BUF to TO, from local address FROM (all zero:
 * the kernel's choice). TO's family is the socket's. Returns what sendmsg
 * returned. */
ssize_t fs_udp_send_from(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to,
			 socklen_t tolen, const uint8_t from[16]);

/* bind() of an application's socket FD that is not fabsock's (the fd table
 * has no entry): for an AF_INET/AF_INET6 UDP socket and a port, the port
 * is the application's even where a probe twin of this process holds it
 * (the twin gives way, fs_listeners_yield), and the socket never receives
 * a probe (a socket filter drops them). Returns 0 or -errno. */
int fs_core_udp_bind(int fd, const struct sockaddr *addr, socklen_t len);

#endif
