/* SPDX-License-Identifier: MIT */
/*
 * Listener records (issue 27, "say no early"): every listener that can
 * offload publishes, per port, a small record in a directory of its user
 * (FABSOCK_RECORDS_DIR/fabsock-u<euid>, mode 0700, owner- and
 * symlink-checked). A client's connect() to an address of this host that
 * finds no record of its own user for the port (or only records that refuse
 * it) stays on TCP at once: no probe, no rail, no HELLO. A record is only a
 * hint that a probe may pay: where one exists, the client probes as before.
 * docs/design.md "Listener records", docs/security.md.
 */
#ifndef FS_CORE_RECORDS_H
#define FS_CORE_RECORDS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

/* What one listener of this process published (kept in its fs_listener;
 * copied into a forked child with it). */
struct fs_record_pub {
	int fd;            /* the record file in the publisher's directory (internal), or -1 */
	int slot;          /* its slot there */
	uint64_t inode;    /* the listening socket's */
	uint16_t port;
	uint32_t uid;      /* whose directory FD is in */
	uint32_t seen_uid; /* the effective uid this process last published for */
	uint32_t marked_uid; /* the uid this process last told the slot it accepts as */
	int moved_fd;      /* the record in seen_uid's directory when that is not uid's (internal), or -1 */
	int moved_slot;
	uint32_t moved_uid;
	pid_t pid;         /* the publishing process */
	uint64_t forks;    /* fs_records_forks when published */
	struct fs_record_pub *next; /* fs_records_list */
};

/* Publishes the listener LISTEN_FD (bound to PORT) in this user's directory.
 * Leaves P->fd -1 (nothing published) if records are off or the directory
 * is not ours. */
void fs_records_publish(struct fs_record_pub *p, int listen_fd, uint16_t port);
/* The listener is closed in this process: its record goes if no other
 * process can hold the socket (none forked since); else the sweep takes it
 * once the kernel no longer lists the socket as listening. */
void fs_records_withdraw(struct fs_record_pub *p);
/* This process accepted from P's listener: if it runs as another user than
 * it published for (a worker that dropped privileges), say so. Cheap when
 * nothing changed. */
void fs_records_accepting(struct fs_record_pub *p);
/* The effective uid changed (setuid and friends): every listener of this
 * process re-publishes for the new user, and marks the old user's record as
 * served by another user. */
void fs_records_uid_changed(void);
/* Process exit: this process's records of listeners no other process holds. */
void fs_records_exit(void);
void fs_records_fork_parent(void);
void fs_records_after_fork(void);

/* The client's question, for a connection to PEER on this host. */
enum fs_record_hint {
	FS_RECORD_UNKNOWN, /* records off or unusable here: probe as before */
	FS_RECORD_PRESENT, /* a listener of this user that may offload: probe */
	FS_RECORD_NONE,    /* no record of this user for the port: plain TCP */
	FS_RECORD_REFUSES, /* records only of listeners that will refuse: plain TCP */
};
enum fs_record_hint fs_records_lookup(uint16_t port);
/* TCP first's waitless HELLO (FABSOCK_TCP_FIRST): whether the listening
 * socket LISTENER_INODE, which the kernel says listens on PORT of this
 * host, has a record of this user that offloads this user and strips a
 * waitless HELLO. Only then may a client write one without a probe: the
 * kernel confirmed the record (a stale one names a socket that no longer
 * listens). One open, flock and read, not cached. */
bool fs_records_tcp_first(uint16_t port, uint64_t listener_inode);
/* TCP first's per-user secret: FS_REC_KEY_LEN random bytes in this user's
 * directory (mode 0600 in a 0700 directory: only this user's processes and
 * root can read it), made by the first process that asks. A waitless
 * HELLO carries a MAC under it, which proves to the server that a process
 * of its user wrote it even after that process closed its socket (the
 * kernel then names no owner for it). false: none usable. */
#define FS_REC_KEY_LEN 16
bool fs_records_secret(uint8_t *key);
/* A probe to PORT on this host found no listener: clear that port's stale
 * records now rather than at the next publish. */
void fs_records_sweep_port(uint16_t port);

#endif
