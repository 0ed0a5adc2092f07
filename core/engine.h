/* SPDX-License-Identifier: MIT */
/*
 * The per-process engine and its streams: the data path over RDM tagged
 * messages.
 *
 * One engine per process, created on the first offloaded stream and
 * re-created in a forked child (the parent's libfabric objects are never
 * touched there). It owns one rail per provider in use (one per NIC with
 * FABSOCK_RAILS above 1: struct fs_engine_rail's next_nic); every stream
 * between this process and a peer process on one NIC shares that peer's
 * rail endpoint.
 *
 * Flow control and shared receives (issue 14):
 *  - every rail keeps catch-all receives posted, shared by all of its
 *    streams: data (CHUNK_SIZE buffers, at most RX_POSTED of them however
 *    many streams there are) and control (small buffers, a fixed number);
 *  - a stream grants its peer credits (core/credit.h): the peer may have
 *    at most that many data messages (DATA, PULL or FIN) in flight or
 *    unread on it. The grant starts at WINDOW_MIN, doubles while the peer
 *    uses all of it, up to WINDOW, as far as the process's budget
 *    (RX_BUDGET_MB) allows, and drops back when the stream goes quiet; so
 *    a stream buffers at most WINDOW x CHUNK_SIZE bytes (+ 64 KiB of small
 *    unread messages), and all streams together at most streams x
 *    WINDOW_MIN x CHUNK_SIZE + the budget;
 *  - a data message lands in a shared receive. While fewer than RX_POSTED
 *    shared buffers sit in streams' queues on the rail, the buffer stays in
 *    its stream's queue (no copy) and a fresh one is posted in its place;
 *    beyond that the message is copied out into memory of its own and the
 *    shared buffer goes back at once. So the engine's progress, never a
 *    reader, returns shared receives: a reader that does not read holds
 *    memory of its own stream only;
 *  - more messages than posted receives at one moment wait at the provider
 *    as unexpected messages (shm keeps the command, the data stays in the
 *    sender's buffer) until the same progress round re-posts;
 *  - the consumed count ("freed") and the grant go back to the sender
 *    piggybacked on data in the other direction, or in a CREDIT control
 *    message (when the peer is short of credit), at most
 *    one of which is unacknowledged per stream (the sender acknowledges
 *    CREDITs in its data headers);
 *  - the sender queues at most SEND_QUEUE further messages, coalescing small
 *    writes while it waits for credit; then send blocks (or EAGAIN).
 * So a slow reader costs at most WINDOW + SEND_QUEUE buffers per stream,
 * and the posted receives of a rail do not grow with its streams.
 *
 * Pulls: a payload of at least the peer's pull size is announced by a
 * header-only FS_MSG_PULL (which takes the seq and the credit) and sent
 * bare, tagged fs_tag_pull(); the reader posts a receive for exactly that
 * tag when the application reads, into its buffer if it can (rxq.c).
 *
 * Messages are delivered in sequence order, never completion order.
 *
 * Locking: one engine mutex guards the rails, the stream table and every
 * stream's state. Lock order: fs_sock.lock, then engine.lock (every lock: core/locks.h).
 */
#ifndef FS_CORE_ENGINE_H
#define FS_CORE_ENGINE_H

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include "config/params.h"
#include "core/util.h"
#include "core/wait.h"
#include "core/credit.h"
#include "core/fabric.h"
#include "core/pool.h"
#include "core/ring.h"

#define fs_stream_of(node, member) \
	((struct fs_stream *)((char *)(node) - __builtin_offsetof(struct fs_stream, member)))

/* Largest message queued before the peer's HELLO-ACK told its chunk size. */
#define FS_PRE_ACK_CHUNK 4096u

struct fs_engine_rail {
	struct fs_rail rail;
	bool open;
	struct fs_pool rx_data, rx_ctrl, tx_data, tx_ctrl;
	uint32_t chunk;                        /* largest payload we accept (the HELLO's) */
	unsigned posted_data, posted_ctrl;     /* catch-all receives at the provider now */
	unsigned data_target;                  /* data receives kept posted (RX_POSTED, clamped) */
	unsigned held_data;                    /* data receives kept in streams' queues */
	unsigned tx_posted;                    /* sends whose completion is due */
	unsigned pulls_posted;                 /* payload receives whose completion is due */
	/* A data buffer never posted, whose memory a pull with a bounce part
	 * borrows (swapped with the pulled buffer's; rxq.c, fs_rx_warm_lend):
	 * the bounce parts land in pages touched already, not in the next of
	 * the posted receives, which a new process has never touched. */
	struct fs_buf *warm;
	bool warm_lent;
	unsigned streams;
	/* More endpoints of the same kind, opened when this one's address
	 * vector is full (shm: 256 peer processes per endpoint); each has its
	 * own address, queues and completions. A stream stays on the one it
	 * was made on. */
	struct fs_engine_rail *next_ep;
	unsigned ep_index;      /* 0: the NIC's first endpoint (e->rails[kind] for NIC 0) */
	/* FABSOCK_RAILS above 1 (issue 28, "Every NIC"): one endpoint chain
	 * per NIC the process uses, the nearest first. head is the first
	 * endpoint of this one's NIC (itself for a first one); a first
	 * endpoint's next_nic is the next NIC's first one (NULL: the last).
	 * A stream stays on the NIC it was made on (its home). */
	struct fs_engine_rail *head;
	struct fs_engine_rail *next_nic;
	unsigned nic_index;     /* 0: the nearest NIC */
	unsigned nic_nth;       /* the rank among the used NICs it was opened on (fs_rail_open_nic) */
	bool nics_tried;        /* e->rails[kind]: the further NICs' rails were tried */
	bool in_cq_set;         /* its completion-queue fd is in the engine's cq_set_fd */
	/* A NIC's first endpoint: its interface went down (fs_engine_nics_watch);
	 * its streams were reset and no new stream makes its home here. */
	bool nic_failed;
	unsigned hello_pending; /* streams made here whose peer is not inserted yet */
};

/* Every open endpoint of every kind, in order:
 * for (er = fs_engine_ep_first(e); er; er = fs_engine_ep_next(e, er)) */
struct fs_engine;
struct fs_engine_rail *fs_engine_ep_first(struct fs_engine *e);
struct fs_engine_rail *fs_engine_ep_next(struct fs_engine *e, struct fs_engine_rail *er);

/*
 * A stream's life (state), and what moves it:
 *
 *   fs_stream_create        fs_stream_connect (HELLO / HELLO-ACK done)
 *   ----------------> HELLO ------------------------------> OPEN
 *                       |                                    |  fs_stream_close
 *   fs_stream_abandon   |  (handshake failed: the queued     |  (the application
 *   (freed at once)  <--+   bytes go to TCP first)           v   closed it)
 *                                                          CLOSED  -- an orphan
 *                                                            |
 *   fs_engine_reap: freed once nothing is in flight, our FIN's send
 *   completed and the peer's FIN came (or the peer is gone); an error (an
 *   abort is one) counts as both; else at the linger deadline, the data
 *   dropped with a warning
 *
 * Inside OPEN, each direction ends on its own: ours with fin_queued, then
 * fin_done (the FIN's send completed); the peer's with peer_fin (its FIN
 * reached the head of the receive queue), then fin_consumed (the reader saw
 * the end). error (ECONNRESET...) ends both. Across OPEN and CLOSED a
 * stream may also go back to TCP (hb, core/handback.h): NONE -> SWITCHING
 * -> DONE, after which fs_engine_retire frees its resources while its
 * socket lives on. Credits (core/credit.h) and the queues (txq.c, rxq.c)
 * work the same in every state that has a peer.
 */
enum fs_stream_state {
	FS_STREAM_HELLO,   /* created, waiting for the handshake to finish */
	FS_STREAM_OPEN,    /* data may flow */
	FS_STREAM_CLOSED,  /* application closed it; flushing, then freed */
};

struct fs_stream;

/* Someone told of every change a poller may care about (fs_stream_changed):
 * an epoll member keeps its instance's ready list this way (core/epoll.c),
 * so epoll_wait looks at the streams that changed, not at all of them. FN
 * runs under the engine lock and may take no lock but a leaf of its own. */
struct fs_stream_watch {
	struct fs_stream_watch *next;    /* on the stream's watchers */
	struct fs_stream *stream;        /* watched; NULL: none (or it went) */
	void (*fn)(struct fs_stream_watch *w);
};

struct fs_stream {
	uint32_t id;      /* our receive id: peers tag messages to us with it */
	uint32_t peer_id; /* the id we tag our messages with */
	uint64_t token;
	enum fs_stream_state state;
	struct fs_engine_rail *erail;
	fi_addr_t peer_addr;
	/* Striping (wire 12; docs/design.md, "Every NIC: striping one
	 * stream"): the rails this stream shares with its peer. Rail 0 is the
	 * home (rail_ep[0] == erail, its peer address peer_addr); rail i >= 1
	 * is the first endpoint of another of our NICs, paired with the
	 * peer's rail i, its address there rail_peer[i] (FI_ADDR_UNSPEC: not
	 * inserted, nothing is sent there; what comes there is taken). Our
	 * HELLO offers nrails; the join cuts it to the peer's count. A
	 * message of the stream is taken on any of them, by the id in its
	 * tag; delivery is by sequence number whatever rail brought it. */
	unsigned nrails;
	struct fs_engine_rail *rail_ep[FS_WIRE_RAILS_MAX];
	fi_addr_t rail_peer[FS_WIRE_RAILS_MAX];
	unsigned stripe_next;   /* the rail whose turn comes next (fs_stripe_pick) */
	unsigned peer_grant;    /* messages the peer's last header granted */
	unsigned window;      /* the most credits we grant the peer (FABSOCK_WINDOW) */
	unsigned ooo_slots;   /* out-of-order slots: the window and what a closing
			       * peer may still send (fs_stream_closing_cap) */
	uint32_t peer_chunk;  /* largest payload the peer accepts */
	uint32_t peer_pull_min; /* payloads this large are announced, for the peer to pull (0: never) */

	/* sending */
	uint32_t tx_seq;       /* last data-class seq posted */
	uint32_t peer_limit;   /* the peer lets us send up to this seq (core/credit.h) */
	struct fs_buf *txq_head, *txq_tail; /* not yet posted (no credit) */
	unsigned txq_count;
	struct fs_dlist pending_link; /* on engine.pending while txq_head != NULL */
	unsigned tx_inflight;  /* posted, completion not yet seen */
	bool fin_queued;       /* a FIN is queued or posted: no more data */
	bool fin_done;         /* our FIN's send completed */

	/* receiving */
	uint32_t rx_expect;    /* next seq to deliver */
	struct fs_buf **ooo;   /* ooo_slots slots for out-of-order arrivals, allocated
				* with the first one (NULL until then: core/rxq.c) */
	struct fs_buf *rxq_head, *rxq_tail; /* in order, unread */
	size_t rx_bytes;       /* unread payload bytes in rxq */
	struct fs_credit_rx credit; /* what the reader consumed, what the peer may send */
	struct fs_credit_budget *budget; /* the engine's, which the grant comes from */
	struct fs_dlist grant_link; /* on engine.grown while the grant is above its floor */
	struct fs_dlist starve_link; /* on engine.starved while the budget refused it more */
	bool pulling;          /* a reader waits for the payload of rxq's head (core/rxq.c) */
	unsigned unpulled;     /* FS_MSG_PULL entries in rxq whose payload nobody asked for yet */
	struct fs_dlist pull_link; /* on engine.unpulled while unpulled != 0 */
	uint32_t stale_mark[2];    /* freed, rx_msgs at the service thread's last look */
	bool peer_fin;         /* FIN reached the head of rxq */
	bool fin_consumed;     /* the application has seen EOF */

	/* credit messages */
	uint32_t ctrl_sent, ctrl_acked; /* CREDITs (and CLOSING) we sent / peer acknowledged */
	uint32_t ctrl_processed;        /* CREDITs (and CLOSING) from the peer we processed */
	bool credit_pending;
	bool closing_pending;   /* a CLOSING is due (fs_stream_maybe_closing) and not sent yet */
	bool closing_sent;      /* the CLOSING went: once per stream */
	struct fs_dlist credit_link; /* on engine.credit_retry while a CREDIT or CLOSING waits for a retry */

	/* Bumped on every change a poller may care about (data, FIN, credit,
	 * send completion, error): edge-triggered epoll reports a change of it. */
	uint32_t ev_gen;
	struct fs_stream_watch *watchers; /* told of every ev_gen change */
	/* Threads asleep on this stream (not the engine's poller) and the
	 * eventfd they sleep on; whoever makes progress rings it. */
	unsigned sleepers;
	struct fs_dlist sleep_link; /* on engine.sleeping while sleepers != 0 */
	int wake_fd;
	bool wake_queued;
	struct fs_stream *wake_next;

	/* doorbell (core/bell.h) */
	struct sockaddr_in6 bell_addr; /* the peer's doorbell; port 0: none */
	uint8_t bell_local[16]; /* our address of the TCP connection (v4-mapped): doorbell datagrams go from it and must come to it */
	uint32_t rx_msgs;      /* data-class messages received */
	bool armed;            /* the peer rings our doorbell after its next message */
	bool peer_armed;       /* we ring the peer's after our next message */
	uint16_t ring_slot;    /* its peer's ring entry (ring.h) + 1, counted in it; 0: none */
	long peer_pid;         /* shm: the peer's process, for a lock it died holding (fabric.h) */
	uint64_t peer_check_ns; /* orphan: when to look again whether that process exited */

	/* failure */
	int error;             /* sticky negative errno (ECONNRESET ...) */
	bool peer_gone;        /* control connection reported EOF/RST */
	/* The peer's process ended before this side joined it (a client
	 * that took its HELLO-ACK after the server answered, closed and
	 * exited): no address to send to, receive only (fs_stream_connect). */
	bool peer_ended;
	uint64_t peer_gone_ns;
	bool error_reported;
	bool av_pending;       /* counted in erail->hello_pending */
	bool wrote_after_gone; /* the one write the kernel accepts after the peer closed */
	/* TCP_CORK set while offloaded (fs_stream_set_cork): kept here, not on
	 * the kernel socket, until the stream goes back to TCP. While corked,
	 * the last DATA message of the send queue, not full, waits for more
	 * (FS_CORK_HOLD_NS at most, from cork_held_ns: when a flush first held
	 * it), as the kernel sends no partial frame of a corked socket: nginx's
	 * answer (header by writev, body by sendfile, between TCP_CORK 1 and 0)
	 * is one message, not two. cork_kernel: the kernel socket's value. */
	bool cork_kept, corked, cork_kernel;
	/* The last send said MSG_MORE: its tail waits as a corked one does,
	 * until a send without it (or 200 ms, a FIN). Engine lock. */
	bool more;
	uint64_t cork_held_ns;

	int app_fd;            /* the application's fd while it is open (exit flush, hand-back) */
	uint32_t fork_gen;     /* fs_handback_fork_gen() when it was created */

	/* Handing it back to TCP (core/handback.h). */
	uint8_t hb;            /* enum fs_hb_state; written under the engine lock with
	                        * fs_stream_hb_set, read without it by fs_stream_hb */
	bool hb_frozen;        /* our reader reads TCP: what comes from the peer goes back */
	bool hb_by_peer;       /* the peer started the hand-back (its SWITCH came first) */
	bool hb_rx_done;       /* the peer's SWITCH was read (or, frozen, reached): rx is on TCP */
	bool hb_end_queued;    /* our RETURN_END is queued */
	bool hb_peer_end;      /* the peer's RETURN_END arrived: no RETURN is left to come */
	bool hb_fin;           /* shut the kernel socket down for writing at the end */
	bool hb_out_blocked;   /* the last write to hb_fd got EAGAIN */
	int hb_fd;             /* our duplicate of the kernel socket, -1 */
	uint64_t hb_waiters;   /* request slots (handback.c) waiting for the end */
	struct fs_buf *hb_ret_head, *hb_ret_tail;   /* RETURN bytes: to TCP first */
	struct fs_buf *hb_held_head, *hb_held_tail; /* ours after them (tx buffers) */
	unsigned hb_held_count;
	struct fs_dlist hb_link; /* on engine.switching */

	/* TCP first (core/tcpfirst.h): each direction on the kernel socket until
	 * its writer's ONTO. Set under the engine lock; read without it only
	 * as hints (fs_tcpfirst_any). */
	bool tf_tx_tcp;        /* our writer writes the kernel socket (no ONTO sent yet) */
	bool tf_rx_tcp;        /* our reader reads the kernel socket (the peer's ONTO not taken yet) */
	bool tf_onto_known;    /* the peer's ONTO arrived: tf_rx_end is N */
	bool tf_rx_eof;        /* TCP ended before any ONTO: the peer's end of stream */
	unsigned tf_tx_busy;   /* kernel sends of ours between their start and their count */
	uint64_t tf_tx_bytes;  /* bytes our writer put on TCP (N of our ONTO) */
	uint64_t tf_rx_bytes;  /* bytes our reader took from TCP */
	uint64_t tf_rx_end;    /* the peer's N */

	/* Lifetime. The socket that owns the stream keeps a reference to its
	 * memory (app_ref) until the socket object itself is recycled, so a
	 * thread that loaded sock->stream just before another thread closed
	 * the socket still looks at a valid (CLOSED) stream. Threads inside
	 * send/recv (users) keep its resources: it is not reaped under them. */
	unsigned users;        /* threads inside the data path on it (lock held to change) */
	bool app_ref;          /* the owning fs_sock still points at it */
	bool dead;             /* resources returned; only the memory is left */

	/* orphan (application closed it, engine still flushing) */
	int ctl_fd;            /* the kernel TCP socket: control channel */
	uint64_t close_deadline_ns;
	struct fs_stream *orphan_next;
};

/* S's rail I (0: the home) and the peer's address there. A rail beyond
 * the joined count is still the one a buffer kept from it goes back to. */
static inline struct fs_engine_rail *fs_stream_rail(const struct fs_stream *s, unsigned i)
{
	return i && i < FS_WIRE_RAILS_MAX && s->rail_ep[i] ? s->rail_ep[i] : s->erail;
}

static inline fi_addr_t fs_stream_rail_peer(const struct fs_stream *s, unsigned i)
{
	if (!i)
		return s->peer_addr;
	return i < s->nrails ? s->rail_peer[i] : FI_ADDR_UNSPEC;
}

/* The hand-back state, read by the application's calls before they take the
 * engine lock (whether the socket is a plain kernel socket now). */
static inline unsigned fs_stream_hb(const struct fs_stream *s)
{
	return __atomic_load_n(&s->hb, __ATOMIC_ACQUIRE);
}

static inline void fs_stream_hb_set(struct fs_stream *s, unsigned hb)
{
	__atomic_store_n(&s->hb, (uint8_t)hb, __ATOMIC_RELEASE);
}

#define FS_ENGINE_FREED_RING 64u

struct fs_engine {
	pthread_mutex_t lock;
	pid_t pid;
	uint8_t host_id[16];
	struct fs_engine_rail rails[FS_PROV_MAX_];
	struct fs_stream **streams; /* by id */
	uint32_t streams_cap;
	uint32_t next_id;
	uint32_t live_streams; /* streams holding an id: open, and orphans until freed */
	struct fs_stream *orphans;
	/* The streams freed last, (id, token) of each: a message that comes
	 * for one of them is late (a CREDIT its reader sent while our FIN was
	 * on its way, a FIN behind the control connection's end), counted
	 * msgs_late, not dropped as foreign. Like TCP's TIME_WAIT, which
	 * takes such segments in silence. */
	struct {
		uint32_t id, token;
	} freed_ring[FS_ENGINE_FREED_RING];
	unsigned freed_next;
	unsigned pending_tx; /* streams with queued data waiting for credit */
	struct fs_dlist pending;  /* those streams (pending_link) */
	struct fs_dlist sleeping; /* streams with sleepers (sleep_link) */
	struct fs_dlist unpulled; /* streams with unpulled announcements (pull_link) */
	struct fs_dlist switching; /* streams on their way back to TCP (hb_link) */
	struct fs_dlist credit_retry; /* streams whose CREDIT post failed (credit_link) */
	struct fs_credit_budget budget; /* receive credits beyond the floors (core/credit.h) */
	struct fs_dlist grown; /* streams whose grant is above its floor (grant_link) */
	struct fs_dlist starved; /* streams the budget refused (starve_link): looked at again */
	/* Requests from processes forked after an offload (core/handback.h):
	 * a page shared with them, and the eventfd they ring. */
	struct fs_hb_page *hb_page;
	int hb_evfd;
	/* Of the threads waiting in fs_stream_wait, one polls the completion
	 * queue in short slices (the poller); the others sleep until rung
	 * (poller_deps of them now: the poller keeps its role while any is;
	 * a waiter beside others whose stream is armed sleeps on it instead,
	 * wait.h). */
	bool has_poller;
	pthread_t poller;
	unsigned poller_deps;
	struct fs_stream *wake_list;
	/* Idleness and the doorbell (core/bell.h). A waiter that finds the
	 * engine deeply idle sleeps long on deep_fd, which is rung when a
	 * progress round changes any stream (or a doorbell rings); the last
	 * deep sleeper to leave resets it. */
	uint64_t completions;  /* handled by progress, ever (no clock on the data path) */
	uint64_t completions_seen, active_ns; /* the service thread's dating of them */
	bool armed_all;        /* every stream has asked its peer for a ring (atomic) */
	/* Waits outlast their spin here (atomic; fs_engine_wait_done): the
	 * process waits on its peers more than it computes, so its messages
	 * ask to be rung and its waiters arm once their spin is over. */
	bool sleepy;
	uint8_t wait_score;    /* late waits raise it, quick ones lower it (atomic) */
	unsigned deep_waiters; /* they watch the doorbell too */
	bool service_bell_off; /* the service thread sleeps without the doorbell (atomic) */
	bool beside_watcher;   /* a waiter beside others watches the doorbell and the ring */
	/* Application threads now asleep with the completion queue's fd in
	 * their set (atomic; fs_engine_cq_sleep): while one is, the service
	 * thread leaves the fd to it instead of waking at every completion
	 * too. */
	unsigned cq_sleepers;
	/* Two or more rails with a completion-queue fd (FABSOCK_RAILS=2 on
	 * tcp, or tcp and net at once): an epoll set of them (-1: none yet),
	 * the one fd a waiter sleeps on (fs_engine_cq_wait_fd). Engine lock. */
	int cq_set_fd;
	/* FABSOCK_RAILS above 1 on tcp or net: when to look at the rails'
	 * interfaces next (fs_engine_nics_watch). */
	uint64_t nics_watch_ns;
	int deep_fd;
	bool deep_rung, deep_wanted;
};

/* Something happened: waiters poll at the normal pace again. Lock held. */
void fs_engine_note_activity(struct fs_engine *e);
/* Nothing seen for IDLE_AFTER_MS, no send in flight, nothing to flush:
 * time to arm the doorbell. The service thread's alone: it dates the
 * engine's completion count, so the data path reads no clock. Lock held. */
bool fs_engine_quiet(struct fs_engine *e, uint64_t now);
/* True when a waiter may sleep FS_BELL_SLICE_MS: every stream is armed,
 * nothing was seen for IDLE_AFTER_MS and no send is in flight. Lock held. */
bool fs_engine_deep_idle(struct fs_engine *e);
/* A waiter whose spin is over: unless something of ours is in flight, it
 * arms every stream (FABSOCK_WAIT_ARM), so that the next message rings the
 * doorbell instead of waiting for a polling slice. Then as
 * fs_engine_deep_idle, except that a caller that did not check its streams
 * under this lock hold (!CHECKED) gets false when this call armed: it must
 * look again before it sleeps. Lock held. */
bool fs_engine_wait_deep(struct fs_engine *e, bool checked);
/* A wait (recv, send, poll, select, epoll_wait) got EVENTS (> 0) things
 * it waited for; LATE: only after its spin was over. The engine is sleepy
 * while late waits for one or two events are more than about one in five.
 * No lock. */
void fs_engine_wait_done(struct fs_engine *e, bool late, int events);
/* Waiters arm at the end of their spin: FABSOCK_WAIT_ARM, or sleepy while
 * at most one thread waits in poll, select or epoll_wait (see
 * fs_ready_wait_enter). */
bool fs_engine_arms_early(const struct fs_engine *e);
/* Waits spin FS_SLEEPY_SPIN_US only: FABSOCK_WAIT_ARM, or sleepy, however
 * many threads wait (their answers come after the spin anyway; a longer
 * one takes a core from the processes they wait for). No lock. */
bool fs_engine_spins_short(const struct fs_engine *e);
/* A thread starts / ends a poll, select or epoll_wait that waits for
 * offloaded sockets. While two or more do, the engine does not arm early:
 * the doorbell wakes a waiter only from a deep sleep, which needs the whole
 * engine settled (no send of any thread in flight), so with several waiters
 * each mostly slept polling slices past its answer and every message paid
 * a ring besides (pgbench -c 4 -j 2: a tenth of the kernel's rate; with
 * FABSOCK_DOORBELL=0 as fast as it). No lock. */
void fs_ready_wait_enter(void);
void fs_ready_wait_leave(void);
/* In a forked child: no thread of it is waiting. */
void fs_ready_wait_after_fork(void);
/* A poll, select or epoll_wait slept on its own streams beside other
 * waiters: from now on a lone waiter does not arm the whole engine either
 * (fs_engine_arms_early). */
void fs_ready_beside_slept(void);
/* Nothing of ours is in flight and nothing waits to be flushed (a ring
 * will announce whatever happens next). Lock held. */
bool fs_engine_settled(struct fs_engine *e);
/* As settled, but other threads' sends may be in flight (their senders
 * poll for those completions). Lock held. */
bool fs_engine_settled_beside(struct fs_engine *e);
/* Waiters arm early and nothing of ours is in flight: while one of them
 * sleeps deeply, the service thread may sleep as long as in deep idle.
 * Lock held. */
bool fs_engine_waiters_arm(struct fs_engine *e);
/* Someone reads the doorbell when a datagram comes: a deep sleeper, or the
 * service thread. The service thread leaves it to deep sleepers (one
 * wake-up per ring instead of two); when the last of them wakes, nobody
 * does until the service thread's next round, and a send reads it first
 * (fs_post). Lock held. */
bool fs_engine_bell_watched(const struct fs_engine *e);
/* A waiter starts / stops such a sleep; begin returns the fd to add to its
 * poll set (-1: none, do not sleep long). Lock held. */
int fs_engine_deep_begin(struct fs_engine *e);
void fs_engine_deep_end(struct fs_engine *e);
/* Something a waiter may care about changed on S: bump its event
 * generation and ring its sleepers after this progress round. Lock held. */
void fs_stream_changed(struct fs_engine *e, struct fs_stream *s);
/* W starts / stops watching S (engine lock held). A stream dropped by its
 * socket (fs_stream_drop_app) forgets its watchers: W->stream becomes NULL. */
void fs_stream_watch_add(struct fs_stream *s, struct fs_stream_watch *w);
void fs_stream_watch_del(struct fs_stream_watch *w);
/* Rings the sleepers of every stream (the poller is leaving). Lock held. */
void fs_engine_wake_all(struct fs_engine *e);
/* A thread starts / stops sleeping on S (not as the poller). Lock held. */
void fs_stream_sleep_begin(struct fs_engine *e, struct fs_stream *s);
/* S's eventfd, which its sleepers wait on, made at its first use; -1 if it
 * cannot be made (the caller sleeps some other way). Lock held. */
int fs_stream_wake_fd(struct fs_stream *s);
void fs_stream_sleep_end(struct fs_engine *e, struct fs_stream *s);

/* True in a child that shares its parent's memory until it execs or exits
 * (vfork, clone with CLONE_VM): everything fabsock keeps is the parent's
 * there, while the descriptor table is the child's own copy, so a close()
 * or dup2() in it must not touch fabsock's state (Python's subprocess
 * closes every fd above 2 in such a child). True as well in a forked child
 * whose fork handlers have not run (or never run: _Fork), whose pid cache
 * is still its parent's (sock.c, fs_core_atfork_child). Asked by the calls
 * that create, close or duplicate descriptors only. One getpid() system
 * call, made only where the answer may be yes: in a process that called
 * vfork() or clone() (fs_vfork_seen, set by their wrappers before the child
 * exists, so the child sees it), or where the pid cache is not known to be
 * this process's (fs_pid_mark). A server's every close() paid it before.
 * glibc's posix_spawn, system and popen run no interposed call in their
 * child. */
static inline bool fs_vfork_child(void)
{
	const unsigned char *mark = __atomic_load_n(&fs_pid_mark, __ATOMIC_ACQUIRE);

	if (!__atomic_load_n(&fs_vfork_seen, __ATOMIC_RELAXED) && mark && __atomic_load_n(mark, __ATOMIC_ACQUIRE))
		return false;
	return getpid() != fs_self_pid();
}

/* The engine of this process, created on first use (NULL on failure). */
struct fs_engine *fs_engine_get(void);
/* The engine if it exists in this process, else NULL. */
struct fs_engine *fs_engine_peek(void);
/* Forgets (without closing) an engine inherited across fork. */
void fs_engine_forget_after_fork(void);
/* The process is ending: every stream delivers what was written and its
 * FIN, within FABSOCK_LINGER_SEC, then the rails close (removing the shm
 * region). Once per process; fs_engine_get() returns NULL afterwards, and
 * calls on streams that remain fail instead of touching closed rails. */
void fs_engine_shutdown(void);

/* The most endpoints of one kind a process opens (fs_engine_rail_for in
 * engine.c: another when every one's address vector is full). */
#define FS_ENGINE_MAX_EPS 16
/* Opens the rail of KIND if needed, for a connection this process accepted
 * (SERVING) or made (its queue depth: fs_engine_depth in engine.c). Engine
 * lock held. */
int fs_engine_rail(struct fs_engine *e, unsigned kind, const struct sockaddr *local, bool serving,
		   struct fs_engine_rail **out, char *why, size_t whylen);

/* Creates a stream on ERAIL, reserving receives. Engine lock held. Returns
 * NULL with *nak set when resources are short. */
struct fs_stream *fs_stream_create(struct fs_engine *e, struct fs_engine_rail *erail, uint64_t token,
				   int *nak);
/* Completes the handshake: peer's id, window, chunk, pull shift (wire.h),
 * address. ENDED_OK: an address whose process has ended already
 * (fs_rail_peer_ended) opens S for receiving only (peer_ended) and returns
 * FS_JOIN_PEER_ENDED. Lock held. 0, FS_JOIN_PEER_ENDED or -errno. */
#define FS_JOIN_PEER_ENDED 1
int fs_stream_connect(struct fs_engine *e, struct fs_stream *s, uint32_t peer_id, unsigned peer_window,
		      uint32_t peer_chunk, unsigned peer_pull_shift, const void *addr, size_t addr_len,
		      bool ended_ok);
/* The pull shift our HELLO offers for streams on ER (0: we do not pull). */
unsigned fs_engine_pull_shift(const struct fs_engine_rail *er);
/* Hands the payload queued on a stream that never opened to SINK, in
 * order (the bytes go to TCP instead). Lock held. */
int fs_stream_take_queued(struct fs_engine *e, struct fs_stream *s, int (*sink)(void *arg, const void *data, size_t len),
			  void *arg);
/* Frees a stream that never opened (handshake failed). Lock held. */
void fs_stream_abandon(struct fs_engine *e, struct fs_stream *s);

/* The two engine steps of a handshake, the same on both sides; each takes
 * the engine lock. fs_engine_open_stream: the rail of PROVIDER from LOCAL
 * with room for PEER (the peer's fabric address, when known), CHECK on it
 * (NULL, or one that refuses with a NAK code and says why into WHY), then a
 * new stream with TOKEN. Returns it, or NULL with *NAK (wire.h) and WHY set
 * (WHY stays empty for a refusal CHECK logged itself or for a lack of
 * resources). */
typedef int (*fs_rail_check_fn)(struct fs_engine_rail *er, void *arg, char *why, size_t whylen);
struct fs_stream *fs_engine_open_stream(struct fs_engine *e, unsigned provider, const struct sockaddr *local,
					const void *peer, size_t peer_len, uint64_t token, fs_rail_check_fn check,
					void *arg, int *nak, char *why, size_t whylen);
/* fs_engine_join_stream: connects ST to the peer's stream its HELLO or
 * HELLO-ACK PEER names, with the peer's doorbell (the TCP connection FD's
 * addresses, PEER's port); a stream that cannot be connected is abandoned.
 * ENDED_OK: as fs_stream_connect's (the client only: a server that found
 * its client's process gone refuses the HELLO, and the connection, which
 * carried nothing over the fabric yet, stays TCP). 0, FS_JOIN_PEER_ENDED
 * or -errno. */
struct fs_hello;
int fs_engine_join_stream(struct fs_engine *e, struct fs_stream *st, const struct fs_hello *peer, int fd,
			  bool ended_ok);

/* True when the engine should be polled without delay (a send the provider
 * deferred could go now, or closing streams are flushing). Lock held. */
bool fs_engine_busy(struct fs_engine *e);

/* The service thread's look at announced payloads nobody pulls: a stream
 * whose reader pulled nothing and received nothing since the last look has
 * its waiting payloads pulled into their own buffers, so that the sender's
 * buffers are not held by a slow (or gone) reader, and a sender that exits
 * has delivered. Lock held. */
void fs_engine_pull_stale(struct fs_engine *e);

/* The service thread's look at grown grants: a stream with nothing new
 * since the last look goes back to its floor (core/credit.h). Lock held. */
void fs_engine_grants_idle(struct fs_engine *e);
/* FABSOCK_RAILS above 1 on tcp and net (issue 28, "a rail that fails resets
 * its streams"): at most once a second, looks at the interface of every
 * NIC's rail; one that is down, not running (no carrier: a veth whose peer
 * went down) or gone fails its rail: every stream homed there is reset
 * (ECONNRESET on both ends, as a peer's reset), and new streams go to the
 * other NICs. The service thread calls it with live streams. Engine lock. */
void fs_engine_nics_watch(struct fs_engine *e, uint64_t now);

/* At FABSOCK_LOG=debug, once a second: one line per stream with its
 * counters (the service thread's; for diagnosing a stalled stream). Lock
 * held. */
void fs_engine_debug_dump(struct fs_engine *e, uint64_t now);

/* The process's engine with its lock taken; NULL (nothing taken) while
 * there is none. */
struct fs_engine *fs_engine_lock_cur(void);
/* Drops E's lock, then writes the rings to sleeping peers that the hold
 * owes (ring.h: a woken peer that takes our core at once no longer finds
 * the lock held). Every release of the engine lock goes through here. */
static inline void fs_engine_unlock(struct fs_engine *e)
{
	pthread_mutex_unlock(&e->lock);
	if (__builtin_expect(fs_ring_owed_n != 0, 0))
		fs_ring_flush();
}
/* Runs the completion queues once. Returns completions handled. Lock held. */
int fs_engine_progress(struct fs_engine *e);
/* The one completion-queue fd a waiter may sleep on besides its slices
 * (tcp and net rails, fs_rail_cq_wait_fd): -1 when no endpoint has one (or
 * more than one has), -EAGAIN when a progress round must come first. Lock
 * held. */
int fs_engine_cq_wait_fd(struct fs_engine *e);
/* fs_engine_cq_wait_fd for a thread about to sleep outside the engine's
 * lock (poll, epoll_wait): -1 also when there is no engine or its lock is
 * taken (its holder progresses for us). */
int fs_engine_cq_wait_fd_try(void);
/* An application thread starts (BEGIN) or ends a sleep with the completion
 * queue's fd (fs_engine_cq_wait_fd) in its set; E may be NULL. No lock. */
void fs_engine_cq_sleep(struct fs_engine *e, bool begin);
/* fs_engine_progress, taking the engine lock; for readiness scans, which progress
 * once per scan and then look at each member without progressing. */
void fs_engine_progress_locked(void);
/* The same only while the engine has a stream (open or an orphan), as the
 * service thread progresses: an epoll look of a server whose members are
 * connections of plain clients read an empty completion queue (the rail
 * its first connections opened) once a connection. */
void fs_engine_progress_live_locked(void);
/* The same if the engine lock is free at once; false (nothing done) when
 * another thread holds it. For the rounds of a spinning wait after its
 * first: the holder's progress serves every stream, and a spinner that
 * queued on the lock would sleep in the kernel behind it, for a whole
 * scheduler slice when the holder was preempted (several threads waiting
 * in poll or epoll_wait on a machine with fewer cores than runnable
 * threads: pgbench -j 4 ran at a tenth of the kernel's speed). */
bool fs_engine_progress_try(void);

/* splice's pipe side (sock_io.c): a source fills BUF with at most LEN
 * bytes, a sink takes at most LEN bytes from BUF; either returns the bytes
 * moved (0: none now, or a source's end of file) or -errno. */
typedef ssize_t (*fs_stream_io_fn)(void *arg, void *buf, size_t len);
/* Data path, called without the engine lock. DEADLINE_NS 0 = none.
 * NONBLOCK: return -EAGAIN rather than wait. */
ssize_t fs_stream_send(struct fs_stream *s, const struct iovec *iov, int iovcnt, bool nonblock,
		       uint64_t deadline_ns, int ctl_fd, bool more);
/* The application set TCP_CORK to ON on S's socket, whose kernel socket
 * has KERNEL (what the last setsockopt that reached it set): true if S
 * keeps it (the kernel is not told; an uncork sends what it held), false
 * if the kernel must take it (S writes or is about to write the kernel
 * socket: TCP first, a hand-back). Without the engine lock. */
bool fs_stream_set_cork(struct fs_stream *s, bool on, bool kernel);
/* S's writes reach the kernel socket from now on (a hand-back, its FD):
 * the TCP_CORK S kept goes to it. Engine lock held. */
void fs_stream_cork_to_kernel(struct fs_stream *s, int fd);
/* flags: MSG_PEEK, MSG_WAITALL honoured. */
ssize_t fs_stream_recv(struct fs_stream *s, const struct iovec *iov, int iovcnt, int flags,
		       bool nonblock, uint64_t deadline_ns, int ctl_fd);
int fs_stream_shutdown_wr(struct fs_stream *s);
/* splice: fs_stream_send with the bytes read from SOURCE (at most TOTAL,
 * never more than the queue takes: fs_txq_append_from), until TOTAL or
 * until SOURCE gives less than asked. Returns the bytes sent, SOURCE's 0
 * (end of file) or -errno when it gave none first (-ENODATA: it had
 * nothing), else as fs_stream_send. */
ssize_t fs_stream_send_from(struct fs_stream *s, fs_stream_io_fn source, void *arg, size_t total, bool nonblock,
			    uint64_t deadline_ns, int ctl_fd);
/* splice: fs_stream_recv (no flags) whose bytes go to SINK from BUF (room
 * for LEN) before they are consumed: up to LEN are copied out without
 * consuming, SINK is called without the engine lock (the head is this
 * reader's meanwhile, as during a pull), and exactly what it took is
 * consumed. Returns that (> 0), 0 at the end of the stream, -ENOSPC when
 * SINK took nothing, SINK's -errno, or as fs_stream_recv. */
ssize_t fs_stream_recv_to(struct fs_stream *s, void *buf, size_t len, fs_stream_io_fn sink, void *arg,
			  bool nonblock, uint64_t deadline_ns, int ctl_fd);

/* Bytes ready to read. */
size_t fs_stream_readable(struct fs_stream *s);
/* What a closed stream still needs from the service thread. */
enum fs_close_need {
	FS_CLOSE_DONE, /* nothing: it is gone already */
	FS_CLOSE_SOON, /* it (or an earlier closed stream) waits for a FIN's
			* completion or the peer's FIN: no hurry */
	FS_CLOSE_NOW,  /* bytes (or the FIN) wait for credit to be posted */
};
/* The application closed the socket. CTL_FD is a duplicate of the kernel
 * socket the engine now owns and closes once our FIN is delivered (or at
 * once, with a reset, if ABORT). SHARED: a process forked after the offload
 * may still hold the socket: no FIN, the stream goes back to TCP. */
enum fs_close_need fs_stream_close(struct fs_stream *s, int ctl_fd, bool abort, bool shared);
/* The owning socket object is being recycled: the stream's memory may go
 * once the engine is done with it. No locks held. */
void fs_stream_drop_app(struct fs_stream *s);


/* poll() events (POLLIN, POLLOUT, POLLRDHUP, POLLHUP, POLLERR) that hold
 * for the stream now, and its event generation (see ev_gen). It does not
 * run the completion queue: scans over many streams progress once first. */
unsigned fs_stream_poll_state(struct fs_stream *s, uint32_t *gen);
/* The same with the engine lock already held. */
unsigned fs_stream_events_locked(struct fs_stream *s, uint32_t *gen);
/* Whether the stream's events will change with time alone (a vanished
 * peer's grace runs: fs_stream_events_locked turns it into a reset), so a
 * poller must keep looking. Engine lock held. */
bool fs_stream_timed_locked(const struct fs_stream *s);
/* Whether the stream has messages not yet posted (before the HELLO-ACK:
 * what the application wrote, held for it). Waits for the engine lock until
 * DEADLINE_NS at most (the exit paths may run where the holder is the
 * interrupted thread): false if it could not look. */
bool fs_stream_holds(struct fs_stream *s, uint64_t deadline_ns);
/* The kernel socket showed activity: look whether the peer went away. */
void fs_stream_note_ctl(struct fs_stream *s, int ctl_fd);

#endif
