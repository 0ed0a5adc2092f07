/* SPDX-License-Identifier: MIT */
/*
 * libfabric, loaded on demand, and the rail: one provider's fabric, domain,
 * address vector, completion queue and RDM endpoint, with the limits read
 * from the fi_info it got. fabsock never links libfabric: fs_fabric_load()
 * dlopen()s it the first time a stream is about to be offloaded, after
 * setting the environment the providers read at load time
 * (IPATH_NO_BACKTRACE, FI_EFA_FORK_SAFE), so a process that never offloads
 * never runs a provider constructor or gets its signal handlers.
 *
 * Every libfabric call is made with the "inside fabsock" guard held, so the
 * provider's own sockets and threads are invisible to the interposer.
 */
#ifndef FS_CORE_FABRIC_H
#define FS_CORE_FABRIC_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "core/wire.h"

struct fs_fabric_api {
	int (*getinfo)(uint32_t version, const char *node, const char *service, uint64_t flags,
		       const struct fi_info *hints, struct fi_info **info);
	void (*freeinfo)(struct fi_info *info);
	struct fi_info *(*dupinfo)(const struct fi_info *info);
	int (*fabric)(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
	uint32_t (*version)(void);
	const char *(*strerror)(int errnum);
};

extern struct fs_fabric_api fs_fi;

/* Loads libfabric once. Returns 0, or -ENOENT with a reason in WHY. */
int fs_fabric_load(char *why, size_t whylen);
/* Loads libfabric and initialises its providers in a process that listens,
 * once, so that the children it forks per connection (a postmaster's
 * backends, a preforking server's workers) inherit them instead of paying
 * them each (a third of a child's first shm rail). Only where a child may
 * inherit them (fabric.c: fs_fabric_warm_safe); otherwise nothing. */
void fs_fabric_warm(void);
/* The process's exit teardown, which closes rails and so must run before
 * libfabric's destructor. Core registers it with atexit() at start; under
 * ThreadSanitizer, whose atexit interceptor runs what a library constructor
 * registered after the dynamic linker's destructors, fs_fabric_load
 * registers it again once libfabric is loaded (the teardown runs once). */
void fs_fabric_set_exit_teardown(void (*fn)(void));

/* The API version fabsock asks for: ours, clamped to what the library has. */
uint32_t fs_fabric_api_version(void);

/* Provider names as libfabric knows them, by enum fs_wire_provider. */
const char *fs_fabric_prov_name(unsigned kind);
/* FS_PROV_* for a FABSOCK_PROVIDER value, or FS_PROV_NONE if unknown. */
unsigned fs_fabric_prov_parse(const char *name);

struct fs_nics;
/* Lists provider KIND's NICs as a rail without a local address would see
 * them: ranked, with the ones this process would use marked (`fabsock
 * info`; core/nics.h). The records' info pointers are cleared. Returns 0,
 * or a negative errno with WHY. */
int fs_fabric_nics(unsigned kind, struct fs_nics *nics, char *why, size_t whylen);

/* True if this host has an EFA device, judged from sysfs without loading
 * libfabric. */
bool fs_fabric_host_has_efa(void);

struct fs_rail {
	unsigned kind; /* enum fs_wire_provider */
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
	uint8_t addr[FS_WIRE_ADDR_MAX];
	size_t addr_len;
	/* How many of the provider's NICs FABSOCK_RAILS and FABSOCK_RAIL_ADDRS
	 * let this process use, as the listing this rail was opened from saw
	 * them (tcp and net opened on a local address: that interface only). */
	unsigned nics_used;

	/* limits from fi_info */
	size_t inject_size;
	size_t max_msg_size;
	size_t tx_depth, rx_depth;
	size_t iov_limit;
	size_t rx_iov_limit; /* a receive's iovec (a pull split: rxq.c) */
	bool mr_local;     /* FI_MR_LOCAL: every buffer needs a descriptor */
	bool mr_prov_key;  /* the provider picks MR keys */
	bool source;       /* FI_SOURCE: completions name the sender */
	/* The completion queue's wait fd (FI_WAIT_FD; -1: none). tcp and net
	 * move bytes only inside our calls (manual progress) and have one: a
	 * waiter sleeps on it (fs_rail_cq_wait_fd) instead of in blind
	 * slices, during which the peer's data would sit in the kernel. */
	int cq_fd;
	uint64_t next_key; /* requested MR keys must be unique per domain */
	unsigned av_count, av_max; /* distinct peers in the address vector */
	struct fs_av_peer *peers;  /* by address: streams to one peer share its entry */
	/* fs_rail_self_check found the region ours under this effective uid
	 * (+1; 0: not yet): only a change of user can change its answer. */
	uint64_t self_region_euid;
};

/* The peer of the shm provider call under way (-1: a completion-queue read,
 * 0: none) and the number of such calls made: the service thread watches
 * them for a call stuck on a lock a dead process holds. */
extern long fs_prov_call_pid;
extern uint64_t fs_prov_calls;
/* The last peer a call was made to; fs_prov_note_peer keeps the last few
 * in a ring, where the watchdog looks for a dead one (fabric.c). */
extern long fs_prov_last_peer;
void fs_prov_note_peer(long pid);
static inline void fs_prov_call_begin(long pid)
{
	__atomic_store_n(&fs_prov_call_pid, pid, __ATOMIC_RELAXED);
	if (pid > 0 && pid != fs_prov_last_peer)
		fs_prov_note_peer(pid);
}
static inline void fs_prov_call_end(void)
{
	__atomic_store_n(&fs_prov_call_pid, 0, __ATOMIC_RELAXED);
	/* callers hold the engine lock: no locked add needed */
	__atomic_store_n(&fs_prov_calls, __atomic_load_n(&fs_prov_calls, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}
/* pthread_spin_lock inside a provider call (FS_GUARDED; the wrapper in
 * preload/wrappers.c). libfabric 1.17's shm guards each region with a
 * pthread spin lock in shared memory, taken by every process that sends to
 * the region's owner and by the owner itself. A holder the scheduler has
 * set aside leaves the other processes spinning on every core, and the
 * holder may be waiting for one of those very cores: on a 2-core VM two
 * nginx workers spun in it for 8 to 40 s while wrk, the holder, waited to
 * run (the kernel's own threads starved with it; wrk -c 1000 timed out).
 * This one spins as glibc's does for 200 us (a running holder's longest
 * hold, through a CMA copy, is tens of microseconds), then sleeps in growing
 * slices (up to 1 ms) so that a holder that is not running gets a core. The
 * lock word stays glibc's: only glibc's trylock touches it. Counted in
 * prov_lock_sleeps. */
int fs_prov_spin_lock(pthread_spinlock_t *lock);
/* The pid in one of our shm addresses (same PID namespace), else 0. */
long fs_shm_addr_pid(const void *addr, size_t len);

/* Opens a rail of KIND. LOCAL (may be NULL) is the local address of the TCP
 * connection, used to bind IP-based providers to the same interface. DEPTH:
 * the send and receive queue depth to ask shm for (0: the provider's own;
 * other providers always get theirs): what the provider allocates and
 * touches at the endpoint's opening grows with it (engine.c,
 * fs_engine_depth). Returns 0, or a negative errno with a one-line reason
 * in WHY. */
int fs_rail_open(struct fs_rail *rail, unsigned kind, const struct sockaddr *local, size_t depth, char *why,
		 size_t whylen);
/* The same on the used NIC of rank NTH (0: the nearest; core/nics.h):
 * -ENODEV with WHY when there is none of that rank. */
int fs_rail_open_nic(struct fs_rail *rail, unsigned kind, const struct sockaddr *local, unsigned nth, size_t depth,
		     char *why, size_t whylen);
void fs_rail_close(struct fs_rail *rail);
/* The IP address in ADDR, a fabric address of KIND (tcp and net: a
 * struct sockaddr_in or sockaddr_in6), as 16 bytes (IPv4 as ::ffff:a.b.c.d)
 * in OUT; false for another provider's or a malformed address. */
bool fs_fabric_addr_ip(unsigned kind, const void *addr, size_t len, uint8_t out[16]);
/* FABSOCK_LOG=debug: logs the time (wall, this thread's CPU) and the page faults
 * since the stamp T, then stamps T again. */
void fs_rail_stamp(const char *what, uint64_t t[3]);

/* ---- the data path's calls, in the core's error convention ------------
 *
 * libfabric returns negative FI_* codes; the core, negative errno. The codes
 * below FI_ERRNO_OFFSET are errno values already (-FI_EAGAIN is -EAGAIN:
 * the provider cannot take it now, try later); libfabric's own become the
 * nearest errno here, the one place they are looked at. FI_EAVAIL, which
 * only a completion-queue read returns, is FS_CQ_ERROR_ENTRY. */

/* fs_rail_cq_read's answer when an error entry is next: read it with
 * fs_rail_cq_readerr. Not an errno value (none is this large). */
#define FS_CQ_ERROR_ENTRY (-FI_EAVAIL)

static inline int fs_fabric_errno(ssize_t ret)
{
	if (ret >= 0 || -ret < FI_ERRNO_OFFSET)
		return (int)ret;
	switch (-ret) {
	case FI_EAVAIL:
		return FS_CQ_ERROR_ENTRY;
	case FI_ETOOSMALL:
	case FI_ETRUNC:
		return -EMSGSIZE;
	case FI_EOVERRUN:
		return -EOVERFLOW;
	case FI_ENORX:
		return -ENOBUFS;
	default:
		return -EIO;
	}
}

/* Posts a send of LEN bytes at DATA to DEST, tagged with TAG if TAGGED;
 * injected if INJECT (done at once: no completion, CTX unused), else with
 * CTX as the completion's context. Returns 0, -EAGAIN (not taken now: try
 * later) or another negative errno. */
static inline int fs_rail_send(struct fs_rail *rail, const void *data, size_t len, void *desc, fi_addr_t dest,
			       bool tagged, uint64_t tag, bool inject, void *ctx)
{
	ssize_t ret;

	if (tagged)
		ret = inject ? fi_tinject(rail->ep, data, len, dest, tag)
			     : fi_tsend(rail->ep, data, len, desc, dest, tag, ctx);
	else
		ret = inject ? fi_inject(rail->ep, data, len, dest) : fi_send(rail->ep, data, len, desc, dest, ctx);
	return fs_fabric_errno(ret);
}

/* Posts a receive of up to LEN bytes into MEM from any peer: for messages
 * tagged exactly TAG if TAGGED, else for untagged ones. The receive queue may
 * be momentarily full: then lets the provider drain it (an empty
 * completion-queue read) and tries again, up to 1000 times. Returns 0,
 * -EAGAIN (still full) or another negative errno. */
static inline int fs_rail_recv(struct fs_rail *rail, void *mem, size_t len, void *desc, bool tagged, uint64_t tag,
			       void *ctx)
{
	ssize_t ret = -FI_EAGAIN;

	for (int tries = 0; tries < 1000; tries++) {
		if (tagged)
			ret = fi_trecv(rail->ep, mem, len, desc, FI_ADDR_UNSPEC, tag, 0, ctx);
		else
			ret = fi_recv(rail->ep, mem, len, desc, FI_ADDR_UNSPEC, ctx);
		if (ret != -FI_EAGAIN)
			break;
		(void)fi_cq_read(rail->cq, NULL, 0);
	}
	return fs_fabric_errno(ret);
}

/* Posts a tagged receive of exactly TAG into the COUNT pieces of IOV (their
 * descriptors in DESC), as fs_rail_recv does for one buffer. COUNT must
 * not exceed the rail's rx_iov_limit. */
static inline int fs_rail_trecvv(struct fs_rail *rail, const struct iovec *iov, void **desc, size_t count,
				 uint64_t tag, void *ctx)
{
	ssize_t ret = -FI_EAGAIN;

	for (int tries = 0; tries < 1000; tries++) {
		ret = fi_trecvv(rail->ep, iov, desc, count, FI_ADDR_UNSPEC, tag, 0, ctx);
		if (ret != -FI_EAGAIN)
			break;
		(void)fi_cq_read(rail->cq, NULL, 0);
	}
	return fs_fabric_errno(ret);
}

/* Cancels the receive posted with context CTX; it completes with -ECANCELED. */
static inline void fs_rail_cancel(struct fs_rail *rail, void *ctx)
{
	(void)fi_cancel(&rail->ep->fid, ctx);
}

/* Reads up to COUNT completions into ENT, and their senders into SRC when
 * the rail has FI_SOURCE (SRC may be NULL otherwise). Returns how many, or
 * -EAGAIN when there are none, FS_CQ_ERROR_ENTRY when an error entry is
 * next, or another negative errno. */
static inline ssize_t fs_rail_cq_read(struct fs_rail *rail, struct fi_cq_tagged_entry *ent, size_t count,
				      fi_addr_t *src)
{
	ssize_t n = rail->source ? fi_cq_readfrom(rail->cq, ent, count, src) : fi_cq_read(rail->cq, ent, count);

	return n > 0 ? n : fs_fabric_errno(n);
}

/* Reads the error entry FS_CQ_ERROR_ENTRY announced: the failed
 * operation's context in *CTX and its error, a negative errno (-ECANCELED: a
 * cancelled receive), in *ERR. False if there was none. */
static inline bool fs_rail_cq_readerr(struct fs_rail *rail, void **ctx, int *err)
{
	struct fi_cq_err_entry entry = { 0 };

	if (fi_cq_readerr(rail->cq, &entry, 0) != 1)
		return false;
	*ctx = entry.op_context;
	*err = fs_fabric_errno(-(ssize_t)entry.err);
	return true;
}

/* Registers BUF for local send/receive use. */
/* RAIL's completion-queue fd to sleep on, when it has one and the provider
 * says sleeping is safe now (fi_trywait: nothing is pending that only a
 * progress call would complete); -1 when it has none, -EAGAIN when the
 * caller must make a progress round before it sleeps. Called with the
 * engine lock held (a call on the domain); the sleep itself is not. */
int fs_rail_cq_wait_fd(struct fs_rail *rail);

int fs_rail_mr_reg(struct fs_rail *rail, void *buf, size_t len, struct fid_mr **mr);

/* Checks a peer's fabric address before the provider sees it (shm accepts
 * any bytes and would fail only on first send): a shm address must name an
 * existing region, and that region and ours must belong to the user this
 * process runs as now. Returns 0, -EADDRNOTAVAIL (not a usable address) or
 * -EPERM (another user: the connection stays on TCP). */
int fs_rail_peer_check(const struct fs_rail *rail, const void *addr, size_t len);
/* Whether ADDR (which fs_rail_peer_check refused) names a shm region of the
 * form fabsock gives that is gone from /dev/shm: its process closed its
 * rail, which it does only at its end (fs_engine_shutdown), after every
 * send of its completed or FABSOCK_LINGER_SEC ran out. False on every other
 * provider and for any other refusal. */
bool fs_rail_peer_ended(const struct fs_rail *rail, const void *addr, size_t len);
/* Whether RAIL can still take new peers as this process is now: a shm
 * region must belong to the current user, and a process that became
 * non-dumpable after libfabric started with cross-memory attach on cannot
 * be read by its peers. Returns 0, or -EPERM with a reason in *WHY. */
int fs_rail_self_check(const struct fs_rail *rail, const char **why);
/* prctl(PR_GET_DUMPABLE) is 1: same-user processes may read our memory. */
bool fs_self_dumpable(void);

/* Looks up or inserts a peer's fabric address (checked first by
 * fs_rail_peer_check) and takes a reference on the entry: every stream to
 * the same peer process shares one. Returns 0 or a negative errno. */
int fs_rail_av_insert(struct fs_rail *rail, const void *addr, size_t addr_len, fi_addr_t *out);
/* Drops a reference; the last one removes the peer from the address vector
 * (shm allows 256 peers at a time, not 256 streams in a lifetime). */
void fs_rail_av_release(struct fs_rail *rail, fi_addr_t addr);
/* ADDR is in the address vector already (a stream to it needs no slot). */
bool fs_rail_av_knows(const struct fs_rail *rail, const void *addr, size_t addr_len);
/* The address vector can take a new peer after PENDING more (inserted, or
 * made room for by evicting a peer no stream uses). */
bool fs_rail_av_room(const struct fs_rail *rail, unsigned pending);

/* After exec: removes the shm regions the previous program of this
 * process left (it could not close them). */
void fs_shm_clean_previous_program(void);

/* False only when process PID certainly does not exist (ESRCH): a live
 * pid, or one we may not signal, counts as alive. */
bool fs_pid_alive(long pid);
/* Gone, or a zombie (its memory and sockets are released, its pid not yet). */
bool fs_pid_dead(long pid);

#endif
