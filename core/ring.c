/* SPDX-License-Identifier: MIT */
/*
 * The local ring (see ring.h): our eventfd and its handover socket, and the
 * table of the eventfds peers of this host handed us.
 */
#include "core/ring.h"

#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/stats.h"
#include "core/util.h"
#include "preload/real.h"

/* What the listener sends with its eventfd: says whose it is, so that a
 * connector that reached another process (a pid reused, a name taken)
 * notices. */
#define FS_RING_MAGIC 0x46535247u /* "FSRG" */
struct fs_ring_hello {
	uint32_t magic;
	uint32_t pid;
	uint16_t bell_port; /* host order */
	uint16_t reserved;
};
_Static_assert(sizeof(struct fs_ring_hello) == 12, "ring hello is 12 bytes");

static int fs_ring_efd = -1;	 /* ours; written by peers */
static int fs_ring_mfd = -1;	 /* our sleepers' page, handed over with it */
static struct fs_ring_page *fs_ring_own; /* that page, mapped */
static int fs_ring_lfd = -1;	 /* the handover socket */
static uint16_t fs_ring_port;	 /* the doorbell port our name carries */
static pid_t fs_ring_owner;	 /* the process that opened them */

/* The page a process hands over beside its eventfd (a sealed memfd):
 * how many of its threads sleep where a ring would wake them (the
 * sleepers of fs_ring_sleep_begin). A ringer that reads 0 there after
 * posting its message writes nothing: every thread of the peer that is
 * not asleep looks at its completion queue before it sleeps, and counts
 * itself before that look (the order both sides keep, with a full fence
 * between their write and their read, is what makes a skipped ring safe:
 * either the ringer sees the sleeper, or the sleeper's look sees the
 * message). */
struct fs_ring_page {
	uint32_t sleepers;
};
#define FS_RING_PAGE_SIZE 4096u

enum fs_ring_state { FS_RING_FREE = 0, FS_RING_PENDING, FS_RING_READY, FS_RING_FAILED };

/* A peer's eventfd. Its entry holds one reference, and every ring that a
 * thread owes it (fs_ring_peer, written once the engine lock is dropped:
 * fs_ring_flush) one more: the last stream with the peer may be freed, and
 * the entry closed, between the post and that write, and the descriptor's
 * number must not be another file's by then. refs is atomic; the rest is
 * set before the box is shared. */
struct fs_ring_box {
	int fd;
	unsigned refs;
	bool failed; /* a write failed (atomic): the entry fails at its next ring */
};

/* A peer process of this host; engine lock held for all of them. */
struct fs_ring_peer {
	pid_t pid;
	uint16_t bell_port; /* host order */
	uint8_t state;	    /* enum fs_ring_state */
	int fd;		    /* PENDING: our connection to its socket */
	struct fs_ring_box *box; /* READY: its eventfd */
	const struct fs_ring_page *page; /* READY: its sleepers' page, or NULL (ring always) */
	unsigned streams;   /* our streams with it */
	uint64_t since_ns;  /* PENDING: when we connected */
	int pidfd;	    /* the peer process (pidfd_open), or -1: tells an idle entry's peer alive */
	uint64_t idle_ns;   /* idle (fs_ring_is_idle): since when */
};

static struct fs_ring_peer fs_ring_peers[FS_RING_PEERS];
static unsigned fs_ring_used; /* entries not FREE */
/* Entries whose last stream ended, kept (at most FS_RING_IDLE_MAX): a
 * process that connects to the same peer again and again (a connection
 * per request) would otherwise hand its eventfd over for every one, a
 * unix connection and a wake-up of the peer's service thread on each
 * side, about half of what such a connection costs over the kernel's. */
static unsigned fs_ring_idle;
static uint64_t fs_ring_swept_ns; /* the service thread's last sweep */

/* An entry in use with no stream left: kept for the next one. */
static bool fs_ring_is_idle(const struct fs_ring_peer *p)
{
	return p->state != FS_RING_FREE && !p->streams;
}

static socklen_t fs_ring_name(struct sockaddr_un *sun, pid_t pid, uint16_t port)
{
	int len;

	memset(sun, 0, sizeof(*sun));
	sun->sun_family = AF_UNIX;
	/* abstract: sun_path[0] is 0, the name is the bytes after it */
	len = snprintf(sun->sun_path + 1, sizeof(sun->sun_path) - 1, "fabsock-ring-%d-%u", (int)pid, (unsigned)port);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len);
}

/* Our sleepers' page: without it (no memfd, no sealing) peers ring always. */
static void fs_ring_page_open(void)
{
	int mfd = memfd_create("fabsock-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *page;

	if (mfd < 0)
		return;
	/* sealed: a peer maps it and must not see it shrink under it (SIGBUS) */
	if (ftruncate(mfd, FS_RING_PAGE_SIZE) ||
	    fs_real.fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ||
	    (page = mmap(NULL, FS_RING_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0)) == MAP_FAILED) {
		fs_real.close(mfd);
		return;
	}
	fs_ring_mfd = fs_internal_fd(mfd);
	__atomic_store_n(&fs_ring_own, (struct fs_ring_page *)page, __ATOMIC_RELEASE);
}

/* A thread counts once however many of its sleeps nest (the depth), on
 * the page it counted on: the page may be made (or dropped at a fork)
 * between its begin and its end, and an end undoes its own begin only. */
static __thread struct fs_ring_page *fs_ring_counted_page __attribute__((tls_model("initial-exec")));
static __thread unsigned fs_ring_depth __attribute__((tls_model("initial-exec")));

void fs_ring_sleep_begin(void)
{
	struct fs_ring_page *page;

	if (fs_ring_depth++)
		return;
	page = __atomic_load_n(&fs_ring_own, __ATOMIC_ACQUIRE);
	if (!page)
		return;
	/* a full barrier: the caller's look at its queue comes after it */
	__atomic_add_fetch(&page->sleepers, 1, __ATOMIC_SEQ_CST);
	fs_ring_counted_page = page;
}

bool fs_ring_sleep_stale(void)
{
	return fs_ring_depth && fs_ring_counted_page != __atomic_load_n(&fs_ring_own, __ATOMIC_ACQUIRE);
}

void fs_ring_sleep_end(void)
{
	if (!fs_ring_depth || --fs_ring_depth)
		return;
	if (fs_ring_counted_page)
		__atomic_sub_fetch(&fs_ring_counted_page->sleepers, 1, __ATOMIC_RELEASE);
	fs_ring_counted_page = NULL;
}

void fs_ring_open(uint16_t bell_port)
{
	struct sockaddr_un sun;
	socklen_t len;
	int efd, lfd;

	if (!fs_params.ring_local || fs_ring_efd >= 0)
		return;
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (efd < 0)
		return;
	lfd = fs_real.socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	len = fs_ring_name(&sun, fs_self_pid(), bell_port);
	if (lfd < 0 || fs_real.bind(lfd, (struct sockaddr *)&sun, len) || fs_real.listen(lfd, 64)) {
		FS_INFO("no ring socket (%s): peers of this host ring the doorbell", strerror(errno));
		if (lfd >= 0)
			fs_real.close(lfd);
		fs_real.close(efd);
		return;
	}
	fs_ring_page_open();
	fs_ring_port = bell_port;
	fs_ring_owner = fs_self_pid();
	__atomic_store_n(&fs_ring_efd, fs_internal_fd(efd), __ATOMIC_RELEASE);
	__atomic_store_n(&fs_ring_lfd, fs_internal_fd(lfd), __ATOMIC_RELEASE);
}

int fs_ring_fd(void)
{
	return __atomic_load_n(&fs_ring_efd, __ATOMIC_ACQUIRE);
}

int fs_ring_listen_fd(void)
{
	return __atomic_load_n(&fs_ring_lfd, __ATOMIC_ACQUIRE);
}

/* The credentials of the process at the other end of unix socket FD. */
static int fs_ring_cred(int fd, struct ucred *cred)
{
	socklen_t len = sizeof(*cred);

	return fs_real.getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) || len != sizeof(*cred) ? -1 : 0;
}

void fs_ring_serve(void)
{
	int lfd = fs_ring_listen_fd(), efd = fs_ring_fd();

	if (lfd < 0 || efd < 0)
		return;
	for (unsigned i = 0; i < 16; i++) {
		struct fs_ring_hello h = { .magic = FS_RING_MAGIC, .pid = (uint32_t)fs_self_pid(), .bell_port = fs_ring_port };
		union {
			struct cmsghdr align;
			char buf[CMSG_SPACE(sizeof(int) * 2)];
		} ctl;
		struct iovec iov = { .iov_base = &h, .iov_len = sizeof(h) };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		struct cmsghdr *cm;
		struct ucred cred;
		int fds[2] = { efd, fs_ring_mfd }, nfds = fs_ring_mfd >= 0 ? 2 : 1;
		int cfd = fs_real.accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (cfd < 0)
			break;
		/* Our own user only: an abstract name is open to every local
		 * user, and a write to our eventfd is a wake-up of this process.
		 * Anyone else gets a closed connection and nothing in it. */
		if (fs_ring_cred(cfd, &cred) || cred.uid != fs_self_euid() || fs_params.test_ring_refuse) {
			FS_STAT_INC(ring_refused);
			fs_real.close(cfd);
			continue;
		}
		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
		if (fs_real.sendmsg(cfd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof(h))
			FS_STAT_INC(ring_given);
		fs_real.close(cfd);
	}
}

bool fs_ring_take(void)
{
	uint64_t v = 0;
	int fd = fs_ring_fd();

	return fd >= 0 && fs_real.read(fd, &v, sizeof(v)) == (ssize_t)sizeof(v) && v;
}

static void fs_ring_box_put(struct fs_ring_box *b)
{
	if (__atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL))
		return;
	fs_internal_fd_close(b->fd);
	free(b);
}

/* Rings owed by this thread (fs_ring_peer), written after the engine lock
 * is dropped: a write wakes the peer's sleeper, which on a crowded host
 * may take the ringer's core at once, and the ringer held the lock its
 * other threads (pgbench's second, a backend's service thread) then queue
 * on. At most FS_RING_DEFERRED peers per lock hold; past them, a ring is
 * written at once, as before. */
#define FS_RING_DEFERRED 8
static __thread struct fs_ring_box *fs_ring_owed[FS_RING_DEFERRED] __attribute__((tls_model("initial-exec")));
__thread unsigned fs_ring_owed_n __attribute__((tls_model("initial-exec")));

void fs_ring_flush(void)
{
	static const uint64_t one = 1;
	int saved = errno; /* callers read errno of their own calls after the unlock */

	while (fs_ring_owed_n) {
		struct fs_ring_box *b = fs_ring_owed[--fs_ring_owed_n];

		fs_ring_owed[fs_ring_owed_n] = NULL;
		/* EAGAIN: the counter is full, so it is rung. Anything else
		 * (it is an eventfd we hold open: nothing should) fails the
		 * entry at its next ring, which goes by datagram then; the
		 * sleeper this one meant finds the message at its deep
		 * sleep's end (FS_BELL_SLICE_MS) at the latest. */
		if (fs_real.write(b->fd, &one, sizeof(one)) != (ssize_t)sizeof(one) && errno != EAGAIN)
			__atomic_store_n(&b->failed, true, __ATOMIC_RELAXED);
		fs_ring_box_put(b);
	}
	errno = saved;
}

/* Owes a ring to B: written by fs_ring_flush when the engine lock is
 * dropped (fs_engine_unlock). False if there is no room: the caller
 * writes it now. Engine lock held. */
static bool fs_ring_owe(struct fs_ring_box *b)
{
	for (unsigned i = 0; i < fs_ring_owed_n; i++)
		if (fs_ring_owed[i] == b)
			return true; /* one write wakes the peer for both */
	if (fs_ring_owed_n == FS_RING_DEFERRED)
		return false;
	__atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
	fs_ring_owed[fs_ring_owed_n++] = b;
	return true;
}

static void fs_ring_page_drop(struct fs_ring_peer *p)
{
	if (p->page)
		munmap((void *)p->page, FS_RING_PAGE_SIZE);
	p->page = NULL;
}

static void fs_ring_peer_free(struct fs_ring_peer *p)
{
	if (p->fd >= 0)
		fs_internal_fd_close(p->fd);
	p->fd = -1;
	if (p->pidfd >= 0)
		fs_internal_fd_close(p->pidfd);
	p->pidfd = -1;
	if (fs_ring_is_idle(p))
		fs_ring_idle--;
	if (p->box)
		fs_ring_box_put(p->box); /* closed by the last ring owed to it */
	p->box = NULL;
	fs_ring_page_drop(p);
	if (p->state != FS_RING_FREE)
		fs_ring_used--;
	p->state = FS_RING_FREE;
}

static void fs_ring_peer_fail(struct fs_ring_peer *p)
{
	if (p->fd >= 0)
		fs_internal_fd_close(p->fd);
	p->fd = -1;
	if (p->box)
		fs_ring_box_put(p->box);
	p->box = NULL;
	fs_ring_page_drop(p);
	p->state = FS_RING_FAILED;
	FS_STAT_INC(ring_handover_failed);
}

/* Whether P's process has exited: its pidfd says so exactly (a pid that
 * was reused is another process); without one, kill(2)'s word. */
static bool fs_ring_peer_gone(const struct fs_ring_peer *p)
{
	struct pollfd pf = { .fd = p->pidfd, .events = POLLIN };

	if (p->pidfd >= 0)
		return fs_real.poll(&pf, 1, 0) != 0; /* readable (ended), or an error */
	return kill(p->pid, 0) < 0 && errno == ESRCH;
}

/* Frees the entries of processes that have exited. */
static void fs_ring_reap(void)
{
	for (unsigned i = 0; i < FS_RING_PEERS; i++) {
		struct fs_ring_peer *p = &fs_ring_peers[i];

		if (p->state != FS_RING_FREE && fs_ring_peer_gone(p))
			fs_ring_peer_free(p);
	}
}

/* Frees the idle entries whose process ended or that were idle for
 * FS_RING_IDLE_NS. */
static void fs_ring_sweep_idle(uint64_t now)
{
	for (unsigned i = 0; i < FS_RING_PEERS && fs_ring_idle; i++) {
		struct fs_ring_peer *p = &fs_ring_peers[i];

		if (fs_ring_is_idle(p) && (now - p->idle_ns >= FS_RING_IDLE_NS || fs_ring_peer_gone(p)))
			fs_ring_peer_free(p);
	}
}

/* S's peer's entry, found through the slot S counted itself in (no search
 * on the ring path): NULL if none, or if the slot was reaped and reused. */
static struct fs_ring_peer *fs_ring_of(const struct fs_stream *s)
{
	struct fs_ring_peer *p;

	if (!s->ring_slot)
		return NULL;
	p = &fs_ring_peers[s->ring_slot - 1];
	return p->state != FS_RING_FREE && p->pid == (pid_t)s->peer_pid && p->bell_port == ntohs(s->bell_addr.sin6_port)
		       ? p
		       : NULL;
}

static struct fs_ring_peer *fs_ring_find(pid_t pid, uint16_t port, bool add)
{
	struct fs_ring_peer *free_slot = NULL;

	for (unsigned i = 0; i < FS_RING_PEERS; i++) {
		struct fs_ring_peer *p = &fs_ring_peers[i];

		if (p->state == FS_RING_FREE) {
			if (!free_slot)
				free_slot = p;
		} else if (p->pid == pid && p->bell_port == port) {
			if (!fs_ring_is_idle(p))
				return p;
			/* kept from an earlier stream: the same process still,
			 * or (pid and port both reused) a stranger's entry */
			if (p->pidfd >= 0 && !fs_ring_peer_gone(p))
				return p;
			fs_ring_peer_free(p);
			if (!free_slot)
				free_slot = p;
		}
	}
	if (!add)
		return NULL;
	if (!free_slot) {
		fs_ring_reap();
		for (unsigned i = 0; i < FS_RING_PEERS && !free_slot; i++)
			if (fs_ring_peers[i].state == FS_RING_FREE)
				free_slot = &fs_ring_peers[i];
	}
	if (free_slot) {
		free_slot->pid = pid;
		free_slot->bell_port = port;
		free_slot->fd = -1;
		free_slot->box = NULL;
		free_slot->page = NULL;
		free_slot->streams = 0;
		free_slot->pidfd = -1;
	}
	return free_slot;
}

/* Whether S's peer may be rung by eventfd: a process of this host (the shm
 * rail) with a doorbell, not this one (which rings itself). */
static bool fs_ring_local_peer(const struct fs_stream *s)
{
	return fs_params.ring_local && s->erail && s->erail->rail.kind == FS_PROV_SHM && s->peer_pid > 0 &&
	       s->bell_addr.sin6_port;
}

void fs_ring_prepare(struct fs_stream *s)
{
	struct sockaddr_un sun;
	struct fs_ring_peer *p;
	struct ucred cred;
	socklen_t len;
	pid_t pid = (pid_t)s->peer_pid;
	uint16_t port = ntohs(s->bell_addr.sin6_port);
	int fd;

	/* Not "only with a ring of our own": a server joins its stream before
	 * its HELLO-ACK opens its doorbell and ring (fs_bell_port), and a
	 * postgres backend has no other stream to fetch it for later. */
	if (!fs_ring_local_peer(s) || pid == fs_self_pid())
		return;
	p = fs_ring_find(pid, port, true);
	if (!p)
		return; /* no room: datagrams */
	if (!s->ring_slot) {
		s->ring_slot = (uint16_t)(p - fs_ring_peers + 1);
		if (fs_ring_is_idle(p))
			fs_ring_idle--;
		p->streams++;
	}
	if (p->state != FS_RING_FREE)
		return; /* known */
	fs_ring_used++;
	p->state = FS_RING_PENDING;
	p->since_ns = fs_now_ns();
	fd = fs_real.socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		fs_ring_peer_fail(p);
		return;
	}
	p->fd = fs_internal_fd(fd);
	len = fs_ring_name(&sun, pid, port);
	/* The listener must be the stream's peer, of our user: an abstract
	 * name can be taken by anyone, and its eventfd will be written to. */
	if (fs_real.connect(p->fd, (struct sockaddr *)&sun, len) || fs_ring_cred(p->fd, &cred) ||
	    cred.uid != fs_self_euid() || cred.pid != pid) {
		fs_ring_peer_fail(p);
		return;
	}
	/* The process itself, for an entry kept past its last stream: a
	 * pidfd names it and not its pid's next owner. Taken while its
	 * listener holds our connection (it is alive); without one (an old
	 * kernel) the entry goes with its last stream, as it used to. */
	fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (fd >= 0)
		p->pidfd = fs_internal_fd(fd);
}

/* Maps MFD, the sleepers' page a peer sent beside its eventfd, if it is
 * one: a sealed memfd of a page at least (a file that could shrink would
 * fault us when we read it). NULL otherwise: the peer is rung always. */
static const struct fs_ring_page *fs_ring_page_map(int mfd)
{
	char path[64], link[64];
	struct stat st;
	ssize_t l;
	int seals;
	void *page;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", mfd);
	l = readlink(path, link, sizeof(link) - 1);
	seals = fs_real.fcntl(mfd, F_GET_SEALS);
	if (l < 0 || (size_t)l < strlen("/memfd:") || memcmp(link, "/memfd:", strlen("/memfd:")) || seals < 0 ||
	    !(seals & F_SEAL_SHRINK) || fstat(mfd, &st) || st.st_size < (off_t)FS_RING_PAGE_SIZE)
		return NULL;
	page = mmap(NULL, FS_RING_PAGE_SIZE, PROT_READ, MAP_SHARED, mfd, 0);
	return page == MAP_FAILED ? NULL : page;
}

/* Takes the eventfd (and the sleepers' page) of PENDING peer P if they came. */
static void fs_ring_receive(struct fs_ring_peer *p)
{
	struct fs_ring_hello h;
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * 4)];
	} ctl;
	struct iovec iov = { .iov_base = &h, .iov_len = sizeof(h) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf) };
	struct cmsghdr *cm;
	int efd = -1, mfd = -1, extra = 0;
	ssize_t n = fs_real.recvmsg(p->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
		if (fs_now_ns() - p->since_ns > FS_RING_HANDOVER_MS * 1000000ull)
			fs_ring_peer_fail(p); /* its service thread never answered */
		return;
	}
	for (cm = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL; cm; cm = CMSG_NXTHDR(&msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i * sizeof(int) + CMSG_LEN(0) < cm->cmsg_len; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (efd < 0) {
				efd = fd;
			} else if (mfd < 0) {
				mfd = fd; /* the sleepers' page (an older peer sends none) */
			} else {
				fs_real.close(fd); /* never more than two: not ours to keep */
				extra++;
			}
		}
	}
	if (n != (ssize_t)sizeof(h) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || extra || efd < 0 ||
	    h.magic != FS_RING_MAGIC || h.pid != (uint32_t)p->pid || h.bell_port != p->bell_port) {
		if (efd >= 0)
			fs_real.close(efd);
		if (mfd >= 0)
			fs_real.close(mfd);
		fs_ring_peer_fail(p); /* refused (closed, nothing sent), or not the peer's */
		return;
	}
	{
		/* what we write to must be an eventfd: a file would take the bytes */
		char path[64], link[32];
		ssize_t l;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", efd);
		l = readlink(path, link, sizeof(link) - 1);
		if (l < 0 || (size_t)l != strlen("anon_inode:[eventfd]") || memcmp(link, "anon_inode:[eventfd]", (size_t)l)) {
			fs_real.close(efd);
			if (mfd >= 0)
				fs_real.close(mfd);
			fs_ring_peer_fail(p);
			return;
		}
	}
	p->box = malloc(sizeof(*p->box));
	if (!p->box) {
		fs_real.close(efd);
		if (mfd >= 0)
			fs_real.close(mfd);
		fs_ring_peer_fail(p);
		return;
	}
	if (mfd >= 0) {
		p->page = fs_ring_page_map(mfd); /* the mapping outlives the descriptor */
		fs_real.close(mfd);
	}
	fs_internal_fd_close(p->fd);
	p->fd = -1;
	p->box->fd = fs_internal_fd(efd);
	p->box->refs = 1;
	p->box->failed = false;
	p->state = FS_RING_READY;
	FS_STAT_INC(ring_handovers);
}

bool fs_ring_peer_paged(const struct fs_stream *s)
{
	const struct fs_ring_peer *p;

	if (!fs_ring_local_peer(s))
		return false;
	if ((pid_t)s->peer_pid == fs_self_pid() && ntohs(s->bell_addr.sin6_port) == fs_ring_port)
		return false; /* a stream to ourselves: rung always */
	p = fs_ring_of(s);
	return p && p->state == FS_RING_READY && p->page;
}

bool fs_ring_peer_sleeps(const struct fs_stream *s)
{
	const struct fs_ring_peer *p = fs_ring_of(s);

	/* the fence orders our post before the read, as a sleeper's count
	 * comes before its look (struct fs_ring_page) */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return !p || p->state != FS_RING_READY || !p->page || __atomic_load_n(&p->page->sleepers, __ATOMIC_RELAXED);
}

bool fs_ring_peer(struct fs_stream *s)
{
	static const uint64_t one = 1;
	struct fs_ring_peer *p;
	int fd;

	if (!fs_ring_local_peer(s))
		return false;
	if ((pid_t)s->peer_pid == fs_self_pid() && ntohs(s->bell_addr.sin6_port) == fs_ring_port) {
		fd = fs_ring_fd(); /* a stream to ourselves */
	} else {
		p = fs_ring_of(s);
		if (!p)
			return false;
		if (p->state == FS_RING_PENDING)
			fs_ring_receive(p);
		if (p->state == FS_RING_READY && __atomic_load_n(&p->box->failed, __ATOMIC_RELAXED))
			fs_ring_peer_fail(p); /* a write after the lock failed */
		if (p->state != FS_RING_READY)
			return false;
		fd = p->box->fd;
		/* Nobody there sleeps where a ring would wake them: the message
		 * just posted is found by the look its next sleeper makes after
		 * counting itself (struct fs_ring_page). The fence orders our
		 * post before the read, as the sleeper's count comes before its
		 * look. */
		if (p->page) {
			__atomic_thread_fence(__ATOMIC_SEQ_CST);
			if (!__atomic_load_n(&p->page->sleepers, __ATOMIC_RELAXED)) {
				FS_STAT_INC(bell_rings_skipped);
				return true;
			}
		}
		/* after the unlock (fs_ring_flush); the message is posted
		 * already, and the sleeper's eventfd stays readable until it
		 * reads it, so a later write wakes it the same */
		if (fs_ring_owe(p->box))
			return true;
		if (fs_real.write(fd, &one, sizeof(one)) == (ssize_t)sizeof(one))
			return true;
		if (errno == EAGAIN)
			return true; /* the counter is full: it is rung */
		fs_ring_peer_fail(p);
		return false;
	}
	return fd >= 0 && fs_real.write(fd, &one, sizeof(one)) == (ssize_t)sizeof(one);
}

void fs_ring_release(struct fs_stream *s)
{
	struct fs_ring_peer *p;

	p = fs_ring_of(s);
	s->ring_slot = 0;
	if (!p || !p->streams || --p->streams)
		return;
	/* The last stream with P: the entry is idle now, kept for the next
	 * one (its eventfd, its page) if it can tell that its process is the
	 * same then, within FS_RING_IDLE_MAX; a server of short-lived clients
	 * must not keep every one's eventfd, so the entries of processes that
	 * ended (and the oldest) go first. */
	fs_ring_idle++;
	p->idle_ns = fs_now_ns();
	if (p->state != FS_RING_FAILED && p->pidfd >= 0 && fs_ring_idle > FS_RING_IDLE_MAX)
		fs_ring_sweep_idle(p->idle_ns); /* (P too, if its process ended) */
	if (p->state != FS_RING_FREE && (p->state == FS_RING_FAILED || p->pidfd < 0 || fs_ring_idle > FS_RING_IDLE_MAX))
		fs_ring_peer_free(p);
}

bool fs_ring_sweep(uint64_t now)
{
	/* (a pidfd poll per idle entry: not on every look of a busy engine) */
	if (fs_ring_idle && now - fs_ring_swept_ns >= FS_RING_SWEEP_NS) {
		fs_ring_swept_ns = now;
		fs_ring_sweep_idle(now);
	}
	return fs_ring_idle != 0;
}

void fs_ring_after_fork(void)
{
	/* rings owed at the fork (a handler forking under the engine lock)
	 * were the parent's to write */
	while (fs_ring_owed_n) {
		fs_ring_box_put(fs_ring_owed[--fs_ring_owed_n]);
		fs_ring_owed[fs_ring_owed_n] = NULL;
	}
	if (fs_ring_efd >= 0 && fs_ring_owner != fs_self_pid()) {
		/* the parent's page stays the parent's: its sleepers are counted
		 * there, not ours (the mapping itself is left, a page) */
		__atomic_store_n(&fs_ring_own, NULL, __ATOMIC_RELEASE);
		if (fs_ring_mfd >= 0)
			fs_internal_fd_close(fs_ring_mfd);
		fs_ring_mfd = -1;
		fs_internal_fd_close(fs_ring_efd);
		fs_internal_fd_close(fs_ring_lfd);
		__atomic_store_n(&fs_ring_efd, -1, __ATOMIC_RELEASE);
		__atomic_store_n(&fs_ring_lfd, -1, __ATOMIC_RELEASE);
	}
	for (unsigned i = 0; i < FS_RING_PEERS; i++) {
		struct fs_ring_peer *p = &fs_ring_peers[i];

		if (p->state != FS_RING_FREE)
			fs_ring_peer_free(p);
	}
	fs_ring_used = 0;
}
