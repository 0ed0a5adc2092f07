/* SPDX-License-Identifier: MIT */
/* What the kernel says of a TCP connection, over NETLINK_SOCK_DIAG (see
 * diag.h). */
#include "core/diag.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>

#include "core/engine.h"
#include "core/fdtable.h"
#include "core/sock.h"
#include "core/udp.h"
#include "preload/real.h"

/* One NETLINK_SOCK_DIAG socket per process, one question at a time. The
 * service thread and application threads drain probes at the same time: on
 * a socket without the lock one asker read and dropped another's reply, and
 * the other waited out its poll (100 ms, the whole of a single-threaded
 * server) to answer unchecked. A fork child opens its own (see
 * fs_service_after_fork), or parent and child would read each other's. */
static pthread_mutex_t fs_diag_lock = PTHREAD_MUTEX_INITIALIZER;
static int fs_diag_fd = -1;

static int fs_diag_socket_locked(void)
{
	if (fs_diag_fd < 0) {
		int fd = fs_real.socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);

		if (fd >= 0)
			fs_diag_fd = fs_internal_fd(fd);
	}
	return fs_diag_fd;
}

/* Sends the sock_diag request ASK and reads its answer: 1 (a connection in
 * a live state, or with ANY_STATE in any state), 0 (none), -1 (cannot tell).
 * A socket found stores its inode in *INODE (0 once no descriptor holds
 * it: closed, TIME_WAIT) and its owner in *UID (the user that made it).
 * Called with fs_diag_lock. */
static int fs_diag_exchange(const struct nlmsghdr *ask, uint32_t *inode, uint32_t *uid, bool any_state)
{
	struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
	union {
		struct nlmsghdr nlh;
		char bytes[1024];
	} reply;
	int fd = fs_diag_socket_locked();
	ssize_t n;

	if (fd < 0)
		return -1;
	if (fs_real.sendto(fd, ask, ask->nlmsg_len, MSG_NOSIGNAL, (struct sockaddr *)&kernel, sizeof(kernel)) < 0)
		return -1;
	for (int tries = 0; tries < 8; tries++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		/* The kernel answers an exact lookup inside sendto(): the reply
		 * is queued before it returns, so read first and poll only if it
		 * is not (a poll before every read was a third system call per
		 * question, 1.5-3 us of the 4-7 a question costs here, and every
		 * local probe asks two). */
		n = fs_real.recv(fd, &reply, sizeof(reply), MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			if (fs_real.poll(&p, 1, 100) <= 0)
				return -1;
			n = fs_real.recv(fd, &reply, sizeof(reply), MSG_DONTWAIT);
		}
		if (n < (ssize_t)sizeof(struct nlmsghdr))
			return -1;
		if (reply.nlh.nlmsg_seq != ask->nlmsg_seq)
			continue; /* an answer to an earlier question that timed out */
		if (reply.nlh.nlmsg_type == SOCK_DIAG_BY_FAMILY) {
			const struct inet_diag_msg *info = NLMSG_DATA(&reply.nlh);

			if (n < (ssize_t)NLMSG_LENGTH(sizeof(*info)))
				return -1;
			*inode = info->idiag_inode;
			*uid = info->idiag_uid;
			if (any_state)
				return 1;
			/* An exact lookup ignores idiag_states: judge the state here.
			 * SYN_RECV: the client's last handshake ACK and its probe may
			 * be processed out of order. Closing states are gone. */
			return info->idiag_state == TCP_ESTABLISHED || info->idiag_state == TCP_SYN_RECV;
		}
		if (reply.nlh.nlmsg_type == NLMSG_ERROR) {
			const struct nlmsgerr *err = NLMSG_DATA(&reply.nlh);

			return err->error == -ENOENT ? 0 : -1;
		}
		return -1;
	}
	return -1;
}

/* One exact NETLINK_SOCK_DIAG lookup of the PROTOCOL socket whose
 * identity is SRC:SPORT -> DST:DPORT (addresses IPv6 or v4-mapped), under
 * the one question at a time lock; as fs_diag_exchange. */
static int fs_diag_ask(uint8_t protocol, uint32_t states, const uint8_t src[16], uint16_t sport,
		       const uint8_t dst[16], uint16_t dport, uint32_t *inode, uint32_t *uid, bool any_state)
{
	static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 req;
	} msg = { 0 };
	bool v4 = memcmp(dst, mapped, 12) == 0;
	int answer;

	msg.nlh.nlmsg_len = sizeof(msg);
	msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	msg.nlh.nlmsg_flags = NLM_F_REQUEST;
	msg.nlh.nlmsg_seq = (uint32_t)fs_now_ns();
	msg.req.sdiag_family = v4 ? AF_INET : AF_INET6;
	msg.req.sdiag_protocol = protocol;
	msg.req.idiag_states = states;
	msg.req.id.idiag_sport = htons(sport);
	msg.req.id.idiag_dport = htons(dport);
	if (v4) {
		memcpy(msg.req.id.idiag_src, src + 12, 4);
		memcpy(msg.req.id.idiag_dst, dst + 12, 4);
	} else {
		memcpy(msg.req.id.idiag_src, src, 16);
		memcpy(msg.req.id.idiag_dst, dst, 16);
	}
	msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
	msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	pthread_mutex_lock(&fs_diag_lock);
	answer = fs_diag_exchange(&msg.nlh, inode, uid, any_state);
	pthread_mutex_unlock(&fs_diag_lock);
	return answer;
}

/* Asks the kernel whether an established TCP connection LOCAL:LPORT <->
 * CLIENT:CPORT exists (in the accept queue or accepted): one exact socket
 * lookup over NETLINK_SOCK_DIAG. A probe is answered yes only for a real
 * connection, so forged or garbled probes cannot leave records for
 * connections that do not exist (which would deny offload to whoever later
 * uses that port). Returns 1 (exists), 0 (does not), -1 (cannot tell). */
static int fs_diag_lookup(const uint8_t local[16], uint16_t lport, const uint8_t client[16], uint16_t cport,
			  uint32_t *inode, uint32_t *uid, bool any_state)
{
	uint32_t ignored, ignored_uid;

	/* the state filter is for dumps; an exact lookup ignores it (see
	 * fs_diag_exchange, which checks the state in the reply) */
	return fs_diag_ask(IPPROTO_TCP, (1u << TCP_ESTABLISHED) | (1u << TCP_SYN_RECV), local, lport, client, cport,
			   inode ? inode : &ignored, uid ? uid : &ignored_uid, any_state);
}

/* A client on this host (its address is ours: the listener's own, or
 * loopback) has its end of the connection in this network namespace. */
static bool fs_client_local(const uint8_t local[16], const uint8_t client[16])
{
	static const uint8_t v4_loop[13] = { [10] = 0xff, [11] = 0xff, [12] = 127 };
	static const uint8_t v6_loop[16] = { [15] = 1 };

	return memcmp(local, client, 16) == 0 || memcmp(client, v4_loop, 13) == 0 ||
	       memcmp(client, v6_loop, 16) == 0;
}

/* Whether the connection LOCAL:LPORT <-> CLIENT:CPORT exists, as
 * fs_diag_lookup. For a client on this host the kernel is asked for the
 * client's end instead (ESTABLISHED once its connect() returned, which is
 * when it probes): the same one lookup proves the connection and gives the
 * inode of the client's socket (*CLIENT_INODE, else 0), which the HELLO's
 * shm address is later checked against (fs_negotiate: one readlink). */
int fs_conn_exists(const uint8_t local[16], uint16_t lport, const uint8_t client[16], uint16_t cport,
		   uint32_t *client_inode, uint32_t *client_uid)
{
	*client_inode = 0;
	*client_uid = FS_DIAG_NO_UID;
	if (fs_client_local(local, client) &&
	    fs_diag_lookup(client, cport, local, lport, client_inode, client_uid, false) == 1)
		return 1;
	*client_inode = 0;
	*client_uid = FS_DIAG_NO_UID;
	return fs_diag_lookup(local, lport, client, cport, NULL, NULL, false);
}

int fs_diag_listener(const uint8_t addr[16], uint16_t port, const uint8_t from[16], uint32_t *inode, uint32_t *uid)
{
	/* An exact lookup finds an established socket first, then the
	 * listener a SYN from FROM would reach: with remote port 0 no
	 * established socket matches, so the answer is the listener. */
	*inode = 0;
	*uid = FS_DIAG_NO_UID;
	return fs_diag_ask(IPPROTO_TCP, 1u << TCP_LISTEN, addr, port, from, 0, inode, uid, true);
}

int fs_udp_owner(const uint8_t addr[16], uint16_t port, const uint8_t peer[16], uint16_t peer_port, uint32_t *uid)
{
	uint32_t inode;
	int answer;

	/* udp_dump_one() looks the socket up as the receiver of a datagram
	 * from idiag_src:sport to idiag_dst:dport ("src and dst are swapped
	 * for historical reasons", net/ipv4/udp_diag.c): the socket's own
	 * address goes in dst, its peer's in src. */
	answer = fs_diag_ask(IPPROTO_UDP, ~0u, peer, peer_port, addr, port, &inode, uid, true);
	if (answer != 1)
		*uid = FS_DIAG_NO_UID;
	return answer;
}

int fs_conn_held_here(const uint8_t local[16], uint16_t lport, const uint8_t client[16], uint16_t cport)
{
	uint32_t inode = 0;
	char want[32], link[64];
	struct dirent *de;
	DIR *dir;
	int found = 0;

	if (fs_diag_lookup(local, lport, client, cport, &inode, NULL, false) != 1)
		return 0;
	if (!inode)
		return 0; /* in the accept queue: the listening socket there now will take it */
	snprintf(want, sizeof(want), "socket:[%u]", inode);
	dir = opendir("/proc/self/fd");
	if (!dir)
		return -1;
	while (!found && (de = readdir(dir))) {
		char path[300];
		ssize_t n;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n > 0) {
			link[n] = 0;
			found = strcmp(link, want) == 0;
		}
	}
	closedir(dir);
	return found;
}

int fs_conn_peer_inode(int fd, uint32_t *inode)
{
	struct sockaddr_storage me, peer;
	socklen_t mlen = sizeof(me), plen = sizeof(peer);
	uint8_t maddr[16], paddr[16];
	uint16_t mport, pport;

	if (fs_real.getsockname(fd, (struct sockaddr *)&me, &mlen) || fs_real.getpeername(fd, (struct sockaddr *)&peer, &plen) ||
	    (me.ss_family != AF_INET && me.ss_family != AF_INET6))
		return -1;
	fs_sockaddr_key((struct sockaddr *)&me, maddr, &mport);
	fs_sockaddr_key((struct sockaddr *)&peer, paddr, &pport);
	/* the peer's socket: its local end is our remote one */
	return fs_diag_lookup(paddr, pport, maddr, mport, inode, NULL, true);
}

/* Reads the replies of one dump request on FD into INODE[] (room for MAX;
 * *N counts). Returns 0 when the dump ended (NLMSG_DONE), 1 when the family
 * has no sock_diag handler (no IPv6: nothing listens there), -1 otherwise
 * (an error, a full INODE[], no answer within a second). */
static int fs_diag_dump_listeners(int fd, uint8_t family, uint64_t *inode, unsigned max, unsigned *n)
{
	struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 req;
	} msg = { 0 };
	union {
		struct nlmsghdr nlh;
		char bytes[16384];
	} reply;

	msg.nlh.nlmsg_len = sizeof(msg);
	msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	msg.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	msg.nlh.nlmsg_seq = family;
	msg.req.sdiag_family = family;
	msg.req.sdiag_protocol = IPPROTO_TCP;
	msg.req.idiag_states = 1u << TCP_LISTEN;
	if (fs_real.sendto(fd, &msg, sizeof(msg), MSG_NOSIGNAL, (struct sockaddr *)&kernel, sizeof(kernel)) < 0)
		return -1;
	/* bounded: a dump of listeners is a few replies */
	for (int parts = 0; parts < 4096; parts++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t len;

		if (fs_real.poll(&p, 1, 1000) <= 0)
			return -1;
		len = fs_real.recv(fd, &reply, sizeof(reply), MSG_DONTWAIT);
		if (len < 0)
			return -1;
		for (struct nlmsghdr *h = &reply.nlh; NLMSG_OK(h, (size_t)len); h = NLMSG_NEXT(h, len)) {
			if (h->nlmsg_seq != family)
				continue;
			if (h->nlmsg_type == NLMSG_DONE)
				return 0;
			if (h->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *err = NLMSG_DATA(h);

				return family == AF_INET6 && (err->error == -ENOENT || err->error == -EAFNOSUPPORT) ? 1 : -1;
			}
			if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY && h->nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
				const struct inet_diag_msg *info = NLMSG_DATA(h);

				if (info->idiag_state != TCP_LISTEN)
					continue;
				if (*n == max)
					return -1;
				inode[(*n)++] = info->idiag_inode;
			}
		}
	}
	return -1;
}

int fs_diag_listeners(uint64_t *inode, unsigned max, unsigned *n)
{
	int fd = fs_real.socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG), ret = -1;

	*n = 0;
	if (fd < 0)
		return -1;
	if (fs_diag_dump_listeners(fd, AF_INET, inode, max, n) == 0 &&
	    fs_diag_dump_listeners(fd, AF_INET6, inode, max, n) >= 0)
		ret = 0;
	fs_real.close(fd);
	return ret;
}

void fs_diag_after_fork(void)
{
	pthread_mutex_init(&fs_diag_lock, NULL);
	if (fs_diag_fd >= 0) { /* shared with the parent, as its replies would be */
		fs_internal_fd_close(fs_diag_fd);
		fs_diag_fd = -1;
	}
}
