/* SPDX-License-Identifier: MIT */
/*
 * The shm provider's regions (see fabric.h): the names fabsock gives them,
 * removing those of dead processes and of the previous program, checking a
 * peer's region before it is mapped and our own after a change of user,
 * and undoing the damage of a peer that died holding its region's lock (a
 * watchdog thread, fs_prov_spin_lock). Rails themselves are fabric.c's.
 */
#include "core/fabric.h"
#include "core/fabric_internal.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "config/log.h"
#include "core/engine.h"
#include "core/guard.h"
#include "core/sigs.h"
#include "core/stats.h"
#include "preload/real.h"
/* shm regions are named after the endpoint; the default name (the pid)
 * collides across PID namespaces and cannot be told apart from other
 * programs' regions. Ours: fabsock-<pid namespace>-<pid>-<random>. */
static unsigned long fs_pid_namespace(void)
{
	/* A process's pid namespace is fixed (unshare(CLONE_NEWPID) and setns
	 * move only its later children): read once per process, as every
	 * HELLO both sides check asks for it. */
	static unsigned long cached_ns;
	static pid_t cached_pid;
	char link[64] = "";
	unsigned long ns = 0;
	ssize_t n;

	if (__atomic_load_n(&cached_pid, __ATOMIC_ACQUIRE) == fs_self_pid())
		return __atomic_load_n(&cached_ns, __ATOMIC_RELAXED);
	n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
	if (n > 0 && sscanf(link, "pid:[%lu]", &ns) == 1 && ns) {
		__atomic_store_n(&cached_ns, ns, __ATOMIC_RELAXED);
		__atomic_store_n(&cached_pid, fs_self_pid(), __ATOMIC_RELEASE);
	}
	return ns;
}

/* Writes "fabsock-<pid namespace>-" into OUT: what our region names start
 * with. Returns its length. */
size_t fs_shm_prefix(char *out, size_t size)
{
	return (size_t)snprintf(out, size, "fabsock-%lu-", fs_pid_namespace());
}

/* The owner pid in NAME if NAME is one of our region names: PREFIX (from
 * fs_shm_prefix, PLEN bytes), then <pid>-. Else 0. */
static long fs_shm_name_pid(const char *name, const char *prefix, size_t plen)
{
	char *end;
	long pid;

	if (strncmp(name, prefix, plen) != 0)
		return 0;
	pid = strtol(name + plen, &end, 10);
	return end != name + plen && *end == '-' && pid > 0 ? pid : 0;
}

bool fs_pid_alive(long pid)
{
	return pid > 0 && !(kill((pid_t)pid, 0) && errno == ESRCH);
}

/* Removes the shm regions of our PID namespace whose owner pid is not
 * alive (OWN false), or that carry this process's pid (OWN true: the
 * previous program's, after exec). Only files of our effective uid: a
 * root process does not remove what another user put there under a name
 * like ours (that user's own processes clean theirs). */
static void fs_shm_clean(bool own)
{
	char prefix[64];
	size_t plen = fs_shm_prefix(prefix, sizeof(prefix));
	DIR *dir = opendir("/dev/shm");
	struct dirent *de;

	if (!dir)
		return;
	while ((de = readdir(dir))) {
		char path[512];
		long pid = fs_shm_name_pid(de->d_name, prefix, plen);
		struct stat st;

		if (!pid || (own ? pid != getpid() : pid == getpid() || fs_pid_alive(pid)))
			continue;
		snprintf(path, sizeof(path), "/dev/shm/%s", de->d_name);
		if (lstat(path, &st) || !S_ISREG(st.st_mode) || st.st_uid != fs_self_euid())
			continue;
		if (unlink(path) == 0)
			FS_INFO("removed shm region %s of %s", de->d_name,
				own ? "this process's previous program (exec)" : "a dead process");
	}
	closedir(dir);
}

void fs_shm_clean_stale(void)
{
	static int done;

	if (!__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL))
		fs_shm_clean(false);
}

void fs_shm_clean_previous_program(void)
{
	/* This pid's regions can only be the previous program's: this one has
	 * opened no rail yet. */
	fs_shm_clean(true);
}

/* The region name in a shm address "fi_shm://NAME" (NUL-terminated, LEN
 * bytes with the NUL), or NULL when ADDR is not one. */
static const char *fs_shm_addr_name(const void *addr, size_t len)
{
	const char *text = addr;

	if (len < 10 || len > FS_WIRE_ADDR_MAX || text[len - 1] != '\0' || strlen(text) != len - 1 ||
	    strncmp(text, "fi_shm://", 9) != 0)
		return NULL;
	for (size_t i = 9; i < len - 1; i++)
		if (text[i] == '/' || text[i] < 0x21 || text[i] > 0x7e)
			return NULL;
	return text + 9;
}

/* Whether NAME is a region name fabsock gives (fs_rail_hints): our pid
 * namespace's prefix, a pid, '-', 8 hex digits, then only the ":<number>"
 * fields the shm provider appends (libfabric 1.17: ":<uid>:<index>"). A HELLO
 * that names any other file in /dev/shm (another program's segment, which
 * libfabric would map as a peer region and crash on) is refused. */
static bool fs_shm_region_name_ours(const char *name)
{
	char prefix[64];
	size_t plen = fs_shm_prefix(prefix, sizeof(prefix));
	long pid = fs_shm_name_pid(name, prefix, plen);
	const char *tail;

	if (!pid) /* (no kill(pid, 0) here: a seccomp sandbox may forbid it) */
		return false;
	tail = strchr(name + plen, '-') + 1; /* fs_shm_name_pid saw the '-' */
	for (unsigned i = 0; i < 8; i++)
		if (!isxdigit((unsigned char)tail[i]))
			return false;
	/* then what the shm provider appends: ":<number>" fields */
	for (tail += 8; *tail; ) {
		if (*tail++ != ':' || !isdigit((unsigned char)*tail))
			return false;
		while (isdigit((unsigned char)*tail))
			tail++;
	}
	return true;
}

/* The owner of the shm region NAME: a regular file in /dev/shm, not a
 * link. Returns 0 with *UID set, or -EADDRNOTAVAIL. */
static int fs_shm_region_owner(const char *name, uid_t *uid)
{
	char path[300];
	struct stat st;

	if ((size_t)snprintf(path, sizeof(path), "/dev/shm/%s", name) >= sizeof(path) || lstat(path, &st) ||
	    !S_ISREG(st.st_mode))
		return -EADDRNOTAVAIL;
	*uid = st.st_uid;
	return 0;
}

bool fs_rail_peer_ended(const struct fs_rail *rail, const void *addr, size_t len)
{
	const char *peer;
	char path[300];
	struct stat st;

	if (rail->kind != FS_PROV_SHM || !(peer = fs_shm_addr_name(addr, len)) || !fs_shm_region_name_ours(peer))
		return false;
	if ((size_t)snprintf(path, sizeof(path), "/dev/shm/%s", peer) >= sizeof(path))
		return false;
	return lstat(path, &st) && errno == ENOENT;
}

bool fs_self_dumpable(void)
{
	return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1;
}

int fs_rail_self_check(const struct fs_rail *rail, const char **why)
{
	const char *own;
	uid_t own_uid, euid;

	*why = NULL;
	if (rail->kind != FS_PROV_SHM)
		return 0;
	euid = fs_self_euid();
	if (__atomic_load_n(&((struct fs_rail *)rail)->self_region_euid, __ATOMIC_RELAXED) != (uint64_t)euid + 1) {
		own = fs_shm_addr_name(rail->addr, rail->addr_len);
		if (!own || fs_shm_region_owner(own, &own_uid) || own_uid != euid) {
			*why = "this process changed user after opening its shm rail: new peers cannot map its region";
			return -EPERM;
		}
		__atomic_store_n(&((struct fs_rail *)rail)->self_region_euid, (uint64_t)euid + 1, __ATOMIC_RELAXED);
	}
	if (!fs_fabric_cma_off && !fs_self_dumpable()) {
		*why = "this process became non-dumpable (it changed user) after loading libfabric: "
		       "its peers cannot read its memory";
		return -EPERM;
	}
	return 0;
}

int fs_rail_peer_check(const struct fs_rail *rail, const void *addr, size_t len)
{
	const char *peer, *why;
	uid_t peer_uid;

	if (!len)
		return -EADDRNOTAVAIL;
	if (rail->kind != FS_PROV_SHM)
		return 0; /* the provider's own insert checks the rest */
	/* In the address vector: its region passed the checks below when it
	 * was inserted, and only its owner, which is our user, could have
	 * replaced the file since (/dev/shm is sticky). */
	if (fs_rail_av_knows(rail, addr, len))
		return fs_rail_self_check(rail, &why);
	peer = fs_shm_addr_name(addr, len);
	if (!peer || !fs_shm_region_name_ours(peer) || fs_shm_region_owner(peer, &peer_uid))
		return -EADDRNOTAVAIL;
	/* Each side maps the other's region with the rights it has now, and
	 * regions are 0600: both must belong to the user this process runs as
	 * (root could map the other's, the other could not map root's, and
	 * libfabric 1.17 then crashes in its progress on the missing region). */
	if (peer_uid != fs_self_euid())
		return -EPERM;
	return fs_rail_self_check(rail, &why);
}

/* ---- a peer that died holding its shm lock ------------------------------
 *
 * libfabric's shm provider guards each process's region with a spin lock in
 * that region, taken by the owner while it progresses and by every sender.
 * A process SIGKILLed while holding it leaves every sender to it spinning
 * inside fi_tsend forever (libfabric 1.17 has no robust lock). fabsock
 * cannot avoid entering that call, so it undoes the damage: every shm post
 * and completion-queue read is announced (fs_prov_call_begin/end); a
 * watchdog thread, seeing one call stuck for FS_STUCK_CALL_MS while a peer
 * is dead, releases a lock that stays taken: the dead peer's, and our own
 * region's (a dead receiver was writing a completion back to us: the case
 * seen in e2e_peerkill), through this process's own mapping of the region.
 *
 * Where the lock is in a region differs between libfabric versions; in all
 * of them it follows the region's base_addr field (the owner's mapping
 * address). The watchdog, started at rail open, first looks for that field
 * in our own region, so the
 * lock's offset is learnt from the running library, not assumed; if the
 * search fails (another layout) the release is simply not done. */
long fs_prov_call_pid;
uint64_t fs_prov_calls;
static size_t fs_shm_lock_off; /* 0: unknown */
_Static_assert(sizeof(pthread_spinlock_t) == sizeof(int), "a spin lock is one int");

/* The start of this process's mapping of the shm region of process PID
 * (deleted or not), or 0. */
static uintptr_t fs_shm_mapping(long pid)
{
	char line[512], prefix[64];
	size_t plen = fs_shm_prefix(prefix, sizeof(prefix));
	uintptr_t addr = 0;
	FILE *maps = fs_real.fopen("/proc/self/maps", "re");

	if (!maps)
		return 0;
	while (!addr && fgets(line, sizeof(line), maps)) {
		const char *name = strstr(line, "/dev/shm/");
		unsigned long start, off;

		if (name && fs_shm_name_pid(name + strlen("/dev/shm/"), prefix, plen) == pid &&
		    sscanf(line, "%lx-%*[0-9a-f] %*s %lx", &start, &off) == 2 && off == 0)
			addr = start;
	}
	fclose(maps);
	return addr;
}

/* The word of a free pthread spin lock (glibc's choice, learnt once): what
 * the region lock holds when free, and what fs_prov_spin_lock waits for. */
static int fs_spin_free_word(void)
{
	static int word, known;

	if (!__atomic_load_n(&known, __ATOMIC_ACQUIRE)) {
		pthread_spinlock_t fresh;
		int w;

		pthread_spin_init(&fresh, PTHREAD_PROCESS_SHARED);
		memcpy(&w, (const void *)&fresh, sizeof(w));
		pthread_spin_destroy(&fresh);
		__atomic_store_n(&word, w, __ATOMIC_RELAXED);
		__atomic_store_n(&known, 1, __ATOMIC_RELEASE);
	}
	return __atomic_load_n(&word, __ATOMIC_RELAXED);
}

/* The watchdog reads and writes regions that other threads unmap whenever
 * they like (the rail closes at exit, a peer's region goes with its address):
 * through the kernel's copy, which fails with EFAULT on an address no longer
 * mapped where a plain load would take the process down (engine.test_pool
 * died so, one run in fifty, when the rail closed under the first look). */
static bool fs_self_copy(void *local_buf, uintptr_t addr, size_t len, bool write)
{
	struct iovec local = { local_buf, len }, remote = { (void *)addr, len };
	ssize_t n = write ? process_vm_writev(getpid(), &local, 1, &remote, 1, 0)
			  : process_vm_readv(getpid(), &local, 1, &remote, 1, 0);

	return n == (ssize_t)len;
}

static void fs_shm_find_lock(void)
{
	const int free_word = fs_spin_free_word();
	unsigned char head[256];
	uintptr_t base;

	if (fs_shm_lock_off)
		return;
	base = fs_shm_mapping(getpid());
	if (!base || !fs_self_copy(head, base, sizeof(head), false))
		return;
	for (size_t off = 0; off + sizeof(uintptr_t) + sizeof(free_word) <= sizeof(head); off += sizeof(uintptr_t)) {
		uintptr_t v;
		int w;

		memcpy(&v, head + off, sizeof(v));
		memcpy(&w, head + off + sizeof(v), sizeof(w));
		if (v == base && w == free_word) {
			fs_shm_lock_off = off + sizeof(v);
			break;
		}
	}
	if (!fs_shm_lock_off)
		FS_INFO("shm region layout not recognised: a peer killed inside libfabric may hang its senders");
}

bool fs_pid_dead(long pid)
{
	char path[64], stat[256], *paren;
	int fd;
	ssize_t n;

	if (!fs_pid_alive(pid))
		return true;
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = pread(fd, stat, sizeof(stat) - 1, 0);
	fs_real.close(fd);
	if (n <= 0)
		return false;
	stat[n] = 0;
	paren = strrchr(stat, ')');
	return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* The lock word is libfabric's. A thread sanitizer models the provider's
 * pthread_spin_* calls on it as mutex operations and reports our look at
 * the word as a race with them, so this load, the waiters' look at it, is
 * not instrumented (the watchdog's go through the kernel, fs_self_copy). */
__attribute__((no_sanitize("thread"), noinline)) static int fs_lock_word_load(const volatile int *w)
{
	return *w;
}

/* True if the spin lock at ADDR is taken at every one of SAMPLES looks
 * 1 ms apart. A live holder keeps it for microseconds, but one that the
 * scheduler has set aside may keep it for tens of milliseconds on a loaded
 * machine: a lock is only ever released when a peer is known dead, and our
 * own region's (which live peers take too) only after a long look. */
static bool fs_lock_stuck(uintptr_t lock, int samples)
{
	for (int i = 0; i < samples; i++) {
		int w;

		if (!fs_self_copy(&w, lock, sizeof(w), false) || w == fs_spin_free_word())
			return false; /* free, or the region is gone */
		usleep(1000);
	}
	return true;
}

/* Releases the lock of the region mapped at BASE if it stays taken. */
static bool fs_shm_unlock_if_stuck(uintptr_t base, const char *whose, int samples)
{
	uintptr_t lock = base + fs_shm_lock_off;
	int free_word = fs_spin_free_word();

	if (!base || !fs_lock_stuck(lock, samples))
		return false;
	/* What pthread_spin_unlock does (a store of the free word), without
	 * telling a thread sanitizer that this thread unlocks a lock it never
	 * took, and without a fault if the region went meanwhile. No fence:
	 * this thread wrote nothing under the lock for the next holder to see
	 * (the dead holder's writes are as far as they got), and the system
	 * call orders everything before it anyway. */
	if (!fs_self_copy(&free_word, lock, sizeof(free_word), true))
		return false;
	FS_WARN("the shm lock of %s stayed taken while a peer process was gone; released it", whose);
	return true;
}

/* The last FS_PEER_RING peers that provider calls were made to: written
 * under the engine lock, read by the watchdog (a stale read only delays a
 * release to its next look). */
#define FS_PEER_RING 16
long fs_prov_last_peer;
static long fs_prov_peer_ring[FS_PEER_RING];
static unsigned fs_prov_peer_next;

void fs_prov_note_peer(long pid)
{
	__atomic_store_n(&fs_prov_last_peer, pid, __ATOMIC_RELAXED);
	for (unsigned i = 0; i < FS_PEER_RING; i++)
		if (__atomic_load_n(&fs_prov_peer_ring[i], __ATOMIC_RELAXED) == pid)
			return;
	__atomic_store_n(&fs_prov_peer_ring[fs_prov_peer_next++ % FS_PEER_RING], pid, __ATOMIC_RELAXED);
}

/* A recent peer that is gone, or 0. */
static long fs_recent_peer_dead(void)
{
	for (unsigned i = 0; i < FS_PEER_RING; i++) {
		long pid = __atomic_load_n(&fs_prov_peer_ring[i], __ATOMIC_RELAXED);

		if (pid > 0 && pid != getpid() && fs_pid_dead(pid))
			return pid;
	}
	return 0;
}

/* A provider call has been stuck for a while: if process PID, or another
 * peer called lately, is gone (or a zombie), releases its region's lock and
 * our own when they stay taken. True if it released one. */
static bool fs_shm_release_dead(long pid)
{
	char whose[64];
	bool done = false;
	long gone;

	if (!fs_shm_lock_off)
		return false;
	/* Only a dead process can hold a lock for good. Without one, the call
	 * is slow, not stuck (its thread, or the lock's holder, waits for a
	 * core), and releasing a lock a live process holds would corrupt the
	 * region under it. */
	gone = pid > 0 && fs_pid_dead(pid) ? pid : fs_recent_peer_dead();
	if (!gone)
		return false;
	snprintf(whose, sizeof(whose), "dead process %ld", gone);
	done = fs_shm_unlock_if_stuck(fs_shm_mapping(gone), whose, 20);
	/* A dead receiver may hold our own region's lock (it was writing a
	 * completion back to us); so may a live peer, set aside by the
	 * scheduler: half a second of looks tells them apart. */
	done |= fs_shm_unlock_if_stuck(fs_shm_mapping(getpid()), "this process's region", 500);
	return done;
}

/* Waiting for a provider's spin lock (fs_prov_spin_lock): reads of the lock
 * word with a pause between (glibc's own loop, so a release is seen at
 * once) for FS_LOCK_SPIN_NS, then sleeps from FS_LOCK_SLEEP_FIRST_NS
 * doubling up to FS_LOCK_SLEEP_MAX_NS, each followed by FS_LOCK_RESPIN_NS of
 * reads. A running holder keeps a region's lock for microseconds, tens
 * through a receiver's CMA copy of a 128 KiB pull: the first spin covers
 * that (a first version that slept after ~30 us cost iperf3 -P 4 half its
 * bandwidth); only a holder that is not running makes a waiter sleep. */
#define FS_LOCK_SPIN_NS 200000ull
#define FS_LOCK_RESPIN_NS 20000ull
#define FS_LOCK_SLEEP_FIRST_NS 20000L
#define FS_LOCK_SLEEP_MAX_NS 1000000L

int fs_prov_spin_lock(pthread_spinlock_t *lock)
{
	int free_word = 0;
	uint64_t spin_end = 0;
	long sleep_ns = FS_LOCK_SLEEP_FIRST_NS;
	bool counted = false;
	unsigned n = 0;

	for (;;) {
		if (pthread_spin_trylock(lock) == 0) /* not interposed: glibc's */
			return 0;
		if (!spin_end) { /* contended: the uncontended path is the trylock alone */
			spin_end = fs_now_ns() + FS_LOCK_SPIN_NS;
			free_word = fs_spin_free_word();
		}
		while (fs_lock_word_load((const volatile int *)lock) != free_word) {
			__builtin_ia32_pause();
			if ((++n & 63) == 0 && fs_now_ns() >= spin_end)
				break;
		}
		if (fs_lock_word_load((const volatile int *)lock) == free_word)
			continue; /* looks free: try it */
		if (!counted) {
			FS_STAT_INC(prov_lock_sleeps);
			counted = true;
		}
		/* the holder may be waiting for this very core */
		nanosleep(&(struct timespec){ 0, sleep_ns }, NULL);
		if (sleep_ns < FS_LOCK_SLEEP_MAX_NS)
			sleep_ns = sleep_ns * 2 < FS_LOCK_SLEEP_MAX_NS ? sleep_ns * 2 : FS_LOCK_SLEEP_MAX_NS;
		spin_end = fs_now_ns() + FS_LOCK_RESPIN_NS;
	}
}

/* A shm provider call not returning for this long is stuck on a lock that a
 * dead process holds. */
#define FS_STUCK_CALL_MS 200

/* Notices a provider call that has not returned for FS_STUCK_CALL_MS. */
static void fs_shm_check_stuck(void)
{
	static long last;
	static uint64_t last_count, since_ns;
	long pid = __atomic_load_n(&fs_prov_call_pid, __ATOMIC_RELAXED);
	uint64_t count = __atomic_load_n(&fs_prov_calls, __ATOMIC_RELAXED), now = fs_now_ns();

	if (!pid || pid != last || count != last_count) {
		last = pid;
		last_count = count;
		since_ns = now;
		return;
	}
	if (now - since_ns < FS_STUCK_CALL_MS * 1000000ull)
		return;
	since_ns = now; /* at most one attempt per period */
	fs_shm_release_dead(pid);
}

/* Our own region's lock, taken at a look while no call of ours is stuck. A
 * peer killed inside a send to us dies holding our lock: every other
 * process that sends to us then spins in its provider call, and its own
 * watchdog cannot help (this process, the region's owner, is alive, and the
 * dead one was never its peer); while this process makes no provider call
 * of its own (idle, asleep until a peer rings it, which those senders would
 * do only after their send) nothing here noticed either, and they spun for
 * ever (tests/progs/fs_lockkill.c "ours"). So each look also reads our lock
 * word, one system call; only when it is taken, and a recent peer is dead,
 * does the long look of fs_shm_release_dead follow. */
static void fs_shm_check_own(void)
{
	static uintptr_t base;
	static pid_t base_pid; /* a forked child has a region of its own */
	static uint64_t resolve_after_ns;
	unsigned char head[sizeof(uintptr_t) + sizeof(int)];
	uintptr_t field = 0;
	pid_t self = getpid();
	int word = 0;
	long gone;
	char whose[96];

	/* The region's base_addr field, just before the lock, names its own
	 * mapping: checked on every look, so that a mapping gone (the rail
	 * closed at exit) and something else mapped at its address is never
	 * taken for it. Looked up again (/proc/self/maps) at most once a
	 * second. */
	if (base && base_pid == self && fs_self_copy(head, base + fs_shm_lock_off - sizeof(uintptr_t), sizeof(head), false))
		memcpy(&field, head, sizeof(field));
	if (!base || base_pid != self || field != base) {
		uint64_t now = fs_now_ns();

		base = 0;
		if (now < resolve_after_ns && base_pid == self)
			return;
		resolve_after_ns = now + 1000000000ull;
		base_pid = self;
		base = fs_shm_mapping(self);
		if (!base || !fs_self_copy(head, base + fs_shm_lock_off - sizeof(uintptr_t), sizeof(head), false))
			return;
		memcpy(&field, head, sizeof(field));
		if (field != base) {
			base = 0;
			return;
		}
	}
	memcpy(&word, head + sizeof(uintptr_t), sizeof(word));
	if (word == fs_spin_free_word() || !(gone = fs_recent_peer_dead()))
		return;
	snprintf(whose, sizeof(whose), "this process's region (dead process %ld was a peer)", gone);
	fs_shm_unlock_if_stuck(base, whose, 500);
}

/* The watchdog is a thread of its own: the stuck call may be the service
 * thread's (its progress posts sends too). It looks four times a second: a
 * wake-up each is nothing for one process, but 300 PostgreSQL backends
 * woke 3,000 times a second at ten looks each, on a machine of two cores. */
static void *fs_shm_watchdog(void *arg)
{
	FS_GUARD_ENTER(); /* everything this thread does is fabsock's own */
	/* Learnt here rather than in the rail open that started this thread:
	 * reading /proc/self/maps of a process with many libraries took 0.5-3
	 * ms of its first connection's setup. Only this thread uses it. */
	fs_shm_find_lock();
	if (!fs_shm_lock_off)
		return arg;
	for (;;) {
		struct timespec ts = { 0, 250 * 1000000L };

		nanosleep(&ts, NULL);
		fs_shm_check_stuck();
		fs_shm_check_own();
	}
	return arg;
}

static void fs_shm_watchdog_start(void)
{
	static pid_t started;

	if (started == getpid())
		return;
	if (fs_thread_start(fs_shm_watchdog, 64 * 1024) == 0)
		started = getpid();
	else
		FS_WARN("cannot start the shm watchdog thread; a peer killed inside libfabric may hang its senders");
}

long fs_shm_addr_pid(const void *addr, size_t len)
{
	char name[FS_WIRE_ADDR_MAX + 1], prefix[64], *p;
	size_t plen;

	if (!len || len > FS_WIRE_ADDR_MAX)
		return 0;
	memcpy(name, addr, len);
	name[len] = 0;
	plen = fs_shm_prefix(prefix, sizeof(prefix));
	p = strstr(name, prefix);
	return p ? fs_shm_name_pid(p, prefix, plen) : 0;
}

void fs_shm_watch_lock(void)
{
	fs_shm_watchdog_start();
}
