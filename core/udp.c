/* SPDX-License-Identifier: MIT */
/* Datagrams between a connection's own addresses, and the address key
 * they are written in (see udp.h). */
#include "core/udp.h"

#include <errno.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <string.h>
#include <time.h>

#include "config/log.h"
#include "core/listener.h"
#include "core/sock.h"
#include "core/wire.h"
#include "preload/real.h"

void fs_sockaddr_key(const struct sockaddr *sa, uint8_t addr[16], uint16_t *port)
{
	memset(addr, 0, 16);
	*port = 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;

		addr[10] = addr[11] = 0xff;
		memcpy(addr + 12, &in->sin_addr, 4);
		*port = ntohs(in->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;

		memcpy(addr, &in6->sin6_addr, 16);
		*port = ntohs(in6->sin6_port);
	}
}

void fs_udp_want_dest(int fd, int family)
{
	int on = 1;

	fs_real.setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &on, sizeof(on));
	if (family == AF_INET6)
		fs_real.setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof(on));
}

static bool fs_udp_dest(struct msghdr *msg, uint8_t out[16])
{
	bool found = false;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO &&
		    c->cmsg_len >= CMSG_LEN(sizeof(struct in6_pktinfo))) {
			struct in6_pktinfo info;

			memcpy(&info, CMSG_DATA(c), sizeof(info));
			memcpy(out, &info.ipi6_addr, 16); /* an IPv4 datagram's is v4-mapped */
			return true;
		}
		if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO &&
		    c->cmsg_len >= CMSG_LEN(sizeof(struct in_pktinfo))) {
			struct in_pktinfo info;

			memcpy(&info, CMSG_DATA(c), sizeof(info));
			memset(out, 0, 10);
			out[10] = out[11] = 0xff;
			memcpy(out + 12, &info.ipi_addr, 4);
			found = true; /* an IPV6_PKTINFO after it says the same */
		}
	}
	return found;
}

ssize_t fs_udp_recv(int fd, void *buf, size_t len, struct sockaddr_storage *from, socklen_t *fromlen,
		    uint8_t dst[16])
{
	union {
		struct cmsghdr align;
		char bytes[256];
	} control;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = {
		.msg_name = from, .msg_namelen = sizeof(*from), .msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = &control, .msg_controllen = sizeof(control),
	};
	ssize_t n = fs_real.recvmsg(fd, &msg, MSG_DONTWAIT);

	memset(dst, 0, 16);
	if (n >= 0) {
		*fromlen = msg.msg_namelen;
		fs_udp_dest(&msg, dst);
	}
	return n;
}

ssize_t fs_udp_send_from(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to,
			 socklen_t tolen, const uint8_t from[16])
{
	union {
		struct cmsghdr align;
		char bytes[CMSG_SPACE(sizeof(struct in6_pktinfo))];
	} control;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_name = (void *)to, .msg_namelen = tolen, .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *c = (struct cmsghdr *)&control;
	static const uint8_t any[16];

	memset(&control, 0, sizeof(control));
	if (memcmp(from, any, 16) != 0) {
		msg.msg_control = &control;
		if (to->sa_family == AF_INET6) {
			struct in6_pktinfo info = { .ipi6_ifindex = 0 };

			memcpy(&info.ipi6_addr, from, 16);
			c->cmsg_level = IPPROTO_IPV6;
			c->cmsg_type = IPV6_PKTINFO;
			c->cmsg_len = CMSG_LEN(sizeof(info));
			memcpy(CMSG_DATA(c), &info, sizeof(info));
			msg.msg_controllen = CMSG_SPACE(sizeof(info));
		} else {
			struct in_pktinfo info = { .ipi_ifindex = 0 };

			memcpy(&info.ipi_spec_dst, from + 12, 4);
			c->cmsg_level = IPPROTO_IP;
			c->cmsg_type = IP_PKTINFO;
			c->cmsg_len = CMSG_LEN(sizeof(info));
			memcpy(CMSG_DATA(c), &info, sizeof(info));
			msg.msg_controllen = CMSG_SPACE(sizeof(info));
		}
	}
	return fs_real.sendmsg(fd, &msg, flags);
}

/* Drops probes (FS_WIRE_PROBE_LEN bytes starting with the probe magic)
 * before they reach FD, an application's UDP socket: a client's probe for a
 * TCP listener on the same port number lands there when the application
 * holds the UDP port (a DNS server's 53), and a plain service must never
 * receive a datagram it did not ask for. A socket filter sees a datagram
 * from its UDP header on (udp_queue_rcv_one_skb trims to it): the length
 * includes the 8-byte header, the payload starts at offset 8. An
 * application that sets a filter of its own replaces this one. */
static void fs_udp_shun_probes(int fd)
{
	struct sock_filter code[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_LEN, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 8 + FS_WIRE_PROBE_LEN, 0, 2),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 8),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, FS_WIRE_PROBE_MAGIC, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, 0xffffffffu), /* everything else: whole */
		BPF_STMT(BPF_RET | BPF_K, 0),           /* a probe: dropped */
	};
	struct sock_fprog prog = { .len = sizeof(code) / sizeof(code[0]), .filter = code };

	if (fs_real.setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)))
		FS_WARN_ONCE("cannot keep probes out of an application's UDP socket (SO_ATTACH_FILTER: %s)",
			     strerror(errno));
}

int fs_core_udp_bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	uint8_t key[16];
	uint16_t port = 0;
	int type = 0, reuseport = 0, ret, yielded = 0;
	socklen_t olen = sizeof(type);

	if (addr && len >= sizeof(struct sockaddr_in) &&
	    (addr->sa_family == AF_INET || (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))))
		fs_sockaddr_key(addr, key, &port);
	if (!port || !fs_core_enabled || fs_real.getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &olen) || type != SOCK_DGRAM)
		return fs_real.bind(fd, addr, len) ? -errno : 0;
	ret = fs_real.bind(fd, addr, len) ? -errno : 0;
	if (ret == -EADDRINUSE && (yielded = fs_listeners_yield(port, fd)) > 0) {
		/* The twin's socket closes once no poll holds its file (the
		 * service thread's ends at the kick; an application thread's
		 * look for a probe within FABSOCK_FIRST_SEND_WAIT_MS). */
		for (int i = 0; i < 500 && ret == -EADDRINUSE; i++) {
			struct timespec ms = { 0, 1000000 };

			nanosleep(&ms, NULL);
			ret = fs_real.bind(fd, addr, len) ? -errno : 0;
		}
	}
	if (ret)
		return ret;
	olen = sizeof(reuseport);
	if (!yielded && fs_real.getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &reuseport, &olen) == 0 && reuseport)
		fs_listeners_yield(port, fd); /* it may have joined a twin's SO_REUSEPORT group */
	fs_udp_shun_probes(fd);
	fs_listeners_note_udp(fd, port);
	return 0;
}
