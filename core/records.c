/* SPDX-License-Identifier: MIT */
/* Listener records (see records.h): one file per port in the user's
 * directory, a fixed array of slots, one per listening socket. Writers take
 * the file's flock exclusively and write one slot at a time; readers take it
 * shared. Everything here is a hint: a record that is missing where a
 * listener offloads costs that listener's clients the fabric (so records are
 * removed only when no process can hold the socket), one that is left over
 * costs its clients what every connection cost before (a probe). */
#include "core/records.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "core/diag.h"
#include "core/fdtable.h"
#include "core/stats.h"
#include "core/util.h"
#include "preload/real.h"

#define FS_REC_MAGIC 0x31525346u /* "FSR1" */
#define FS_REC_VERSION 1u
/* listening sockets per port and user: SO_REUSEPORT groups, addresses,
 * network namespaces */
#define FS_REC_SLOTS 32
/* files per directory: a publisher makes no new one beyond this */
#define FS_REC_MAX_FILES 4096
/* a slot this young is not swept: its publisher may not have called the
 * kernel's listen() yet (the twin is bound, and the record written, first) */
#define FS_REC_YOUNG_NS (2ull * 1000000000ull)
/* how often a process sweeps its directory (at most) */
#define FS_REC_SWEEP_EVERY_NS (2ull * 1000000000ull)
/* listening sockets of this network namespace a sweep can hold in mind;
 * beyond that it does not judge this namespace's slots */
#define FS_REC_MAX_LISTENERS 8192
#define FS_REC_ANY_UID 0xffffffffu
#define FS_REC_OFFLOAD 1u /* the listener may offload a client of serve_uid */
/* its process runs with FABSOCK_TCP_FIRST=1: it strips a waitless HELLO
 * (one without a probe, written in the client's connect()) from the head
 * of a connection, whatever it does first, and whatever its own
 * FABSOCK_TCP_FIRST_WAITLESS says (that one is the client's setting;
 * docs/design.md, TCP first) */
#define FS_REC_TCP_FIRST 2u

struct fs_rec_slot {
	uint64_t inode; /* the listening socket; 0: a free slot */
	uint64_t netns; /* the publisher's network namespace (inode of /proc/self/ns/net) */
	uint64_t born_ns; /* CLOCK_BOOTTIME: one clock for every process of the host */
	int32_t pid; /* the publisher (for a slot of another namespace: its liveness) */
	uint32_t serve_uid; /* the effective uid of the processes that accept (FS_REC_ANY_UID: several) */
	uint32_t flags;
	uint32_t pad;
};

struct fs_rec_file {
	uint32_t magic;
	uint32_t version;
	struct fs_rec_slot slot[FS_REC_SLOTS];
};

/* fs_records_lock guards the directory cache and the list; a leaf (the
 * files' flocks are taken under it; no fabsock lock is). */
static pthread_mutex_t fs_records_lock = PTHREAD_MUTEX_INITIALIZER;
static int fs_rec_dir_fd = -1; /* internal */
static uint32_t fs_rec_dir_uid = FS_REC_ANY_UID;
static uint32_t fs_rec_dir_gen; /* counts the openings of fs_rec_dir_fd: the client's cache is per opening */
static uint32_t fs_rec_bad_uid = FS_REC_ANY_UID; /* its directory was not ours: not tried again */
static struct fs_record_pub *fs_records_list;
static uint64_t fs_records_forks;
static uint64_t fs_rec_last_sweep_ns;
static uint32_t fs_rec_last_sweep_uid = FS_REC_ANY_UID;

static uint64_t fs_rec_boot_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t fs_rec_netns(void)
{
	static uint64_t ns;
	struct stat st;

	if (!ns && stat("/proc/self/ns/net", &st) == 0)
		ns = (uint64_t)st.st_ino;
	return ns;
}

static void fs_rec_close(int fd)
{
	if (fd >= 0)
		fs_real.close(fd);
}

/* The directory of UID, checked: a directory, not a symlink, owned by UID,
 * no access for group or others. CREATE: make it if it is missing. Returns
 * the cached descriptor (valid while fs_records_lock is held), -ENOENT when
 * it is missing and not made, or another negative errno when it cannot be
 * used (logged once). fs_records_lock held. */
static int fs_rec_dir(uint32_t uid, bool create)
{
	char path[PATH_MAX];
	struct stat st;
	int fd;

	if (fs_rec_dir_fd >= 0 && fs_rec_dir_uid == uid) {
		/* removed under us (rm -rf of /dev/shm/fabsock-*): make it again,
		 * or a client would never see a listener published since (a
		 * client looks only when a file is missing: fs_rec_dir_gone) */
		if (!create || (fstat(fs_rec_dir_fd, &st) == 0 && st.st_nlink > 0))
			return fs_rec_dir_fd;
		fs_internal_fd_close(fs_rec_dir_fd);
		fs_rec_dir_fd = -1;
	}
	if (uid == fs_rec_bad_uid)
		return -EPERM;
	if (fs_rec_dir_fd >= 0) { /* another user's: this process changed user */
		fs_internal_fd_close(fs_rec_dir_fd);
		fs_rec_dir_fd = -1;
	}
	if (snprintf(path, sizeof(path), "%s/fabsock-u%u", fs_params.records_dir, uid) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	if (create && mkdir(path, 0700) && errno != EEXIST)
		goto bad;
	fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return -ENOENT;
		goto bad; /* ELOOP, ENOTDIR: a symlink or a file planted there */
	}
	if (fstat(fd, &st) || !S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 077)) {
		fs_rec_close(fd);
		errno = EPERM;
		goto bad;
	}
	/* made under a umask that took our own bits: ours, so give them back */
	if ((st.st_mode & 0700) != 0700 && fchmod(fd, 0700)) {
		fs_rec_close(fd);
		goto bad;
	}
	fd = fs_internal_fd(fd);
	if (fd < 0)
		return -EMFILE;
	fs_rec_dir_fd = fd;
	fs_rec_dir_uid = uid;
	fs_rec_dir_gen++;
	return fd;
bad:
	FS_WARN("listener records: %s is not a private directory of user %u (%s); connections probe as without records",
		path, uid, strerror(errno));
	FS_STAT_INC(records_refused);
	fs_rec_bad_uid = uid;
	return -EPERM;
}

/* The cached directory was removed (a file was missing in it): forget it, so
 * that the next look opens the new one. fs_records_lock held. */
static bool fs_rec_dir_gone(void)
{
	struct stat st;

	if (fs_rec_dir_fd < 0 || (fstat(fs_rec_dir_fd, &st) == 0 && st.st_nlink > 0))
		return false;
	fs_internal_fd_close(fs_rec_dir_fd);
	fs_rec_dir_fd = -1;
	return true;
}

/* Takes FD's flock (LOCK_SH or LOCK_EX), waiting at most ~20 ms (a client,
 * which probes as without records when it cannot look) or ~1 s (LOCK_EX:
 * a publisher or a sweep, whose failure would leave a listener without a
 * record and its clients on TCP). A holder writes one slot, but on a loaded
 * machine it may wait for a core longer than 20 ms (17 servers started at
 * once lost records that way); only a stopped process holds it for long. */
static bool fs_rec_flock(int fd, int how)
{
	int tries = how == LOCK_EX ? 10000 : 200;

	for (int i = 0; i < tries; i++) {
		if (flock(fd, how | LOCK_NB) == 0)
			return true;
		if (errno != EWOULDBLOCK && errno != EINTR)
			return false;
		usleep(100);
	}
	return false;
}

/* A record file we may trust: a regular file of UID, of our size (or empty:
 * just made). */
static bool fs_rec_file_ok(int fd, uint32_t uid, struct stat *st)
{
	return fstat(fd, st) == 0 && S_ISREG(st->st_mode) && st->st_uid == uid && !(st->st_mode & 077) &&
	       (st->st_size == 0 || (size_t)st->st_size == sizeof(struct fs_rec_file));
}

#define FS_REC_NAME_MAX 11 /* "port-65535" */

/* "port-N": by hand, not snprintf, which cost 740 instructions in a lookup
 * a client makes at every connection to a port on this host (callgrind,
 * wrk through fabsock: a third of its connect()). */
static void fs_rec_name(char name[static FS_REC_NAME_MAX], uint16_t port)
{
	char digits[5];
	unsigned n = 0, v = port;

	do {
		digits[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	memcpy(name, "port-", 5);
	for (unsigned i = 0; i < n; i++)
		name[5 + i] = digits[n - 1 - i];
	name[5 + n] = '\0';
}

/* Opens and locks (exclusive) PORT's record file in DFD (UID's), making it
 * if CREATE; *F gets its content (a fresh header if it was empty). Returns
 * the descriptor, or -1. */
static int fs_rec_file_lock(int dfd, uint32_t uid, uint16_t port, bool create, struct fs_rec_file *f)
{
	char name[32];
	struct stat st;

	fs_rec_name(name, port);
	for (int tries = 0; tries < 3; tries++) {
		int fd = openat(dfd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | (create ? O_CREAT : 0), 0600);

		if (fd < 0)
			return -1;
		if (!fs_rec_file_ok(fd, uid, &st) || !fs_rec_flock(fd, LOCK_EX)) {
			fs_rec_close(fd);
			return -1;
		}
		/* a sweep removed it while we waited for the lock: a slot
		 * written into it would be lost */
		if (fstat(fd, &st) || st.st_nlink == 0) {
			fs_rec_close(fd);
			continue;
		}
		memset(f, 0, sizeof(*f));
		if (st.st_size == 0 && !create) {
			/* being made by a publisher that has not taken the lock
			 * yet: a sweep must not empty and remove it under it */
			fs_rec_close(fd);
			return -1;
		}
		if (st.st_size == 0) {
			f->magic = FS_REC_MAGIC;
			f->version = FS_REC_VERSION;
			if (pwrite(fd, f, sizeof(*f), 0) != (ssize_t)sizeof(*f)) {
				fs_rec_close(fd);
				return -1;
			}
		} else if (pread(fd, f, sizeof(*f), 0) != (ssize_t)sizeof(*f) || f->magic != FS_REC_MAGIC ||
			   f->version != FS_REC_VERSION) {
			fs_rec_close(fd);
			return -1;
		}
		return fd;
	}
	return -1;
}

static bool fs_rec_slot_write(int fd, int i, const struct fs_rec_slot *s)
{
	off_t off = (off_t)(offsetof(struct fs_rec_file, slot) + (size_t)i * sizeof(*s));

	return pwrite(fd, s, sizeof(*s), off) == (ssize_t)sizeof(*s);
}

/* ---- the sweep ---------------------------------------------------------- */

struct fs_rec_listening {
	uint64_t inode[FS_REC_MAX_LISTENERS];
	unsigned n;
	bool complete; /* every listener of this namespace is in inode[] */
};

static void fs_rec_read_listening(const char *path, struct fs_rec_listening *l)
{
	FILE *f = fs_real.fopen(path, "re"); /* not the wrapper: no libfabric question here */
	char line[512], *buf;

	if (!f) {
		if (errno != ENOENT) /* no IPv6: nothing listens there */
			l->complete = false;
		return;
	}
	/* stdio reads /proc in 1 KiB pieces: a host with thousands of
	 * connections (TIME_WAIT included) made a sweep thousands of reads.
	 * (glibc takes setvbuf's size only with a buffer given.) */
	buf = malloc(64 << 10);
	if (buf)
		setvbuf(f, buf, _IOFBF, 64 << 10);
	if (!fgets(line, sizeof(line), f)) /* the header */
		l->complete = false;
	while (fgets(line, sizeof(line), f)) {
		unsigned st;
		unsigned long ino;

		if (sscanf(line, "%*s %*s %*s %x %*s %*s %*s %*u %*u %lu", &st, &ino) != 2) {
			l->complete = false;
			continue;
		}
		if (st != 0x0A) /* TCP_LISTEN */
			continue;
		if (l->n == FS_REC_MAX_LISTENERS) {
			l->complete = false;
			break;
		}
		l->inode[l->n++] = ino;
	}
	fclose(f);
	free(buf);
}

static bool fs_rec_slot_stale(const struct fs_rec_slot *s, const struct fs_rec_listening *l, uint64_t now)
{
	/* (born after NOW, the sweep's start, is young too: an unsigned
	 * NOW - BORN wrapped round and swept records published while a sweep
	 * ran, whose sockets its earlier read of /proc/net/tcp missed) */
	if (!s->inode || s->born_ns + FS_REC_YOUNG_NS > now)
		return false;
	if (s->netns != fs_rec_netns()) {
		/* another namespace's listener: the kernel lists it there only.
		 * Its publisher's death is all we can see (a forked worker that
		 * outlives it loses the record, and that namespace's clients
		 * of this user stay on TCP: docs/design.md names the limit). */
		return s->pid > 0 && kill(s->pid, 0) && errno == ESRCH;
	}
	if (!l->complete)
		return false;
	for (unsigned i = 0; i < l->n; i++)
		if (l->inode[i] == s->inode)
			return false;
	return true;
}

/* Clears stale slots in DFD's files (only PORT's if PORT): a listening
 * socket the kernel no longer lists (SIGKILL, or closed by a process whose
 * children held it); removes files left empty. Returns the number of files
 * that remain. fs_records_lock held. */
static unsigned fs_rec_sweep(int dfd, uint32_t uid, int port)
{
	struct fs_rec_listening *l = calloc(1, sizeof(*l));
	unsigned files = 0;
	uint64_t now = fs_rec_boot_ns();
	DIR *dir;
	struct dirent *de;
	int dfd2;

	if (!l)
		return 0;
	l->complete = true;
	/* the kernel's list of listeners; /proc's list of every socket only
	 * where netlink cannot answer */
	if (fs_diag_listeners(l->inode, FS_REC_MAX_LISTENERS, &l->n)) {
		l->n = 0;
		fs_rec_read_listening("/proc/net/tcp", l);
		fs_rec_read_listening("/proc/net/tcp6", l);
	}
	dfd2 = fs_real.fcntl(dfd, F_DUPFD_CLOEXEC, 0);
	if (dfd2 < 0 || !(dir = fdopendir(dfd2))) {
		fs_rec_close(dfd2);
		free(l);
		return 0;
	}
	rewinddir(dir);
	while ((de = readdir(dir))) {
		struct fs_rec_file f;
		unsigned p;
		int fd, used = 0;
		char end;

		if (sscanf(de->d_name, "port-%u%c", &p, &end) != 1 || p > 65535)
			continue;
		files++;
		if (port >= 0 && (int)p != port)
			continue;
		fd = fs_rec_file_lock(dfd, uid, (uint16_t)p, false, &f);
		if (fd < 0)
			continue;
		for (int i = 0; i < FS_REC_SLOTS; i++) {
			if (fs_rec_slot_stale(&f.slot[i], l, now)) {
				memset(&f.slot[i], 0, sizeof(f.slot[i]));
				if (fs_rec_slot_write(fd, i, &f.slot[i]))
					FS_STAT_INC(records_swept);
			}
			used += f.slot[i].inode != 0;
		}
		if (!used && unlinkat(dfd, de->d_name, 0) == 0)
			files--;
		fs_rec_close(fd); /* drops the flock */
	}
	closedir(dir);
	free(l);
	return files;
}

/* ---- publishing --------------------------------------------------------- */

/* Writes P's listener into UID's directory, served by SERVE_UID. KEEP: the
 * descriptor of the file is returned (P's own record), else closed. Returns
 * the descriptor kept, or -1. fs_records_lock held. */
static int fs_rec_put(struct fs_record_pub *p, uint32_t uid, uint32_t serve_uid, bool keep, int *slot_out)
{
	struct fs_rec_file f;
	struct fs_rec_slot s;
	uint64_t now = fs_rec_boot_ns();
	int dfd = fs_rec_dir(uid, true), fd, slot = -1;
	char name[32];

	if (dfd < 0)
		return -1;
	fs_rec_name(name, p->port);
	if (now - fs_rec_last_sweep_ns > FS_REC_SWEEP_EVERY_NS || uid != fs_rec_last_sweep_uid) {
		fs_rec_last_sweep_ns = now;
		fs_rec_last_sweep_uid = uid;
		if (fs_rec_sweep(dfd, uid, -1) >= FS_REC_MAX_FILES && faccessat(dfd, name, F_OK, AT_SYMLINK_NOFOLLOW)) {
			FS_WARN_ONCE("listener records: %u files in %s/fabsock-u%u; no more are made", FS_REC_MAX_FILES,
				     fs_params.records_dir, uid);
			return -1;
		}
	}
	fd = fs_rec_file_lock(dfd, uid, p->port, true, &f);
	if (fd < 0) {
		FS_INFO("listener records: cannot lock the record of port %u (%s); its local clients stay on TCP",
			p->port, strerror(errno));
		FS_STAT_INC(records_refused);
		return -1;
	}
	for (int pass = 0; pass < 2 && slot < 0; pass++) {
		for (int i = 0; i < FS_REC_SLOTS; i++) {
			if (f.slot[i].inode == p->inode && f.slot[i].netns == fs_rec_netns()) {
				slot = i; /* ours already: a fork's child, an exec, a re-listen */
				break;
			}
			if (!f.slot[i].inode && slot < 0)
				slot = i;
		}
		if (slot < 0 && pass == 0) { /* full: stale slots may free one */
			fs_rec_close(fd);
			fs_rec_sweep(dfd, uid, p->port);
			fd = fs_rec_file_lock(dfd, uid, p->port, true, &f);
			if (fd < 0)
				return -1;
		}
	}
	memset(&s, 0, sizeof(s));
	s.inode = p->inode;
	s.netns = fs_rec_netns();
	s.born_ns = now;
	s.pid = (int32_t)getpid();
	s.serve_uid = serve_uid;
	/* a listener whose process cannot use shm refuses its local clients */
	s.flags = fs_params.shm ? FS_REC_OFFLOAD : 0;
	if (fs_params.shm && fs_params.tcp_first)
		s.flags |= FS_REC_TCP_FIRST;
	if (slot < 0 || !fs_rec_slot_write(fd, slot, &s)) {
		FS_INFO("listener records: no room for port %u", p->port);
		fs_rec_close(fd);
		return -1;
	}
	FS_STAT_INC(records_published);
	flock(fd, LOCK_UN);
	if (!keep) {
		fs_rec_close(fd);
		return -1;
	}
	*slot_out = slot;
	return fs_internal_fd(fd);
}

void fs_records_publish(struct fs_record_pub *p, int listen_fd, uint16_t port)
{
	struct stat st;

	memset(p, 0, sizeof(*p));
	p->fd = -1;
	p->moved_fd = -1;
	if (!fs_params.records || fstat(listen_fd, &st))
		return;
	p->inode = (uint64_t)st.st_ino;
	p->port = port;
	p->uid = (uint32_t)fs_self_euid();
	p->seen_uid = p->uid;
	p->marked_uid = FS_REC_ANY_UID; /* the first accept looks at the slot */
	p->pid = getpid();
	fs_lock(&fs_records_lock);
	p->forks = fs_records_forks;
	p->fd = fs_rec_put(p, p->uid, p->uid, true, &p->slot);
	p->next = fs_records_list;
	fs_records_list = p;
	pthread_mutex_unlock(&fs_records_lock);
}

/* Clears slot SLOT of FD (UID's file of P's port) if it is still P's, and
 * removes the file if that left it empty and we may (our own directory).
 * fs_records_lock held. */
static void fs_rec_clear(struct fs_record_pub *p, int fd, int slot, uint32_t uid)
{
	struct fs_rec_file f;
	struct stat st;
	int used = 0;

	if (fd < 0 || !fs_rec_flock(fd, LOCK_EX))
		return;
	if (pread(fd, &f, sizeof(f), 0) == (ssize_t)sizeof(f) && f.slot[slot].inode == p->inode &&
	    f.slot[slot].netns == fs_rec_netns()) {
		memset(&f.slot[slot], 0, sizeof(f.slot[slot]));
		fs_rec_slot_write(fd, slot, &f.slot[slot]);
		for (int i = 0; i < FS_REC_SLOTS; i++)
			used += f.slot[i].inode != 0;
		/* under the flock: a writer that waits for it finds the file
		 * unlinked (st_nlink 0) and makes a new one */
		if (!used && uid == (uint32_t)fs_self_euid() && fstat(fd, &st) == 0 && st.st_nlink > 0) {
			int dfd = fs_rec_dir(uid, false);
			char name[32];

			fs_rec_name(name, p->port);
			if (dfd >= 0)
				unlinkat(dfd, name, 0);
		}
	}
	flock(fd, LOCK_UN);
}

/* Whether this process knows that no other holds P's socket: it published
 * it and forked no child since. */
static bool fs_rec_sole_holder(const struct fs_record_pub *p)
{
	return p->pid == getpid() && p->forks == fs_records_forks;
}

void fs_records_withdraw(struct fs_record_pub *p)
{
	if (!p->inode)
		return;
	fs_lock(&fs_records_lock);
	for (struct fs_record_pub **link = &fs_records_list; *link; link = &(*link)->next) {
		if (*link == p) {
			*link = p->next;
			break;
		}
	}
	/* only a process that forked no child since it published knows that
	 * no other process holds the socket; else the sweep looks later. Nor
	 * while another listener of ours publishes the same socket (two
	 * threads' listen() raced: the loser's goes, the socket stays). */
	for (struct fs_record_pub *o = fs_records_list; o; o = o->next)
		if (o->inode == p->inode)
			goto keep;
	if (fs_rec_sole_holder(p)) {
		fs_rec_clear(p, p->fd, p->slot, p->uid);
		fs_rec_clear(p, p->moved_fd, p->moved_slot, p->moved_uid);
	}
keep:
	if (p->fd >= 0)
		fs_internal_fd_close(p->fd);
	if (p->moved_fd >= 0)
		fs_internal_fd_close(p->moved_fd);
	p->fd = -1;
	p->moved_fd = -1;
	p->inode = 0;
	pthread_mutex_unlock(&fs_records_lock);
}

/* This process serves P's listener as UID: the slot in the publisher's
 * directory says which user accepts (the first user other than the
 * publisher's takes it over, so the publisher's own clients are refused:
 * they stay on TCP at once; a second user, the publisher's own included,
 * makes it "several": clients probe). fs_records_lock held. */
static void fs_rec_mark(struct fs_record_pub *p, uint32_t uid)
{
	if (p->fd >= 0) {
		struct fs_rec_slot s;
		off_t off = (off_t)(offsetof(struct fs_rec_file, slot) + (size_t)p->slot * sizeof(s));

		/* through the descriptor inherited from the publisher: this
		 * process may no longer open the publisher's directory */
		if (fs_rec_flock(p->fd, LOCK_EX)) {
			if (pread(p->fd, &s, sizeof(s), off) == (ssize_t)sizeof(s) && s.inode == p->inode &&
			    s.serve_uid != uid && s.serve_uid != FS_REC_ANY_UID) {
				s.serve_uid = s.serve_uid == p->uid ? uid : FS_REC_ANY_UID;
				fs_rec_slot_write(p->fd, p->slot, &s);
			}
			flock(p->fd, LOCK_UN);
		}
	}
	__atomic_store_n(&p->marked_uid, uid, __ATOMIC_RELEASE);
}

/* This process now runs as UID (a setuid, or first seen at an accept): it
 * serves P's listener as UID (fs_rec_mark), and UID's directory gets a
 * record so that UID's clients probe. fs_records_lock held. */
static void fs_rec_moved(struct fs_record_pub *p, uint32_t uid)
{
	fs_rec_mark(p, uid);
	if (p->moved_fd >= 0) { /* it moved before: that record stays (hint) */
		fs_internal_fd_close(p->moved_fd);
		p->moved_fd = -1;
	}
	if (uid != p->uid) {
		p->moved_fd = fs_rec_put(p, uid, uid, true, &p->moved_slot);
		p->moved_uid = uid;
	}
	__atomic_store_n(&p->seen_uid, uid, __ATOMIC_RELEASE);
}

void fs_records_accepting(struct fs_record_pub *p)
{
	uint32_t uid;

	if (!p->inode)
		return;
	uid = (uint32_t)fs_self_euid();
	if (uid == __atomic_load_n(&p->marked_uid, __ATOMIC_ACQUIRE))
		return; /* this process looked at the slot for this user before */
	fs_lock(&fs_records_lock);
	if (p->inode && uid != p->seen_uid)
		fs_rec_moved(p, uid);
	else if (p->inode)
		fs_rec_mark(p, uid); /* e.g. a root parent that accepts while a child serves as another user */
	pthread_mutex_unlock(&fs_records_lock);
}

void fs_records_uid_changed(void)
{
	uint32_t uid = (uint32_t)fs_self_euid();

	if (!fs_params.records)
		return;
	fs_lock(&fs_records_lock);
	for (struct fs_record_pub *p = fs_records_list; p; p = p->next)
		if (p->inode && uid != p->seen_uid)
			fs_rec_moved(p, uid);
	pthread_mutex_unlock(&fs_records_lock);
}

void fs_records_exit(void)
{
	/* nothing published: no lock, no clock */
	if (!__atomic_load_n(&fs_records_list, __ATOMIC_ACQUIRE))
		return;
	/* the exit may have stopped a thread inside the lock */
	if (fs_mutex_lock_until(&fs_records_lock, fs_now_ns() + 50000000ull))
		return;
	for (struct fs_record_pub *p = fs_records_list; p; p = p->next)
		if (fs_rec_sole_holder(p)) {
			fs_rec_clear(p, p->fd, p->slot, p->uid);
			fs_rec_clear(p, p->moved_fd, p->moved_slot, p->moved_uid);
		}
	pthread_mutex_unlock(&fs_records_lock);
}

void fs_records_fork_parent(void)
{
	__atomic_add_fetch(&fs_records_forks, 1, __ATOMIC_RELAXED);
}

void fs_records_after_fork(void)
{
	pthread_mutex_init(&fs_records_lock, NULL);
}

/* ---- the client's question ---------------------------------------------- */

/*
 * The client's cache of its last answers, one entry per port (modulo
 * FS_REC_CACHE): a connection per request to one port would otherwise pay
 * open, fstat, flock, pread and close (or an open that fails and the
 * directory's fstat) every time, each a few microseconds on a VM. An entry
 * is checked with one system call and trusted only while what it was read
 * from is unchanged:
 *   - a file's answer: fstatat of the name gives the same inode, size,
 *     owner, mode, mtime and ctime (every write of a slot is a pwrite, which
 *     moves both);
 *   - "no file": the directory's fstat gives the same mtime and ctime (a
 *     file made or removed in it moves both) and a link count (not removed).
 * The kernel stamps those times from a clock that may lag by a tick, so a
 * change in the same tick as the stamp we keep would not show: an entry is
 * kept only when the stamp is older than FS_REC_CACHE_STAMP_NS before the
 * look began, and any later change then stamps a newer time. Only hints
 * live here (a PRESENT answer still probes, and the listener checks the
 * probe's owner); the same checks as an uncached look (our directory, our
 * file of the exact size, mode 0600) hold for what it compares.
 */
#define FS_REC_CACHE 64
#define FS_REC_CACHE_STAMP_NS 50000000ll
/* An entry checked this recently is trusted without its system call: a
 * program that connects to one port thousands of times a second (an event
 * loop to a plain server, or to another user's) made an fstat per
 * connection. A record made or changed meanwhile is seen at most this much
 * later; until then the connection goes as the old answer says, which is
 * never a HELLO to a listener that did not ask for one (a "present" answer
 * still probes, and a listener no longer there answers no probe). */
#define FS_REC_CACHE_TRUST_NS 20000000ull

struct fs_rec_cached {
	uint32_t gen; /* fs_rec_dir_gen when read; 0: empty */
	uint32_t uid;
	uint16_t port;
	bool absent; /* no file: stamps are the directory's */
	uint8_t hint;
	uint64_t checked_ns; /* fs_now_coarse_ns of its last check (FS_REC_CACHE_TRUST_NS) */
	uint64_t ino;
	int64_t size;
	struct timespec mtim, ctim;
};
static struct fs_rec_cached fs_rec_cache[FS_REC_CACHE]; /* fs_records_lock */

static int64_t fs_rec_ts_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000ll + t->tv_nsec;
}

static int64_t fs_rec_real_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return fs_rec_ts_ns(&ts);
}

static bool fs_rec_same_stamps(const struct fs_rec_cached *c, const struct stat *st)
{
	return c->ino == (uint64_t)st->st_ino && c->size == (int64_t)st->st_size &&
	       fs_rec_ts_ns(&c->mtim) == fs_rec_ts_ns(&st->st_mtim) && fs_rec_ts_ns(&c->ctim) == fs_rec_ts_ns(&st->st_ctim);
}

/* Keeps ANSWER for PORT, read from ST (the file's, or the directory's when
 * ABSENT) in a look that began at BEGAN_NS (CLOCK_REALTIME), if its stamps
 * are old enough to show any later change. fs_records_lock held. */
static void fs_rec_cache_put(uint16_t port, uint32_t uid, bool absent, enum fs_record_hint answer, const struct stat *st,
			     int64_t began_ns)
{
	struct fs_rec_cached *c = &fs_rec_cache[port % FS_REC_CACHE];

	c->gen = 0;
	if (fs_rec_ts_ns(&st->st_mtim) > began_ns - FS_REC_CACHE_STAMP_NS ||
	    fs_rec_ts_ns(&st->st_ctim) > began_ns - FS_REC_CACHE_STAMP_NS)
		return;
	c->uid = uid;
	c->port = port;
	c->absent = absent;
	c->hint = (uint8_t)answer;
	c->ino = (uint64_t)st->st_ino;
	c->size = (int64_t)st->st_size;
	c->mtim = st->st_mtim;
	c->ctim = st->st_ctim;
	c->checked_ns = fs_now_coarse_ns();
	c->gen = fs_rec_dir_gen;
}

/* The cached answer for PORT if what it was read from is unchanged (one
 * fstat or fstatat of DFD), else FS_RECORD_UNKNOWN. fs_records_lock held. */
static enum fs_record_hint fs_rec_cache_get(int dfd, uint16_t port, uint32_t uid, const char *name)
{
	struct fs_rec_cached *c = &fs_rec_cache[port % FS_REC_CACHE];
	struct stat st;
	uint64_t now;

	if (!c->gen || c->gen != fs_rec_dir_gen || c->port != port || c->uid != uid)
		return FS_RECORD_UNKNOWN;
	now = fs_now_coarse_ns();
	if (now - c->checked_ns < FS_REC_CACHE_TRUST_NS)
		return (enum fs_record_hint)c->hint;
	if (c->absent) {
		if (fstat(dfd, &st) == 0 && st.st_nlink > 0 && fs_rec_same_stamps(c, &st)) {
			c->checked_ns = now;
			return (enum fs_record_hint)c->hint;
		}
	} else if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && st.st_uid == uid &&
		   !(st.st_mode & 077) && fs_rec_same_stamps(c, &st)) {
		c->checked_ns = now;
		return (enum fs_record_hint)c->hint;
	}
	c->gen = 0;
	return FS_RECORD_UNKNOWN;
}

enum fs_record_hint fs_records_lookup(uint16_t port)
{
	enum fs_record_hint answer = FS_RECORD_NONE;
	struct fs_rec_file f;
	struct stat st, dst;
	uint32_t uid;
	char name[32];
	int dfd, fd = -1, open_errno = 0;
	int64_t began_ns;
	uint32_t gen;

	if (!fs_params.records)
		return FS_RECORD_UNKNOWN;
	uid = (uint32_t)fs_self_euid();
	fs_rec_name(name, port);
	fs_lock(&fs_records_lock);
	dfd = fs_rec_dir(uid, false);
	if (dfd >= 0 && (answer = fs_rec_cache_get(dfd, port, uid, name)) != FS_RECORD_UNKNOWN) {
		pthread_mutex_unlock(&fs_records_lock);
		FS_STAT_INC(records_cached);
		return answer;
	}
	began_ns = fs_rec_real_ns();
	for (int tries = 0; tries < 2; tries++) {
		dfd = fs_rec_dir(uid, false);
		fd = dfd >= 0 ? openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK) : -1;
		open_errno = errno;
		if (fd >= 0 || dfd < 0 || open_errno != ENOENT)
			break;
		/* no file: unless the directory itself was removed (rm -rf of
		 * /dev/shm/fabsock-*: look again in the new one), that is the
		 * answer, kept while the directory does not change */
		if (fstat(dfd, &dst) == 0 && dst.st_nlink > 0) {
			fs_rec_cache_put(port, uid, true, FS_RECORD_NONE, &dst, began_ns);
			break;
		}
		if (!fs_rec_dir_gone())
			break;
	}
	gen = fs_rec_dir_gen;
	pthread_mutex_unlock(&fs_records_lock);
	if (dfd == -ENOENT)
		return FS_RECORD_NONE; /* no listener of this user published anything */
	if (dfd < 0)
		return FS_RECORD_UNKNOWN;
	if (fd < 0)
		return open_errno == ENOENT ? FS_RECORD_NONE : FS_RECORD_UNKNOWN;
	if (!fs_rec_file_ok(fd, uid, &st) || !fs_rec_flock(fd, LOCK_SH)) {
		fs_rec_close(fd);
		return FS_RECORD_UNKNOWN;
	}
	if (st.st_size == 0) { /* being made: its writer holds the lock we now have */
		fs_rec_close(fd);
		return FS_RECORD_UNKNOWN;
	}
	if (pread(fd, &f, sizeof(f), 0) != (ssize_t)sizeof(f) || f.magic != FS_REC_MAGIC ||
	    f.version != FS_REC_VERSION) {
		fs_rec_close(fd);
		return FS_RECORD_UNKNOWN;
	}
	fs_rec_close(fd);
	answer = FS_RECORD_NONE;
	for (int i = 0; i < FS_REC_SLOTS; i++) {
		const struct fs_rec_slot *s = &f.slot[i];

		if (!s->inode)
			continue;
		if (answer == FS_RECORD_NONE)
			answer = FS_RECORD_REFUSES;
		if ((s->flags & FS_REC_OFFLOAD) && (s->serve_uid == uid || s->serve_uid == FS_REC_ANY_UID)) {
			answer = FS_RECORD_PRESENT;
			break;
		}
	}
	/* (ST was taken before the read: a write between them moved the
	 * stamps past it, so the next look reads again) */
	fs_lock(&fs_records_lock);
	if (fs_rec_dir_gen == gen && fs_rec_dir_uid == uid)
		fs_rec_cache_put(port, uid, false, answer, &st, began_ns);
	pthread_mutex_unlock(&fs_records_lock);
	return answer;
}

/* fs_records_tcp_first's answers, one per port (modulo FS_REC_CACHE), kept
 * and checked as the lookup's cache (fs_rec_cache_put): trusted while the
 * record file's stamps are unchanged and the listener asked about is the
 * same socket. A connection per request saved an open, fstat, flock, pread
 * and close each. fs_records_lock. */
static struct fs_rec_cached fs_rec_tf_cache[FS_REC_CACHE];
static uint64_t fs_rec_tf_listener[FS_REC_CACHE];

bool fs_records_tcp_first(uint16_t port, uint64_t listener_inode)
{
	struct fs_rec_cached *c = &fs_rec_tf_cache[port % FS_REC_CACHE];
	struct fs_rec_file f;
	struct stat st;
	uint32_t uid, gen;
	char name[32];
	int dfd, fd;
	bool yes = false;
	int64_t began_ns;

	if (!fs_params.records || !listener_inode)
		return false;
	uid = (uint32_t)fs_self_euid();
	fs_rec_name(name, port);
	fs_lock(&fs_records_lock);
	dfd = fs_rec_dir(uid, false);
	if (dfd >= 0 && c->gen && c->gen == fs_rec_dir_gen && c->port == port && c->uid == uid &&
	    fs_rec_tf_listener[port % FS_REC_CACHE] == listener_inode &&
	    fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && st.st_uid == uid &&
	    !(st.st_mode & 077) && fs_rec_same_stamps(c, &st)) {
		yes = c->hint;
		pthread_mutex_unlock(&fs_records_lock);
		return yes;
	}
	began_ns = fs_rec_real_ns();
	gen = fs_rec_dir_gen;
	fd = dfd >= 0 ? openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK) : -1;
	pthread_mutex_unlock(&fs_records_lock);
	if (fd < 0)
		return false;
	if (!fs_rec_file_ok(fd, uid, &st) || !fs_rec_flock(fd, LOCK_SH)) {
		fs_rec_close(fd);
		return false;
	}
	if (pread(fd, &f, sizeof(f), 0) == (ssize_t)sizeof(f) && f.magic == FS_REC_MAGIC && f.version == FS_REC_VERSION)
		for (int i = 0; i < FS_REC_SLOTS && !yes; i++) {
			const struct fs_rec_slot *s = &f.slot[i];

			/* the very socket the kernel says listens there: a slot
			 * left by a listener gone (not swept yet) names another */
			yes = s->inode == listener_inode && (s->flags & FS_REC_OFFLOAD) && (s->flags & FS_REC_TCP_FIRST) &&
			      (s->serve_uid == uid || s->serve_uid == FS_REC_ANY_UID);
		}
	fs_rec_close(fd);
	fs_lock(&fs_records_lock);
	c->gen = 0;
	/* (stamps older than the look began by the margin: see fs_rec_cache_put) */
	if (fs_rec_dir_gen == gen && fs_rec_dir_uid == uid && fs_rec_ts_ns(&st.st_mtim) <= began_ns - FS_REC_CACHE_STAMP_NS &&
	    fs_rec_ts_ns(&st.st_ctim) <= began_ns - FS_REC_CACHE_STAMP_NS) {
		c->uid = uid;
		c->port = port;
		c->absent = false;
		c->hint = yes;
		c->ino = (uint64_t)st.st_ino;
		c->size = (int64_t)st.st_size;
		c->mtim = st.st_mtim;
		c->ctim = st.st_ctim;
		c->gen = gen;
		fs_rec_tf_listener[port % FS_REC_CACHE] = listener_inode;
	}
	pthread_mutex_unlock(&fs_records_lock);
	return yes;
}

/* TCP first's per-user secret (records.h): a file of FS_REC_KEY_LEN random
 * bytes in the user's directory, made once (a private name linked into
 * place, so that two makers agree on the first one), cached per user and
 * directory opening. fs_records_lock guards the cache. */
#define FS_REC_KEY_NAME "tcpfirst.key"
static uint8_t fs_rec_key[FS_REC_KEY_LEN];
static uint32_t fs_rec_key_uid = FS_REC_ANY_UID, fs_rec_key_gen;

static bool fs_rec_key_read(int dfd, uint32_t uid, uint8_t *key)
{
	struct stat st;
	int fd = openat(dfd, FS_REC_KEY_NAME, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	bool ok;

	if (fd < 0)
		return false;
	ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == uid && !(st.st_mode & 077) &&
	     st.st_size == FS_REC_KEY_LEN && pread(fd, key, FS_REC_KEY_LEN, 0) == FS_REC_KEY_LEN;
	fs_rec_close(fd);
	return ok;
}

bool fs_records_secret(uint8_t *key)
{
	uint32_t uid;
	int dfd;
	bool ok = false;

	if (!fs_params.records)
		return false;
	uid = (uint32_t)fs_self_euid();
	fs_lock(&fs_records_lock);
	/* (the cached directory as it is: making it again if removed costs
	 * an fstat per call, and the key cached for it stays good) */
	dfd = fs_rec_dir(uid, false);
	if (dfd == -ENOENT)
		dfd = fs_rec_dir(uid, true);
	if (dfd >= 0 && fs_rec_key_uid == uid && fs_rec_key_gen == fs_rec_dir_gen) {
		memcpy(key, fs_rec_key, FS_REC_KEY_LEN);
		pthread_mutex_unlock(&fs_records_lock);
		return true;
	}
	if (dfd >= 0 && !(ok = fs_rec_key_read(dfd, uid, key)) && errno == ENOENT) {
		char tmp[64];
		uint8_t fresh[FS_REC_KEY_LEN];
		int fd;

		snprintf(tmp, sizeof(tmp), FS_REC_KEY_NAME ".%d", (int)getpid());
		unlinkat(dfd, tmp, 0);
		fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd >= 0) {
			if (getrandom(fresh, sizeof(fresh), 0) == (ssize_t)sizeof(fresh) &&
			    pwrite(fd, fresh, sizeof(fresh), 0) == (ssize_t)sizeof(fresh))
				linkat(dfd, tmp, dfd, FS_REC_KEY_NAME, 0); /* EEXIST: another's came first */
			fs_rec_close(fd);
			unlinkat(dfd, tmp, 0);
		}
		ok = fs_rec_key_read(dfd, uid, key);
	}
	if (ok) {
		memcpy(fs_rec_key, key, FS_REC_KEY_LEN);
		fs_rec_key_uid = uid;
		fs_rec_key_gen = fs_rec_dir_gen;
	}
	pthread_mutex_unlock(&fs_records_lock);
	return ok;
}

void fs_records_sweep_port(uint16_t port)
{
	uint32_t uid;
	int dfd;

	if (!fs_params.records)
		return;
	uid = (uint32_t)fs_self_euid();
	fs_lock(&fs_records_lock);
	dfd = fs_rec_dir(uid, false);
	if (dfd >= 0)
		fs_rec_sweep(dfd, uid, port);
	pthread_mutex_unlock(&fs_records_lock);
}
