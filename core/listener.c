/* SPDX-License-Identifier: MIT */
/*
 * The listener side of the UDP capability probe: a listener's answers, the
 * probe-record table they write (private, or shared in /dev/shm by
 * SO_REUSEPORT listeners), opening and closing listeners. A probe is
 * answered yes only for a connection the kernel confirms (diag.h). See
 * listener.h for the record state machine. The service thread polls the
 * twins (fs_service_on_fds); this file keeps the list of them. The twin's
 * socket, its lifetime and the application's UDP port are twin.c's.
 */
#include "core/listener.h"
#include "core/fabric.h"
#include "core/listener_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <dirent.h>
#include <stddef.h>
#include <sys/stat.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "config/log.h"
#include "config/rules.h"
#include "core/diag.h"
#include "core/engine.h"
#include "core/fdtable.h"
#include "core/plain.h"
#include "core/service.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/udp.h"
#include "core/wire.h"
#include "preload/real.h"

/* A YES waits for the server to read the connection's HELLO, however long
 * the connection sits in the accept backlog. */
#define FS_PROBE_REC_TTL_NS (120ull * 1000000000ull)
/* A settled connection's record (TCP, or its HELLO read) only answers a
 * late probe NO, and a probe comes within its client's wait of the
 * connect (at most FS_WIRE_PROBE_WAIT_MAX_MS), which came before the
 * server settled it: kept that long and 5 s more. */
#define FS_PROBE_SETTLED_TTL_NS ((FS_WIRE_PROBE_WAIT_MAX_MS + 5000ull) * 1000000ull)
#define FS_PROBE_RATE_PER_SEC 20000u

/* ---- the shared record table ------------------------------------------- */

/* How long a table's lock may be waited for. Every holder keeps it for a
 * lookup or two (microseconds); a process that keeps it longer (stopped
 * under a debugger, or one of our user's processes holding it on purpose)
 * costs each connection of the listener this much, then TCP. */
#define FS_PROBE_TABLE_LOCK_MS 1000

#define FS_PROBE_TABLE_STUCK_NS (5ull * 1000000000ull)

static int fs_table_lock(struct fs_listener *l)
{
	struct fs_probe_table *t = l->table;
	struct timespec until;
	uint64_t stuck = __atomic_load_n(&l->table_stuck_until_ns, __ATOMIC_RELAXED);
	int ret;

	/* free (nearly always: a holder keeps it for a lookup): no clock read,
	 * three a connection took on a plain client's server end */
	if (!stuck) {
		ret = pthread_mutex_trylock(&t->lock);
		if (ret == 0)
			return 0;
		if (ret == EOWNERDEAD) {
			pthread_mutex_consistent(&t->lock);
			return 0;
		}
	}
	if (stuck && stuck > fs_now_ns()) {
		/* held too long a moment ago: no more waiting (the service
		 * thread answers every listener's probes) until it has been
		 * seen free again */
		ret = pthread_mutex_trylock(&t->lock);
		if (ret == EOWNERDEAD) {
			pthread_mutex_consistent(&t->lock);
			ret = 0;
		}
		if (ret == 0)
			__atomic_store_n(&l->table_stuck_until_ns, 0, __ATOMIC_RELAXED);
		return ret;
	}
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += FS_PROBE_TABLE_LOCK_MS / 1000;
	until.tv_nsec += (FS_PROBE_TABLE_LOCK_MS % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	ret = pthread_mutex_timedlock(&t->lock, &until);
	if (ret == EOWNERDEAD) {
		/* A process died holding it: records are plain data, still valid. */
		pthread_mutex_consistent(&t->lock);
		ret = 0;
	}
	if (ret == ETIMEDOUT) {
		__atomic_store_n(&l->table_stuck_until_ns, fs_now_ns() + FS_PROBE_TABLE_STUCK_NS, __ATOMIC_RELAXED);
		FS_WARN_ONCE("a probe table's lock was held for over %d ms: its listener's connections stay on "
			     "kernel TCP while it is", FS_PROBE_TABLE_LOCK_MS);
	}
	return ret;
}

/* R's state becomes STATE, T's count of YES records with it. Table lock
 * held. */
static void fs_rec_state_set(struct fs_probe_table *t, struct fs_probe_rec *r, uint32_t state)
{
	uint32_t n = __atomic_load_n(&t->yes_live, __ATOMIC_RELAXED);

	if (r->state == FS_REC_YES && state != FS_REC_YES && n)
		__atomic_store_n(&t->yes_live, n - 1, __ATOMIC_RELAXED);
	else if (r->state != FS_REC_YES && state == FS_REC_YES)
		__atomic_store_n(&t->yes_live, n + 1, __ATOMIC_RELEASE);
	r->state = state;
}

/* R emptied (its slot free), T's count with it. Table lock held. */
static void fs_rec_clear(struct fs_probe_table *t, struct fs_probe_rec *r)
{
	fs_rec_state_set(t, r, FS_REC_NONE);
	memset(r, 0, sizeof(*r));
}

static bool fs_rec_stale(const struct fs_probe_rec *r, uint64_t now)
{
	if (r->state == FS_REC_NONE)
		return true;
	return now - r->stamp_ns > (r->state == FS_REC_YES ? FS_PROBE_REC_TTL_NS : FS_PROBE_SETTLED_TTL_NS);
}

/* Linear probing ends a key's chain at the first empty (NONE) slot. A
 * stale record right before an empty slot is on no live key's chain (that
 * chain would have to pass the empty slot), so it becomes empty too, and
 * so on backwards from EMPTY. Without it every slot ever used stayed
 * occupied, and each lookup of a new connection walked the whole table. */
static void fs_table_trim(struct fs_probe_table *t, unsigned empty, uint64_t now)
{
	for (unsigned n = 0; n < FS_PROBE_TABLE_SLOTS; n++) {
		unsigned prev = (empty + FS_PROBE_TABLE_SLOTS - 1) % FS_PROBE_TABLE_SLOTS;
		struct fs_probe_rec *r = &t->rec[prev];

		if (r->state == FS_REC_NONE || !fs_rec_stale(r, now))
			return;
		fs_rec_clear(t, r);
		empty = prev;
	}
}

/* The first empty slot of the walk from H, among its first N + 1. */
static struct fs_probe_rec *fs_table_first_none(struct fs_probe_table *t, uint32_t h, unsigned n)
{
	for (unsigned i = 0; i <= n; i++) {
		struct fs_probe_rec *r = &t->rec[(h + i) % FS_PROBE_TABLE_SLOTS];

		if (r->state == FS_REC_NONE)
			return r;
	}
	return NULL;
}

/* The key's hash: where its walk starts. */
static uint32_t fs_table_hash(const uint8_t addr[16], uint16_t port, struct fs_rec_hint *hint)
{
	uint32_t h;

	if (hint && hint->hashed)
		return hint->hash;
	h = fs_wire_crc32(addr, 16) ^ (port * 2654435761u);
	if (hint) {
		hint->hash = h;
		hint->hashed = true;
	}
	return h;
}

static struct fs_probe_rec *fs_table_find(struct fs_probe_table *t, const uint8_t addr[16], uint16_t port,
					  bool create, struct fs_rec_hint *hint)
{
	uint64_t now = fs_now_ns();
	uint32_t h = fs_table_hash(addr, port, hint);
	struct fs_probe_rec *free_slot = NULL, *r;

	/* where the key was last: the record the walk would find first (a
	 * key is in one live record at most, what made it stops at it) */
	if (hint && hint->placed && hint->slot < FS_PROBE_TABLE_SLOTS) {
		r = &t->rec[hint->slot];
		if (!fs_rec_stale(r, now) && r->port == port && memcmp(r->addr, addr, 16) == 0)
			return r;
		hint->placed = false;
	}
	for (unsigned i = 0; i < FS_PROBE_TABLE_SLOTS; i++) {
		unsigned slot = (h + i) % FS_PROBE_TABLE_SLOTS;
		bool stale;

		r = &t->rec[slot];
		stale = fs_rec_stale(r, now);
		if (!stale && r->port == port && memcmp(r->addr, addr, 16) == 0) {
			if (hint) {
				hint->slot = slot;
				hint->placed = true;
			}
			return r;
		}
		if (r->state == FS_REC_NONE) {
			/* end of this probe chain: what ends in stale records
			 * before it ends here now, so chains stay short */
			fs_table_trim(t, slot, now);
			if (free_slot && free_slot->state == FS_REC_NONE)
				free_slot = NULL; /* trimmed: the first NONE of the walk is as good */
			if (!free_slot)
				free_slot = fs_table_first_none(t, h, i);
			break;
		}
		if (stale && !free_slot)
			free_slot = r;
	}
	if (!create || !free_slot)
		return NULL;
	fs_rec_clear(t, free_slot);
	memcpy(free_slot->addr, addr, 16);
	free_slot->port = port;
	free_slot->stamp_ns = now;
	if (hint) {
		hint->slot = (uint32_t)(free_slot - t->rec);
		hint->placed = true;
	}
	return free_slot;
}

bool fs_probe_rec_stale(const struct fs_probe_rec *r, uint64_t accepted_ns)
{
	return accepted_ns && (r->state == FS_REC_TCP || r->state == FS_REC_DONE) && r->stamp_ns < accepted_ns;
}

/* The record of (ADDR, PORT) in L's table, under its lock: with CLAIM made
 * if missing and, when new or stale for ACCEPTED_NS, taken for TCP. Copied
 * to OUT (if any). Its state; NONE_STATE when the table cannot be used or
 * holds no such record. */
static enum fs_rec_state fs_listener_rec(struct fs_listener *l, const uint8_t addr[16], uint16_t port, bool claim,
					 uint64_t accepted_ns, struct fs_probe_rec *out, enum fs_rec_state none_state,
					 struct fs_rec_hint *hint)
{
	struct fs_probe_rec *r;
	enum fs_rec_state state = none_state;

	if (fs_table_lock(l))
		return none_state;
	r = fs_table_find(l->table, addr, port, claim, hint);
	if (r) {
		if (claim && (r->state == FS_REC_NONE || fs_probe_rec_stale(r, accepted_ns))) {
			fs_rec_state_set(l->table, r, FS_REC_TCP);
			r->stamp_ns = fs_now_ns();
			/* this connection's now: a later probe must not take it
			 * for an earlier connection's (fs_listener_answer) */
			r->client_inode = 0;
		}
		state = r->state;
		if (out)
			*out = *r;
	}
	pthread_mutex_unlock(&l->table->lock);
	return state;
}

enum fs_rec_state fs_listener_claim_tcp(struct fs_listener *l, const uint8_t addr[16], uint16_t port,
					uint64_t accepted_ns, struct fs_probe_rec *out, struct fs_rec_hint *hint)
{
	return fs_listener_rec(l, addr, port, true, accepted_ns, out, FS_REC_TCP, hint);
}

enum fs_rec_state fs_listener_lookup(struct fs_listener *l, const uint8_t addr[16], uint16_t port,
				     struct fs_probe_rec *out, struct fs_rec_hint *hint)
{
	return fs_listener_rec(l, addr, port, false, 0, out, FS_REC_NONE, hint);
}

bool fs_listener_yes_none(const struct fs_listener *l)
{
	return __atomic_load_n(&l->table->yes_live, __ATOMIC_ACQUIRE) == 0;
}

void fs_listener_forget(struct fs_listener *l, const uint8_t addr[16], uint16_t port, struct fs_rec_hint *hint)
{
	struct fs_probe_rec *r;

	if (fs_table_lock(l))
		return;
	r = fs_table_find(l->table, addr, port, false, hint);
	if (r) {
		/* Keep the slot occupied (it may be inside another key's probe
		 * chain) but make it match nothing and be reusable; a walk that
		 * ends after it empties it (fs_table_trim), and so does this
		 * close when the slot after it is empty: a server of plain
		 * clients (a connection per request) left the table full of
		 * such slots, and every new key's walk crossed them to the next
		 * empty one (a third of a claim's time). (The fine clock: the
		 * stamps are its, and a coarse reading behind a fresh stamp
		 * would make that record look stale.) */
		unsigned slot = (unsigned)(r - l->table->rec), next = (slot + 1) % FS_PROBE_TABLE_SLOTS;

		memset(r->addr, 0, sizeof(r->addr));
		r->port = 0;
		r->stamp_ns = 0;
		if (l->table->rec[next].state == FS_REC_NONE)
			fs_table_trim(l->table, next, fs_now_ns());
	}
	pthread_mutex_unlock(&l->table->lock);
}

bool fs_listener_move(struct fs_listener *l, const uint8_t addr[16], uint16_t port, enum fs_rec_state from,
		      enum fs_rec_state to, struct fs_rec_hint *hint)
{
	struct fs_probe_rec *r;
	bool moved = false;

	if (fs_table_lock(l))
		return false;
	r = fs_table_find(l->table, addr, port, from == FS_REC_NONE, hint);
	if (r && r->state == from) {
		fs_rec_state_set(l->table, r, to);
		r->stamp_ns = fs_now_ns();
		moved = true;
	}
	pthread_mutex_unlock(&l->table->lock);
	return moved;
}

/* The listeners whose twins the service thread polls (fs_listeners_fds),
 * newest first. Lock order: the service thread takes fs_listeners_lock
 * inside its own lock (fs_listeners_count, fs_listeners_add_fds), never the
 * other way. */
pthread_mutex_t fs_listeners_lock = PTHREAD_MUTEX_INITIALIZER;
struct fs_listener *fs_service_listeners;
/* A listener was published in this process once (atomic): the exit path's
 * look without the lock. Not the list itself, which the service thread
 * changes under fs_listeners_lock (TSan: a race with fs_service_drop_closed). */
static bool fs_listeners_ever;
static const struct fs_service_fds fs_listeners_fds;

/* ---- listener side ----------------------------------------------------- */

static void fs_probe_table_init_lock(struct fs_probe_table *table)
{
	pthread_mutexattr_t ma;

	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&table->lock, &ma);
	pthread_mutexattr_destroy(&ma);
}

/*
 * SO_REUSEPORT listeners: several sockets (often in several processes) on
 * one address and port, the kernel spreading connections among them. Their
 * UDP twins share the port too (SO_REUSEPORT), and the kernel spreads probes
 * by its own hash, so the twin that answers a probe is not the listener
 * that accepts the connection. They therefore share one probe table, a
 * file in /dev/shm named after the network namespace and the address:
 * whichever twin answers records there, whichever listener accepts looks
 * there. The file lists the processes using it; the last one out removes
 * it, and a process that finds only dead ones (SIGKILL) starts it afresh.
 */
static void fs_probe_tables_clean_stale(void);
static void fs_probe_table_leave(struct fs_listener *l);

/* Opens the table file PATH (FLAGS: O_RDWR or O_RDONLY, maybe with
 * O_CREAT|O_EXCL) and takes its flock: every step that creates, joins,
 * leaves or removes a shared table runs under it, so no process sees a
 * table half made or signs in to one being removed. The file must be ours:
 * a regular file (no symlink), owned by our effective uid, mode 0600, no
 * larger than a table; anything else is refused (-1, *REFUSED set). The
 * path must still name the file opened (else -1, errno ESTALE: a leaver
 * removed it meanwhile; try again). */
static int fs_probe_table_lock(const char *path, int flags, struct stat *st, bool *refused)
{
	struct stat now;
	int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC, 0600);

	*refused = false;
	if (fd < 0) {
		/* a symlink (ELOOP), or a file of another user's (EACCES) */
		*refused = errno == ELOOP || errno == EACCES || errno == EPERM;
		return -1;
	}
	if (flags & O_CREAT)
		(void)fchmod(fd, 0600); /* whatever the umask */
	while (flock(fd, LOCK_EX) && errno == EINTR)
		;
	if (fstat(fd, st) || !S_ISREG(st->st_mode) || st->st_uid != fs_self_euid() || (st->st_mode & 07777) != 0600 ||
	    (size_t)st->st_size > sizeof(struct fs_probe_table)) {
		*refused = true;
		fs_real.close(fd);
		return -1;
	}
	if (stat(path, &now) || now.st_dev != st->st_dev || now.st_ino != st->st_ino) {
		fs_real.close(fd);
		errno = ESTALE;
		return -1;
	}
	return fd;
}

/* Drops the flock and closes FD. The flock must be dropped by hand: a
 * mapping of the file keeps its open file, and the lock, alive. */
static void fs_probe_table_unlock(int fd)
{
	flock(fd, LOCK_UN);
	fs_real.close(fd);
}

/* Signs PID in (a free or dead process's slot); false if all are taken. */
static bool fs_probe_table_sign_in(struct fs_probe_table *table, int32_t pid)
{
	for (int i = 0; i < FS_PROBE_TABLE_USERS; i++) {
		int32_t old = __atomic_load_n(&table->users[i], __ATOMIC_ACQUIRE);

		if (old > 0 && old != pid && fs_pid_alive(old))
			continue;
		if (__atomic_compare_exchange_n(&table->users[i], &old, pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			return true;
	}
	return false;
}

static bool fs_probe_table_in_use(const int32_t users[FS_PROBE_TABLE_USERS], int32_t except)
{
	for (int i = 0; i < FS_PROBE_TABLE_USERS; i++)
		if (users[i] > 0 && users[i] != except && fs_pid_alive(users[i]))
			return true;
	return false;
}

/* Reads a locked table file's `ready` and `users` (not its records):
 * true if it is a whole, ready table that no live process but EXCEPT uses. */
static bool fs_probe_table_file_stale(int fd, const struct stat *st, int32_t except)
{
	int32_t users[FS_PROBE_TABLE_USERS];
	uint32_t ready;

	return (size_t)st->st_size == sizeof(struct fs_probe_table) &&
	       pread(fd, &ready, sizeof(ready), offsetof(struct fs_probe_table, ready)) == (ssize_t)sizeof(ready) &&
	       ready &&
	       pread(fd, users, sizeof(users), offsetof(struct fs_probe_table, users)) == (ssize_t)sizeof(users) &&
	       !fs_probe_table_in_use(users, except);
}

static struct fs_probe_table *fs_probe_table_shared(struct fs_listener *l, const struct sockaddr_storage *ss)
{
	uint8_t key[16];
	uint16_t port;
	struct stat st;
	struct fs_probe_table *table = MAP_FAILED;
	unsigned long netns = 0;

	fs_probe_tables_clean_stale();
	if (stat("/proc/self/ns/net", &st) == 0)
		netns = (unsigned long)st.st_ino;
	fs_sockaddr_key((const struct sockaddr *)ss, key, &port);
	snprintf(l->table_path, sizeof(l->table_path),
		 "/dev/shm/fabsock-probe-%lu-%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x-%u", netns,
		 key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7], key[8], key[9], key[10], key[11],
		 key[12], key[13], key[14], key[15], port);
	/* Bounded: each retry means another process created or removed the
	 * file in the meantime, which takes it microseconds. */
	for (int attempt = 0; attempt < 200; attempt++) {
		bool refused, creator = true;
		int fd = fs_probe_table_lock(l->table_path, O_RDWR | O_CREAT | O_EXCL, &st, &refused);

		if (fd < 0 && !refused && errno == EEXIST) {
			creator = false;
			fd = fs_probe_table_lock(l->table_path, O_RDWR, &st, &refused);
		}
		if (refused) {
			FS_STAT_INC(probe_tables_refused);
			FS_WARN("probe table %s is not one this process made (owner, mode or size); the listener "
				"stays plain TCP",
				l->table_path);
			return NULL;
		}
		if (fd < 0) {
			if (errno != ENOENT && errno != ESTALE && errno != EEXIST)
				return NULL;
			usleep(1000);
			continue;
		}
		if (!creator && (size_t)st.st_size < sizeof(*table)) {
			/* its creator has not yet taken the lock, or died before */
			fs_probe_table_unlock(fd);
			usleep(1000);
			continue;
		}
		if ((!creator || ftruncate(fd, sizeof(*table)) == 0) &&
		    (table = mmap(NULL, sizeof(*table), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) != MAP_FAILED) {
			if (creator || !__atomic_load_n(&table->ready, __ATOMIC_ACQUIRE)) {
				/* new, or left unready by a creator that died mid-way */
				fs_probe_table_init_lock(table);
				memset(table->users, 0, sizeof(table->users));
			}
			if (!fs_probe_table_sign_in(table, (int32_t)getpid()))
				FS_WARN("probe table %s: more than %d processes share it; not signed in",
					l->table_path, FS_PROBE_TABLE_USERS);
			/* signed in before ready: a ready table with no live user is stale */
			__atomic_store_n(&table->ready, 1, __ATOMIC_RELEASE);
		} else if (creator) {
			unlink(l->table_path);
		}
		fs_probe_table_unlock(fd);
		if (table == MAP_FAILED)
			return NULL;
		l->shared_table = true;
		FS_DBG("listener on port %u shares probe table %s%s", port, l->table_path, creator ? " (new)" : "");
		return table;
	}
	FS_WARN("probe table %s: could not join it; the listener stays plain TCP", l->table_path);
	return NULL;
}

void fs_listeners_exit(void)
{
	/* a process that never listened: no lock, no clock (every short
	 * process exits through here) */
	if (!__atomic_load_n(&fs_listeners_ever, __ATOMIC_ACQUIRE))
		return;
	/* the exit may have interrupted this thread inside the lock: the
	 * tables are left then (their files go when their last user's
	 * process does: fs_probe_tables_clean_stale) */
	if (fs_mutex_lock_until(&fs_listeners_lock, fs_now_ns() + 100000000ull))
		return;
	for (struct fs_listener *l = fs_service_listeners; l; l = l->next) {
		if (l->shared_table && l->pid == getpid())
			fs_probe_table_leave(l);
		/* the children that accept from it drain the twin themselves now */
		if (!l->shared_table && l->table && l->table != MAP_FAILED &&
		    __atomic_load_n(&l->table->answerer, __ATOMIC_ACQUIRE) == fs_self_pid())
			__atomic_store_n(&l->table->answerer, 0, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&fs_listeners_lock);
}

/* Removes shared probe tables whose every user died (SIGKILL): once per
 * process, when it first shares one. */
static void fs_probe_tables_clean_stale(void)
{
	static int done;
	DIR *dir;
	struct dirent *de;

	if (__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL) || !(dir = opendir("/dev/shm")))
		return;
	while ((de = readdir(dir))) {
		char path[300];
		struct stat st;
		bool refused;
		int fd;

		if (strncmp(de->d_name, "fabsock-probe-", 14) != 0)
			continue;
		snprintf(path, sizeof(path), "/dev/shm/%s", de->d_name);
		fd = fs_probe_table_lock(path, O_RDONLY, &st, &refused);
		if (fd < 0)
			continue; /* gone, or not ours: not ours to remove */
		/* a short file is being created (its creator waits for the lock) */
		if (fs_probe_table_file_stale(fd, &st, 0) && unlink(path) == 0)
			FS_INFO("removed stale probe table %s", de->d_name);
		fs_probe_table_unlock(fd);
	}
	closedir(dir);
}

/* Signs this process out of a shared table; the last one removes the file. */
static void fs_probe_table_leave(struct fs_listener *l)
{
	int32_t me = (int32_t)getpid();
	struct stat st;
	bool refused;
	int fd = fs_probe_table_lock(l->table_path, O_RDONLY, &st, &refused);

	for (int i = 0; i < FS_PROBE_TABLE_USERS; i++) {
		int32_t pid = me;

		__atomic_compare_exchange_n(&l->table->users[i], &pid, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
	}
	if (fd < 0)
		return; /* removed already, or replaced by a file not ours */
	/* the file may be a newer table than ours (ours was removed and made
	 * again): remove it only if it is unused, whichever it is */
	if (fs_probe_table_file_stale(fd, &st, me))
		unlink(l->table_path);
	fs_probe_table_unlock(fd);
}

/* Gives L a probe table of its own (no SO_REUSEPORT), ready for use.
 * Returns false if there is no memory for one. */
static bool fs_probe_table_private(struct fs_listener *l)
{
	/* a memfd, so that a program this process execs with a connection
	 * accepted here can look its record up (fs_listener_exec_fd) */
	int tfd = memfd_create("fabsock-probe-table", MFD_CLOEXEC);

	l->table_fd = -1;
	if (tfd >= 0 && ftruncate(tfd, sizeof(*l->table)) == 0) {
		l->table = mmap(NULL, sizeof(*l->table), PROT_READ | PROT_WRITE, MAP_SHARED, tfd, 0);
		if (l->table != MAP_FAILED)
			l->table_fd = fs_internal_fd(tfd);
		else
			fs_real.close(tfd);
	} else {
		if (tfd >= 0)
			fs_real.close(tfd);
		l->table = mmap(NULL, sizeof(*l->table), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
				-1, 0);
	}
	if (l->table == MAP_FAILED)
		return false;
	fs_probe_table_init_lock(l->table);
	__atomic_store_n(&l->table->ready, 1, __ATOMIC_RELEASE);
	return true;
}

/* Hands L to the service thread, which answers its probes from now on. */
static void fs_listener_publish(struct fs_listener *l)
{
	fs_service_on_fds(&fs_listeners_fds);
	pthread_mutex_lock(&fs_listeners_lock);
	fs_listener_get(l);
	l->next = fs_service_listeners;
	fs_service_listeners = l;
	__atomic_store_n(&fs_listeners_ever, true, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&fs_listeners_lock);
	fs_service_kick(); /* starts the service thread if it is not running */
}

/* A closed listener of this process on the same address whose connections
 * still hold it: a new listening socket there (iperf3 makes one for each
 * test) carries on with its twin and its table, so a late probe of the old
 * one's connections and the new one's own are answered from the same
 * records. fs_listeners_lock held. */
static struct fs_listener *fs_listener_reopen(const struct sockaddr_storage *ss, socklen_t len, bool reuseport)
{
	for (struct fs_listener *l = fs_service_listeners; l; l = l->next) {
		if (l->pid != getpid() || !__atomic_load_n(&l->closed, __ATOMIC_ACQUIRE) || l->addrlen != len ||
		    l->reuseport != reuseport || memcmp(&l->addr, ss, len) != 0)
			continue;
		fs_listener_get(l); /* the new listening socket's */
		__atomic_store_n(&l->closed, false, __ATOMIC_RELEASE);
		l->closed_ns = 0;
		if (!l->twin_bound && fs_twin_bind_soon(l)) {
			l->twin_retry_ms = FS_TWIN_RETRY_FIRST_MS;
			l->twin_retry_ns = fs_now_ns() + l->twin_retry_ms * 1000000ull;
		}
		return l;
	}
	return NULL;
}

struct fs_listener *fs_listener_open(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss), olen;
	struct fs_listener *l;
	int reuseport = 0, v6only = 0, err;

	if (fs_real.getsockname(fd, (struct sockaddr *)&ss, &len))
		return NULL;
	if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)
		return NULL;
	olen = sizeof(reuseport);
	fs_real.getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &reuseport, &olen);
	olen = sizeof(v6only);
	if (ss.ss_family == AF_INET6)
		fs_real.getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &olen);
	pthread_mutex_lock(&fs_listeners_lock);
	l = fs_listener_reopen(&ss, len, reuseport != 0);
	pthread_mutex_unlock(&fs_listeners_lock);
	if (l) {
		l->app_fd = fd;
		fs_service_kick(); /* polls the twin if it is bound again */
		fs_twin_timer_arm(l->twin_retry_ns);
		fs_records_publish(&l->rec, fd, l->port); /* a new socket: a new inode */
		return l;
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->udp_fd = -1;
	l->table_fd = -1;
	l->app_fd = fd;
	memcpy(&l->addr, &ss, len);
	l->addrlen = len;
	l->v6only = v6only;
	l->reuseport = reuseport != 0;
	l->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	err = fs_twin_bind(l);
	if (err == -EADDRINUSE) {
		/* The UDP port is taken: by the application itself (a DNS server
		 * binds UDP 53 before it listens on TCP 53), whose socket drops
		 * probes (fs_udp_shun_probes), or by another process. The
		 * listener answers nothing until the port is free; its
		 * connections stay on TCP (peers_plain). */
		FS_INFO("listener on port %u: the UDP port is taken; its connections stay on TCP until it is free",
			l->port);
		FS_STAT_INC(twins_missing);
		l->twin_retry_ms = FS_TWIN_RETRY_FIRST_MS;
		l->twin_retry_ns = fs_now_ns() + l->twin_retry_ms * 1000000ull;
	} else if (err) {
		FS_INFO("listener on port %u: no UDP twin (%s); this listener stays plain TCP", l->port, strerror(-err));
		free(l);
		return NULL;
	}
	if (l->reuseport) { /* SO_REUSEPORT */
		l->table = fs_probe_table_shared(l, &ss);
		if (!l->table) {
			FS_INFO("listener on port %u: cannot share a probe table (%s); this listener stays plain TCP",
				l->port, strerror(errno));
			goto fail;
		}
	} else if (!fs_probe_table_private(l)) {
		goto fail;
	}
	l->refs = 1;
	l->pid = getpid();
	fs_listener_note_answerer(l);
	fs_listener_publish(l);
	fs_twin_timer_arm(l->twin_retry_ns);
	/* clients of this user on this host now probe it (core/records.h) */
	fs_records_publish(&l->rec, fd, l->port);
	return l;
fail:
	if (l->udp_fd >= 0)
		fs_real.close(l->udp_fd);
	free(l);
	return NULL;
}

int fs_listener_exec_fd(struct fs_listener *l)
{
	int fd = -1, out;

	if (l->table_fd >= 0)
		fd = fs_real.fcntl(l->table_fd, F_DUPFD_CLOEXEC, 0);
	else if (l->shared_table)
		fd = open(l->table_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	out = fs_internal_fd(fd);
	if (out >= 0)
		fs_real.fcntl(out, F_SETFD, 0); /* it survives the exec */
	return out;
}

struct fs_listener *fs_listener_attach(int fd)
{
	struct fs_probe_table *table;
	struct fs_listener *l;
	struct stat st;

	/* our own file (the old program's): a memfd, or a table in /dev/shm
	 * this user made; nothing else is mapped */
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != fs_self_euid() ||
	    (size_t)st.st_size != sizeof(*table)) {
		FS_INFO("fd %d: not a probe table of this user; connections inherited with it stay on TCP", fd);
		return NULL;
	}
	table = mmap(NULL, sizeof(*table), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (table == MAP_FAILED)
		return NULL;
	if (__atomic_load_n(&table->ready, __ATOMIC_ACQUIRE) != 1 || !(l = calloc(1, sizeof(*l)))) {
		munmap(table, sizeof(*table));
		return NULL;
	}
	l->udp_fd = -1;
	l->table_fd = -1;
	l->table = table;
	l->refs = 1;
	l->pid = getpid();
	l->closed = true; /* it listens on nothing here */
	return l;
}

int fs_listener_fd(struct fs_listener *l)
{
	return l->udp_fd;
}

void fs_listener_get(struct fs_listener *l)
{
	__atomic_fetch_add(&l->refs, 1, __ATOMIC_RELAXED);
}

void fs_listener_put(struct fs_listener *l)
{
	if (__atomic_sub_fetch(&l->refs, 1, __ATOMIC_ACQ_REL))
		return;
	fs_records_withdraw(&l->rec); /* closed before: a no-op then */
	if (l->udp_fd >= 0)
		fs_real.close(l->udp_fd);
	if (l->table_fd >= 0)
		fs_internal_fd_close(l->table_fd);
	if (l->shared_table && l->pid == getpid())
		fs_probe_table_leave(l);
	/* (a plain listener's table stays: marks of connections it accepted
	 * untracked may be let go of later, core/plain.h) */
	if (!__atomic_load_n(&l->plain_handle, __ATOMIC_ACQUIRE))
		munmap(l->table, sizeof(*l->table));
	free(l);
}

/* The application closed the listening socket: its twin goes with it, so
 * that the port is free for a new listener (of this process or another) or
 * the application's own UDP socket. Probes already queued are answered
 * first. Connections it accepted whose probe may still be on its way (socat
 * closes its listener right after accept()) keep the twin for at most
 * FS_TWIN_CLOSE_GRACE_NS, answered only for connections this process holds
 * (fs_listener_answer); a later probe finds the port closed and its client
 * stays on TCP. The record goes with the twin when nothing is unsettled;
 * else it stays while connections hold L (fs_listener_put), so that the
 * client of a connection accepted just before the close (its connect()
 * may look for the record after our accept() and close()) still probes. */
void fs_listener_close(struct fs_listener *l)
{
	bool release;

	fs_listener_drain(l);
	pthread_mutex_lock(&fs_listeners_lock);
	__atomic_store_n(&l->closed, true, __ATOMIC_RELEASE);
	l->closed_ns = fs_now_ns();
	l->twin_retry_ns = 0;
	release = __atomic_load_n(&l->unsettled, __ATOMIC_ACQUIRE) == 0 || l->pid != getpid();
	if (release)
		fs_twin_release(l);
	pthread_mutex_unlock(&fs_listeners_lock);
	if (release)
		fs_records_withdraw(&l->rec);
	else
		fs_twin_timer_arm(l->closed_ns + FS_TWIN_CLOSE_GRACE_NS);
	fs_listener_put(l);
	fs_service_kick(); /* its poll lets go of the twin's file */
}

void fs_listener_unsettled(struct fs_listener *l, bool more)
{
	if (more) {
		__atomic_add_fetch(&l->unsettled, 1, __ATOMIC_ACQ_REL);
		return;
	}
	if (__atomic_sub_fetch(&l->unsettled, 1, __ATOMIC_ACQ_REL) == 0 && __atomic_load_n(&l->closed, __ATOMIC_ACQUIRE))
		fs_twin_timer_arm(fs_now_ns()); /* the twin can go now */
}

void fs_listener_accepting(struct fs_listener *l)
{
	fs_records_accepting(&l->rec);
	fs_listeners_accepted(l);
}

/* How long a parent seen alive is taken to answer a child's probes
 * without a look: the child's connections come far more often (one
 * kill(pid, 0) per connection would be a system call more than the
 * kernel's), and a parent that died meanwhile costs at most that long of
 * unanswered probes (its clients wait up to FABSOCK_PROBE_TIMEOUT_MS). */
#define FS_ANSWERER_CHECK_NS 100000000ull

bool fs_listener_answered(struct fs_listener *l)
{
	pid_t answerer;
	uint64_t now;

	if (l->pid == fs_self_pid())
		return true;
	if (l->shared_table || !l->table || l->table == MAP_FAILED)
		return false; /* several processes' twins: each drains its own */
	/* the parent's, or a process that took the listener over when the
	 * parent was gone (fs_listener_adopt: a daemon's worker) */
	answerer = __atomic_load_n(&l->table->answerer, __ATOMIC_ACQUIRE);
	if (answerer <= 0)
		return false;
	now = fs_now_coarse_ns(); /* (answerer_seen_until_ns is of this clock alone) */
	if (now < __atomic_load_n(&l->answerer_seen_until_ns, __ATOMIC_RELAXED))
		return true;
	/* EPERM: alive, as another user (a child that dropped privileges) */
	if (kill(answerer, 0) && errno != EPERM)
		return false;
	__atomic_store_n(&l->answerer_seen_until_ns, now + FS_ANSWERER_CHECK_NS, __ATOMIC_RELAXED);
	return true;
}

bool fs_listener_adopt(struct fs_listener *l)
{
	pid_t self = fs_self_pid(), seen, maker = __atomic_load_n(&l->pid, __ATOMIC_RELAXED);
	uint64_t now = fs_now_coarse_ns(); /* answerer_seen_until_ns's clock */

	if (maker == self || l->shared_table || !l->table ||
	    l->table == MAP_FAILED || __atomic_load_n(&l->closed, __ATOMIC_ACQUIRE) ||
	    !__atomic_load_n(&l->twin_bound, __ATOMIC_ACQUIRE) || __atomic_load_n(&l->udp_fd, __ATOMIC_ACQUIRE) < 0 ||
	    now < __atomic_load_n(&l->answerer_seen_until_ns, __ATOMIC_RELAXED))
		return false;
	seen = __atomic_load_n(&l->table->answerer, __ATOMIC_ACQUIRE);
	/* A live answerer (EPERM: another user's, a parent that kept root)
	 * keeps the twin; one that exited left 0, one killed its pid. A maker
	 * that lives and answers nothing let its twin go (the application's
	 * own use of the port won): nothing to take over. */
	if (seen == self || fs_pid_alive(seen) || (maker != seen && fs_pid_alive(maker))) {
		__atomic_store_n(&l->answerer_seen_until_ns, now + FS_ANSWERER_CHECK_NS, __ATOMIC_RELAXED);
		return false;
	}
	/* one of the processes that hold the listener wins */
	if (!__atomic_compare_exchange_n(&l->table->answerer, &seen, self, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return false;
	__atomic_store_n(&l->pid, self, __ATOMIC_RELEASE);
	fs_listener_publish(l); /* the service thread polls its twin from now on */
	FS_STAT_INC(listeners_adopted);
	FS_INFO("listener on port %u: its maker (pid %d) is gone; this process answers its probes", l->port,
		(int)seen);
	return true;
}

void fs_listener_note_answerer(struct fs_listener *l)
{
	pid_t self = fs_self_pid();

	if (l->shared_table || !l->table || l->table == MAP_FAILED || l->pid != self)
		return;
	if (__atomic_load_n(&l->twin_bound, __ATOMIC_ACQUIRE))
		__atomic_store_n(&l->table->answerer, self, __ATOMIC_RELEASE);
	else
		__atomic_store_n(&l->table->answerer, 0, __ATOMIC_RELEASE);
}

int fs_listener_probe_fd(struct fs_listener *l)
{
	/* a placeholder's number while the twin is not bound: polling it
	 * never reports anything (struct fs_listener) */
	return __atomic_load_n(&l->udp_fd, __ATOMIC_ACQUIRE);
}

bool fs_listener_has_twin(struct fs_listener *l)
{
	return __atomic_load_n(&l->twin_bound, __ATOMIC_ACQUIRE);
}

/* Takes closed listeners that nothing but the service list holds off the
 * list. fs_listeners_lock held. */
static void fs_service_drop_closed(void)
{
	for (struct fs_listener **link = &fs_service_listeners; *link;) {
		struct fs_listener *l = *link;

		if (__atomic_load_n(&l->closed, __ATOMIC_ACQUIRE) && __atomic_load_n(&l->refs, __ATOMIC_ACQUIRE) == 1) {
			*link = l->next;
			fs_twin_release(l);
			fs_listener_put(l);
			continue;
		}
		link = &l->next;
	}
}

static bool fs_listener_rate_ok(struct fs_listener *l)
{
	uint64_t now = fs_now_ns();

	if (now - l->bucket_ns > 1000000000ull) {
		l->bucket_ns = now;
		l->bucket_used = 0;
	}
	return ++l->bucket_used <= FS_PROBE_RATE_PER_SEC;
}

/* A probe from this host (the client's end of the connection was found,
 * owned by CLIENT_UID) came from the UDP socket at SRC:SRC_PORT: honoured
 * only if that socket belongs to the same user. Another local user can
 * send a probe from the client's address for any connection; a yes to it
 * made a server that speaks first hold its banner back for up to the
 * probe's wait (10 s) from a plain client (issue 26). The answer is then
 * no, and no record is written: the real client's own probe, if any, is
 * answered as if the forged one never came. */
static bool fs_probe_owner_ok(const uint8_t local[16], uint16_t lport, const uint8_t src[16], uint16_t src_port,
			      uint32_t client_uid, uint16_t client_port)
{
	uint32_t probe_uid;
	int found = fs_udp_owner(src, src_port, local, lport, &probe_uid);

	if (found < 0) {
		/* no UDP sock_diag here (the udp_diag module missing): the
		 * address check alone, as before, counted */
		FS_STAT_INC(probes_owner_unchecked);
		FS_WARN_ONCE("cannot tell who sent a probe (UDP sock_diag); answering local probes by address only");
		return true;
	}
	if (found == 0 || client_uid == FS_DIAG_NO_UID || probe_uid != client_uid) {
		FS_STAT_INC(probes_foreign);
		FS_DBG("probe for port %u from UDP port %u: its socket's user (%d) is not the connection's (%d)",
		       client_port, src_port, found ? (int)probe_uid : -1, (int)client_uid);
		return false;
	}
	return true;
}

/* A probe sent again (its client heard no answer within 30 ms: a burst,
 * a busy answerer) for a connection already answered yes: the record holds
 * its nonce, which only that client knows (64 random bits, sent from its
 * own address, where another user cannot read them), so the kernel's word
 * on the connection and on the probe's sender is the one the first answer
 * had. True (answer yes again) without the sock_diag lookups that cost each
 * probe two or three system calls under fs_diag_lock: in a storm the
 * resends came in hundreds, each checked in full while first probes waited
 * behind them, and a client that had closed its probe socket meanwhile
 * made its resend look foreign (probes_foreign). The record is left as it
 * is: the server's HELLO wait still counts from the first answer. A resend
 * read once the HELLO came (the record DONE, its nonce kept: in CI the
 * application thread took the first probe, the HELLO followed, and the
 * service thread read the resend only then) is the same repeat. Not for a
 * closed listener's twin, whose answers look at this process's
 * descriptors (fs_listener_close). */
static bool fs_listener_answered_yes(struct fs_listener *l, const struct fs_probe *ask)
{
	struct fs_probe_rec *r;
	bool again = false;

	if (!ask->nonce || __atomic_load_n(&l->closed, __ATOMIC_ACQUIRE) || fs_table_lock(l))
		return false;
	r = fs_table_find(l->table, ask->client_addr, ask->client_port, false, NULL);
	if (r && (r->state == FS_REC_YES || r->state == FS_REC_DONE) && r->nonce == ask->nonce)
		again = true;
	pthread_mutex_unlock(&l->table->lock);
	if (again)
		FS_STAT_INC(probes_repeated);
	return again;
}

static void fs_listener_answer(struct fs_listener *l, const uint8_t *pkt, ssize_t len,
			       const struct sockaddr_storage *from, socklen_t fromlen, const uint8_t local[16],
			       bool have_local)
{
	struct fs_probe ask, reply;
	uint8_t src[16], out[FS_WIRE_PROBE_LEN];
	uint16_t src_port;
	struct fs_probe_rec *r;
	uint8_t answer = FS_PROBE_NO;
	uint32_t client_inode = 0;

	if (len != FS_WIRE_PROBE_LEN || fs_wire_probe_decode(pkt, (size_t)len, &ask) || ask.type != FS_PROBE_ASK) {
		FS_STAT_INC(probes_bad);
		return;
	}
	fs_sockaddr_key((const struct sockaddr *)from, src, &src_port);
	/* The datagram must come from the address it speaks for. */
	if (memcmp(src, ask.client_addr, 16) != 0) {
		FS_STAT_INC(probes_bad);
		return;
	}
	{
		bool ok = false;

		/* The service thread and application threads both drain probes. */
		if (fs_table_lock(l) == 0) {
			ok = fs_listener_rate_ok(l);
			pthread_mutex_unlock(&l->table->lock);
		}
		if (!ok)
			return;
	}
	{
		struct sockaddr_in6 client = { .sin6_family = AF_INET6, .sin6_port = htons(ask.client_port) };

		memcpy(&client.sin6_addr, ask.client_addr, 16);
		if (fs_rules_match(&fs_rules_global, FS_SIDE_SERVER, (struct sockaddr *)&client, l->port) ==
		    FS_RULE_KERNEL)
			goto reply;
	}
	if (fs_listener_answered_yes(l, &ask)) {
		answer = FS_PROBE_YES;
		goto reply;
	}
	/* Only a connection that exists gets a record (and a yes). */
	if (have_local) {
		uint32_t client_uid;
		int exists = fs_conn_exists(local, l->port, ask.client_addr, ask.client_port, &client_inode,
					    &client_uid);

		if (exists == 0) {
			FS_STAT_INC(probes_bad);
			FS_DBG("probe for port %u: no such connection", ask.client_port);
			goto reply;
		}
		if (exists < 0) {
			FS_STAT_INC(probes_unchecked);
			FS_WARN_ONCE("cannot check probes against the kernel's connections (sock_diag); "
				     "answering them unchecked");
		}
		if (client_inode && !fs_probe_owner_ok(local, l->port, src, src_port, client_uid, ask.client_port))
			goto reply;
		/* A closed listener's twin, kept for the probes of connections it
		 * accepted (fs_listener_close): a connection this process does
		 * not hold is another listener's (a new one of another process
		 * on the port), whose records are elsewhere. */
		if (__atomic_load_n(&l->closed, __ATOMIC_ACQUIRE) &&
		    fs_conn_held_here(local, l->port, ask.client_addr, ask.client_port) == 0) {
			FS_DBG("probe for port %u: not a connection of this closed listener's", ask.client_port);
			goto reply;
		}
	}
	if (fs_table_lock(l) == 0) {
		r = fs_table_find(l->table, ask.client_addr, ask.client_port, true, NULL);
		/* A record of an earlier connection from the same client port (a
		 * client with hundreds of connections reuses ports within the
		 * record's lifetime): the kernel names another socket for the
		 * connection now, and only one connection holds a 4-tuple at a
		 * time, so that one is gone. (Seen: pgbench -c 300's second run,
		 * 8 of 300 answered no.) */
		if (r && r->state != FS_REC_NONE && client_inode && r->client_inode && r->client_inode != client_inode) {
			FS_DBG("probe for port %u: the record was an earlier connection's (inode %u, now %u)",
			       ask.client_port, r->client_inode, client_inode);
			fs_rec_state_set(l->table, r, FS_REC_NONE);
		}
		if (r && r->state == FS_REC_DONE && ask.nonce && r->nonce == ask.nonce) {
			/* a resend read after its connection's HELLO came (the
			 * record moved on while this thread checked the kernel):
			 * a repeat, answered as the first was, the record as it is */
			FS_STAT_INC(probes_repeated);
			answer = FS_PROBE_YES;
		} else if (r && (r->state == FS_REC_NONE || (r->state == FS_REC_YES && r->nonce == ask.nonce))) {
			/* a resend whose first probe another thread was answering
			 * meanwhile (the service thread and an application thread
			 * drain the same twin): a repeat all the same */
			bool repeat = r->state == FS_REC_YES;

			if (repeat)
				FS_STAT_INC(probes_repeated);
			fs_rec_state_set(l->table, r, FS_REC_YES);
			r->nonce = ask.nonce;
			r->wait_ms = ask.wait_ms;
			r->client_inode = client_inode;
			r->stamp_ns = fs_now_ns();
			answer = FS_PROBE_YES;
			/* a plain listener's untracked connection from this port
			 * (core/plain.h: the YES is recorded first, then the
			 * count read): no, and the listener tracks again */
			if (!repeat && fs_plain_refuses(l->table, ask.client_port, ask.wait_ms)) {
				FS_DBG("probe for port %u answered no: a connection from it is not tracked",
				       ask.client_port);
				fs_rec_state_set(l->table, r, FS_REC_TCP);
				answer = FS_PROBE_NO;
			}
		} else if (r) {
			FS_DBG("probe for port %u answered no: record state %u, nonce %#llx vs %#llx, age %llu ms",
			       ask.client_port, r->state, (unsigned long long)r->nonce,
			       (unsigned long long)ask.nonce, (unsigned long long)((fs_now_ns() - r->stamp_ns) / 1000000));
		}
		pthread_mutex_unlock(&l->table->lock);
	}
reply:
	reply = ask;
	reply.type = answer;
	/* from the address the probe came to: the client's UDP socket is
	 * connected to it, and a listener on the wildcard address would
	 * otherwise answer from its route's (a client of 127.0.0.2, or of a
	 * host's second address, never heard the answer) */
	if (fs_wire_probe_encode(&reply, out, sizeof(out)) == FS_WIRE_PROBE_LEN)
		fs_udp_send_from(l->udp_fd, out, sizeof(out), MSG_DONTWAIT | MSG_NOSIGNAL, (const struct sockaddr *)from,
				 fromlen, local);
	if (answer == FS_PROBE_YES)
		FS_STAT_INC(probes_answered_yes);
	else
		FS_STAT_INC(probes_answered_no);
}

void fs_listener_drain(struct fs_listener *l)
{
	if (__atomic_load_n(&l->udp_fd, __ATOMIC_ACQUIRE) < 0)
		return; /* attached (fs_listener_attach): another process answers */
	for (int i = 0; i < 256; i++) {
		uint8_t pkt[FS_WIRE_PROBE_LEN + 1], local[16];
		struct sockaddr_storage from;
		socklen_t fromlen;
		/* with the local address the probe was sent to: the connection's */
		ssize_t n = fs_udp_recv(l->udp_fd, pkt, sizeof(pkt), &from, &fromlen, local);
		static const uint8_t any[16];

		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		fs_listener_answer(l, pkt, n, &from, fromlen, local, memcmp(local, any, 16) != 0);
	}
}

void fs_listeners_after_fork(void)
{
	/* The parent's listeners stay the parent's to answer; the ones whose
	 * socket this child holds are still its own to accept from. */
	pthread_mutex_init(&fs_listeners_lock, NULL);
	fs_listeners_inherit(fs_service_listeners);
	fs_service_listeners = NULL;
	fs_twin_after_fork();
}

/* ---- the service thread's share ---------------------------------------- */

/* After the service thread's poll: answers the probes that came, and lets
 * go of L (fs_listeners_add_fds took a reference). */
static void fs_listener_polled(void *arg, short revents)
{
	struct fs_listener *l = arg;

	if (revents & POLLIN)
		fs_listener_drain(l);
	fs_listener_put(l);
}

/* A round of the service thread begins: closed listeners that nothing else
 * holds go, and the others are counted. Service lock held. */
static size_t fs_listeners_count(void)
{
	size_t listeners = 0;

	pthread_mutex_lock(&fs_listeners_lock);
	fs_service_drop_closed();
	for (struct fs_listener *l = fs_service_listeners; l; l = l->next)
		listeners++;
	pthread_mutex_unlock(&fs_listeners_lock);
	return listeners;
}

/* Puts the twins in the round's poll set, each holding a reference while
 * it is polled. Service lock held. */
static void fs_listeners_add_fds(struct fs_service_set *set)
{
	if (!fs_params.test_service_probes)
		return;
	pthread_mutex_lock(&fs_listeners_lock);
	for (struct fs_listener *l = fs_service_listeners; l; l = l->next) {
		if (!l->twin_bound)
			continue; /* a placeholder reads nothing */
		if (!fs_service_set_add(set, l->udp_fd, POLLIN, fs_listener_polled, l))
			break;
		fs_listener_get(l);
	}
	pthread_mutex_unlock(&fs_listeners_lock);
}

static const struct fs_service_fds fs_listeners_fds = {
	.count = fs_listeners_count,
	.put = fs_listeners_add_fds,
};
