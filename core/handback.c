/* SPDX-License-Identifier: MIT */
/*
 * Handing a stream back to TCP (see handback.h for the protocol), the page
 * through which processes forked after an offload ask for it, and the fork
 * bookkeeping that tells a close or an exit whether a child may still share
 * a socket.
 *
 * A stream on its way back is on engine.switching; fs_handback_progress,
 * run by every progress round, moves it along: (initiator) returns what its
 * reader had not read, (both) writes RETURN bytes and then held bytes to the
 * kernel socket, and ends it once both directions are on TCP and its last
 * messages are delivered. Everything here runs with the engine lock held,
 * except fs_handback_sync and fs_handback_request, which wait.
 */
#include "core/handback.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/stream_internal.h"
#include "core/util.h"
#include "preload/real.h"

/* Whether S, which cannot go back to TCP (its peer ended before it joined,
 * or it was reset), leaves nothing unread but its peer's end: the kernel
 * socket then says what S would (the end of stream), and a process that
 * reads it there instead of S loses nothing. Engine lock held. */
static bool fs_hb_drained(const struct fs_stream *s)
{
	return !s->error && !s->rx_bytes && s->peer_fin && (s->peer_ended || s->peer_gone);
}

/* ---- the request page --------------------------------------------------------
 *
 * One page per engine, MAP_SHARED and anonymous, created with the engine, so
 * every process forked afterwards shares it with the owner. A process that
 * needs a stream back claims a free slot, writes the stream's id and token
 * (the token proves it is a process that had the stream's memory: only the
 * owner's descendants do), marks it ASKED and rings the owner's eventfd. The
 * owner's service thread starts the hand-back, and marks the slot DONE when
 * it is over (GONE when there is no such stream: closed, or handed back
 * already). The asker then frees the slot. */
#define FS_HB_SLOTS 64
#define FS_HB_ANSWER_MS 3000u /* a live owner's service thread answers well within */
#define FS_HB_MAGIC 0x66734842u /* "fsHB" */

enum fs_hb_slot_state {
	FS_HB_SLOT_FREE = 0,
	FS_HB_SLOT_CLAIMED = 1,
	FS_HB_SLOT_ASKED = 2,
	FS_HB_SLOT_STARTED = 3,
	FS_HB_SLOT_DONE = 4,
	FS_HB_SLOT_GONE = 5,
	/* the stream cannot go back (its peer ended before it joined, or it
	 * was reset) and holds what the asker would have read: the asker's
	 * socket reports a reset, never the kernel socket's clean end */
	FS_HB_SLOT_BROKEN = 6,
};

struct fs_hb_slot {
	uint32_t state; /* atomic */
	uint32_t stream_id;
	uint64_t token;
	int32_t asker;
	uint32_t pad;
};

/* The last hand-backs the owner finished: a process that asks after the
 * owner is gone (its parent exited, handing back at its end) finds its
 * stream here, and knows the kernel socket is whole. */
#define FS_HB_RECENT 128

struct fs_hb_recent {
	uint64_t token;
	uint32_t stream_id;
	uint32_t pad;
};

struct fs_hb_page {
	uint32_t magic;
	int32_t owner;
	uint32_t ended; /* the owner's end is handled (atomic): ask no more */
	uint32_t pad0;
	struct fs_hb_slot slot[FS_HB_SLOTS];
	uint32_t recent_next; /* atomic */
	uint32_t pad;
	struct fs_hb_recent recent[FS_HB_RECENT];
};
_Static_assert(sizeof(struct fs_hb_page) <= 4096, "the request page is one page");
_Static_assert(FS_HB_SLOTS <= 64, "a stream's waiters are a 64-bit mask");

int fs_handback_page_create(struct fs_engine *e)
{
	struct fs_hb_page *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int fd;

	e->hb_page = NULL;
	e->hb_evfd = -1;
	if (page == MAP_FAILED)
		return -errno;
	fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (fd < 0) {
		munmap(page, 4096);
		return -errno;
	}
	page->magic = FS_HB_MAGIC;
	page->owner = (int32_t)e->pid;
	e->hb_page = page;
	e->hb_evfd = fs_internal_fd(fd);
	return 0;
}

void fs_handback_owner_ended(struct fs_engine *e, bool ended)
{
	if (e && e->hb_page)
		__atomic_store_n(&e->hb_page->ended, ended ? 1u : 0u, __ATOMIC_RELEASE);
}

int fs_handback_request_fd(struct fs_engine *e)
{
	return e ? e->hb_evfd : -1;
}

/* Marks the slots in MASK with STATE. */
static void fs_hb_slots_answer(struct fs_engine *e, uint64_t mask, uint32_t state)
{
	for (unsigned i = 0; i < FS_HB_SLOTS && mask; i++, mask >>= 1)
		if (mask & 1)
			__atomic_store_n(&e->hb_page->slot[i].state, state, __ATOMIC_RELEASE);
}

void fs_handback_serve(struct fs_engine *e)
{
	uint64_t v;
	ssize_t n;

	if (!e->hb_page)
		return;
	n = fs_real.read(e->hb_evfd, &v, sizeof(v));
	(void)n;
	for (unsigned i = 0; i < FS_HB_SLOTS; i++) {
		struct fs_hb_slot *slot = &e->hb_page->slot[i];
		struct fs_stream *s;

		if (__atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) != FS_HB_SLOT_ASKED)
			continue;
		s = slot->stream_id < e->streams_cap ? e->streams[slot->stream_id] : NULL;
		if (!s || s->token != slot->token || s->state == FS_STREAM_HELLO ||
		    (s->hb == FS_HB_NONE && (s->state != FS_STREAM_OPEN || s->app_fd < 0))) {
			/* no such stream here (any more): it closed, or went back */
			__atomic_store_n(&slot->state, FS_HB_SLOT_GONE, __ATOMIC_RELEASE);
			continue;
		}
		FS_INFO("stream %u: process %d, forked from this one, uses its socket: handing it back to TCP", s->id,
			(int)slot->asker);
		if (s->hb == FS_HB_NONE && fs_handback_start(e, s, s->app_fd)) {
			/* A receive-only stream (its server ended before we
			 * joined: nobody to answer a SWITCH) or a reset one. Its
			 * bytes are in this process's memory, where a forked
			 * child cannot read them, and the kernel socket only
			 * holds the peer's end: read there, the child took a
			 * clean end of stream for an answer it never got. Unless
			 * nothing is left but that end, it reads a reset. */
			__atomic_store_n(&slot->state, fs_hb_drained(s) ? FS_HB_SLOT_GONE : FS_HB_SLOT_BROKEN,
					 __ATOMIC_RELEASE);
			continue;
		}
		__atomic_store_n(&slot->state, FS_HB_SLOT_STARTED, __ATOMIC_RELEASE);
		s->hb_waiters |= 1ull << i;
	}
	fs_handback_progress(e);
}

/* Records that the stream ID/TOKEN is back on TCP. */
static void fs_hb_recent_add(struct fs_hb_page *page, uint32_t id, uint64_t token)
{
	uint32_t i = __atomic_fetch_add(&page->recent_next, 1, __ATOMIC_ACQ_REL) % FS_HB_RECENT;

	__atomic_store_n(&page->recent[i].stream_id, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&page->recent[i].token, token, __ATOMIC_RELEASE);
	__atomic_store_n(&page->recent[i].stream_id, id, __ATOMIC_RELEASE);
}

static bool fs_hb_recent_has(const struct fs_hb_page *page, uint32_t id, uint64_t token)
{
	for (unsigned i = 0; i < FS_HB_RECENT; i++)
		if (__atomic_load_n(&page->recent[i].stream_id, __ATOMIC_ACQUIRE) == id &&
		    __atomic_load_n(&page->recent[i].token, __ATOMIC_ACQUIRE) == token)
			return true;
	return false;
}

int fs_handback_request(struct fs_sock *s)
{
	struct fs_hb_page *page = s->hb_page;
	uint64_t deadline = fs_now_ns() + (fs_params.linger_sec + 5) * 1000000000ull, one = 1;
	struct fs_hb_slot *slot = NULL;
	uint32_t state = FS_HB_SLOT_ASKED;
	unsigned sleep_ms = 1;
	ssize_t n;

	/* Only memory, clock_gettime, write, poll and getpid from here on: the
	 * asker may be sandboxed (sshd's preauth child runs under a seccomp
	 * filter that kills it for kill(), the usual way to ask whether the
	 * owner lives; open and fstat fail there). */
	if (!page || page->magic != FS_HB_MAGIC || page->owner != s->pid)
		return -ECONNRESET;
	if (fs_hb_recent_has(page, s->hb_stream_id, s->token))
		return 0; /* handed back already (by a close, or at the owner's end) */
	if (__atomic_load_n(&page->ended, __ATOMIC_ACQUIRE)) {
		FS_WARN("fd %d: process %d, which offloaded it before this one was forked, ended without handing "
			"it back to TCP; the connection is broken",
			s->fd, (int)s->pid);
		return -ECONNRESET; /* its stream died with its owner */
	}
	while (!slot && fs_now_ns() < deadline) {
		for (unsigned i = 0; i < FS_HB_SLOTS && !slot; i++) {
			uint32_t free_state = FS_HB_SLOT_FREE;

			if (__atomic_compare_exchange_n(&page->slot[i].state, &free_state, FS_HB_SLOT_CLAIMED, 0,
							__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
				slot = &page->slot[i];
		}
		if (!slot)
			fs_real.poll(NULL, 0, 1);
	}
	if (!slot)
		return -ECONNRESET;
	slot->stream_id = s->hb_stream_id;
	slot->token = s->token;
	slot->asker = (int32_t)getpid();
	__atomic_store_n(&slot->state, FS_HB_SLOT_ASKED, __ATOMIC_RELEASE);
	n = fs_real.write(s->hb_evfd, &one, sizeof(one));
	(void)n;
	FS_INFO("fd %d: offloaded by process %d before a fork; asking it to hand the stream back to TCP", s->fd,
		(int)s->pid);
	{
		/* the owner's service thread takes the request at once (STARTED or
		 * GONE); one that does not within FS_HB_ANSWER_MS is gone or stuck */
		uint64_t asked = fs_now_ns();

		while (fs_now_ns() < deadline) {
			state = __atomic_load_n(&slot->state, __ATOMIC_ACQUIRE);
			if (state == FS_HB_SLOT_DONE || state == FS_HB_SLOT_GONE || state == FS_HB_SLOT_BROKEN ||
			    __atomic_load_n(&page->ended, __ATOMIC_ACQUIRE) ||
			    (state == FS_HB_SLOT_ASKED && fs_now_ns() - asked > FS_HB_ANSWER_MS * 1000000ull))
				break;
			fs_real.poll(NULL, 0, (int)sleep_ms);
			sleep_ms = sleep_ms < 16 ? sleep_ms * 2 : 16;
		}
	}
	__atomic_store_n(&slot->state, FS_HB_SLOT_FREE, __ATOMIC_RELEASE);
	if (state == FS_HB_SLOT_BROKEN) {
		FS_INFO("fd %d: process %d holds what this process would read, and cannot hand it back to TCP: "
			"the connection reads as reset here", s->fd, (int)s->pid);
		return -ECONNRESET;
	}
	if (state == FS_HB_SLOT_DONE || state == FS_HB_SLOT_GONE || fs_hb_recent_has(page, s->hb_stream_id, s->token))
		return 0;
	FS_WARN("fd %d: process %d did not hand its stream back to TCP in time; the connection is broken", s->fd,
		(int)s->pid);
	return -ECONNRESET;
}

/* ---- forks ----------------------------------------------------------------- */

#define FS_HB_CHILDREN 64
#define FS_HB_FD_SCAN_MAX 65536u /* descriptors looked at in a child */

static pthread_mutex_t fs_hb_fork_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t fs_hb_gen; /* bumped by every fork of this process */
static struct {
	pid_t pid;
	uint32_t gen;
} fs_hb_children[FS_HB_CHILDREN];
static bool fs_hb_children_overflow; /* a child could not be remembered: assume sharing */

void fs_handback_forked(pid_t pid)
{
	uint32_t gen = __atomic_add_fetch(&fs_hb_gen, 1, __ATOMIC_ACQ_REL);
	unsigned free_slot = FS_HB_CHILDREN;

	pthread_mutex_lock(&fs_hb_fork_lock);
	for (unsigned i = 0; i < FS_HB_CHILDREN; i++) {
		if (fs_hb_children[i].pid && !fs_pid_alive(fs_hb_children[i].pid))
			fs_hb_children[i].pid = 0;
		if (!fs_hb_children[i].pid && free_slot == FS_HB_CHILDREN)
			free_slot = i;
	}
	if (free_slot < FS_HB_CHILDREN) {
		fs_hb_children[free_slot].pid = pid;
		fs_hb_children[free_slot].gen = gen;
	} else {
		fs_hb_children_overflow = true;
	}
	pthread_mutex_unlock(&fs_hb_fork_lock);
}

uint32_t fs_handback_fork_gen(void)
{
	return __atomic_load_n(&fs_hb_gen, __ATOMIC_ACQUIRE);
}

/* True unless PID is known not to hold the socket INO: it is gone (or a
 * zombie, which closed its descriptors), or none of its descriptors is
 * that socket. A process we cannot look into holds it. */
static bool fs_hb_child_holds(pid_t pid, ino_t ino)
{
	char path[64], link[64], want[48];
	unsigned seen = 0;
	struct dirent *d;
	bool holds = false;
	DIR *dir;

	if (fs_pid_dead(pid))
		return false;
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	snprintf(want, sizeof(want), "socket:[%lu]", (unsigned long)ino);
	dir = opendir(path);
	if (!dir)
		return !fs_pid_dead(pid);
	while (!holds && (d = readdir(dir))) {
		char entry[64 + sizeof(d->d_name)];
		ssize_t n;

		if (d->d_name[0] == '.')
			continue;
		if (++seen > FS_HB_FD_SCAN_MAX) {
			holds = true; /* too many to look at: assume it does */
			break;
		}
		snprintf(entry, sizeof(entry), "%s/%s", path, d->d_name);
		n = readlink(entry, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		holds = strcmp(link, want) == 0;
	}
	closedir(dir);
	return holds;
}

bool fs_handback_maybe_shared(uint32_t gen, int fd)
{
	struct stat st;
	bool shared = false;

	if (gen == fs_handback_fork_gen())
		return false; /* no fork since: the usual case, no look at /proc */
	if (fd < 0 || fstat(fd, &st))
		return true;
	pthread_mutex_lock(&fs_hb_fork_lock);
	shared = fs_hb_children_overflow;
	for (unsigned i = 0; i < FS_HB_CHILDREN && !shared; i++) {
		/* forked after the stream was made, and still holding it */
		if (fs_hb_children[i].pid && (int32_t)(fs_hb_children[i].gen - gen) > 0)
			shared = fs_hb_child_holds(fs_hb_children[i].pid, st.st_ino);
	}
	pthread_mutex_unlock(&fs_hb_fork_lock);
	return shared;
}

void fs_handback_after_fork(void)
{
	/* the child has no children yet; its parent's are not its own */
	pthread_mutex_init(&fs_hb_fork_lock, NULL);
	memset(fs_hb_children, 0, sizeof(fs_hb_children));
	fs_hb_children_overflow = false;
}

/* ---- the hand-back itself ---------------------------------------------------- */

/* Queues a header-only message of KIND on S. Returns 0 or -ENOBUFS. */
static int fs_hb_queue(struct fs_engine *e, struct fs_stream *s, unsigned kind)
{
	struct fs_buf *buf = fs_pool_get(&s->erail->tx_data);

	if (!buf)
		return -ENOBUFS;
	buf->kind = (uint8_t)kind;
	buf->len = 0;
	buf->stream = s;
	fs_stream_enqueue(e, s, buf);
	return 0;
}

/* Common to both sides: the duplicate of the kernel socket, the SWITCH. */
static int fs_hb_begin(struct fs_engine *e, struct fs_stream *s, int fd, bool frozen)
{
	int dup_fd = fd >= 0 ? fs_real.fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;

	if (dup_fd < 0)
		return -EBADF;
	if (fs_hb_queue(e, s, FS_MSG_SWITCH)) {
		fs_real.close(dup_fd);
		return -ENOBUFS;
	}
	s->hb_fd = fs_internal_fd(dup_fd);
	/* our writes go to the kernel socket from here on: the TCP_CORK the
	 * stream kept goes with them */
	fs_stream_cork_to_kernel(s, s->hb_fd);
	fs_stream_hb_set(s, FS_HB_SWITCHING);
	s->hb_frozen = frozen;
	s->hb_rx_done = false;
	s->hb_fin = s->fin_queued; /* its FIN is now the kernel socket's shutdown */
	fs_dlist_add(&e->switching, &s->hb_link);
	fs_stream_changed(e, s);
	fs_stream_flush(e, s);
	FS_STAT_INC(handbacks);
	return 0;
}

int fs_handback_start(struct fs_engine *e, struct fs_stream *s, int fd)
{
	int ret;

	if (s->hb != FS_HB_NONE) {
		/* answering the peer already; a freeze now returns what our
		 * reader has not read yet (our RETURN_END waits for it) */
		s->hb_frozen = true;
		fs_stream_changed(e, s);
		return 0;
	}
	/* (A peer that ended before we joined it cannot answer a SWITCH.) */
	if (s->state == FS_STREAM_HELLO || s->error || s->peer_ended)
		return -ECONNRESET;
	ret = fs_hb_begin(e, s, fd, true);
	if (!ret)
		FS_INFO("stream %u: handing back to TCP (initiator)", s->id);
	return ret;
}

void fs_handback_peer_switch(struct fs_engine *e, struct fs_stream *s)
{
	if (s->hb != FS_HB_NONE)
		return; /* we started too: the same rules */
	/* The kernel socket: the application's fd, or a closed stream's own. */
	if (fs_hb_begin(e, s, s->state == FS_STREAM_CLOSED ? s->ctl_fd : s->app_fd, false)) {
		fs_stream_reset(e, s, "cannot answer the peer's hand-back to TCP");
		return;
	}
	s->hb_by_peer = true; /* (a client's history learns of it: fs_sock_unshare) */
	FS_INFO("stream %u: the peer hands the stream back to TCP", s->id);
}

bool fs_handback_tx_tcp(const struct fs_stream *s)
{
	return s->hb == FS_HB_DONE ||
	       (s->hb == FS_HB_SWITCHING && s->hb_peer_end && !s->hb_ret_head && !s->hb_held_head);
}

size_t fs_handback_hold(struct fs_engine *e, struct fs_stream *s, const struct iovec *iov, int iovcnt, size_t done,
			size_t total)
{
	size_t taken = 0;

	while (done + taken < total) {
		struct fs_buf *buf = s->hb_held_tail;
		size_t room, n;

		if (!buf || buf->len >= buf->cap - FS_WIRE_MSG_PREFIX) {
			buf = fs_txq_data_buf(s, s->hb_held_count);
			if (!buf)
				break;
			fs_buf_append(&s->hb_held_head, &s->hb_held_tail, buf);
			s->hb_held_count++;
		}
		room = buf->cap - FS_WIRE_MSG_PREFIX - buf->len;
		n = fs_iov_copy_out(buf->mem + FS_WIRE_MSG_PREFIX + buf->len, room, iov, iovcnt, done + taken);
		buf->len += (uint32_t)n;
		taken += n;
		if (!n)
			break;
	}
	if (taken)
		fs_handback_progress(e);
	return taken;
}

/* The kernel socket's poll() events (or its error as POLLERR). */
static unsigned fs_hb_kernel_events(int fd, short events)
{
	struct pollfd p = { .fd = fd, .events = events };

	if (fd < 0)
		return POLLERR;
	return fs_real.poll(&p, 1, 0) > 0 ? (unsigned)p.revents : 0;
}

/* The peer's SWITCH at the head of an unfrozen reader's queue: everything
 * before it was read, so the reader is on TCP from now on. Taken as soon
 * as it is there, not at the next read: until then poll() would report
 * the marker as readable, and a nonblocking read would then find the
 * kernel socket empty (EAGAIN after POLLIN: ssh treats it as fatal). */
static void fs_hb_take_switch(struct fs_engine *e, struct fs_stream *s)
{
	if (!s->hb_frozen && !s->hb_rx_done && !s->pulling && s->rxq_head && s->rxq_head->kind == FS_MSG_SWITCH) {
		fs_stream_consume_head(e, s);
		s->hb_rx_done = true;
		fs_stream_changed(e, s);
	}
}

unsigned fs_handback_events(struct fs_stream *s)
{
	unsigned ev = 0;
	bool rx_tcp;

	if (s->hb == FS_HB_SWITCHING)
		fs_hb_take_switch(fs_engine_peek(), s);
	rx_tcp = s->hb_frozen || s->hb_rx_done;
	if (s->hb == FS_HB_DONE) /* a plain kernel socket now (its core lets go of it at its next call) */
		return fs_hb_kernel_events(s->app_fd, POLLIN | POLLOUT | POLLRDHUP) &
		       (POLLIN | POLLOUT | POLLRDHUP | POLLHUP | POLLERR);

	if (rx_tcp)
		ev |= fs_hb_kernel_events(s->hb_fd, POLLIN | POLLRDHUP) & (POLLIN | POLLRDHUP | POLLHUP | POLLERR);
	else if (s->rxq_head)
		ev |= POLLIN; /* data before the peer's SWITCH, or the SWITCH itself */
	if (fs_handback_tx_tcp(s))
		ev |= fs_hb_kernel_events(s->hb_fd, POLLOUT) & (POLLOUT | POLLERR | POLLHUP);
	else if (s->hb_held_count < fs_params.send_queue)
		ev |= POLLOUT;
	if (s->error)
		ev |= POLLERR;
	return ev;
}

unsigned fs_handback_blocked_fds(struct fs_engine *e, int *fds, unsigned max)
{
	unsigned n = 0;

	for (struct fs_dlist *l = e->switching.next; l != &e->switching && n < max; l = l->next) {
		struct fs_stream *s = fs_stream_of(l, hb_link);

		if (s->hb_out_blocked && s->hb_fd >= 0)
			fds[n++] = s->hb_fd;
	}
	return n;
}

/* Writes what it can of LIST's buffers (payload from off) to S's kernel
 * socket, releasing each when written (RX: a RETURN, reposted and counted
 * as consumed; else a held tx buffer). Returns false when a write got
 * EAGAIN or failed. */
static bool fs_hb_write(struct fs_engine *e, struct fs_stream *s, struct fs_buf **head, struct fs_buf **tail, bool rx)
{
	while (*head) {
		struct fs_buf *buf = *head;
		ssize_t n = 0;

		if (buf->off < buf->len) {
			n = fs_real.send(s->hb_fd, buf->mem + FS_WIRE_MSG_PREFIX + buf->off, buf->len - buf->off,
					 MSG_DONTWAIT | MSG_NOSIGNAL);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
				s->hb_out_blocked = true;
				return false;
			}
			if (n < 0) {
				FS_WARN("stream %u: writing to the kernel socket on the way back to TCP: %s", s->id,
					strerror(errno));
				s->error = -errno;
				fs_stream_changed(e, s);
				return false;
			}
			buf->off += (uint32_t)n;
			FS_STAT_ADD(handback_tcp_bytes, (uint64_t)n);
			if (buf->off < buf->len)
				continue;
		}
		*head = buf->next;
		if (!*head)
			*tail = NULL;
		buf->next = NULL;
		if (rx) {
			fs_stream_consumed(e, s);
			fs_engine_repost(fs_stream_rail(s, buf->rail), buf);
		} else {
			s->hb_held_count--;
			fs_pool_put(buf);
		}
		fs_stream_changed(e, s);
		if (rx) /* the peer may be waiting for this room to send the rest */
			fs_stream_maybe_credit(e, s);
	}
	s->hb_out_blocked = false;
	return true;
}

/* Frozen: sends back, as RETURN, what the reader had not read, up to the
 * peer's SWITCH; then RETURN_END. Stops at a pull under way, or when the
 * send queue is long. */
static void fs_hb_return(struct fs_engine *e, struct fs_stream *s)
{
	while (s->rxq_head && !s->hb_end_queued && !s->pulling && s->txq_count < fs_params.window + fs_params.send_queue) {
		struct fs_buf *buf = s->rxq_head;

		if (buf->kind == FS_MSG_PULL) {
			if (buf->pull == FS_PULL_NONE && !fs_engine_pull(fs_stream_rail(s, buf->rail), buf, NULL, 0))
				fs_stream_unpulled_dec(e, s);
			if (buf->pull != FS_PULL_DONE)
				return; /* its completion comes through progress */
			buf->pull = FS_PULL_NONE;
			buf->kind = FS_MSG_DATA;
		}
		if (buf->kind == FS_MSG_DATA && buf->off < buf->len) {
			struct fs_buf *out = fs_pool_get(&s->erail->tx_data);
			uint32_t n = buf->len - buf->off;

			if (!out)
				return;
			if (n > s->peer_chunk)
				n = s->peer_chunk;
			memcpy(out->mem + FS_WIRE_MSG_PREFIX, buf->mem + FS_WIRE_MSG_PREFIX + buf->off, n);
			out->kind = FS_MSG_RETURN;
			out->len = n;
			out->stream = s;
			fs_stream_enqueue(e, s, out);
			buf->off += n;
			s->rx_bytes -= n;
			FS_STAT_ADD(handback_returned_bytes, n);
			if (buf->off < buf->len)
				continue;
		}
		if (buf->kind == FS_MSG_SWITCH)
			s->hb_rx_done = true;
		fs_stream_consume_head(e, s);
		if (s->hb_rx_done) {
			if (!fs_hb_queue(e, s, FS_MSG_RETURN_END))
				s->hb_end_queued = true;
			break;
		}
	}
	fs_stream_flush(e, s);
	fs_stream_maybe_credit(e, s);
}

/* A closed responder's reader is gone: what it had not read goes, as TCP
 * would drop it, up to the peer's SWITCH. */
static void fs_hb_discard_closed(struct fs_engine *e, struct fs_stream *s)
{
	while (s->rxq_head && !s->hb_rx_done && !s->pulling) {
		bool marker = s->rxq_head->kind == FS_MSG_SWITCH;

		s->rx_bytes -= s->rxq_head->len - s->rxq_head->off;
		fs_stream_consume_head(e, s);
		s->hb_rx_done = marker;
	}
	fs_stream_maybe_credit(e, s);
}

/* Both directions on TCP and our last messages delivered: the kernel socket
 * takes over in every process. */
static void fs_hb_finish(struct fs_engine *e, struct fs_stream *s)
{
	if (s->hb_fin)
		fs_real.shutdown(s->hb_fd, SHUT_WR);
	fs_internal_fd_close(s->hb_fd);
	s->hb_fd = -1;
	fs_stream_hb_set(s, FS_HB_DONE);
	fs_dlist_del(&s->hb_link);
	if (e->hb_page)
		fs_hb_recent_add(e->hb_page, s->id, s->token);
	if (s->hb_waiters) {
		fs_hb_slots_answer(e, s->hb_waiters, FS_HB_SLOT_DONE);
		s->hb_waiters = 0;
	}
	FS_INFO("stream %u: back on TCP", s->id);
	fs_stream_changed(e, s);
	/* a closed stream is an orphan: the reaper frees it now; an open one
	 * gives its resources back here (its socket is released by the core
	 * on its next call, fs_sock_handback_done) */
	if (s->state != FS_STREAM_CLOSED)
		fs_engine_retire(e, s);
}

void fs_handback_progress(struct fs_engine *e)
{
	for (struct fs_dlist *l = e->switching.next, *next; l != &e->switching; l = next) {
		struct fs_stream *s = fs_stream_of(l, hb_link);

		next = l->next;
		if (s->error) {
			/* broken on the way: the kernel socket is all there is */
			s->hb_rx_done = s->hb_peer_end = true;
			while (s->hb_ret_head) {
				struct fs_buf *buf = s->hb_ret_head;

				s->hb_ret_head = buf->next;
				fs_engine_repost(fs_stream_rail(s, buf->rail), buf);
			}
			s->hb_ret_tail = NULL;
			while (s->hb_held_head) {
				struct fs_buf *buf = s->hb_held_head;

				s->hb_held_head = buf->next;
				fs_pool_put(buf);
			}
			s->hb_held_tail = NULL;
			s->hb_held_count = 0;
			if (!s->users)
				fs_hb_finish(e, s);
			continue;
		}
		if (s->hb_frozen)
			fs_hb_return(e, s);
		else if (s->state == FS_STREAM_CLOSED)
			fs_hb_discard_closed(e, s);
		else
			fs_hb_take_switch(e, s);
		if (!s->hb_frozen && s->hb_rx_done && !s->hb_end_queued && !fs_hb_queue(e, s, FS_MSG_RETURN_END)) {
			s->hb_end_queued = true;
			fs_stream_flush(e, s);
		}
		/* to TCP: the peer's RETURN bytes first, then ours */
		if (fs_hb_write(e, s, &s->hb_ret_head, &s->hb_ret_tail, true) && s->hb_peer_end)
			fs_hb_write(e, s, &s->hb_held_head, &s->hb_held_tail, false);
		if (s->hb_end_queued && !s->txq_head && !s->tx_inflight && s->hb_peer_end && !s->hb_ret_head &&
		    !s->hb_held_head && s->hb_rx_done && !s->users)
			fs_hb_finish(e, s);
	}
}

int fs_handback_sync(struct fs_stream *s, int fd)
{
	struct fs_engine *e = fs_engine_peek();
	uint64_t deadline = fs_now_ns() + fs_params.linger_sec * 1000000000ull;
	int ret = 0;

	if (!e)
		return -ECONNRESET;
	pthread_mutex_lock(&e->lock);
	if (s->state == FS_STREAM_OPEN || s->hb != FS_HB_NONE)
		ret = fs_handback_start(e, s, fd);
	else
		ret = -EBADF;
	while (!ret && s->hb == FS_HB_SWITCHING && fs_now_ns() < deadline) {
		fs_engine_progress(e);
		if (s->hb != FS_HB_SWITCHING)
			break;
		fs_engine_unlock(e);
		fs_real.poll(NULL, 0, 1);
		pthread_mutex_lock(&e->lock);
	}
	if (!ret && s->hb == FS_HB_SWITCHING) {
		FS_WARN("stream %u: the peer did not take the stream back to TCP within FABSOCK_LINGER_SEC; "
			"the connection is broken",
			s->id);
		s->error = -ECONNRESET;
		fs_stream_changed(e, s);
		fs_engine_progress(e);
		ret = -ECONNRESET;
	}
	/* The socket leaves this program (exec, SCM_RIGHTS) on the kernel's
	 * TCP, which does not carry the stream: what the peer sent over the
	 * fabric, and the peer's next bytes, would never come there, and the
	 * new holder would read a clean end of stream (a receive-only stream,
	 * whose server ended) or wait for ever. It reads a reset instead, and
	 * the peer gets one. (-EBADF: closed here; nobody holds it.) */
	if (ret && ret != -EBADF && fd >= 0 && !fs_hb_drained(s)) {
		FS_WARN("stream %u: cannot go back to TCP as its socket leaves this program: resetting the connection",
			s->id);
		(void)fs_tcp_reset(fd);
	}
	fs_engine_unlock(e);
	return ret;
}
