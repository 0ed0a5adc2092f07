/* SPDX-License-Identifier: MIT */
/* Small helpers of the core (util.h). */
#include "core/util.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "config/log.h"
#include "core/guard.h"
#include "preload/real.h"

__thread int fs_guard_depth __attribute__((tls_model("initial-exec")));
__thread int fs_fresh_region __attribute__((tls_model("initial-exec")));

pid_t fs_pid_cache;
bool fs_vfork_seen; /* set by the vfork and clone wrappers (preload/vfork.c) */
unsigned fs_fds_spread = 1; /* (util.h) never 0, which a socket's stamp means "unknown" */
const unsigned char *fs_pid_mark;

/* Called by fs_core_init and first thing in a forked child: the cache is
 * never 0 after start-up, so a vfork child (which runs no fork handlers and
 * shares this memory with its parent) never writes its own pid into it.
 * The mark (util.h) says the cache is this process's; its page is wiped
 * in every child the kernel forks, before that child runs. */
void fs_self_pid_refresh(void)
{
	static unsigned char *mark;

	__atomic_store_n(&fs_pid_cache, getpid(), __ATOMIC_RELAXED);
	if (!mark) {
		void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (page == MAP_FAILED)
			return;
		if (madvise(page, 4096, MADV_WIPEONFORK)) {
			munmap(page, 4096); /* a kernel before 4.14: getpid() every time */
			return;
		}
		mark = page;
	}
	__atomic_store_n(mark, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&fs_pid_mark, mark, __ATOMIC_RELEASE);
}

pid_t fs_self_pid_slow(void)
{
	pid_t pid = getpid();

	__atomic_store_n(&fs_pid_cache, pid, __ATOMIC_RELAXED);
	return pid;
}

uid_t fs_euid_cache;
bool fs_euid_uncached;

void fs_self_euid_refresh(void)
{
	__atomic_store_n(&fs_euid_cache, geteuid(), __ATOMIC_RELAXED);
}

uint64_t fs_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t fs_now_coarse_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Whether the calling thread holds M. glibc keeps the holder's thread id in
 * the mutex (a plain mutex too); only this thread can have written its own
 * id there, so a racy read answers this question exactly. Elsewhere it says
 * no, and the callers wait out their deadline. */
static bool fs_mutex_mine(pthread_mutex_t *m)
{
#ifdef __GLIBC__
	return __atomic_load_n(&m->__data.__owner, __ATOMIC_RELAXED) == (int)syscall(SYS_gettid);
#else
	(void)m;
	return false;
#endif
}

bool fs_lock_forked;
/* How soon a lock orphaned by a fork is found: a wait looks every this long. */
#define FS_ORPHAN_LOOK_NS 10000000ull
/* Serialises taking over: two threads of the child finding the same
 * orphaned lock re-initialise it once. */
static pthread_mutex_t fs_orphan_lock = PTHREAD_MUTEX_INITIALIZER;

/* Whether M is held by a thread that is not one of this process's: in a
 * forked child, a thread of the parent (tgkill finds no such thread in our
 * group). */
static bool fs_mutex_orphaned(pthread_mutex_t *m)
{
#ifdef __GLIBC__
	int owner = __atomic_load_n(&m->__data.__owner, __ATOMIC_RELAXED), saved = errno;
	bool gone = owner > 0 && syscall(SYS_tgkill, (int)getpid(), owner, 0) < 0 && errno == ESRCH;

	errno = saved;
	return gone;
#else
	(void)m;
	return false;
#endif
}

/* Takes M over if it is orphaned: afterwards it is free (or taken by the
 * thread that got there first). */
static void fs_mutex_adopt(pthread_mutex_t *m)
{
	if (!fs_mutex_orphaned(m))
		return;
	pthread_mutex_lock(&fs_orphan_lock);
	if (fs_mutex_orphaned(m)) {
		pthread_mutex_init(m, NULL);
		FS_INFO("a lock held by a thread of the parent at fork() was taken over");
	}
	pthread_mutex_unlock(&fs_orphan_lock);
}

/* pthread_mutex_timedlock for at most WAIT_NS. 0 or an error number. */
static int fs_mutex_timedlock_ns(pthread_mutex_t *m, uint64_t wait_ns)
{
	struct timespec real;
	uint64_t at;

	clock_gettime(CLOCK_REALTIME, &real);
	at = (uint64_t)real.tv_sec * 1000000000ull + (uint64_t)real.tv_nsec + wait_ns;
	real.tv_sec = (time_t)(at / 1000000000ull);
	real.tv_nsec = (long)(at % 1000000000ull);
	return pthread_mutex_timedlock(m, &real);
}

void fs_lock_slow(pthread_mutex_t *m)
{
	if (pthread_mutex_trylock(m) == 0)
		return;
	/* a live holder lets go; an orphaned lock is found within 10 ms */
	while (fs_mutex_timedlock_ns(m, FS_ORPHAN_LOOK_NS) != 0)
		fs_mutex_adopt(m);
}

int fs_trylock(pthread_mutex_t *m)
{
	int ret = pthread_mutex_trylock(m);

	if (ret && __atomic_load_n(&fs_lock_forked, __ATOMIC_RELAXED)) {
		fs_mutex_adopt(m);
		ret = pthread_mutex_trylock(m);
	}
	return ret;
}

void fs_lock_after_fork(void)
{
	pthread_mutex_init(&fs_orphan_lock, NULL);
	__atomic_store_n(&fs_lock_forked, true, __ATOMIC_RELAXED);
}

int fs_mutex_lock_until(pthread_mutex_t *m, uint64_t deadline_ns)
{
	uint64_t now;

	/* free (the rule): no system call, which a sandboxed child's filter
	 * may forbid at its exit (gettid) */
	if (pthread_mutex_trylock(m) == 0)
		return 0;
	if (fs_mutex_mine(m))
		return -EDEADLK;
	for (;;) {
		now = fs_now_ns();
		if (now >= deadline_ns)
			return pthread_mutex_trylock(m) ? -ETIMEDOUT : 0;
		if (!__atomic_load_n(&fs_lock_forked, __ATOMIC_RELAXED))
			return fs_mutex_timedlock_ns(m, deadline_ns - now) ? -ETIMEDOUT : 0;
		if (fs_mutex_timedlock_ns(m, deadline_ns - now < FS_ORPHAN_LOOK_NS ? deadline_ns - now : FS_ORPHAN_LOOK_NS) == 0)
			return 0;
		fs_mutex_adopt(m);
	}
}

/* What a new thread of ours starts with: its function, and a flag it sets
 * once it runs it. */
struct fs_thread_boot {
	void *(*fn)(void *);
	int running; /* atomic */
};

static void *fs_thread_boot(void *arg)
{
	struct fs_thread_boot *boot = arg;
	void *(*fn)(void *) = boot->fn;

	/* fabsock's own from its first instruction, whichever pthread_create
	 * started it (fs_create: ASan's calls libc's, not our wrapper) */
	FS_GUARD_ENTER();
	__atomic_store_n(&boot->running, 1, __ATOMIC_RELEASE); /* BOOT is the creator's: not touched after */
	return fn(NULL);
}

/* The pthread_create a thread of ours is started with. In an ASan build the
 * runtime must see every thread start: one created past its interceptor
 * (fs_real's is libc's, the next after this library) runs with no thread
 * state of the runtime, and ASan took the stale shadow of a reused stack
 * for a stack-buffer-underflow in the shm watchdog of an Apache prefork
 * child (CI's ASan stage, "thread T-1"). So its interceptor is called by
 * its own name (in a program not built with ASan the runtime comes after
 * libc: the global pthread_create is not its); it calls ours, which marks
 * the thread fabsock's own (FS_GUARDED at the call).
 * Not in a TSan build: there the same call makes TSan see our threads in a
 * program not built with TSan whose locks (libc's, the runtime after libc)
 * it cannot see, and it reports races that are not there; preloading the
 * runtime first instead makes fs_real resolve past it, and it misses our
 * closes. A thread it did not create has no thread state, which is why the
 * TSan build does not retry a refused stack (below). */
static int fs_create(pthread_t *tid, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
#if defined(FS_SANITIZE_ADDRESS)
	static int (*create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

	if (!create)
		create = (int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *))dlsym(RTLD_DEFAULT, "__interceptor_pthread_create");
	if (create)
		return create(tid, attr, fn, arg);
#endif
	return fs_real.pthread_create(tid, attr, fn, arg);
}

int fs_thread_start(void *(*fn)(void *), size_t stack)
{
	struct fs_thread_boot boot = { .fn = fn, .running = 0 };
	pthread_t tid;
	pthread_attr_t attr;
	sigset_t all, old;
	int ret;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	/* glibc puts the program's static TLS on every thread's stack and
	 * refuses (EINVAL) a stack that cannot hold it with room to spare: a
	 * program with 64 KiB of __thread data had no shm watchdog (its 64 KiB
	 * stack). A refused size is tried again at the default size (8 MiB of
	 * address space, touched only as used). Not under TSan: a thread its
	 * runtime did not create (fs_create) crashed as soon as it ran the
	 * instrumented code (the watchdog in e2e_exec inetd's cat), while at
	 * 64 KiB glibc refused it (TSan's TLS is large) and it never ran. */
#if defined(FS_SANITIZE_THREAD)
	for (int tries = 0; tries < 1; tries++) {
#else
	for (int tries = 0; tries < 2; tries++) {
#endif
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (!tries)
			pthread_attr_setstacksize(&attr, stack);
		FS_GUARD_ENTER();
		ret = fs_create(&tid, &attr, fs_thread_boot, &boot);
		FS_GUARD_LEAVE();
		pthread_attr_destroy(&attr);
		if (ret != EINVAL)
			break;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	/* Until the new thread runs our code it may hold locks of the runtime
	 * that set it up (ASan's allocator does): a fork in that window left
	 * a prefork worker hung for good in its first malloc. The creator
	 * returns once it runs; the fork handlers (fs_service_fork_prepare)
	 * then find it where they can wait for it. BOOT lives on this stack:
	 * the wait has no bound but the thread's start (a created thread
	 * runs), and no allocation may stand in for it (the thread would
	 * free it in the very window this closes). */
	while (ret == 0 && !__atomic_load_n(&boot.running, __ATOMIC_ACQUIRE)) {
		struct timespec ts = { 0, 100000 };

		nanosleep(&ts, NULL);
	}
	return ret;
}

int fs_tcp_reset(int fd)
{
	struct sockaddr unspec = { .sa_family = AF_UNSPEC };
	int ret = fs_real.connect(fd, &unspec, sizeof(unspec)) ? -errno : 0;

	/* (on the disconnected socket it answers ENOTCONN, and still marks
	 * both directions shut) */
	(void)fs_real.shutdown(fd, SHUT_RDWR);
	return ret;
}
