/* SPDX-License-Identifier: MIT */
/*
 * The engine (see engine.h for the flow-control rules): lifecycle, rails
 * and their endpoints, the stream table (create, connect, destroy), the
 * progress loop that reads the completion queues and hands each completion
 * to the queue it belongs to, orphans, and the process's exit.
 * The application-facing operations on a stream (send, recv, wait, close)
 * are in stream.c; the send queue, its posting and the credit reports in
 * txq.c; the shared receives, the receive path and the receive queue in
 * rxq.c; waking the threads that sleep on streams in wake.c.
 */
#include "core/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <arpa/inet.h>
#include <limits.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "core/bell.h"
#include "core/fdtable.h"
#include "core/guard.h"
#include "core/handback.h"
#include "core/negotiate.h"
#include "core/nics.h"
#include "core/ring.h"
#include "core/sigs.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/stream_internal.h"
#include "core/udp.h"
#include "core/wire.h"
#include "preload/real.h"

#define FS_CTRL_BUF 64u
/* Control receives a rail keeps posted, shared by all its streams: a CREDIT
 * is handled and its buffer re-posted in the progress round it lands in. */
#define FS_CTRL_POSTED 64u
#define FS_CQ_BATCH 16

static pthread_mutex_t fs_engine_create_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fs_engine *fs_engine_cur;
/* The process is ending and its engine has been shut down: no new streams. */
static int fs_engine_ended;

static void fs_read_host_id(uint8_t out[16])
{
	char text[64] = "";
	int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
	unsigned j = 0;

	memset(out, 0, 16);
	if (fd >= 0) {
		ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
		(void)n;
		fs_real.close(fd);
	}
	for (unsigned i = 0; text[i] && j < 32; i++) {
		char c = text[i];
		int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;

		if (v < 0)
			continue;
		out[j / 2] |= (uint8_t)(v << ((j % 2) ? 0 : 4));
		j++;
	}
}

struct fs_engine *fs_engine_peek(void)
{
	struct fs_engine *e = __atomic_load_n(&fs_engine_cur, __ATOMIC_ACQUIRE);

	return e && e->pid == fs_self_pid() ? e : NULL;
}

struct fs_engine *fs_engine_get(void)
{
	struct fs_engine *e = fs_engine_peek();

	if (e)
		return e;
	pthread_mutex_lock(&fs_engine_create_lock);
	e = fs_engine_peek();
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (e) {
			pthread_mutex_init(&e->lock, NULL);
			e->pid = fs_self_pid();
			e->next_id = 1;
			/* made with the engine, not at the first deep sleep: a
			 * sleepy process sleeps deeply within its first requests,
			 * and its descriptors stay what they were after the first
			 * connection (e2e_perrequest) */
			e->deep_fd = -1;
			e->cq_set_fd = -1;
			fs_engine_deep_fd_open(e);
			e->active_ns = fs_now_ns();
			fs_dlist_init(&e->pending);
			fs_dlist_init(&e->unpulled);
			fs_dlist_init(&e->sleeping);
			fs_dlist_init(&e->switching);
			fs_dlist_init(&e->credit_retry);
			fs_dlist_init(&e->grown);
			fs_dlist_init(&e->starved);
			e->budget.cap = (uint64_t)fs_params.rx_budget_mb << 20;
			fs_read_host_id(e->host_id);
			if (fs_handback_page_create(e))
				FS_WARN("cannot create the hand-back page: processes forked later cannot use "
					"this one's offloaded sockets");
			__atomic_store_n(&fs_engine_cur, e, __ATOMIC_RELEASE);
		}
	}
	pthread_mutex_unlock(&fs_engine_create_lock);
	/* none after the process's end has been handled (fs_engine_shutdown) */
	return __atomic_load_n(&fs_engine_ended, __ATOMIC_ACQUIRE) ? NULL : e;
}

void fs_engine_forget_after_fork(void)
{
	/* The child must not close, progress or free the parent's objects: they
	 * stay allocated (and mapped) but unreachable. */
	struct fs_engine *e = __atomic_load_n(&fs_engine_cur, __ATOMIC_ACQUIRE);

	if (e && e->pid != getpid()) {
		__atomic_store_n(&fs_engine_cur, NULL, __ATOMIC_RELEASE);
		pthread_mutex_init(&fs_engine_create_lock, NULL);
	}
}

/* ---- rails and endpoints ----------------------------------------------- */

/* The queue depth a new endpoint of KIND asks its provider for
 * (fs_rail_open; only shm takes it). A process's first connection waits for
 * its endpoint, and what shm allocates and first touches there grows with
 * the depth: its free stacks of send, receive, unexpected-message and
 * segmented-transfer entries (~350 B each), the region's command queue and
 * the completion queue. At shm's own 1024 that is ~300 page faults, 5-9 ms
 * of CPU on this project's 2-core VM (a first touch costs ~16 us there),
 * against the 1-3 ms that 256 costs: a third of what a curl process
 * fetching 4 MB paid for its rail (docs/design.md, "A rail's cost").
 * A process that opens the rail for a connection it made (a client: curl,
 * wrk, pgbench) gets FABSOCK_SHM_DEPTH (0 by default: the provider's; a
 * wrk of 1,000 streams on 256 once saw its server's last writes stall);
 * one that opens it for a connection
 * it accepted (a server, whose streams are many), and every extra endpoint
 * (opened because the others' address vectors are full: many peers),
 * keep the provider's depth. The depth bounds what is in flight at once,
 * not what can be: a send past it is refused by the provider and posted
 * again (txq.c), the data receives kept posted are clamped below it
 * (fs_engine_ep_open). */
static size_t fs_engine_depth(unsigned kind, bool serving, bool extra)
{
	if (kind != FS_PROV_SHM || serving || extra)
		return 0;
	return (size_t)fs_params.shm_depth;
}

/* Opens endpoint ER of KIND (its rail, pools and first receives), with the
 * queue depth of fs_engine_depth. */
static int fs_engine_ep_open(struct fs_engine_rail *er, unsigned kind, const struct sockaddr *local, unsigned nth,
			     size_t depth, char *why, size_t whylen)
{
	uint32_t chunk = (uint32_t)fs_params.chunk_size;
	uint64_t t[3] = { 0, 0, 0 };
	int ret;

	fs_rail_stamp("start", t);
	ret = fs_rail_open_nic(&er->rail, kind, local, nth, depth, why, whylen);
	if (ret)
		return ret;
	fs_rail_stamp("endpoint open in all", t);
	/* from now on a signal that ends the process delivers first */
	fs_sigs_exit_install();
	if (er->rail.max_msg_size && chunk + FS_WIRE_MSG_PREFIX > er->rail.max_msg_size)
		chunk = (uint32_t)(er->rail.max_msg_size - FS_WIRE_MSG_PREFIX);
	/* exactly CHUNK_SIZE (buffers are rounded up): with a power of two,
	 * payloads line up with the application's reads, so that they can be
	 * pulled straight into its buffer */
	er->chunk = chunk;
	/* The provider's receive queue holds the posted data and control
	 * receives and the pulls' receives (a pull that finds the queue full
	 * loses its payload: rxq.c), so a quarter of it is left to the pulls
	 * (of shm's 1024 more than RX_POSTED leaves anyway; of a client's 256,
	 * 64); the data pool, those posted and as many kept by streams. */
	er->data_target = (unsigned)fs_params.rx_posted;
	if (er->rail.rx_depth < FS_CTRL_POSTED + 2 + er->rail.rx_depth / 4)
		er->data_target = 1;
	else if (er->data_target > er->rail.rx_depth - FS_CTRL_POSTED - 1 - er->rail.rx_depth / 4)
		er->data_target = (unsigned)(er->rail.rx_depth - FS_CTRL_POSTED - 1 - er->rail.rx_depth / 4);
	er->held_data = 0;
	fs_pool_init(&er->rx_data, &er->rail, FS_BUF_RX_DATA, chunk + FS_WIRE_MSG_PREFIX, 16, 2 * er->data_target);
	fs_pool_init(&er->rx_ctrl, &er->rail, FS_BUF_RX_CTRL, FS_CTRL_BUF, 64, FS_CTRL_POSTED);
	fs_pool_init(&er->tx_data, &er->rail, FS_BUF_TX, chunk + FS_WIRE_MSG_PREFIX, 16, 1u << 20);
	fs_pool_init(&er->tx_ctrl, &er->rail, FS_BUF_TX, FS_CTRL_BUF, 64, 1u << 20);
	er->open = true;
	if (fs_post_more(er, &er->rx_ctrl, &er->posted_ctrl,
			 er->rail.rx_depth < FS_CTRL_POSTED + 2 ? 1 : FS_CTRL_POSTED)) {
		snprintf(why, whylen, "%s rail: cannot post receives", fs_fabric_prov_name(kind));
		fs_pool_fini(&er->rx_data);
		fs_pool_fini(&er->rx_ctrl);
		fs_pool_fini(&er->tx_data);
		fs_pool_fini(&er->tx_ctrl);
		fs_rail_close(&er->rail);
		er->open = false;
		er->posted_ctrl = 0;
		return -EIO;
	}
	fs_rail_stamp("pools and first receives", t);
	return 0;
}

/* Whether IP (16 bytes, as fs_sockaddr_key gives it) is an IPv4 address. */
static bool fs_ip_v4mapped(const uint8_t ip[16])
{
	static const uint8_t prefix[12] = { [10] = 0xff, [11] = 0xff };

	return !memcmp(ip, prefix, sizeof(prefix));
}

/* The address of NIC a rail of KIND (tcp, net) opens on: the one of its
 * addresses FABSOCK_RAIL_ADDRS names, else its first. */
static bool fs_engine_nic_ip(const struct fs_nic *nic, const struct fs_nics_spec *spec, uint8_t out[16])
{
	for (unsigned i = 0; i < spec->count; i++)
		for (unsigned k = 0; spec->entry[i].kind == FS_NICS_BY_IP && k < nic->ips; k++)
			if (!memcmp(spec->entry[i].ip, nic->ip[k], 16)) {
				memcpy(out, nic->ip[k], 16);
				return true;
			}
	if (!nic->ips)
		return false;
	memcpy(out, nic->ip[0], 16);
	return true;
}

/* Whether the interface holding IP (16 bytes, IPv4 mapped) is up and
 * running in IFS; false when no interface holds it. */
static bool fs_engine_ip_running(const struct ifaddrs *ifs, const uint8_t ip[16])
{
	for (const struct ifaddrs *ifa = ifs; ifa; ifa = ifa->ifa_next) {
		uint8_t key[16];
		uint16_t port;

		if (!ifa->ifa_addr || (ifa->ifa_addr->sa_family != AF_INET && ifa->ifa_addr->sa_family != AF_INET6))
			continue;
		fs_sockaddr_key(ifa->ifa_addr, key, &port);
		if (!memcmp(key, ip, 16))
			return (ifa->ifa_flags & IFF_UP) && (ifa->ifa_flags & IFF_RUNNING);
	}
	return false;
}

/* Opens one more NIC's first endpoint after TAIL (on the used NIC of rank
 * NTH, or at LOCAL); false (logged) if it does not open. */
static bool fs_engine_nic_open(struct fs_engine_rail **tail, unsigned kind, const struct sockaddr *local,
			       unsigned nth, size_t depth)
{
	struct fs_engine_rail *er = calloc(1, sizeof(*er));
	char why[200];

	if (!er)
		return false;
	if (fs_engine_ep_open(er, kind, local, nth, depth, why, sizeof(why))) {
		FS_INFO("FABSOCK_RAILS=%u: no rail on a further %s NIC: %s", (unsigned)fs_params.rails,
			fs_fabric_prov_name(kind), why);
		free(er);
		return false;
	}
	er->head = er;
	er->nic_index = (*tail)->nic_index + 1;
	er->nic_nth = nth;
	(*tail)->next_nic = er;
	*tail = er;
	FS_STAT_INC(nic_rails);
	return true;
}

/* FABSOCK_RAILS above 1: a rail on each further NIC this process may use,
 * opened right after the first (issue 28, "Every NIC"; docs/design.md).
 * efa and providers that list their NICs: the used NICs of rank 1.. (the
 * first rail took rank 0). tcp and net, whose first rail is opened on the
 * TCP connection's own local address: the other NICs of this host that
 * FABSOCK_RAIL_ADDRS names (named, since the provider cannot tell which of
 * a host's interfaces a peer reaches; never a loopback one unless the
 * first is; not one whose interface is down), each on its named address.
 * A rail that does not open is logged and left out: the streams spread
 * over the others. */
static void fs_engine_open_nics(struct fs_engine_rail *first, unsigned kind, size_t depth)
{
	struct fs_engine_rail *tail = first;
	unsigned want = (unsigned)fs_params.rails, opened = 1;
	const struct fs_nics_spec *spec;
	struct fs_nics *nics;
	struct ifaddrs *ifs = NULL;
	uint8_t first_ip[16];
	bool first_lo;
	char why[200];

	first->nics_tried = true;
	if (kind == FS_PROV_SHM || want <= 1)
		return;
	if (kind != FS_PROV_TCP && kind != FS_PROV_NET) {
		for (unsigned nth = 1; nth < first->rail.nics_used && opened < want; nth++)
			opened += fs_engine_nic_open(&tail, kind, NULL, nth, depth);
		return;
	}
	spec = fs_nics_spec_global();
	if (!spec->count) {
		FS_INFO("FABSOCK_RAILS=%u: a further %s rail opens only on an interface FABSOCK_RAIL_ADDRS names",
			(unsigned)fs_params.rails, fs_fabric_prov_name(kind));
		return;
	}
	if (!fs_fabric_addr_ip(kind, first->rail.addr, first->rail.addr_len, first_ip))
		return;
	first_lo = fs_negotiate_loopback(first_ip);
	nics = calloc(1, sizeof(*nics));
	if (!nics)
		return;
	FS_GUARD_ENTER();
	if (getifaddrs(&ifs))
		ifs = NULL;
	FS_GUARD_LEAVE();
	if (fs_fabric_nics(kind, nics, why, sizeof(why)) == 0) {
		for (unsigned nth = 0; opened < want; nth++) {
			const struct fs_nic *nic = fs_nics_nth_used(nics, nth);
			struct sockaddr_storage ss;
			uint8_t ip[16];
			bool ours = false;

			if (!nic)
				break;
			for (unsigned k = 0; k < nic->ips; k++)
				ours |= !memcmp(nic->ip[k], first_ip, 16);
			if (ours || !fs_engine_nic_ip(nic, spec, ip) || (fs_negotiate_loopback(ip) && !first_lo))
				continue;
			if (ifs && !fs_engine_ip_running(ifs, ip)) {
				FS_INFO("FABSOCK_RAILS=%u: no rail on %s NIC %s: its interface is down", (unsigned)fs_params.rails,
					fs_fabric_prov_name(kind), nic->name);
				continue;
			}
			memset(&ss, 0, sizeof(ss));
			if (fs_ip_v4mapped(ip)) {
				struct sockaddr_in *four = (struct sockaddr_in *)&ss;

				four->sin_family = AF_INET;
				memcpy(&four->sin_addr, ip + 12, 4);
			} else {
				struct sockaddr_in6 *six = (struct sockaddr_in6 *)&ss;

				six->sin6_family = AF_INET6;
				memcpy(&six->sin6_addr, ip, 16);
			}
			opened += fs_engine_nic_open(&tail, kind, (struct sockaddr *)&ss, 0, depth);
		}
	} else {
		FS_INFO("FABSOCK_RAILS=%u: cannot list the %s NICs: %s", (unsigned)fs_params.rails,
			fs_fabric_prov_name(kind), why);
	}
	if (ifs) {
		FS_GUARD_ENTER();
		freeifaddrs(ifs);
		FS_GUARD_LEAVE();
	}
	free(nics);
}

int fs_engine_rail(struct fs_engine *e, unsigned kind, const struct sockaddr *local, bool serving,
		   struct fs_engine_rail **out, char *why, size_t whylen)
{
	struct fs_engine_rail *er;
	int ret;

	if (kind <= FS_PROV_NONE || kind >= FS_PROV_MAX_)
		return -EINVAL;
	er = &e->rails[kind];
	if (!er->open) {
		ret = fs_engine_ep_open(er, kind, local, 0, fs_engine_depth(kind, serving, false), why, whylen);
		if (ret)
			return ret;
		er->head = er;
	}
	if (!er->nics_tried)
		fs_engine_open_nics(er, kind, fs_engine_depth(kind, serving, false));
	*out = er;
	return 0;
}

void fs_engine_nics_watch(struct fs_engine *e, uint64_t now)
{
	struct ifaddrs *ifs = NULL;
	bool several = false;

	for (unsigned kind = FS_PROV_TCP; kind <= FS_PROV_NET; kind++)
		several |= e->rails[kind].open && e->rails[kind].next_nic;
	if (!several || now < e->nics_watch_ns)
		return;
	e->nics_watch_ns = now + 1000000000ull;
	FS_GUARD_ENTER();
	if (getifaddrs(&ifs))
		ifs = NULL;
	FS_GUARD_LEAVE();
	if (!ifs)
		return;
	for (unsigned kind = FS_PROV_TCP; kind <= FS_PROV_NET; kind++) {
		if (!e->rails[kind].open || !e->rails[kind].next_nic)
			continue;
		for (struct fs_engine_rail *h = &e->rails[kind]; h && h->open; h = h->next_nic) {
			uint8_t ip[16];
			char why[160], text[INET6_ADDRSTRLEN];
			unsigned reset = 0;

			if (h->nic_failed || !fs_fabric_addr_ip(kind, h->rail.addr, h->rail.addr_len, ip) ||
			    fs_engine_ip_running(ifs, ip))
				continue;
			h->nic_failed = true;
			FS_STAT_INC(nic_rails_failed);
			if (!inet_ntop(AF_INET6, ip, text, sizeof(text)))
				snprintf(text, sizeof(text), "?");
			snprintf(why, sizeof(why), "the interface of its %s rail (NIC %u, %s) is down or gone",
				 fs_fabric_prov_name(kind), h->nic_index, text);
			for (uint32_t id = 1; id < e->streams_cap; id++) {
				struct fs_stream *st = e->streams[id];

				/* its home or one of its stripes (stripe.c) */
				if (st && !st->dead && !st->error && st->erail && fs_stripe_uses(st, h)) {
					fs_stream_reset(e, st, why);
					reset++;
				}
			}
			FS_WARN("%s: %u stream(s) reset; new streams take the other NICs", why, reset);
		}
	}
	FS_GUARD_ENTER();
	freeifaddrs(ifs);
	FS_GUARD_LEAVE();
}

/* How many leading bits A and B share. */
unsigned fs_ip_common_bits(const uint8_t a[16], const uint8_t b[16])
{
	unsigned bits = 0;

	for (unsigned i = 0; i < 16; i++) {
		uint8_t x = a[i] ^ b[i];

		if (x)
			return bits + (unsigned)__builtin_clz((unsigned)x) - 24;
		bits += 8;
	}
	return bits;
}

/* The NIC a new stream of KIND makes its home (its first endpoint), among
 * FIRST and the further NICs' (next_nic): with the peer's address known (a
 * server, from the HELLO) on tcp and net, the one whose address shares the
 * most leading bits with it (a link's own subnet: rail 1 to the peer's
 * rail 1); then, and everywhere else, the one with the fewest streams, the
 * nearest first. */
static struct fs_engine_rail *fs_engine_pick_nic(struct fs_engine_rail *first, unsigned kind, const void *peer,
						 size_t peer_len)
{
	struct fs_engine_rail *best = first;
	unsigned best_load = UINT_MAX;
	int best_bits = -1;
	uint8_t pip[16], rip[16];
	bool by_ip;

	if (!first->next_nic)
		return first;
	by_ip = peer && fs_fabric_addr_ip(kind, peer, peer_len, pip);
	for (struct fs_engine_rail *h = first; h; h = h->next_nic) {
		unsigned load = 0;
		int bits = -1;

		if (h->nic_failed)
			continue; /* its interface went down (fs_engine_nics_watch); all down: the first */
		for (struct fs_engine_rail *er = h; er; er = er->next_ep)
			load += er->streams;
		if (by_ip && fs_fabric_addr_ip(kind, h->rail.addr, h->rail.addr_len, rip))
			bits = (int)fs_ip_common_bits(pip, rip);
		if (bits > best_bits || (bits == best_bits && load < best_load)) {
			best = h;
			best_bits = bits;
			best_load = load;
		}
	}
	return best;
}

/* An endpoint of KIND for a stream to the peer at PEER (NULL: not known
 * yet, a client before the HELLO-ACK): one whose address vector holds the
 * peer or has room for it, the first endpoints first; opens another when
 * all are full; -ENOSPC (WHY says so) when FS_ENGINE_MAX_EPS are open and
 * full, so that the socket stays on TCP. Engine lock held. */
static int fs_engine_rail_for(struct fs_engine *e, unsigned kind, const struct sockaddr *local, const void *peer,
			      size_t peer_len, struct fs_engine_rail **out, char *why, size_t whylen)
{
	struct fs_engine_rail *first, *er, *last = NULL;
	const struct sockaddr *at = local;
	/* a peer known: the HELLO's, on the server's side */
	int ret = fs_engine_rail(e, kind, local, peer != NULL, &first, why, whylen);

	if (ret)
		return ret;
	first = fs_engine_pick_nic(first, kind, peer, peer_len);
	*out = first;
	/* the peer's endpoint, if one of ours knows it: no new slot, and its
	 * streams keep to one pair of regions */
	for (er = first; er && peer; er = er->next_ep)
		if (fs_rail_av_knows(&er->rail, peer, peer_len)) {
			*out = er;
			return 0;
		}
	for (er = first; er; er = er->next_ep) {
		if (fs_rail_av_room(&er->rail, er->hello_pending)) {
			*out = er;
			return 0;
		}
		last = er;
	}
	/* All full. Refused here, before the HELLO or the ACK names an
	 * endpoint: a client that found no slot after the server's ACK could
	 * only reset the connection. */
	if (last->ep_index + 1 >= FS_ENGINE_MAX_EPS) {
		snprintf(why, whylen, "all %u endpoints of the %s rail hold their most peers (%u each)",
			 FS_ENGINE_MAX_EPS, fs_fabric_prov_name(kind), last->rail.av_max);
		return -ENOSPC;
	}
	er = calloc(1, sizeof(*er));
	if (!er) {
		snprintf(why, whylen, "out of memory for another endpoint");
		return -ENOSPC;
	}
	/* Its own region, named like the first with a fresh nonce; on the NIC
	 * of FIRST: NIC 0 as it was opened, a further one of tcp or net at its
	 * own address, of another provider by its rank (nic_nth). */
	if (first != &e->rails[kind])
		at = kind == FS_PROV_TCP || kind == FS_PROV_NET ? (const struct sockaddr *)first->rail.addr : NULL;
	if (fs_engine_ep_open(er, kind, at, first->nic_nth, fs_engine_depth(kind, peer != NULL, true), why,
			      whylen)) {
		free(er);
		return -ENOSPC;
	}
	er->ep_index = last->ep_index + 1;
	er->head = first;
	er->nic_index = first->nic_index;
	last->next_ep = er;
	FS_STAT_INC(endpoints_extra);
	FS_INFO("opened endpoint %u of the %s rail: the address vectors of the first %u hold %u peers each",
		er->ep_index, fs_fabric_prov_name(kind), er->ep_index, last->rail.av_max);
	*out = er;
	return 0;
}

/* The epoll set of every rail's completion-queue fd (level-triggered: it
 * reads ready while one of them does), made when a second such rail is
 * first waited on; rails only close at the process's end. -1 if it cannot
 * be made: the waiters keep to their slices, as they did with two fds. */
static int fs_engine_cq_set(struct fs_engine *e)
{
	if (e->cq_set_fd < 0) {
		FS_GUARD_ENTER();
		e->cq_set_fd = fs_real.epoll_create1(EPOLL_CLOEXEC);
		FS_GUARD_LEAVE();
		if (e->cq_set_fd < 0)
			return -1;
	}
	for (struct fs_engine_rail *er = fs_engine_ep_first(e); er; er = fs_engine_ep_next(e, er)) {
		struct epoll_event ev = { .events = EPOLLIN };

		if (er->in_cq_set || er->rail.cq_fd < 0)
			continue;
		ev.data.fd = er->rail.cq_fd;
		FS_GUARD_ENTER();
		if (fs_real.epoll_ctl(e->cq_set_fd, EPOLL_CTL_ADD, er->rail.cq_fd, &ev) && errno != EEXIST) {
			FS_GUARD_LEAVE();
			return -1;
		}
		FS_GUARD_LEAVE();
		er->in_cq_set = true;
	}
	return e->cq_set_fd;
}

int fs_engine_cq_wait_fd(struct fs_engine *e)
{
	int fd = -1;
	unsigned fds = 0;

	for (struct fs_engine_rail *er = fs_engine_ep_first(e); er; er = fs_engine_ep_next(e, er)) {
		int r = fs_rail_cq_wait_fd(&er->rail);

		if (r == -EAGAIN)
			return -EAGAIN;
		if (r >= 0) {
			fd = r;
			fds++;
		}
	}
	/* every rail said "sleep" (fi_trywait): one fd, or the set of them */
	return fds > 1 ? fs_engine_cq_set(e) : fd;
}

int fs_engine_cq_wait_fd_try(void)
{
	struct fs_engine *e = fs_engine_peek();
	int fd;

	if (!e || pthread_mutex_trylock(&e->lock))
		return -1;
	fd = fs_engine_cq_wait_fd(e);
	fs_engine_unlock(e);
	return fd;
}

void fs_engine_cq_sleep(struct fs_engine *e, bool begin)
{
	if (!e)
		return;
	if (begin)
		__atomic_add_fetch(&e->cq_sleepers, 1, __ATOMIC_RELAXED);
	else
		__atomic_sub_fetch(&e->cq_sleepers, 1, __ATOMIC_RELAXED);
}

struct fs_engine_rail *fs_engine_ep_first(struct fs_engine *e)
{
	for (unsigned kind = FS_PROV_SHM; kind < FS_PROV_MAX_; kind++)
		if (e->rails[kind].open)
			return &e->rails[kind];
	return NULL;
}

struct fs_engine_rail *fs_engine_ep_next(struct fs_engine *e, struct fs_engine_rail *er)
{
	if (er->next_ep)
		return er->next_ep;
	if (er->head && er->head->next_nic)
		return er->head->next_nic;
	for (unsigned kind = er->rail.kind + 1; kind < FS_PROV_MAX_; kind++)
		if (e->rails[kind].open)
			return &e->rails[kind];
	return NULL;
}

/* ---- streams ----------------------------------------------------------- */

static uint32_t fs_engine_alloc_id(struct fs_engine *e, struct fs_stream *s)
{
	if (e->live_streams + 1 >= FS_STREAM_ID_MAX)
		return 0;
	if (e->live_streams + 1 >= e->streams_cap && e->streams_cap < FS_STREAM_ID_MAX + 1) {
		uint32_t cap = e->streams_cap ? e->streams_cap * 2 : 256;
		struct fs_stream **grown;

		if (cap > FS_STREAM_ID_MAX + 1)
			cap = FS_STREAM_ID_MAX + 1;
		grown = realloc(e->streams, cap * sizeof(*grown));
		if (!grown)
			return 0;
		memset(grown + e->streams_cap, 0, (cap - e->streams_cap) * sizeof(*grown));
		e->streams = grown;
		e->streams_cap = cap;
	}
	/* Ids are handed out round-robin so a closed stream's id is not reused
	 * soon; the token in every tag catches the rest. */
	for (uint32_t n = 0; n < e->streams_cap; n++) {
		uint32_t id = e->next_id;

		e->next_id = e->next_id + 1 >= e->streams_cap ? 1 : e->next_id + 1;
		if (id && !e->streams[id]) {
			e->streams[id] = s;
			e->live_streams++;
			return id;
		}
	}
	return 0;
}

struct fs_stream *fs_stream_create(struct fs_engine *e, struct fs_engine_rail *er, uint64_t token, int *nak)
{
	struct fs_stream *s = calloc(1, sizeof(*s));
	unsigned window = (unsigned)fs_params.window;
	/* what may arrive beyond the reader: the window, and what a closing
	 * peer still had queued (credit.h, fs_credit_rx_closing's cap) */
	unsigned slots = window + fs_stream_closing_cap();

	*nak = FS_NAK_RESOURCES;
	if (!s)
		return NULL;
	s->id = fs_engine_alloc_id(e, s);
	if (!s->id) {
		free(s);
		return NULL;
	}
	er->streams++;
	er->hello_pending++;
	s->av_pending = true;
	/* Receives are shared (engine.h): a new stream only tops them up. A
	 * rail that cannot post any data receive takes no stream. */
	if (fs_post_more(er, &er->rx_data, &er->posted_data, fs_data_want(er)) && !er->posted_data) {
		FS_WARN_ONCE("no receive can be posted on the %s rail; new streams stay on TCP",
			     fs_fabric_prov_name(er->rail.kind));
		er->streams--;
		er->hello_pending--;
		e->streams[s->id] = NULL;
		e->live_streams--;
		free(s);
		return NULL;
	}
	s->erail = er;
	s->window = window;
	s->ooo_slots = slots;
	s->budget = &e->budget;
	fs_credit_rx_init(&s->credit, (unsigned)fs_params.window_min, window, er->chunk);
	s->token = token;
	s->state = FS_STREAM_HELLO;
	s->rx_expect = 1;
	s->ctl_fd = -1;
	s->app_fd = -1;
	s->wake_fd = -1;
	s->hb_fd = -1;
	s->fork_gen = fs_handback_fork_gen();
	s->peer_addr = FI_ADDR_UNSPEC;
	fs_stripe_init(e, s); /* the rails its HELLO offers */
	/* Until the peer's HELLO-ACK says otherwise, queued sends are cut to a
	 * size every peer accepts (FABSOCK_CHUNK_SIZE is at least this). */
	s->peer_chunk = FS_PRE_ACK_CHUNK;
	s->app_ref = true;
	*nak = FS_NAK_NONE;
	return s;
}

unsigned fs_engine_pull_shift(const struct fs_engine_rail *er)
{
	unsigned shift = FS_WIRE_PULL_SHIFT_MIN;

	/* A pull lands in the application's memory, which a provider that
	 * wants every buffer registered (FI_MR_LOCAL) cannot take: such a
	 * receiver would pull into its bounce buffer and gain nothing. None
	 * of ours is opened so any more (fs_rail_hints): efa's RDM endpoint
	 * registers what it is given through its own MR cache. */
	if (!fs_params.pull_min || er->rail.mr_local || fs_params.pull == 2 /* off */)
		return 0;
	/* tcp;ofi_rxm and net send a payload when it is posted, into buffers
	 * of their own at the receiver (eager, or rxm's segmented protocol up
	 * to its SAR limit), whether or not a receive waits for it: a pull
	 * keeps nothing at the sender there. It costs the reader a post and a
	 * progress round per message, and parks every announced payload in the
	 * provider's unexpected queue, whose buffers a larger WINDOW multiplies.
	 * Between namespaces (issue 28) pulls took one iperf3 stream from 11.0
	 * to 3.8 Gbit/s. shm keeps the payload in the sender's buffer and efa
	 * sends a large one only when its receive is posted (long-CTS, read):
	 * there a pull lands it in the reader's buffer with no bounce. */
	if (fs_params.pull == 0 /* auto */ && er->rail.kind != FS_PROV_SHM && er->rail.kind != FS_PROV_EFA)
		return 0;
	while (shift < FS_WIRE_PULL_SHIFT_MAX && (1ull << shift) < fs_params.pull_min)
		shift++;
	return shift;
}

/* S's peer ended before S could reach it (fs_stream_connect): its server
 * answered, wrote, closed and exited before this client looked at the
 * HELLO-ACK, whose fabric address names a region that is gone. What it
 * sent is in our queues or on its way in our own region: its exit waited
 * for each of its sends to complete (shm completes a send once it is in
 * the receiver's region or was copied out by the receiver's progress), and
 * a payload it announced for us to pull kept it alive until we pulled it,
 * which a reader does only after the join. So the stream stays, for
 * receiving only, as a kernel socket whose peer closed: the data, then the
 * FIN as an end of stream (without a FIN, the reset after
 * FABSOCK_PEER_GRACE_MS, as for any vanished peer). What this side held
 * for the server before the ACK can reach nobody: dropped, as the kernel's
 * bytes sent to a closed socket are (that was the one write a kernel
 * accepts after the peer's close; the next fails with EPIPE). Lock held. */
static void fs_stream_peer_ended(struct fs_engine *e, struct fs_stream *s)
{
	struct fs_buf *buf, *next;
	size_t dropped = 0;

	s->peer_ended = true;
	s->peer_gone = true;
	s->peer_gone_ns = fs_now_ns();
	if (s->txq_head) {
		for (buf = s->txq_head; buf; buf = next) {
			next = buf->next;
			dropped += buf->len;
			fs_pool_put(buf);
		}
		s->txq_head = s->txq_tail = NULL;
		s->txq_count = 0;
		e->pending_tx--;
		fs_dlist_del(&s->pending_link);
		s->wrote_after_gone = true;
	}
	if (s->fin_queued)
		s->fin_done = true; /* a shutdown before the ACK: nobody to tell */
	FS_INFO("stream %u: the server's process ended before this client joined it; receiving what it "
		"sent (%zu bytes held for it dropped)", s->id, dropped);
	FS_STAT_INC(peers_ended_at_join);
	fs_stream_changed(e, s);
}

int fs_stream_connect(struct fs_engine *e, struct fs_stream *s, uint32_t peer_id, unsigned peer_window,
		      uint32_t peer_chunk, unsigned peer_pull_shift, const void *addr, size_t addr_len,
		      bool ended_ok)
{
	struct fs_engine_rail *er = s->erail;
	bool ended = false;
	int ret;

	if (s->av_pending) {
		s->av_pending = false;
		er->hello_pending--;
	}
	if (!peer_id || peer_id > FS_STREAM_ID_MAX || peer_window < 1 || peer_window > FS_WIRE_WINDOW_MAX ||
	    peer_chunk < FS_PRE_ACK_CHUNK)
		return -EPROTO;
	ret = fs_rail_av_insert(&er->rail, addr, addr_len, &s->peer_addr);
	if (ret == -EADDRNOTAVAIL && ended_ok && fs_rail_peer_ended(&er->rail, addr, addr_len))
		ended = true; /* peer_addr stays FI_ADDR_UNSPEC */
	else if (ret)
		return ret;
	s->peer_id = peer_id;
	s->peer_pid = er->rail.kind == FS_PROV_SHM ? fs_shm_addr_pid(addr, addr_len) : 0;
	/* the first grant: messages 1 to window (a header that came before
	 * the join granted nothing: fs_rx_header_common) */
	s->peer_limit = peer_window;
	s->peer_grant = peer_window;
	s->peer_chunk = peer_chunk;
	if (s->peer_chunk + FS_WIRE_MSG_PREFIX > er->tx_data.buf_cap)
		s->peer_chunk = er->tx_data.buf_cap - FS_WIRE_MSG_PREFIX;
	/* The announcement goes by inject: it must fit. */
	if (peer_pull_shift >= FS_WIRE_PULL_SHIFT_MIN && peer_pull_shift <= FS_WIRE_PULL_SHIFT_MAX &&
	    er->rail.inject_size >= FS_WIRE_MSG_PREFIX)
		s->peer_pull_min = 1u << peer_pull_shift;
	s->state = FS_STREAM_OPEN;
	fs_engine_note_activity(e); /* and the new stream is not armed */
	if (ended) {
		fs_stream_peer_ended(e, s);
		return FS_JOIN_PEER_ENDED;
	}
	fs_stream_flush(e, s); /* what the application wrote before the ACK */
	return 0;
}

/* Returns every buffer the stream holds to its rail and frees it. */
static void fs_stream_destroy(struct fs_engine *e, struct fs_stream *s)
{
	struct fs_engine_rail *er = s->erail;
	struct fs_buf *buf, *next;

	fs_ring_release(s);
	if (s->av_pending) {
		s->av_pending = false;
		er->hello_pending--;
	}
	/* (each received buffer goes back to the rail that brought it) */
	for (buf = s->rxq_head; buf; buf = next) {
		next = buf->next;
		fs_engine_rx_discard(fs_stream_rail(s, buf->rail), buf);
	}
	for (unsigned i = 0; s->ooo && i < s->ooo_slots; i++)
		if (s->ooo[i])
			fs_engine_rx_discard(fs_stream_rail(s, s->ooo[i]->rail), s->ooo[i]);
	for (buf = s->txq_head; buf; buf = next) {
		next = buf->next;
		fs_pool_put(buf);
	}
	if (s->txq_head) {
		e->pending_tx--;
		fs_dlist_del(&s->pending_link);
	}
	if (fs_dlist_linked(&s->sleep_link))
		fs_dlist_del(&s->sleep_link);
	if (fs_dlist_linked(&s->credit_link))
		fs_dlist_del(&s->credit_link);
	if (fs_dlist_linked(&s->grant_link))
		fs_dlist_del(&s->grant_link);
	if (fs_dlist_linked(&s->starve_link))
		fs_dlist_del(&s->starve_link);
	fs_credit_rx_release(&s->credit, s->budget);
	if (s->unpulled) {
		s->unpulled = 0;
		fs_dlist_del(&s->pull_link);
	}
	if (fs_dlist_linked(&s->hb_link))
		fs_dlist_del(&s->hb_link);
	for (buf = s->hb_ret_head; buf; buf = next) {
		next = buf->next;
		fs_engine_repost(fs_stream_rail(s, buf->rail), buf);
	}
	for (buf = s->hb_held_head; buf; buf = next) {
		next = buf->next;
		fs_pool_put(buf);
	}
	s->hb_ret_head = s->hb_ret_tail = s->hb_held_head = s->hb_held_tail = NULL;
	s->hb_held_count = 0;
	if (s->hb_fd >= 0)
		fs_internal_fd_close(s->hb_fd);
	s->hb_fd = -1;
	/* Buffers still posted for this stream's sends (closed and its linger
	 * over, reset) complete later and are returned by the completion
	 * handler, which takes a NULL stream as nobody's: their owner is
	 * cleared here, S may be freed below. */
	if (s->tx_inflight) {
		FS_STAT_ADD(tx_disowned, fs_pool_disown(&er->tx_data, s) + fs_pool_disown(&er->tx_ctrl, s) +
						 fs_stripe_disown(s));
		s->tx_inflight = 0;
	}
	er->streams--;
	if (s->id < e->streams_cap && e->streams[s->id] == s) {
		e->streams[s->id] = NULL;
		e->live_streams--;
	}
	if (s->ctl_fd >= 0)
		fs_internal_fd_close(s->ctl_fd);
	if (s->peer_addr != FI_ADDR_UNSPEC)
		fs_rail_av_release(&er->rail, s->peer_addr);
	fs_stripe_release(s);
	if (s->wake_queued) {
		for (struct fs_stream **link = &e->wake_list; *link; link = &(*link)->wake_next)
			if (*link == s) {
				*link = s->wake_next;
				break;
			}
	}
	if (s->wake_fd >= 0)
		fs_internal_fd_close(s->wake_fd);
	s->wake_fd = -1;
	s->ctl_fd = -1;
	s->dead = true;
	if (s->peer_id) {
		FS_STAT_INC(streams_freed); /* it was connected: offloaded */
		e->freed_ring[e->freed_next % FS_ENGINE_FREED_RING].id = s->id;
		e->freed_ring[e->freed_next % FS_ENGINE_FREED_RING].token = (uint32_t)s->token;
		e->freed_next++;
	}
	free(s->ooo);
	s->ooo = NULL;
	if (!s->app_ref)
		free(s);
}

bool fs_engine_freed_recently(const struct fs_engine *e, uint32_t id, uint32_t token)
{
	for (unsigned i = 0; i < FS_ENGINE_FREED_RING; i++)
		if (e->freed_ring[i].id == id && e->freed_ring[i].token == token && id)
			return true;
	return false;
}

void fs_engine_retire(struct fs_engine *e, struct fs_stream *s)
{
	fs_stream_destroy(e, s);
}

void fs_stream_drop_app(struct fs_stream *s)
{
	struct fs_engine *e = fs_engine_peek();

	if (!e)
		return; /* the engine is gone with its streams (exit) */
	pthread_mutex_lock(&e->lock);
	s->app_ref = false;
	while (s->watchers) /* none should be left: their members held the socket */
		fs_stream_watch_del(s->watchers);
	if (s->dead)
		free(s);
	fs_engine_unlock(e);
}

void fs_stream_abandon(struct fs_engine *e, struct fs_stream *s)
{
	s->ctl_fd = -1;
	s->app_ref = false; /* a half-made stream is only seen under the socket lock */
	fs_stream_destroy(e, s);
}

struct fs_stream *fs_engine_open_stream(struct fs_engine *e, unsigned provider, const struct sockaddr *local,
					const void *peer, size_t peer_len, uint64_t token, fs_rail_check_fn check,
					void *arg, int *nak, char *why, size_t whylen)
{
	struct fs_engine_rail *er;
	struct fs_stream *st = NULL;
	int ret;

	pthread_mutex_lock(&e->lock);
	ret = fs_engine_rail_for(e, provider, local, peer, peer_len, &er, why, whylen);
	if (ret)
		*nak = ret == -ENOSPC ? FS_NAK_RESOURCES : FS_NAK_PROVIDER;
	else if (!check || !(*nak = check(er, arg, why, whylen)))
		st = fs_stream_create(e, er, token, nak);
	fs_engine_unlock(e);
	return st;
}

int fs_engine_join_stream(struct fs_engine *e, struct fs_stream *st, const struct fs_hello *peer, int fd,
			  bool ended_ok)
{
	struct sockaddr_storage paddr, laddr;
	socklen_t plen = sizeof(paddr), llen = sizeof(laddr);
	/* where the peer rings: the TCP peer's address, its HELLO's port */
	uint16_t bell_port = peer->bell_port;
	int ret;

	if (fs_real.getpeername(fd, (struct sockaddr *)&paddr, &plen) ||
	    fs_real.getsockname(fd, (struct sockaddr *)&laddr, &llen))
		bell_port = 0;
	pthread_mutex_lock(&e->lock);
	if (ended_ok && fs_params.test_join_fail) /* testing: the client's join fails */
		ret = -(int)fs_params.test_join_fail;
	else
		ret = fs_stream_connect(e, st, peer->stream_id, peer->window, peer->chunk, peer->pull_shift,
					peer->addr, peer->addr_len, ended_ok);
	if (ret < 0) {
		fs_stream_abandon(e, st);
	} else if (ret == 0) { /* (a peer that ended has no doorbell to ring) */
		fs_bell_set_peer(st, (struct sockaddr *)&paddr, (struct sockaddr *)&laddr, bell_port);
		/* the further rails: a server (a HELLO came) pairs its NICs with
		 * the client's, which its ACK then offers */
		fs_stripe_join(e, st, peer, peer->magic == FS_WIRE_HELLO_MAGIC);
	}
	fs_engine_unlock(e);
	return ret;
}

/* ---- progress ---------------------------------------------------------- */

bool fs_engine_busy(struct fs_engine *e)
{
	/* Closing streams with bytes still to deliver need prompt progress;
	 * ones that only wait for the peer's FIN do not. */
	for (struct fs_stream *s = e->orphans; s; s = s->orphan_next)
		if (!s->error && (s->txq_head || s->tx_inflight))
			return true;
	/* bytes for TCP on the way back, which the kernel socket takes now */
	for (struct fs_dlist *n = e->switching.next; n != &e->switching; n = n->next) {
		struct fs_stream *s = fs_stream_of(n, hb_link);

		if (!s->hb_out_blocked && (s->hb_ret_head || (s->hb_peer_end && s->hb_held_head)))
			return true;
	}
	/* Only a send that could go now (credit there, the provider said
	 * "again") needs fast polling; one waiting for credit or for the
	 * HELLO-ACK waits for a message, which slower polling also finds. */
	for (struct fs_dlist *n = e->pending.next; n != &e->pending; n = n->next) {
		struct fs_stream *s = fs_stream_of(n, pending_link);

		if (s->state != FS_STREAM_HELLO && fs_stream_can_post(s))
			return true;
	}
	return false;
}

/* A data message's send failed on the rail: what follows it in the stream
 * can no longer arrive in order, so the stream is reset, on both ends. */
static void fs_tx_failed(struct fs_engine *e, struct fs_engine_rail *er, struct fs_buf *buf, int err)
{
	struct fs_stream *s = buf->stream;

	if (s && !fs_msg_is_ctrl(buf->kind) && !s->error) {
		char why[96];

		snprintf(why, sizeof(why), "send failed on the %s rail: %s", fs_fabric_prov_name(er->rail.kind),
			 strerror(-err));
		fs_stream_reset(e, s, why);
	}
	fs_tx_done(e, er, buf);
}

/* FABSOCK_TEST_SEND_FAIL: whether this completion of a data message's send
 * is the one to take as failed (the Nth of this process). */
static bool fs_test_send_fails(const struct fs_buf *buf)
{
	static unsigned seen;

	return !fs_msg_is_ctrl(buf->kind) && buf->stream && ++seen == fs_params.test_send_fail;
}

static void fs_cq_error(struct fs_engine *e, struct fs_engine_rail *er)
{
	void *ctx;
	struct fs_buf *buf;
	int err;

	if (!fs_rail_cq_readerr(&er->rail, &ctx, &err))
		return;
	buf = ctx;
	if (!buf)
		return;
	if (buf->role == FS_BUF_TX) {
		fs_tx_failed(e, er, buf, err);
		return;
	}
	if (buf->pull == FS_PULL_POSTED) {
		if (err != -ECANCELED)
			FS_WARN_ONCE("pulling a payload on the %s rail failed: %s", fs_fabric_prov_name(er->rail.kind),
				     strerror(-err));
		fs_rx_pulled(e, er, buf, 0, err);
		return;
	}
	if (err != -ECANCELED)
		FS_WARN_ONCE("a receive failed on the %s rail: %s", fs_fabric_prov_name(er->rail.kind),
			     strerror(-err));
	fs_recv_landed(er, buf);
	if (err == -ECANCELED)
		fs_pool_put(buf);
	else
		fs_engine_repost(er, buf);
}

/* A data message's receive completion (not a send, a pull or a control
 * message). */
static bool fs_cq_is_data_rx(const struct fi_cq_tagged_entry *ent)
{
	const struct fs_buf *buf = ent->op_context;

	return buf && buf->role != FS_BUF_TX && buf->role != FS_BUF_RX_CTRL && buf->pull != FS_PULL_POSTED;
}

/* FABSOCK_TEST_REORDER: swaps each pair of data receives in a batch, so
 * that the out-of-order path (core/rxq.c) runs on a provider that keeps
 * order (shm), as it would on efa. Every receive is its own buffer, so
 * the swap changes nothing else. */
static void fs_cq_test_reorder(struct fi_cq_tagged_entry *ent, fi_addr_t *src, ssize_t n)
{
	for (ssize_t i = 0; i + 1 < n; i++) {
		if (fs_cq_is_data_rx(&ent[i]) && fs_cq_is_data_rx(&ent[i + 1])) {
			struct fi_cq_tagged_entry t = ent[i];

			ent[i] = ent[i + 1];
			ent[i + 1] = t;
			if (src) { /* filled only by fi_cq_readfrom */
				fi_addr_t f = src[i];

				src[i] = src[i + 1];
				src[i + 1] = f;
			}
			i++;
		}
	}
}

int fs_engine_progress(struct fs_engine *e)
{
	int handled = 0;

	for (struct fs_engine_rail *er = fs_engine_ep_first(e); er; er = fs_engine_ep_next(e, er)) {
		struct fi_cq_tagged_entry ent[FS_CQ_BATCH];
		fi_addr_t src[FS_CQ_BATCH];
		ssize_t n;

		for (int rounds = 0; rounds < 8; rounds++) {
			FS_GUARD_ENTER();
			FS_PROV_ENTER(er, -1);
			n = fs_rail_cq_read(&er->rail, ent, FS_CQ_BATCH, src);
			FS_PROV_LEAVE(er);
			FS_GUARD_LEAVE();
			if (n == FS_CQ_ERROR_ENTRY) {
				fs_cq_error(e, er);
				handled++;
				continue;
			}
			if (n <= 0)
				break;
			if (fs_params.test_reorder)
				fs_cq_test_reorder(ent, er->rail.source ? src : NULL, n);
			for (ssize_t i = 0; i < n; i++) {
				struct fs_buf *buf = ent[i].op_context;
				fi_addr_t from = er->rail.source ? src[i] : FI_ADDR_NOTAVAIL;

				if (!buf)
					continue;
				if (buf->role == FS_BUF_TX) {
					if (__builtin_expect(fs_params.test_send_fail != 0, 0) && fs_test_send_fails(buf))
						fs_tx_failed(e, er, buf, -EIO);
					else
						fs_tx_done(e, er, buf);
					continue;
				}
				if (buf->pull == FS_PULL_POSTED) {
					fs_rx_pulled(e, er, buf, ent[i].len, 0);
					continue;
				}
				fs_recv_landed(er, buf);
				if (buf->role == FS_BUF_RX_CTRL)
					fs_rx_ctrl(e, er, buf, ent[i].len, from);
				else
					fs_rx_data(e, er, buf, ent[i].len, from);
			}
			handled += (int)n;
			if (n < FS_CQ_BATCH)
				break;
		}
	}
	/* Sends the provider refused for now (-EAGAIN: shm maps a new peer
	 * lazily, queues fill) are retried on every round. */
	for (struct fs_dlist *n = e->pending.next, *next; n != &e->pending; n = next) {
		struct fs_stream *s = fs_stream_of(n, pending_link);

		next = n->next; /* a flush that empties the queue unlinks S */
		if (fs_stream_can_post(s))
			fs_stream_flush(e, s);
	}
	if (e->credit_retry.next != &e->credit_retry)
		fs_engine_retry_credits(e);
	if (e->switching.next != &e->switching)
		fs_handback_progress(e);
	if (e->orphans)
		fs_engine_reap(e);
	if (e->wake_list)
		fs_engine_ring(e);
	e->completions += (unsigned)handled;
	if (e->deep_wanted)
		fs_engine_deep_wake(e);
	return handled;
}

struct fs_engine *fs_engine_lock_cur(void)
{
	struct fs_engine *e = fs_engine_peek();

	if (e)
		pthread_mutex_lock(&e->lock);
	return e;
}

static void fs_engine_progress_cur(bool live_only)
{
	struct fs_engine *e = fs_engine_lock_cur();

	if (!e)
		return;
	if (!live_only || e->live_streams)
		fs_engine_progress(e);
	fs_engine_unlock(e);
}

void fs_engine_progress_locked(void)
{
	fs_engine_progress_cur(false);
}

void fs_engine_progress_live_locked(void)
{
	fs_engine_progress_cur(true);
}

bool fs_engine_progress_try(void)
{
	struct fs_engine *e = fs_engine_peek();

	if (!e)
		return true;
	if (pthread_mutex_trylock(&e->lock))
		return false;
	fs_engine_progress(e);
	fs_engine_unlock(e);
	return true;
}

/* ---- orphans ----------------------------------------------------------- */

/* An orphan's kernel socket closes once its FIN is out: the peer's control
 * connection then reports EOF, the way TCP would report our FIN. */
void fs_orphan_check(struct fs_engine *e, struct fs_stream *s)
{
	if (s->ctl_fd >= 0 && ((s->fin_done && !s->tx_inflight) || s->error)) {
		fs_internal_fd_close(s->ctl_fd);
		s->ctl_fd = -1;
	}
}

void fs_engine_add_orphan(struct fs_engine *e, struct fs_stream *s)
{
	s->orphan_next = e->orphans;
	e->orphans = s;
	fs_orphan_check(e, s);
}

/* Frees orphans that are done: our FIN delivered and the peer's FIN seen,
 * or the peer gone, or their linger time over. */
/* True once the process of S's peer (on this host: shm, same PID namespace)
 * no longer exists; looked at most every 100 ms per stream. */
static bool fs_orphan_peer_exited(struct fs_stream *s, uint64_t now)
{
	if (s->peer_pid <= 0 || now < s->peer_check_ns)
		return false;
	s->peer_check_ns = now + 100000000ull;
	return kill((pid_t)s->peer_pid, 0) < 0 && errno == ESRCH;
}

void fs_engine_reap(struct fs_engine *e)
{
	uint64_t now = fs_now_ns();
	struct fs_stream **link = &e->orphans;

	while (*link) {
		struct fs_stream *s = *link;
		bool sent = (s->fin_done && !s->tx_inflight) || s->error;
		bool heard = s->peer_fin || s->peer_gone || s->error;

		if (s->txq_head)
			fs_stream_flush(e, s);
		fs_orphan_check(e, s);
		if (s->users || (s->hb == FS_HB_SWITCHING && now < s->close_deadline_ns)) {
			/* a thread is still inside send/recv on it, or it is on its
			 * way back to TCP (handback.c ends it) */
			link = &s->orphan_next;
			continue;
		}
		if (s->hb == FS_HB_DONE)
			sent = heard = true;
		/* Heard the peer out, and its process on this host has exited:
		 * what we still owe it and could not post (our FIN, on shm into
		 * a region nobody drains any more) can never be delivered, and
		 * the application is done with it. The kernel drops such a
		 * socket too. (Sends already posted must complete first: their
		 * completions name the stream.) */
		if (heard && !sent && !s->tx_inflight && fs_orphan_peer_exited(s, now))
			sent = true;
		if ((sent && heard && !s->tx_inflight) || now >= s->close_deadline_ns) {
			*link = s->orphan_next;
			if (!sent)
				FS_WARN("stream %u: closed with undelivered data after FABSOCK_LINGER_SEC; dropped",
					s->id);
			fs_stream_destroy(e, s);
			FS_STAT_INC(orphans_reaped);
			continue;
		}
		link = &s->orphan_next;
	}
}

/* True if the kernel socket FD says the peer closed or died. */
static bool fs_ctl_closed(int fd)
{
	char byte;
	ssize_t n;

	if (fd < 0)
		return true;
	n = fs_real.recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Takes the engine lock, waiting until DEADLINE_NS at most: the exit paths
 * may run in a signal handler or in _exit() called from one, whose own
 * thread may be the holder. Returns 0 or -ETIMEDOUT. */
static int fs_engine_lock_until(struct fs_engine *e, uint64_t deadline_ns)
{
	return fs_mutex_lock_until(&e->lock, deadline_ns);
}

bool fs_stream_holds(struct fs_stream *s, uint64_t deadline_ns)
{
	struct fs_engine *e = fs_engine_peek();
	bool held;

	if (!e || fs_engine_lock_until(e, deadline_ns))
		return false;
	held = s->txq_head != NULL;
	fs_engine_unlock(e);
	return held;
}

void fs_engine_shutdown(void)
{
	struct fs_engine *e = fs_engine_peek();
	uint64_t deadline, t[3] = { 0, 0, 0 };

	if (!e || __atomic_exchange_n(&fs_engine_ended, 1, __ATOMIC_ACQ_REL))
		return;
	fs_rail_stamp("exit: start", t);
	deadline = fs_now_ns() + fs_params.linger_sec * 1000000000ull;
	if (fs_engine_lock_until(e, deadline)) {
		/* held by the thread this exit interrupted, or stuck: the peers
		 * see the control connections end without a FIN, a reset */
		FS_WARN("process ending: the engine was busy (inside the call this exit interrupted, or for "
			"FABSOCK_LINGER_SEC); unsent bytes are lost");
		return;
	}
	fs_engine_progress(e);
	/* Streams the application never closed end like TCP at exit: a FIN
	 * after the data already written, unless the peer is gone already. */
	for (uint32_t id = 1; id < e->streams_cap; id++) {
		struct fs_stream *s = e->streams[id];

		if (!s || s->state != FS_STREAM_OPEN)
			continue;
		s->state = FS_STREAM_CLOSED;
		s->close_deadline_ns = deadline;
		/* A child forked after the offload may go on with the socket:
		 * no FIN, back to TCP for it (handback.h). */
		if (s->hb == FS_HB_NONE && !s->error && s->app_fd >= 0 &&
		    fs_handback_maybe_shared(s->fork_gen, s->app_fd) && !fs_handback_start(e, s, s->app_fd))
			FS_INFO("stream %u: process ending while a child may hold its socket", s->id);
		if (s->hb != FS_HB_NONE) {
			fs_engine_add_orphan(e, s);
			continue;
		}
		s->peer_gone = true; /* do not wait for the peer's FIN at exit */
		if (s->error || fs_ctl_closed(s->app_fd))
			s->error = s->error ? s->error : -ECONNRESET;
		else
			fs_stream_queue_fin(e, s);
		fs_engine_add_orphan(e, s);
	}
	for (struct fs_stream *s = e->orphans; s; s = s->orphan_next) {
		if (s->hb == FS_HB_SWITCHING)
			continue; /* its peer answers the hand-back */
		s->peer_gone = true;
		/* an orphan whose peer vanished cannot deliver anything more */
		if (s->ctl_fd >= 0 && !s->error && fs_ctl_closed(s->ctl_fd))
			s->error = -ECONNRESET;
	}
	while (e->orphans && fs_now_ns() < deadline) {
		bool deliverable = false;

		fs_engine_progress(e);
		/* A stream whose peer is gone (error set) can deliver nothing
		 * more, and its posted sends may never complete: do not wait
		 * out FABSOCK_LINGER_SEC for it (the rails close below). */
		for (struct fs_stream *s = e->orphans; s && !deliverable; s = s->orphan_next)
			deliverable = !s->error;
		if (!deliverable)
			break;
		fs_engine_unlock(e);
		usleep(50);
		if (fs_engine_lock_until(e, deadline))
			return;
	}
	fs_rail_stamp("exit: streams ended", t);
	for (unsigned kind = FS_PROV_SHM; kind < FS_PROV_MAX_; kind++) {
		for (struct fs_engine_rail *head = &e->rails[kind]; head && head->open; head = head->next_nic) {
			struct fs_engine_rail *er = head;

			/* tcp and net rails are left to the process's end:
			 * libfabric 1.17's tcp provider crashed (SIGSEGV inside
			 * fi_close of the endpoint) closing one whose peer's
			 * connection had died, the peer's link gone down (one
			 * rail: 3 runs of 3; e2e_tworails' link-down case: 3 of
			 * 4), and such a rail leaves nothing behind that the
			 * kernel does not close (its sockets; the bytes of the
			 * streams were delivered above). shm rails remove their
			 * region files; efa ones keep their close. */
			if (kind == FS_PROV_TCP || kind == FS_PROV_NET)
				continue;
			while (er && er->open) {
				struct fs_engine_rail *next = er->next_ep;

				/* Closing an endpoint removes its shm region from
				 * /dev/shm. (The extra ones stay allocated: a
				 * stream left behind still points at its
				 * endpoint, which says closed.) */
				fs_rail_close(&er->rail);
				er->open = false;
				er = next;
			}
		}
	}
	fs_rail_stamp("exit: rails closed", t);
	fs_engine_unlock(e);
}

void fs_engine_debug_dump(struct fs_engine *e, uint64_t now)
{
	static uint64_t last_ns;

	if (fs_log_level < FS_LOG_DEBUG || now - last_ns < 1000000000ull)
		return;
	last_ns = now;
	for (uint32_t id = 1; id < e->streams_cap; id++) {
		struct fs_stream *s = e->streams[id];
		unsigned rxq = 0;

		if (!s)
			continue;
		for (struct fs_buf *b = s->rxq_head; b; b = b->next)
			rxq++;
		FS_DBG("dump stream %u->%u st %d tx_seq %u peer_limit %u txq %u inflight %u head_ann %d | "
		       "rx_expect %u freed %u limit %u grant %u rxq %u rx_bytes %zu unpulled %u pulling %d head_kind %d "
		       "head_pull %d | ctrl sent %u acked %u processed %u pending %d | fin q%d d%d peer_fin %d gone %d "
		       "err %d users %u sleepers %u",
		       s->id, s->peer_id, s->state, s->tx_seq, s->peer_limit, s->txq_count, s->tx_inflight,
		       s->txq_head ? s->txq_head->announced : -1, s->rx_expect, s->credit.freed, s->credit.limit,
		       (unsigned)s->credit.grant, rxq,
		       s->rx_bytes, s->unpulled, s->pulling, s->rxq_head ? s->rxq_head->kind : -1,
		       s->rxq_head ? s->rxq_head->pull : -1, s->ctrl_sent, s->ctrl_acked, s->ctrl_processed,
		       s->credit_pending, s->fin_queued, s->fin_done, s->peer_fin, s->peer_gone, s->error, s->users,
		       s->sleepers);
	}
}
