/* SPDX-License-Identifier: MIT */
/*
 * Connection history: the shared table that says, per program and
 * destination, whether recent connections were short (history.h). One file
 * per user, history-v2 in that user's record directory (the directory of
 * listener records, made and checked the same way: 0700, owned, no
 * symlink), mapped MAP_SHARED by every process of the user that connects or
 * serves a first write. It is a hint only: whatever it says, the worst
 * outcome is a connection on kernel TCP (or negotiated as before records
 * and history); it holds no pointer and every index into it is reduced
 * modulo its fixed sizes, so a garbled file cannot make us read outside it.
 *
 * Layout (history-v2, 34,832 bytes, fixed; v1 had no times, 32-byte entries):
 *   header   magic, version, next note index
 *   notes    FS_HIST_NOTES x { client socket inode, CLOCK_BOOTTIME ns }:
 *            for servers that speak first (fs_history_client_note): client
 *            sockets sent to TCP by their history (the inode as it is), and
 *            client sockets that will probe (the inode with FS_HIST_INTENT,
 *            bit 63, set: a socket inode is 32 bits, so a library that
 *            knows only TCP notes never matches one)
 *   entries  FS_HIST_ENTRIES x { tag, short streak, TCP decisions, last
 *            close (boot s), closes, step-backs, relearn level, the TCP and
 *            fabric connections' time per turn and when each was measured,
 *            the last step-back on a crowded host (boot s), 12 bytes
 *            reserved },
 *            open addressing over FS_HIST_PROBE
 *            slots from tag % FS_HIST_ENTRIES, the oldest replaced when full
 * Every field is read and written with relaxed atomics and no lock: two
 * processes closing at once may lose one count, which only delays a
 * decision by a connection.
 */
#include "core/history.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "core/runq.h"
#include "core/stats.h"
#include "core/stepback.h"
#include "core/udp.h"
#include "core/util.h"
#include "preload/real.h"

#define FS_HIST_MAGIC 0x49485346u /* "FSHI" */
#define FS_HIST_VERSION 2u
#define FS_HIST_NAME "history-v2"
#define FS_HIST_NOTES 128u
#define FS_HIST_ENTRIES 512u
#define FS_HIST_PROBE 8u
/* A note older than this is an earlier connection's (a reused inode). */
#define FS_HIST_NOTE_NS (30ull * 1000000000ull)
/* The mark of an intent note, and how long one counts: a client probes as
 * its connect() returns and gives up after its probe timeout (at most 10 s),
 * so an older intent is an earlier connection's or a lost probe's. */
#define FS_HIST_INTENT (1ull << 63)
#define FS_HIST_INTENT_NS (10ull * 1000000000ull)
/* How often a process checks that its mapped file is still the one in the
 * directory (rm -rf of the directory, a new file made by another process). */
#define FS_HIST_RECHECK_NS (2ull * 1000000000ull)
/* At most this many mappings per process (old ones stay mapped: another
 * thread may still be inside them). */
#define FS_HIST_MAPS_MAX 8
#define FS_HIST_STREAK_MAX 1000000u
/* A short report to an entry whose streak holds this many already writes
 * nothing but a new second into last_s: a program that makes a connection
 * per request (wrk with Connection: close, nginx's upstream connections)
 * reported each into the same shared entry from every thread and process,
 * whose cache line then went from core to core at every close. */
#define FS_HIST_STREAK_SAT 256u
/* A relearn (of a step-back's decision only: fs_history_decide) whose
 * connection stepped back again doubles the interval to the next one, up to
 * FABSOCK_HISTORY_RELEARN << this (64 x 64: 4096). A relearn is a whole
 * offload (probe, rail, HELLO, a fabric stream) on both ends: nginx proxying
 * to nginx, a new upstream connection per request, paid ~1.3 ms of CPU per
 * end for each, a fifth of its throughput at one in 64. A long connection
 * (a relearn's, or any) starts over at FABSOCK_HISTORY_RELEARN. */
#define FS_HIST_RELEARN_LEVEL_MAX 6u

struct fs_hist_note {
	uint64_t inode;
	uint64_t boot_ns;
};

struct fs_hist_entry {
	uint64_t tag;          /* 0: empty */
	uint32_t short_streak; /* consecutive short connections reported */
	uint32_t tcp_decided;  /* connections sent to TCP (the relearn count) */
	uint32_t last_s;       /* last report, CLOCK_BOOTTIME seconds */
	uint32_t closes;       /* reports, a sole connection's second one
				* included (equal to the streak while every
				* report was short; not counted while the
				* streak is past FS_HIST_STREAK_SAT) */
	uint32_t stepped_back; /* connections that stepped back from the fabric
				* since one made a whole step-back window
				* without (0 in files of before: same layout) */
	uint32_t relearn_level; /* relearns since the last long connection */
	/* Time per turn, ns (lifetime over turns; 0: not measured), of the
	 * program's recent connections to the destination that made a whole
	 * step-back window: on kernel TCP (fs_hist_report_tcp) and on the
	 * fabric (its judged windows: fs_history_offloaded_closed), each an
	 * average that weighs the newest a quarter, and the second
	 * (CLOCK_BOOTTIME) of the newest: what the step-back compares a
	 * window with (fs_history_tcp_ns_turn). */
	uint32_t tcp_ns_turn;
	uint32_t fab_ns_turn;
	uint32_t tcp_s;
	uint32_t fab_s;
	/* The second (CLOCK_BOOTTIME) of the last step-back made during or
	 * right after a spell of lost slices (runq.h: work beside took the
	 * spins' time slices), 0: none. Not a step-back's verdict (the host
	 * may be quiet again, where the fabric wins): for
	 * FABSOCK_HISTORY_BUSY_SEC after it, a connection goes to TCP only
	 * while the host is still crowded (fs_history_decide). Not cleared by
	 * a connection that made its windows without stepping back: of
	 * memcslap's eight beside busy loops, the two that ended before their
	 * step-back wiped out six that stepped back. A reserved word of files
	 * of before: 0 there. */
	uint32_t busy_s;
	uint32_t reserved[3];
};

struct fs_hist_file {
	uint32_t magic;
	uint32_t version;
	uint32_t note_next;
	uint32_t reserved;
	struct fs_hist_note notes[FS_HIST_NOTES];
	struct fs_hist_entry entries[FS_HIST_ENTRIES];
};
_Static_assert(sizeof(struct fs_hist_entry) == 64, "history entry layout");
_Static_assert(sizeof(struct fs_hist_file) == 16 + 16 * FS_HIST_NOTES + 64 * FS_HIST_ENTRIES, "history file layout");

static pthread_mutex_t fs_hist_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fs_hist_file *fs_hist_map; /* the current mapping, or NULL */
static uint32_t fs_hist_uid;             /* whose it is */
static uint64_t fs_hist_ino;             /* the file's inode, to see it replaced */
static uint64_t fs_hist_check_ns;        /* when to look at the directory again */
static uint32_t fs_hist_bad_uid = UINT32_MAX; /* a user whose directory or file we refused */
static int fs_hist_maps;
static uint64_t fs_hist_prog;            /* hash of /proc/self/cmdline, 0: not yet */
static uint64_t fs_hist_fam;             /* ... without its last argument (fs_hist_family) */
static uint64_t fs_hist_cmd;             /* ... its first argument alone (fs_hist_command) */

static uint64_t fs_hist_boot_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_BOOTTIME in seconds, for an entry's last_s (which only orders
 * entries for eviction): read again at most every 100 ms of the coarse
 * clock. */
static uint32_t fs_hist_boot_s(void)
{
	static uint64_t until_ns;
	static uint32_t cached_s;
	uint64_t now = fs_now_coarse_ns();

	if (now < __atomic_load_n(&until_ns, __ATOMIC_ACQUIRE))
		return __atomic_load_n(&cached_s, __ATOMIC_RELAXED);
	__atomic_store_n(&cached_s, (uint32_t)(fs_hist_boot_ns() / 1000000000ull), __ATOMIC_RELAXED);
	__atomic_store_n(&until_ns, now + 100000000ull, __ATOMIC_RELEASE);
	return __atomic_load_n(&cached_s, __ATOMIC_RELAXED);
}

static uint64_t fs_hist_fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* The program: its command line, so that `pgbench -C` (a connection per
 * transaction) and `pgbench -S` (one connection for the run) learn apart,
 * and one curl command run again and again learns from its predecessors. */
static uint64_t fs_hist_program(void)
{
	uint64_t h = __atomic_load_n(&fs_hist_prog, __ATOMIC_RELAXED);
	char buf[4096];
	ssize_t n;
	int fd;

	if (h)
		return h;
	h = 0xcbf29ce484222325ull;
	fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		n = fs_real.read(fd, buf, sizeof(buf));
		if (n > 0) {
			size_t last;

			h = fs_hist_fnv(h, buf, (size_t)n);
			/* the family: up to the last argument's start (each
			 * argument ends with its NUL), from another seed, so
			 * that its tags never meet the programs' */
			for (last = (size_t)n - 1; last > 0 && buf[last - 1] != '\0'; last--)
				;
			if (last > 0 && (size_t)n < sizeof(buf))
				__atomic_store_n(&fs_hist_fam, fs_hist_fnv(0x84222325cbf29ce4ull, buf, last) | 1,
						 __ATOMIC_RELAXED);
			/* the command: the first argument, with its NUL (a third
			 * seed: its tag is no destination's entry) */
			__atomic_store_n(&fs_hist_cmd,
					 fs_hist_fnv(0x2325cbf29ce48422ull, buf, strnlen(buf, (size_t)n)) | 1,
					 __ATOMIC_RELAXED);
		}
		fs_real.close(fd);
	}
	h |= 1;
	__atomic_store_n(&fs_hist_prog, h, __ATOMIC_RELAXED);
	return h;
}

/* The program's family: its command line without the last argument (0: a
 * command line of one argument, or one too long to have read whole). A
 * script fetching a list of URLs with curl, `python3 client.py N` run for
 * N = 1, 2, 3: every command line is new, and each would open a rail and
 * pay a HELLO for the fabric's sake before its history knew it; their
 * family's history knows. The last argument only: `pgbench -C db` and
 * `pgbench -S db` stay apart. After fs_hist_program. */
static uint64_t fs_hist_family(void)
{
	return __atomic_load_n(&fs_hist_fam, __ATOMIC_RELAXED);
}

/* The command's entry (one per command, every destination): how its
 * processes that made one connection in all turned out. A script runs
 * `curl` against one URL after another, a new host or port among them: its
 * command line and its family are new to that destination, and each
 * process is one connection that the kernel serves as fast as anything,
 * yet its first one there opened a rail (4-6 ms of CPU, the fresh shm
 * region) and paid the HELLO. Its streak counts such processes whose one
 * connection was short, in a row; any long connection of the command, to
 * any destination, ends it. A process's first connection to a destination
 * neither it nor its family has an entry for follows it (fs_history_decide).
 * After fs_hist_program; 0: no command line. */
static uint64_t fs_hist_command(void)
{
	return __atomic_load_n(&fs_hist_cmd, __ATOMIC_RELAXED);
}

/* Forked children and exec'd programs: a child keeps its parent's command
 * line (and the mapping); an exec'd program is a new library instance. */

static void fs_hist_refuse(const char *path, uint32_t uid, const char *what)
{
	FS_WARN("connection history: %s %s (%s); connections negotiate without history", path, what,
		strerror(errno));
	FS_STAT_INC(history_refused);
	fs_hist_bad_uid = uid;
}

/* Opens (making them if missing) the directory and the file of UID and maps
 * the file. fs_hist_lock held. */
static struct fs_hist_file *fs_hist_open(uint32_t uid, struct stat *fst)
{
	char path[PATH_MAX];
	struct stat st;
	struct fs_hist_file *m;
	int dfd, fd;

	if (snprintf(path, sizeof(path), "%s/fabsock-u%u", fs_params.records_dir, uid) >= (int)sizeof(path))
		return NULL;
	if (mkdir(path, 0700) && errno != EEXIST) {
		fs_hist_refuse(path, uid, "cannot be made");
		return NULL;
	}
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		fs_hist_refuse(path, uid, "cannot be opened");
		return NULL;
	}
	if (fstat(dfd, &st) || !S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 077)) {
		fs_real.close(dfd);
		errno = EPERM;
		fs_hist_refuse(path, uid, "is not a private directory of this user");
		return NULL;
	}
	fd = openat(dfd, FS_HIST_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	fs_real.close(dfd);
	if (fd < 0) {
		fs_hist_refuse(path, uid, FS_HIST_NAME " cannot be opened");
		return NULL;
	}
	if (fstat(fd, fst) || !S_ISREG(fst->st_mode) || fst->st_uid != uid || (fst->st_mode & 077) ||
	    (fst->st_size && fst->st_size != (off_t)sizeof(struct fs_hist_file)) ||
	    (!fst->st_size && ftruncate(fd, sizeof(struct fs_hist_file)))) {
		fs_real.close(fd);
		errno = EPERM;
		fs_hist_refuse(path, uid, FS_HIST_NAME " is not a private file of this user of the expected size");
		return NULL;
	}
	m = mmap(NULL, sizeof(*m), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	fs_real.close(fd);
	if (m == MAP_FAILED)
		return NULL;
	/* a new file is zeros: the first to map it stamps it; a file of
	 * another layout with the right size is not ours to use */
	{
		uint32_t zero = 0;

		if (__atomic_compare_exchange_n(&m->magic, &zero, FS_HIST_MAGIC, false, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE))
			__atomic_store_n(&m->version, FS_HIST_VERSION, __ATOMIC_RELEASE);
		else if (zero != FS_HIST_MAGIC)
			goto bad;
		/* (a file stamped a moment ago may show version 0 still) */
		if (__atomic_load_n(&m->version, __ATOMIC_ACQUIRE) > FS_HIST_VERSION)
			goto bad;
	}
	return m;
bad:
	munmap(m, sizeof(*m));
	errno = EPROTO;
	fs_hist_refuse(path, uid, FS_HIST_NAME " has another format");
	return NULL;
}

/* This user's table, mapped; NULL when history is unusable here. */
static struct fs_hist_file *fs_hist_get(void)
{
	uint32_t uid = (uint32_t)fs_self_euid();
	uint64_t now = fs_now_coarse_ns(); /* (fs_hist_check_ns is of this clock alone) */
	struct fs_hist_file *m = __atomic_load_n(&fs_hist_map, __ATOMIC_ACQUIRE);
	char path[PATH_MAX];
	struct stat st;

	if (m && fs_hist_uid == uid && now < __atomic_load_n(&fs_hist_check_ns, __ATOMIC_RELAXED))
		return m;
	if (uid == fs_hist_bad_uid)
		return NULL;
	fs_lock(&fs_hist_lock);
	if (uid == fs_hist_bad_uid) { /* refused by another thread meanwhile: once is enough */
		pthread_mutex_unlock(&fs_hist_lock);
		return NULL;
	}
	m = fs_hist_map;
	if (m && fs_hist_uid == uid) {
		/* still the file in the directory? */
		if (snprintf(path, sizeof(path), "%s/fabsock-u%u/" FS_HIST_NAME, fs_params.records_dir, uid) <
			    (int)sizeof(path) &&
		    lstat(path, &st) == 0 && (uint64_t)st.st_ino == fs_hist_ino) {
			__atomic_store_n(&fs_hist_check_ns, now + FS_HIST_RECHECK_NS, __ATOMIC_RELAXED);
			pthread_mutex_unlock(&fs_hist_lock);
			return m;
		}
	}
	if (fs_hist_maps >= FS_HIST_MAPS_MAX) {
		pthread_mutex_unlock(&fs_hist_lock);
		return m && fs_hist_uid == uid ? m : NULL;
	}
	m = fs_hist_open(uid, &st);
	if (m) {
		fs_hist_maps++;
		fs_hist_uid = uid;
		fs_hist_ino = (uint64_t)st.st_ino;
		__atomic_store_n(&fs_hist_check_ns, now + FS_HIST_RECHECK_NS, __ATOMIC_RELAXED);
		__atomic_store_n(&fs_hist_map, m, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&fs_hist_lock);
	return m;
}

static struct fs_hist_entry *fs_hist_find(struct fs_hist_file *m, uint64_t tag, bool create)
{
	uint32_t first = (uint32_t)(tag % FS_HIST_ENTRIES), oldest_s = UINT32_MAX;
	struct fs_hist_entry *oldest = NULL;

	for (int round = 0; round < 2; round++) {
		for (uint32_t i = 0; i < FS_HIST_PROBE; i++) {
			struct fs_hist_entry *e = &m->entries[(first + i) % FS_HIST_ENTRIES];
			uint64_t t = __atomic_load_n(&e->tag, __ATOMIC_ACQUIRE);
			uint32_t s;

			if (t == tag)
				return e;
			if (!create)
				continue;
			if (!t) {
				if (__atomic_compare_exchange_n(&e->tag, &t, tag, false, __ATOMIC_ACQ_REL,
								__ATOMIC_ACQUIRE))
					return e; /* a fresh slot: zeros, as a new file's */
				if (t == tag)
					return e;
				continue;
			}
			s = __atomic_load_n(&e->last_s, __ATOMIC_RELAXED);
			if (s < oldest_s) {
				oldest_s = s;
				oldest = e;
			}
		}
		if (!create || round)
			break;
	}
	if (!oldest)
		return NULL;
	/* full: the least recently reported destination makes room */
	__atomic_store_n(&oldest->short_streak, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&oldest->tcp_decided, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&oldest->closes, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&oldest->stepped_back, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&oldest->relearn_level, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&oldest->tcp_ns_turn, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&oldest->fab_ns_turn, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&oldest->tag, tag, __ATOMIC_RELEASE);
	return oldest;
}

/* A measured time per turn older than this is not compared with (the
 * host's load, the program or its peer may have changed since). */
#define FS_HIST_RATE_S 600u

/* AVG, measured at second AT, if it is recent enough to compare (0: not). */
static uint32_t fs_hist_fresh(const uint32_t *avg, const uint32_t *at)
{
	uint32_t v = __atomic_load_n(avg, __ATOMIC_RELAXED);

	return v && fs_hist_boot_s() - __atomic_load_n(at, __ATOMIC_RELAXED) <= FS_HIST_RATE_S ? v : 0;
}

/* Whether E's last step-back on a crowded host (busy_s) is less than
 * FABSOCK_HISTORY_BUSY_SEC old. */
static bool fs_hist_busy_fresh(struct fs_hist_entry *e)
{
	uint32_t at = __atomic_load_n(&e->busy_s, __ATOMIC_RELAXED);

	return at && fs_params.history_busy_sec && fs_hist_boot_s() - at < fs_params.history_busy_sec;
}

/* One more measured time per turn, NS, into the average *AVG (the newest
 * weighs a quarter; alone when the average is older than FS_HIST_RATE_S),
 * measured at second *AT. */
static void fs_hist_rate(uint32_t *avg, uint32_t *at, uint64_t ns)
{
	uint32_t old = fs_hist_fresh(avg, at);
	uint64_t v;

	if (ns > UINT32_MAX)
		ns = UINT32_MAX;
	v = old ? ((uint64_t)old * 3 + ns) / 4 : ns;
	__atomic_store_n(avg, v ? (uint32_t)v : 1u, __ATOMIC_RELAXED);
	__atomic_store_n(at, fs_hist_boot_s(), __ATOMIC_RELAXED);
}

void fs_history_fabric_time(const struct fs_history_conn *h, uint64_t ns_turn)
{
	uint64_t tag = __atomic_load_n(&h->tag, __ATOMIC_RELAXED);
	struct fs_hist_file *m;
	struct fs_hist_entry *e;

	if (ns_turn && tag && (m = fs_hist_get()) && (e = fs_hist_find(m, tag, true)))
		fs_hist_rate(&e->fab_ns_turn, &e->fab_s, ns_turn);
}

uint32_t fs_history_tcp_ns_turn(const struct fs_history_conn *h)
{
	uint64_t tag = __atomic_load_n(&h->tag, __ATOMIC_RELAXED);
	struct fs_hist_file *m;
	struct fs_hist_entry *e;

	if (!tag || !(m = fs_hist_get()) || !(e = fs_hist_find(m, tag, false)))
		return 0;
	return fs_hist_fresh(&e->tcp_ns_turn, &e->tcp_s);
}

/* This process's connections per entry, for the sole-connection rule
 * (fs_history_exit): a process that made one connection to a destination,
 * short, and exits is what its next run of the same command line will do
 * (curl URL, a script's client), so its exit counts that connection twice.
 * A process that also made others there (pgbench's short scale check
 * before its long sessions) gets nothing more. Bounded: a destination past
 * FS_HIST_PROC is not counted (no bonus), nor is any once the process made
 * more than FS_HIST_PROC connections in all (not the shape of a process
 * whose next run repeats its one connection; and a connection per request
 * then takes no process-wide lock at its connect and its close).
 * fs_hist_lock. */
#define FS_HIST_PROC 16u
static struct fs_hist_proc {
	uint64_t tag, family_tag;
	uint32_t conns, shorts;
} fs_hist_proc[FS_HIST_PROC];
static pid_t fs_hist_proc_pid;
static uint32_t fs_hist_proc_conns; /* this process's connections, every destination (atomic) */

/* Whether this process still keeps count per destination (a forked child
 * keeps its parent's count until its first connection resets it, which
 * only leaves its bookkeeping off: it has no slots of its own yet). */
static bool fs_hist_proc_counts(void)
{
	return __atomic_load_n(&fs_hist_proc_conns, __ATOMIC_RELAXED) <= FS_HIST_PROC ||
	       fs_hist_proc_pid != fs_self_pid();
}

static struct fs_hist_proc *fs_hist_proc_find(uint64_t tag, bool create)
{
	if (fs_hist_proc_pid != fs_self_pid()) { /* a forked child: its own */
		memset(fs_hist_proc, 0, sizeof(fs_hist_proc));
		__atomic_store_n(&fs_hist_proc_conns, 0, __ATOMIC_RELAXED);
		fs_hist_proc_pid = fs_self_pid();
	}
	for (unsigned i = 0; i < FS_HIST_PROC; i++)
		if (fs_hist_proc[i].tag == tag || (create && !fs_hist_proc[i].tag)) {
			fs_hist_proc[i].tag = tag;
			return &fs_hist_proc[i];
		}
	return NULL;
}

/* One more short connection reported to TAG's entry (never past a long
 * one that came since: the streak is only extended). */
static void fs_hist_extend(struct fs_hist_file *m, uint64_t tag)
{
	struct fs_hist_entry *e = tag ? fs_hist_find(m, tag, false) : NULL;
	uint32_t streak = e ? __atomic_load_n(&e->short_streak, __ATOMIC_RELAXED) : 0;

	if (streak && streak < FS_HIST_STREAK_MAX) {
		__atomic_add_fetch(&e->short_streak, 1, __ATOMIC_RELAXED);
		/* a second report, for fs_history_decide's "every report short"
		 * (the streak equal to the reports) */
		__atomic_add_fetch(&e->closes, 1, __ATOMIC_RELAXED);
	}
}

/* A process of the command made one connection in all, short, and exits:
 * its command's streak grows by one. */
static void fs_hist_command_short(struct fs_hist_file *m)
{
	struct fs_hist_entry *e = fs_hist_find(m, fs_hist_command(), true);

	if (!e)
		return;
	if (__atomic_load_n(&e->short_streak, __ATOMIC_RELAXED) < FS_HIST_STREAK_MAX)
		__atomic_add_fetch(&e->short_streak, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&e->last_s, fs_hist_boot_s(), __ATOMIC_RELAXED);
	__atomic_add_fetch(&e->closes, 1, __ATOMIC_RELAXED);
}

/* The two tags of a destination (KEY, PORT) for this program, and this
 * thread's last few of them: two FNV-1a passes over 18 bytes each, about
 * 180 instructions of a connect() that a program connecting to one
 * destination thousands of times a second repeated every time. Per thread:
 * nothing shared, nothing torn. */
#define FS_HIST_TAG_MEMO 4u

static __thread struct fs_hist_tag_memo {
	uint64_t tag, family_tag; /* tag 0: empty */
	uint8_t key[16];
	uint16_t port;
} fs_hist_tag_memo[FS_HIST_TAG_MEMO] __attribute__((tls_model("initial-exec")));

/* (the program's and the family's hashes are the process's, made once
 * from its command line: a thread's memo holds for its life, a fork's
 * child has the same, and an exec starts with none) */
static void fs_hist_tags(struct fs_history_conn *h, const uint8_t key[16], uint16_t port)
{
	struct fs_hist_tag_memo *t = &fs_hist_tag_memo[(key[15] ^ port) % FS_HIST_TAG_MEMO];

	if (!t->tag || t->port != port || memcmp(t->key, key, 16) != 0) {
		uint64_t prog = fs_hist_program(), fam = fs_hist_family(); /* (in this order) */

		t->tag = fs_hist_fnv(fs_hist_fnv(prog, key, 16), &port, sizeof(port)) | 1;
		t->family_tag = fam ? fs_hist_fnv(fs_hist_fnv(fam, key, 16), &port, sizeof(port)) | 1 : 0;
		memcpy(t->key, key, 16);
		t->port = port;
	}
	h->tag = t->tag;
	h->family_tag = t->family_tag;
}

bool fs_history_decide(struct fs_history_conn *h, const struct sockaddr *addr)
{
	struct fs_hist_file *m;
	struct fs_hist_entry *e;
	uint8_t key[16];
	uint16_t port;
	uint32_t n;
	bool first = false;

	memset(h, 0, sizeof(*h));
	if (!fs_params.history_short || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
		return false;
	m = fs_hist_get();
	if (!m)
		return false;
	fs_sockaddr_key(addr, key, &port);
	fs_hist_tags(h, key, port);
	if (fs_hist_proc_counts()) {
		struct fs_hist_proc *p;

		pthread_mutex_lock(&fs_hist_lock);
		if ((p = fs_hist_proc_find(h->tag, true))) {
			p->family_tag = h->family_tag;
			p->conns++;
		}
		first = __atomic_fetch_add(&fs_hist_proc_conns, 1, __ATOMIC_RELAXED) == 0;
		pthread_mutex_unlock(&fs_hist_lock);
	} else {
		__atomic_add_fetch(&fs_hist_proc_conns, 1, __ATOMIC_RELAXED);
	}
	e = fs_hist_find(m, h->tag, false);
	if (e && h->family_tag && !__atomic_load_n(&e->stepped_back, __ATOMIC_RELAXED) && !fs_hist_busy_fresh(e)) {
		/* an entry of this command line that knows nothing its family
		 * does not: every report to it short (its streak all its
		 * reports), too few yet to decide. Its first connections
		 * followed the family to TCP and made it; the next one of the
		 * same command line went to the fabric, whether it came before
		 * or after the first one's close (e2e_history's family case,
		 * its two streams in turn). The family decides until this
		 * entry can (or a long report of its own ends the match). */
		uint32_t streak = __atomic_load_n(&e->short_streak, __ATOMIC_RELAXED);

		if (streak < fs_params.history_short && __atomic_load_n(&e->closes, __ATOMIC_RELAXED) == streak)
			e = NULL;
	}
	if (!e && h->family_tag) {
		/* this command line's first connection to the destination: its
		 * family's entry decides for it (never a step-back's: that one
		 * was the program's own), and the connection reports to both */
		e = fs_hist_find(m, h->family_tag, false);
		if (e && __atomic_load_n(&e->short_streak, __ATOMIC_RELAXED) < fs_params.history_short)
			e = NULL;
		h->by_family = e != NULL;
	}
	if (!e && first && fs_hist_command()) {
		/* nor its family's: the process's first connection follows its
		 * command's processes of one connection (fs_hist_command) */
		e = fs_hist_find(m, fs_hist_command(), false);
		if (e && __atomic_load_n(&e->short_streak, __ATOMIC_RELAXED) < fs_params.history_short)
			e = NULL;
		h->by_command = e != NULL;
	}
	if (!e)
		return false; /* unknown: negotiate as before */
	/* a connection that stepped back from the fabric (stepback.h) sends
	 * the next ones to TCP at once, whatever their length: they would
	 * pay the rail and HELLO only to step back a window later */
	h->stepped = !h->by_family && !h->by_command && __atomic_load_n(&e->stepped_back, __ATOMIC_RELAXED) != 0;
	if (!h->by_family && !h->by_command && fs_params.stepback) {
		/* what was measured outweighs the step-backs' sleeps (stepback.h,
		 * "time per turn"): the fabric slower per turn than TCP sends
		 * the connection to TCP as a step-back would (relearns
		 * included), faster lets it negotiate. TCP's time comes from
		 * the connections a step-back sent there: nothing is sent to
		 * TCP only to measure it (a program the fabric serves well
		 * would pay a run at the kernel's speed for it: pgbench -S -c 1,
		 * 1.7-2x on the fabric, ran a round at 0.8-0.9x) */
		uint32_t tcp = fs_hist_fresh(&e->tcp_ns_turn, &e->tcp_s);
		uint32_t fab = fs_hist_fresh(&e->fab_ns_turn, &e->fab_s);

		int cmp = tcp && fab ? fs_stepback_compare(fab, tcp) : 0;

		if (cmp > 0)
			h->stepped = h->measured = true;
		else if (cmp < 0)
			h->stepped = false;
		/* A recent step-back on a crowded host (busy_s) and the host
		 * still crowded now: this connection would lose as that one
		 * did (memcslap -c 8 beside four busy loops: every run offloaded
		 * again, stepped back after its windows' 300 ms, 0.45-0.65x the
		 * kernel), so TCP; on a host quiet again, the fabric, where it
		 * wins (pgbench -S -c 1: 1.7-2.2x). Where the times say the
		 * fabric is faster, they decide. */
		if (!h->stepped && cmp >= 0 && fs_hist_busy_fresh(e) && fs_runq_host_busy_now(fs_now_ns()))
			h->stepped = h->busy = true;
	}
	if (!h->stepped && __atomic_load_n(&e->short_streak, __ATOMIC_RELAXED) < fs_params.history_short)
		return false; /* not short enough: negotiate as before */
	n = __atomic_add_fetch(&e->tcp_decided, 1, __ATOMIC_RELAXED);
	/* Only a step-back's decision is ever tried on the fabric again: a
	 * short one is re-judged by every connection it sends to TCP (each
	 * reports the kernel's counts at its close, and one long one ends the
	 * streak), so a relearn would learn nothing those do not, at the cost
	 * of a whole offload on both ends (wrk with Connection: close, one
	 * relearn in 64 to 4096: 5-7 % of its requests/s). Whether the fabric
	 * is still slower only the fabric can say. */
	if (fs_params.history_relearn && h->stepped) {
		uint32_t level = __atomic_load_n(&e->relearn_level, __ATOMIC_RELAXED);
		uint64_t every = (uint64_t)fs_params.history_relearn
				 << (level < FS_HIST_RELEARN_LEVEL_MAX ? level : FS_HIST_RELEARN_LEVEL_MAX);

		if (n % every == 0) {
			FS_STAT_INC(history_relearn);
			h->relearn = true;
			/* the next one later, unless this one comes back long
			 * (fs_hist_report) */
			if (level < FS_HIST_RELEARN_LEVEL_MAX)
				__atomic_store_n(&e->relearn_level, level + 1, __ATOMIC_RELAXED);
			return false; /* offload one now and then: the program may have changed */
		}
	}
	h->chose_tcp = true;
	/* No note of its inode (an fstat per connection): a server that
	 * speaks first treats a client of our user that noted nothing as
	 * one that sends no probe, which is what this one is. */
	return true;
}

/* Writes note VALUE (an inode, marked or not) into the next of M's notes,
 * returning its index. */
static uint32_t fs_hist_note(struct fs_hist_file *m, uint64_t value)
{
	uint32_t i = __atomic_fetch_add(&m->note_next, 1, __ATOMIC_RELAXED) % FS_HIST_NOTES;

	/* the time first, so that a server never pairs the new inode with a
	 * stale time and thinks the note old (nor a stale inode with the new
	 * time: a false match only skips a server's wait for a client whose
	 * history went TCP anyway, or makes it wait, bounded, for a probe) */
	__atomic_store_n(&m->notes[i].boot_ns, fs_hist_boot_ns(), __ATOMIC_RELAXED);
	__atomic_store_n(&m->notes[i].inode, value, __ATOMIC_RELEASE);
	return i;
}

void fs_history_note_intent(struct fs_history_conn *h, int fd)
{
	struct fs_hist_file *m = fs_hist_get();
	struct stat st;

	if (!m || fstat(fd, &st) || !st.st_ino || (uint64_t)st.st_ino >= FS_HIST_INTENT)
		return;
	h->intent = (uint64_t)st.st_ino | FS_HIST_INTENT;
	h->intent_slot = fs_hist_note(m, h->intent);
}

void fs_history_withdraw_intent(struct fs_history_conn *h)
{
	struct fs_hist_file *m;
	uint64_t expected = h->intent;

	if (!expected)
		return;
	h->intent = 0;
	/* (only if the slot still holds our note: a newer one stays) */
	if ((m = fs_hist_get()))
		__atomic_compare_exchange_n(&m->notes[h->intent_slot % FS_HIST_NOTES].inode, &expected, 0, false,
					    __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

enum fs_history_note fs_history_client_note(uint32_t inode)
{
	enum fs_history_note found = FS_HISTORY_NOTE_NONE;
	struct fs_hist_file *m;
	uint64_t now, newest = 0;

	if (!inode)
		return FS_HISTORY_NOTE_UNKNOWN;
	if (!(m = fs_hist_get()))
		return FS_HISTORY_NOTE_UNKNOWN; /* no file we may use: nobody could note */
	now = fs_hist_boot_ns();
	for (uint32_t i = 0; i < FS_HIST_NOTES; i++) {
		uint64_t v = __atomic_load_n(&m->notes[i].inode, __ATOMIC_ACQUIRE), t;
		bool intent = (v & FS_HIST_INTENT) != 0;

		if ((v & ~FS_HIST_INTENT) != inode)
			continue;
		t = __atomic_load_n(&m->notes[i].boot_ns, __ATOMIC_RELAXED);
		/* (a time ahead of ours by more than a second is garbage; one
		 * a little ahead was written after we read the clock: age 0) */
		if (t > now + 1000000000ull || (t < now && now - t >= (intent ? FS_HIST_INTENT_NS : FS_HIST_NOTE_NS)) ||
		    (found != FS_HISTORY_NOTE_NONE && t < newest))
			continue;
		/* the newest note of the inode counts (an older one is a
		 * reused inode's) */
		newest = t;
		found = intent ? FS_HISTORY_NOTE_INTENT : FS_HISTORY_NOTE_TCP;
	}
	return found;
}

static void fs_hist_report(uint64_t tag, uint64_t turns, uint64_t bytes)
{
	struct fs_hist_file *m = fs_hist_get();
	struct fs_hist_entry *e;
	bool is_short = turns < fs_params.history_turns && bytes < fs_params.history_bytes;

	if (!m || !tag || !(e = fs_hist_find(m, tag, true)))
		return;
	if (is_short && fs_hist_proc_counts()) {
		struct fs_hist_proc *p;

		pthread_mutex_lock(&fs_hist_lock);
		if ((p = fs_hist_proc_find(tag, false)))
			p->shorts++;
		pthread_mutex_unlock(&fs_hist_lock);
	}
	if (is_short && __atomic_load_n(&e->short_streak, __ATOMIC_RELAXED) >= FS_HIST_STREAK_SAT) {
		/* nothing a short report could change but the second: the
		 * streak is far past any FABSOCK_HISTORY_SHORT */
		uint32_t now_s = fs_hist_boot_s();

		if (__atomic_load_n(&e->last_s, __ATOMIC_RELAXED) != now_s)
			__atomic_store_n(&e->last_s, now_s, __ATOMIC_RELAXED);
		return;
	}
	if (!is_short) {
		__atomic_store_n(&e->short_streak, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&e->relearn_level, 0, __ATOMIC_RELAXED);
		/* a long connection of the command, anywhere, ends its
		 * streak of short single-connection processes too */
		struct fs_hist_entry *c = fs_hist_command() ? fs_hist_find(m, fs_hist_command(), false) : NULL;

		if (c)
			__atomic_store_n(&c->short_streak, 0, __ATOMIC_RELAXED);
	} else if (__atomic_load_n(&e->short_streak, __ATOMIC_RELAXED) < FS_HIST_STREAK_MAX)
		__atomic_add_fetch(&e->short_streak, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&e->last_s, fs_hist_boot_s(), __ATOMIC_RELAXED);
	__atomic_add_fetch(&e->closes, 1, __ATOMIC_RELAXED);
	FS_DBG("connection history: %s connection (%llu turns, %llu bytes), streak now %u", is_short ? "short" : "long",
	       (unsigned long long)turns, (unsigned long long)bytes,
	       __atomic_load_n(&e->short_streak, __ATOMIC_RELAXED));
}

void fs_history_offloaded_closed(struct fs_history_conn *h, uint64_t turns, uint64_t bytes, bool losing,
				 uint64_t ns_turn)
{
	/* (read once: a window's end may read it from another thread, and
	 * the stores that clear it are atomic too) */
	uint64_t tag = __atomic_load_n(&h->tag, __ATOMIC_RELAXED);
	struct fs_hist_file *m;
	struct fs_hist_entry *e;

	if (!tag)
		return;
	fs_hist_report(tag, turns, bytes);
	if (h->family_tag)
		fs_hist_report(h->family_tag, turns, bytes);
	fs_history_fabric_time(h, ns_turn);
	if (losing) {
		/* ended in a streak of windows that said the fabric loses,
		 * before the streak was long enough to step back: as a
		 * step-back for the next connections (a relearn's too: the
		 * fabric is still slower) */
		FS_STAT_INC(history_losing_closed);
		fs_history_stepped_back(h);
		return;
	}
	/* A whole step-back window on the fabric without stepping back. A
	 * relearn's connection: the fabric pays here again, half the
	 * step-backs are forgotten. Any other (one with the step-back off, or one of a
	 * run whose other connections stepped back) outweighs one step-back:
	 * the entry keeps the verdict of the most. A reset by any of them
	 * sent every run of a program with several connections back to the
	 * fabric, to step back again a window later (pgbench -c 4 -j 2,
	 * memcslap's eight threads: most of a run's connections stepped
	 * back, and the rest, making their window, wiped that out). */
	if (fs_stepback_whole_window(turns) && (m = fs_hist_get()) && (e = fs_hist_find(m, tag, false))) {
		uint32_t v = __atomic_load_n(&e->stepped_back, __ATOMIC_RELAXED);

		/* a relearn's halves the count (one that misjudged, its answers
		 * quick only because another connection's events ended the
		 * waits of an epoll set, sent a whole wrk run's four
		 * connections back to the fabric, each to lose for its life,
		 * every 64 connections); any other takes one off */
		while (v && !__atomic_compare_exchange_n(&e->stepped_back, &v, h->relearn ? v / 2 : v - 1, false,
							 __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			;
	}
	__atomic_store_n(&h->tag, 0, __ATOMIC_RELAXED);
}

void fs_history_stepped_back(struct fs_history_conn *h)
{
	uint64_t tag = __atomic_load_n(&h->tag, __ATOMIC_RELAXED);
	struct fs_hist_file *m;
	struct fs_hist_entry *e;

	if (!tag)
		return;
	/* during or right after a spell of lost slices (runq.h): work beside
	 * made the fabric lose, not the program's pattern; kept, the verdict
	 * would start its next connections on TCP once the host is quiet
	 * again, where the fabric wins (pgbench -S -c 1: 1.7-2.2x) */
	if (fs_runq_spell_lately(fs_now_ns())) {
		FS_STAT_INC(history_busy_unlearnt);
		/* (but dated: while the host stays crowded, the next
		 * connections go to TCP: fs_history_decide) */
		if (fs_params.history_busy_sec && (m = fs_hist_get()) && (e = fs_hist_find(m, tag, true))) {
			uint32_t now_s = fs_hist_boot_s();

			__atomic_store_n(&e->busy_s, now_s ? now_s : 1, __ATOMIC_RELAXED); /* (0: none) */
		}
		__atomic_store_n(&h->tag, 0, __ATOMIC_RELAXED);
		return;
	}
	if ((m = fs_hist_get()) && (e = fs_hist_find(m, tag, true))) {
		if (__atomic_load_n(&e->stepped_back, __ATOMIC_RELAXED) < FS_HIST_STREAK_MAX)
			__atomic_add_fetch(&e->stepped_back, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&e->last_s, fs_hist_boot_s(), __ATOMIC_RELAXED);
	}
	__atomic_store_n(&h->tag, 0, __ATOMIC_RELAXED); /* its close is a kernel socket's: nothing more to say */
}

/* ---- kernel TCP connections the history chose -------------------------- */

/* Followed by descriptor number (one socket holds a number at a time; a
 * newer one in the same slot replaces an older, whose report is lost). A
 * number closed or replaced through the preload (close, close_range,
 * dup2, dup3, syscall(SYS_close)) reports first; one closed behind its back
 * (an inline system call, io_uring) and reused by another TCP socket would
 * report that socket's counts, at worst a short or long count too many for
 * one entry: not worth an fstat on every close (issue 27, target 5). */
#define FS_HIST_FDS 256u

struct fs_hist_fd {
	int fd;
	uint64_t tag;
	uint64_t family_tag;
	uint64_t start_ns; /* fs_now_ns() at its connect() */
};

static pthread_mutex_t fs_hist_fd_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fs_hist_fd fs_hist_fds[FS_HIST_FDS];
unsigned fs_history_tracked;

void fs_history_track(const struct fs_history_conn *h, int fd)
{
	struct fs_hist_fd *t = &fs_hist_fds[(unsigned)fd % FS_HIST_FDS];

	if (!h->tag)
		return;
	fs_lock(&fs_hist_fd_lock);
	if (!t->tag)
		__atomic_add_fetch(&fs_history_tracked, 1, __ATOMIC_RELAXED);
	*t = (struct fs_hist_fd){ .fd = fd, .tag = h->tag, .family_tag = h->family_tag, .start_ns = fs_now_ns() };
	pthread_mutex_unlock(&fs_hist_fd_lock);
}

/* Reports the kernel's counts of the TCP connection T followed. One that
 * closes within FABSOCK_HISTORY_QUICK_US of its connect() is short without
 * asking (a getsockopt per connection of a program that makes a connection
 * per request, issue 27 target 5): whatever its turns, its whole life was
 * shorter than what an offload costs to set up, so offloading it could not
 * have paid; and it cannot have moved HISTORY_BYTES in that time. */
static void fs_hist_report_tcp(const struct fs_hist_fd *t)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (fs_params.history_quick_us && fs_now_ns() - t->start_ns < fs_params.history_quick_us * 1000ull) {
		fs_hist_report(t->tag, 0, 0);
		if (t->family_tag)
			fs_hist_report(t->family_tag, 0, 0);
		return;
	}
	memset(&ti, 0, sizeof(ti));
	if (fs_real.getsockopt(t->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ||
	    len < offsetof(struct tcp_info, tcpi_data_segs_out) + sizeof(ti.tcpi_data_segs_out))
		return; /* a kernel before 4.6 does not count data segments */
	/* a request and its answer are a data segment each way at least (a
	 * large answer is many: the smaller count is the turns) */
	uint64_t turns = ti.tcpi_data_segs_in < ti.tcpi_data_segs_out ? ti.tcpi_data_segs_in : ti.tcpi_data_segs_out;

	if (turns >= fs_params.stepback_turns) {
		/* time per turn over its life, for the step-back's comparison
		 * (fs_history_tcp_ns_turn): as many turns as a whole window */
		struct fs_hist_file *m = fs_hist_get();
		struct fs_hist_entry *e = m ? fs_hist_find(m, t->tag, true) : NULL;
		uint64_t life = fs_now_ns() - t->start_ns;
		/* without the idle tail (a pooled connection waiting to be
		 * closed): since the last data, either way, by the kernel */
		uint64_t idle = (uint64_t)(ti.tcpi_last_data_sent < ti.tcpi_last_data_recv ? ti.tcpi_last_data_sent
											   : ti.tcpi_last_data_recv) *
				1000000ull;

		if (idle < life)
			life -= idle;
		if (e)
			fs_hist_rate(&e->tcp_ns_turn, &e->tcp_s, life / turns);
	}
	fs_hist_report(t->tag, turns, ti.tcpi_bytes_acked + ti.tcpi_bytes_received);
	if (t->family_tag)
		fs_hist_report(t->family_tag, turns, ti.tcpi_bytes_acked + ti.tcpi_bytes_received);
}

bool fs_history_follows(int fd)
{
	const struct fs_hist_fd *t;

	if (fd < 0 || !__atomic_load_n(&fs_history_tracked, __ATOMIC_RELAXED))
		return false;
	t = &fs_hist_fds[(unsigned)fd % FS_HIST_FDS];
	return __atomic_load_n(&t->fd, __ATOMIC_RELAXED) == fd && __atomic_load_n(&t->tag, __ATOMIC_RELAXED);
}

void fs_history_fd_closing(int fd)
{
	struct fs_hist_fd *t, copy;

	if (fd < 0)
		return;
	t = &fs_hist_fds[(unsigned)fd % FS_HIST_FDS];
	if (__atomic_load_n(&t->fd, __ATOMIC_RELAXED) != fd || !__atomic_load_n(&t->tag, __ATOMIC_RELAXED))
		return;
	fs_lock(&fs_hist_fd_lock);
	copy = *t;
	if (t->fd == fd && t->tag) {
		t->tag = 0;
		__atomic_sub_fetch(&fs_history_tracked, 1, __ATOMIC_RELAXED);
	} else {
		copy.tag = 0;
	}
	pthread_mutex_unlock(&fs_hist_fd_lock);
	if (copy.tag)
		fs_hist_report_tcp(&copy);
}

void fs_history_exit(void)
{
	struct fs_hist_file *m;

	if (__atomic_load_n(&fs_history_tracked, __ATOMIC_RELAXED))
		for (unsigned i = 0; i < FS_HIST_FDS; i++)
			if (fs_hist_fds[i].tag)
				fs_history_fd_closing(fs_hist_fds[i].fd);
	/* the sole-connection rule (struct fs_hist_proc) */
	pthread_mutex_lock(&fs_hist_lock);
	if (fs_hist_proc_pid == fs_self_pid() && (m = fs_hist_map) &&
	    __atomic_load_n(&fs_hist_proc_conns, __ATOMIC_RELAXED) <= FS_HIST_PROC) {
		for (unsigned i = 0; i < FS_HIST_PROC; i++) {
			const struct fs_hist_proc *p = &fs_hist_proc[i];

			if (p->tag && p->conns == 1 && p->shorts == 1) {
				fs_hist_extend(m, p->tag);
				fs_hist_extend(m, p->family_tag);
				FS_DBG("connection history: this process's sole connection to a destination was short: "
				       "counted twice");
				/* ... and the only one it made: one more process of
				 * its command that a connection served whole
				 * (fs_hist_command) */
				if (__atomic_load_n(&fs_hist_proc_conns, __ATOMIC_RELAXED) == 1 && fs_hist_command())
					fs_hist_command_short(m);
			}
		}
	}
	pthread_mutex_unlock(&fs_hist_lock);
}
