/* SPDX-License-Identifier: MIT */
/*
 * Connection history (issue 27, "offload only when it will pay"): what the
 * connections of one program to one destination (host:port) turned out to
 * be, kept in a small shared table in the user's record directory
 * (FABSOCK_RECORDS_DIR/fabsock-u<euid>/history-v2), so that it outlives the
 * processes that learnt it. A client's connect() asks it first: a
 * destination whose last FABSOCK_HISTORY_SHORT connections of this program
 * were all short (few request/response turns, few bytes) stays on kernel
 * TCP with no probe, no rail and no HELLO (fallback_short_history), except
 * every FABSOCK_HISTORY_RELEARN-th, which offloads to learn again. Such a
 * client also notes its socket's inode there, so that a server that speaks
 * first does not wait for a probe that will not come; a client that will
 * probe notes its intent, so that such a server waits for that probe. Both the TCP
 * connections it decided and the offloaded ones report at their close.
 * docs/design.md "Connection history".
 */
#ifndef FS_CORE_HISTORY_H
#define FS_CORE_HISTORY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

/* What a client socket carries for its history (in struct fs_sock, zeroed
 * with it). TAG 0: not followed. */
struct fs_history_conn {
	uint64_t tag;      /* the (program, destination) entry's key */
	uint64_t family_tag; /* the (program's family, destination) entry's key, 0: none */
	bool chose_tcp;    /* the history said TCP (fs_history_decide) */
	bool by_family;    /* ... from the family's entry: none of the program's own */
	bool by_command;   /* ... from the command's (its processes of one
			    * connection): neither the program's nor the family's */
	bool stepped;      /* ... because a connection stepped back from the fabric */
	bool relearn;      /* offloaded to learn again what a step-back decided */
	bool measured;     /* stepped: the fabric's time per turn was the longer */
	bool busy;         /* stepped: a recent step-back on a crowded host, and the
			    * host crowded now (FABSOCK_HISTORY_BUSY_SEC) */
	uint64_t intent;   /* the intent note written for this socket, 0: none */
	uint32_t intent_slot; /* ... and where */
};

/* Before the kernel's connect() of a client socket to ADDR: looks the
 * destination up and fills H. Returns true when the connection is to stay
 * on TCP (then its close will be measured; nothing is noted: a server
 * that speaks first takes a client that noted nothing for one that sends
 * no probe); false: negotiate as before (H->tag set when the connection
 * should report at its close if it offloads). */
bool fs_history_decide(struct fs_history_conn *h, const struct sockaddr *addr);
/* The connection that fs_history_decide sent to TCP left fabsock's hands:
 * its close reports what the kernel counted. */
void fs_history_track(const struct fs_history_conn *h, int fd);
/* An offloaded connection stepped back from the fabric (stepback.h): the
 * program's next connections to the destination start on TCP (until a
 * relearn's connection makes a whole window without stepping back). It
 * reports nothing more. Not noted during or right after a spell of slices
 * lost to work beside (fs_runq_spell_lately). */
void fs_history_stepped_back(struct fs_history_conn *h);
/* An offloaded connection closes: its counts, TURNS and BYTES (the
 * stream's, counted once for the step-back too: fs_stepback_totals), go
 * into its entry. LOSING: its step-back measure said the fabric lost when
 * it closed (fs_stepback_losing): noted as a step-back (as
 * fs_history_stepped_back), not as a connection the fabric paid for. */
void fs_history_offloaded_closed(struct fs_history_conn *h, uint64_t turns, uint64_t bytes, bool losing,
				 uint64_t ns_turn);
/* ... NS_TURN: its judged windows' time per turn (0: less than a whole
 * window judged), into the entry's average for the fabric: with TCP's, it
 * decides the program's next connections (fs_history_decide).
 * The time per turn (ns) of the program's recent TCP connections to H's
 * destination that made a whole step-back window, measured by the kernel's
 * counts at their close; 0: none known, or none of the last
 * FS_HIST_RATE_S seconds. Lock-free after the first call. */
uint32_t fs_history_tcp_ns_turn(const struct fs_history_conn *h);
/* H's stream ran NS_TURN ns a turn on the fabric over its judged windows
 * (0: not a whole window): into the entry's average for the fabric. At an
 * offloaded close (fs_history_offloaded_closed) and at a step-back
 * (fs_stepback_fire, before fs_history_stepped_back lets go of H). */
void fs_history_fabric_time(const struct fs_history_conn *h, uint64_t ns_turn);
/* The application closes FD (not a fabsock socket any more): if it is one
 * fs_history_track follows, report it. Cheap when none is followed. */
extern unsigned fs_history_tracked;
void fs_history_fd_closing(int fd);
/* Whether FD is a TCP connection fs_history_track follows (a socket, not
 * an epoll instance: fs_epoll_is_instance asks, to spare an fstat). */
bool fs_history_follows(int fd);
/* Process exit: report the followed connections still open. */
void fs_history_exit(void);
/* Before the kernel's connect() of client socket FD, which will probe
 * (issue 27, target 7): notes its inode as an intent, so that a server of
 * our user that speaks first waits for the probe (and one whose client noted
 * nothing writes at once). Fills H->intent. */
void fs_history_note_intent(struct fs_history_conn *h, int fd);
/* The connection noted an intent and then did not probe: takes it back, so
 * that a server waiting on it stops at its next look. */
void fs_history_withdraw_intent(struct fs_history_conn *h);
/* Server side: what the client socket INODE (of this user, on this host)
 * noted before its connect(). UNKNOWN: no history file this process may use
 * (nothing can be told). */
enum fs_history_note {
	FS_HISTORY_NOTE_UNKNOWN,
	FS_HISTORY_NOTE_NONE,   /* nothing: a plain program, sends no probe */
	FS_HISTORY_NOTE_TCP,    /* its history sent it to TCP: no probe either */
	FS_HISTORY_NOTE_INTENT, /* it will probe */
};
enum fs_history_note fs_history_client_note(uint32_t inode);

#endif
