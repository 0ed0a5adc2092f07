/* SPDX-License-Identifier: MIT */
/*
 * The out-of-band capability probe, client side (listener.h is the side
 * that answers).
 *
 * fs_probe_start() sends the ASK right after connect() and
 * fs_probe_result() collects the answer on first use, bounded by
 * FABSOCK_PROBE_TIMEOUT_MS; "no", a timeout or ICMP port unreachable mean
 * plain TCP, and the destination is remembered as such for
 * FABSOCK_NEG_CACHE_SEC (negcache.h).
 */
#ifndef FS_CORE_PROBE_H
#define FS_CORE_PROBE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/wire.h"

enum fs_probe_outcome {
	FS_PROBE_PENDING = 0,
	FS_PROBE_OUT_YES,
	FS_PROBE_OUT_NO,
	FS_PROBE_OUT_TIMEOUT,
	FS_PROBE_OUT_REFUSED,
};

struct fs_probe_client {
	int udp_fd;
	uint64_t nonce;
	uint64_t deadline_ns;      /* CLOCK_MONOTONIC */
	uint64_t deadline_real_ns; /* the same in CLOCK_REALTIME, for arrival stamps */
	uint8_t pkt[FS_WIRE_PROBE_LEN]; /* the ASK, sent again while no answer comes */
	unsigned resends;
	uint64_t resend_ns;             /* CLOCK_MONOTONIC: when to send it again */
};

/* Sends the ASK for TCP socket FD connected to PEER. Returns 0 or -errno. */
int fs_probe_start(struct fs_probe_client *pc, int fd, const struct sockaddr *peer);
/* Waits until an answer, the probe's own timeout or DEADLINE (absolute
 * fs_now_ns() ns, 0: none; a time already passed: one look) while also
 * watching TCP socket FD for incoming bytes: *TCP_READABLE is set if the
 * server spoke first. Closes the UDP socket once final. */
enum fs_probe_outcome fs_probe_result(struct fs_probe_client *pc, int fd, uint64_t deadline_ns,
				      bool *tcp_readable);
void fs_probe_cancel(struct fs_probe_client *pc);

#endif
